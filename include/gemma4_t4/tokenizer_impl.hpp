// gemma4_t4 implementation part: Tokenizer::Impl -- the vocabulary, the BPE merge table, the added-token tries,
// the normalizer / pre-tokenizer / decoder settings -- and the encoding pipeline over them (steps 1-4 of
// tokenizer.hpp's list). Filled by tokenizer_load.hpp; used by tokenizer.hpp. Included through tokenizer.hpp
// inside GEMMA4_T4_IMPLEMENTATION; not a public header.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#ifdef GEMMA4_T4_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace gemma4_t4 {
namespace detail {

// ---- UTF-8 ----

// The first byte c of a multi-byte UTF-8 sequence: false when no sequence starts with it (ASCII included);
// else *more continuation bytes follow, the first of them in [*lo, *hi] (the others in [0x80, 0xBF]).
inline bool utf8_lead(unsigned c, size_t* more, unsigned* lo, unsigned* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    *more = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    *more = 2;
    if (c == 0xE0) *lo = 0xA0;  // no overlong forms
    if (c == 0xED) *hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    *more = 3;
    if (c == 0xF0) *lo = 0x90;  // no overlong forms
    if (c == 0xF4) *hi = 0x8F;  // <= U+10FFFF
  } else {
    return false;
  }
  return true;
}

// Scans the UTF-8 sequence starting at s[0] (n >= 1 bytes available). Returns 1 and *len = its length when
// it is complete and valid; 0 when s[0..n) is a valid but incomplete prefix (*len = n); -1 when ill-formed,
// *len = the maximal ill-formed subpart (>= 1 byte) to replace with one U+FFFD.
inline int utf8_scan(const unsigned char* s, size_t n, size_t* len) {
  const unsigned c = s[0];
  size_t more = 0;
  unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c < 0x80) {
    *len = 1;
    return 1;
  }
  if (!utf8_lead(c, &more, &lo, &hi)) {
    *len = 1;
    return -1;
  }
  const size_t need = more + 1;
  for (size_t i = 1; i < need; ++i) {
    if (i >= n) {
      *len = i;
      return 0;
    }
    const unsigned b = s[i];
    if (b < (i == 1 ? lo : 0x80u) || b > (i == 1 ? hi : 0xBFu)) {
      *len = i;
      return -1;
    }
  }
  *len = need;
  return 1;
}

// Offset of the first byte that is not part of valid UTF-8, or npos.
inline size_t utf8_invalid_at(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    if (utf8_scan(p + i, s.size() - i, &len) != 1) return i;
    i += len;
  }
  return std::string_view::npos;
}

// ---- BPE tables ----

// Token ids are below 2^21 (Gemma: 262144). The bound caps what a hostile file can make load() allocate,
// and lets an id share a 64-bit table slot with other fields.
constexpr int64_t kMaxTokenIds = int64_t(1) << 21;

// The open-addressing tables below: 8-byte slots (0: empty), a power-of-two count, at most half full.
inline uint64_t mix64(uint64_t k) {  // a 64-bit finalizer (murmur3's): every input bit moves every output bit
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return k;
}
// *slots becomes max(16, want) rounded up to a power of two empty slots (*mask = count - 1); returns the old
// slots, for the caller to insert again.
inline std::vector<uint64_t> regrow_slots(size_t want, std::vector<uint64_t>* slots, size_t* mask) {
  size_t cap = 16;
  while (cap < want) cap <<= 1;
  std::vector<uint64_t> old = std::move(*slots);
  slots->assign(cap, 0);
  *mask = cap - 1;
  return old;
}

// Token texts back to back in one string, each a record [length][bytes]: one length byte below 255, else 0xFF
// and four bytes (little-endian). A record is named by its offset; offset 0 names none. One allocation for
// all of Gemma's 262,144 texts (2.6 MB) instead of a std::string each.
class TextArena {
 public:
  TextArena() : data_(1, '\0') {}
  void reserve(size_t bytes) { data_.reserve(bytes); }
  // Appends s; its offset, or 0 when the arena would pass 4 GiB.
  uint32_t add(std::string_view s) {
    const size_t head = s.size() < 255 ? 1 : 5;
    if (data_.size() + head + s.size() > UINT32_MAX) return 0;
    const uint32_t off = uint32_t(data_.size());
    if (head == 1) {
      data_.push_back(char(s.size()));
    } else {
      const uint32_t n = uint32_t(s.size());
      const char len[5] = {'\xff', char(n), char(n >> 8), char(n >> 16), char(n >> 24)};
      data_.append(len, 5);
    }
    data_.append(s.data(), s.size());
    return off;
  }
  std::string_view at(uint32_t off) const {
    const auto* p = reinterpret_cast<const unsigned char*>(data_.data()) + off;
    if (p[0] < 255) return {reinterpret_cast<const char*>(p) + 1, p[0]};
    const uint32_t n = p[1] | uint32_t(p[2]) << 8 | uint32_t(p[3]) << 16 | uint32_t(p[4]) << 24;
    return {reinterpret_cast<const char*>(p) + 5, n};
  }
  // The record after the one at off (records are walked in the order they were added).
  uint32_t next(uint32_t off) const {
    const std::string_view s = at(off);
    return uint32_t(s.data() + s.size() - data_.data());
  }
  uint32_t end() const { return uint32_t(data_.size()); }
  const char* data() const { return data_.data(); }

 private:
  std::string data_;
};

// Token text -> id over texts in a TextArena: open addressing, linear probing, at most half full. A slot is
// 8 bytes -- the text's record offset, the id (21 bits) and 11 more bits of the hash, so that a probe of
// another text rarely reads the arena: Gemma's 262,144 texts take 4 MiB of slots (a std::unordered_map took
// several times that in nodes, and its lookups were most of loading the vocabulary and the 514,906 merges).
// Of two records with one text the first added keeps it.
class VocabIndex {
 public:
  // Room for n texts without growing.
  void reserve(size_t n, const TextArena& texts) {
    if (2 * n > slots_.size()) rehash(2 * n, texts);
  }
  size_t size() const { return size_; }
  // The id of text k, or -1.
  int32_t find(std::string_view k, const TextArena& texts) const { return find(k, probe(k), texts); }
  // A lookup in steps, so that many can be in flight (loading the merges: three lookups each, mostly cache
  // misses): probe() hashes k and prefetches its slot, prefetch_text() then the text of the first slot that
  // may hold k, find(k, probe, texts) finds it.
  struct Probe {
    uint64_t hash;
  };
  Probe probe(std::string_view k) const {
    const Probe p{hash(k)};
    if (!slots_.empty()) __builtin_prefetch(&slots_[size_t(p.hash) & mask_]);
    return p;
  }
  void prefetch_text(Probe p, const TextArena& texts) const {
    if (slots_.empty()) return;
    for (size_t i = size_t(p.hash) & mask_;; i = (i + 1) & mask_) {
      const uint64_t s = slots_[i];
      if (s == 0) return;
      if ((s >> 53) == (p.hash >> 53)) return __builtin_prefetch(texts.data() + uint32_t(s));
    }
  }
  int32_t find(std::string_view k, Probe p, const TextArena& texts) const {
    if (slots_.empty()) return -1;
    for (size_t i = size_t(p.hash) & mask_;; i = (i + 1) & mask_) {
      const uint64_t s = slots_[i];
      if (s == 0) return -1;
      if ((s >> 53) == (p.hash >> 53) && texts.at(uint32_t(s)) == k) return int32_t((s >> 32) & (kMaxTokenIds - 1));
    }
  }
  // Adds the text of record `off` -> id (0 <= id < kMaxTokenIds) unless that text is there already.
  void add(uint32_t off, int32_t id, const TextArena& texts) { add(off, id, probe(texts.at(off)), texts); }
  void add(uint32_t off, int32_t id, Probe p, const TextArena& texts) {
    if (2 * (size_ + 1) > slots_.size()) {
      rehash(std::max<size_t>(16, 2 * slots_.size()), texts);
      p = probe(texts.at(off));
    }
    const std::string_view k = texts.at(off);
    for (size_t i = size_t(p.hash) & mask_;; i = (i + 1) & mask_) {
      uint64_t& s = slots_[i];
      if (s == 0) {
        s = uint64_t(off) | uint64_t(id) << 32 | (p.hash >> 53) << 53;
        ++size_;
        return;
      }
      if ((s >> 53) == (p.hash >> 53) && texts.at(uint32_t(s)) == k) return;
    }
  }

 private:
  // FNV-1a over 8-byte words, then a finalizer (token texts are short: a few words at most).
  static uint64_t hash(std::string_view k) {
    uint64_t h = 0xcbf29ce484222325ull ^ k.size();
    size_t i = 0;
    for (; i + 8 <= k.size(); i += 8) {
      uint64_t w;
      std::memcpy(&w, k.data() + i, 8);
      h = (h ^ w) * 0x100000001b3ull;
    }
    if (k.size() > i) {
      uint64_t w = 0;
      std::memcpy(&w, k.data() + i, k.size() - i);
      h = (h ^ w) * 0x100000001b3ull;
    }
    return mix64(h);
  }
  void rehash(size_t want, const TextArena& texts) {
    const std::vector<uint64_t> old = regrow_slots(want, &slots_, &mask_);
    size_ = 0;
    for (const uint64_t s : old)
      if (s != 0) add(uint32_t(s), int32_t((s >> 32) & (kMaxTokenIds - 1)), texts);
  }
  std::vector<uint64_t> slots_;  // [2^k] off | id << 32 | hash >> 53 << 53; 0: empty
  size_t mask_ = 0, size_ = 0;
};

// (left id, right id) -> (rank, merged id): open addressing, linear probing, at most half full, 8 bytes a slot
// -- the pair and the rank -- and the merged ids by rank beside it (Gemma's 514,906 merges: 8 + 2 MiB; 16-byte
// slots took 16).
class MergeTable {
 public:
  static constexpr size_t kMaxMerges = (size_t(1) << 22) - 1;  // rank + 1 fits 22 bits
  // Room for n merges without growing.
  void reserve(size_t n) {
    merged_.reserve(n);
    if (2 * n > slots_.size()) rehash(2 * n);
  }
  size_t size() const { return merged_.size(); }
  // Fetches the slot of (a, b) ahead of add() (loading: the merges of a batch are added together).
  void prefetch(int32_t a, int32_t b) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[mix64(pair(a, b)) & mask_]);
  }
  // The next merge in rank order: (a, b) -> id (ids below kMaxTokenIds; at most kMaxMerges merges). A later
  // duplicate replaces an earlier one (tokenizers collects the merges into a HashMap).
  void add(int32_t a, int32_t b, int32_t id) {
    if (2 * (used_ + 1) > slots_.size()) rehash(std::max<size_t>(16, 2 * slots_.size()));
    merged_.push_back(id);
    put(pair(a, b) << 22 | merged_.size());
  }
  // Rank and merged id of (a, b); false when the pair does not merge.
  bool find(int32_t a, int32_t b, int32_t* rank, int32_t* id) const {
    if (slots_.empty()) return false;
    const uint64_t key = pair(a, b);
    for (uint64_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
      const uint64_t s = slots_[i];
      if (s == 0) return false;
      if (s >> 22 == key) {
        *rank = int32_t((s & ((uint64_t(1) << 22) - 1)) - 1);
        *id = merged_[size_t(*rank)];
        return true;
      }
    }
  }

 private:
  static uint64_t pair(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 21 | uint32_t(b); }
  void put(uint64_t slot) {
    for (uint64_t i = mix64(slot >> 22) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i] == 0) ++used_;
      if (slots_[i] == 0 || slots_[i] >> 22 == slot >> 22) {
        slots_[i] = slot;
        return;
      }
    }
  }
  void rehash(size_t want) {
    const std::vector<uint64_t> old = regrow_slots(want, &slots_, &mask_);
    used_ = 0;
    for (const uint64_t s : old)
      if (s != 0) put(s);
  }
  std::vector<uint64_t> slots_;  // [2^k] pair(a, b) << 22 | rank + 1; 0: empty
  std::vector<int32_t> merged_;  // [merges] merged id by rank
  size_t mask_ = 0;
  size_t used_ = 0;  // slots in use
};

// Byte trie of added-token strings: longest match at a position.
class TokenTrie {
 public:
  bool empty() const { return nodes_.size() == 1; }
  void add(std::string_view s, int32_t id) {
    size_t node = 0;
    for (unsigned char c : s) {
      int32_t next = child(node, c);
      if (next < 0) {
        next = int32_t(nodes_.size());
        nodes_[node].next.emplace_back(c, next);
        nodes_.emplace_back();
      }
      node = size_t(next);
    }
    nodes_[node].id = id;
  }
  // Length of the longest token that s[0..n) starts with (0: none); *id its id.
  size_t longest(const char* s, size_t n, int32_t* id) const {
    size_t node = 0, best = 0;
    for (size_t i = 0; i < n; ++i) {
      const int32_t next = child(node, static_cast<unsigned char>(s[i]));
      if (next < 0) break;
      node = size_t(next);
      if (nodes_[node].id >= 0) {
        best = i + 1;
        *id = nodes_[node].id;
      }
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;
    int32_t id = -1;
  };
  int32_t child(size_t node, unsigned char c) const {
    for (const auto& e : nodes_[node].next)
      if (e.first == c) return e.second;
    return -1;
  }
  std::vector<Node> nodes_ = std::vector<Node>(1);
};

inline void replace_all(std::string* s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s->find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(*s, pos, hit - pos);
    out += to;
  }
  if (pos == 0) return;
  out.append(*s, pos, std::string::npos);
  *s = std::move(out);
}

}  // namespace detail

// ---- Tokenizer::Impl ----

struct Tokenizer::Impl {
  std::string source;  // the file it came from (for messages)

  // vocabulary: model vocab overlaid with added tokens
  detail::TextArena texts;                             // every text: the model vocab's in file order, then
                                                       // those of added tokens that renamed an id
  std::vector<uint32_t> piece_at;                      // [vocab] record of the id's text in texts; 0: unused id
  detail::VocabIndex lookup;                           // model vocab: text -> id (its own texts, in texts)
  std::unordered_map<std::string, int32_t> added_ids;  // added tokens: text -> id
  std::vector<uint8_t> special;                        // [vocab] 1 for added tokens marked special
  std::vector<int16_t> byte_value;                     // [vocab] 0..255 for "<0xXX>" tokens, else -1
  // [vocab] the texts as std::strings for Tokenizer::piece(), made by its first call (a string per token
  // would be 8 MiB and most of the load time, for a method few programs call).
  mutable std::vector<std::string> piece_strings;
  mutable std::once_flag piece_strings_once;

  // normalizer: steps in order
  struct NormStep {
    enum Kind { Replace, Prepend } kind;
    std::string a, b;  // Replace: a -> b; Prepend: a
  };
  std::vector<NormStep> normalizer;

  // pre-tokenizer: Split steps in order
  enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
  struct SplitStep {
    std::string pattern;
    SplitBehavior behavior;
  };
  std::vector<SplitStep> pre_tokenizer;

  // model (BPE)
  detail::MergeTable merges;
  int32_t unk_id = -1;
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  std::vector<int32_t> byte_ids = std::vector<int32_t>(256, -1);  // [256] id of "<0xXX>" or -1

  // added tokens, matched before the model
  detail::TokenTrie raw_added;   // normalized: false, matched on the raw text
  detail::TokenTrie norm_added;  // normalized: true, matched on the normalized text (content normalized)

  // decoder
  std::vector<std::pair<std::string, std::string>> dec_replace;  // applied to every non-byte token
  bool dec_bytes = false;                                        // ByteFallback present
  bool dec_join_space = false;                                   // no decoder: tokens joined with " "
  std::string strip_content;                                     // Strip after Fuse: leading chars to drop
  int strip_start = 0;                                           //   at most this many

#ifdef GEMMA4_T4_SENTENCEPIECE
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp;
#endif

  size_t vocab_size() const { return piece_at.size(); }
  bool valid_id(int32_t id) const { return id >= 0 && size_t(id) < piece_at.size() && piece_at[size_t(id)] != 0; }
  std::string_view piece_text(int32_t id) const { return texts.at(piece_at[size_t(id)]); }  // a valid id

  void normalize(std::string* s) const {
    for (const NormStep& st : normalizer) {
      if (st.kind == NormStep::Replace) {
        detail::replace_all(s, st.a, st.b);
      } else if (!s->empty()) {
        s->insert(0, st.a);
      }
    }
  }

  // ---- encoding ----

  // tokenizers' Split with a literal pattern: (begin, end) ranges of the words of s, in order.
  static void split_words(const std::string& s, const SplitStep& st, std::vector<std::pair<size_t, size_t>>* in_out) {
    std::vector<std::pair<size_t, size_t>> out;
    for (const auto& w : *in_out) {
      // (range, is_match) covering the word
      std::vector<std::pair<std::pair<size_t, size_t>, bool>> parts;
      size_t pos = w.first;
      while (pos < w.second) {
        size_t hit = s.find(st.pattern, pos);
        if (hit == std::string::npos || hit + st.pattern.size() > w.second) break;
        if (hit > pos) parts.push_back({{pos, hit}, false});
        parts.push_back({{hit, hit + st.pattern.size()}, true});
        pos = hit + st.pattern.size();
      }
      if (pos < w.second) parts.push_back({{pos, w.second}, false});
      std::vector<std::pair<size_t, size_t>> acc;
      bool prev_match = false;
      switch (st.behavior) {
        case SplitBehavior::Removed:
          for (const auto& p : parts)
            if (!p.second) acc.push_back(p.first);
          break;
        case SplitBehavior::Isolated:
          for (const auto& p : parts) acc.push_back(p.first);
          break;
        case SplitBehavior::MergedWithPrevious:
          for (const auto& p : parts) {
            if (p.second && !prev_match && !acc.empty()) {
              acc.back().second = p.first.second;
            } else {
              acc.push_back(p.first);
            }
            prev_match = p.second;
          }
          break;
        case SplitBehavior::MergedWithNext:
          for (size_t i = parts.size(); i-- > 0;) {
            const auto& p = parts[i];
            if (p.second && !prev_match && !acc.empty()) {
              acc.back().first = p.first.first;
            } else {
              acc.push_back(p.first);
            }
            prev_match = p.second;
          }
          std::reverse(acc.begin(), acc.end());
          break;
        case SplitBehavior::Contiguous:
          for (size_t i = 0; i < parts.size(); ++i) {
            const auto& p = parts[i];
            if (i > 0 && p.second == prev_match) {
              acc.back().second = p.first.second;
            } else {
              acc.push_back(p.first);
            }
            prev_match = p.second;
          }
          break;
      }
      out.insert(out.end(), acc.begin(), acc.end());
    }
    *in_out = std::move(out);
  }

  // BPE of one word (normalized text), appended to *ids.
  void bpe(std::string_view w, std::vector<int32_t>* ids) const {
    if (w.empty()) return;
    if (ignore_merges) {
      const int32_t id = lookup.find(w, texts);
      if (id >= 0) {
        ids->push_back(id);
        return;
      }
    }
    struct Sym {
      int32_t id;
      int32_t prev, next;  // indices in syms, -1 at the ends
      bool alive;
    };
    std::vector<Sym> syms;
    syms.reserve(w.size());
    auto add = [&](int32_t id) {
      const int32_t i = int32_t(syms.size());
      syms.push_back(Sym{id, i - 1, -1, true});
      if (i > 0) syms[size_t(i) - 1].next = i;
    };
    const auto* p = reinterpret_cast<const unsigned char*>(w.data());
    bool pending_unk = false;
    for (size_t i = 0; i < w.size();) {
      size_t len = 1;
      detail::utf8_scan(p + i, w.size() - i, &len);  // input was validated: always a whole character
      const int32_t id = lookup.find(w.substr(i, len), texts);
      if (id >= 0) {
        if (pending_unk) add(unk_id), pending_unk = false;
        add(id);
      } else {
        bool bytes_ok = byte_fallback;
        for (size_t k = 0; bytes_ok && k < len; ++k) bytes_ok = byte_ids[p[i + k]] >= 0;
        if (bytes_ok) {
          if (pending_unk) add(unk_id), pending_unk = false;
          for (size_t k = 0; k < len; ++k) add(byte_ids[p[i + k]]);
        } else if (unk_id >= 0) {
          if (pending_unk && !fuse_unk) add(unk_id);
          pending_unk = true;
        }  // no unk token: the character is dropped, as tokenizers does
      }
      i += len;
    }
    if (pending_unk) add(unk_id);

    // Merge the lowest-ranked pair first, the leftmost on ties; entries made stale by earlier merges are
    // recognised when popped (the pair at pos no longer yields the same merged id).
    struct Cand {
      int32_t rank, pos, id;
      bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }  // min-heap
    };
    std::priority_queue<Cand> heap;
    auto consider = [&](int32_t pos) {
      if (pos < 0) return;
      const int32_t nx = syms[size_t(pos)].next;
      if (nx < 0) return;
      int32_t rank = 0, id = 0;
      if (merges.find(syms[size_t(pos)].id, syms[size_t(nx)].id, &rank, &id)) heap.push(Cand{rank, pos, id});
    };
    for (int32_t i = 0; i + 1 < int32_t(syms.size()); ++i) consider(i);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      Sym& left = syms[size_t(c.pos)];
      if (!left.alive || left.next < 0) continue;
      Sym& right = syms[size_t(left.next)];
      int32_t rank = 0, id = 0;
      if (!merges.find(left.id, right.id, &rank, &id) || id != c.id) continue;
      left.id = id;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) syms[size_t(right.next)].prev = c.pos;
      consider(left.prev);
      consider(c.pos);
    }
    for (const Sym& s : syms)
      if (s.alive) ids->push_back(s.id);
  }

  // Cuts text at the added tokens `trie` finds (leftmost-longest): on_text(begin, end) for each non-empty
  // stretch between them, in order, and each token's id appended to *ids where it stands.
  template <class OnText>
  static void cut_added(const detail::TokenTrie& trie, std::string_view text, std::vector<int32_t>* ids,
                        const OnText& on_text) {
    if (trie.empty()) {
      if (!text.empty()) on_text(size_t(0), text.size());
      return;
    }
    size_t start = 0;
    for (size_t i = 0; i < text.size();) {
      int32_t id = -1;
      const size_t len = trie.longest(text.data() + i, text.size() - i, &id);
      if (len == 0) {
        ++i;
        continue;
      }
      if (i > start) on_text(start, i);
      ids->push_back(id);
      i += len;
      start = i;
    }
    if (start < text.size()) on_text(start, text.size());
  }

  // A segment of raw text between added tokens: normalize, cut normalized added tokens, pre-tokenize, BPE.
  void encode_segment(std::string_view raw, std::vector<int32_t>* ids) const {
    std::string s(raw);
    normalize(&s);
    cut_added(norm_added, s, ids, [&](size_t b, size_t e) {
      std::vector<std::pair<size_t, size_t>> words{{b, e}};
      for (const SplitStep& st : pre_tokenizer) split_words(s, st, &words);
      for (const auto& w : words) bpe(std::string_view(s).substr(w.first, w.second - w.first), ids);
    });
  }

  void encode(std::string_view text, std::vector<int32_t>* ids) const {
    cut_added(raw_added, text, ids, [&](size_t b, size_t e) { encode_segment(text.substr(b, e - b), ids); });
  }
};

}  // namespace gemma4_t4
