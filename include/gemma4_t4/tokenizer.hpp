// gemma4_t4 implementation part: Tokenizer and Tokenizer::Streamer. Included by gemma4_t4.hpp inside
// GEMMA4_T4_IMPLEMENTATION; not a public header.
//
// tokenizer.json is run the way Hugging Face `tokenizers` runs Gemma's file:
//   1. added tokens (normalized: false) are cut out of the raw text first, leftmost-longest;
//   2. each remaining segment is normalized (Replace " " -> "▁", Prepend, Sequence), then added tokens with
//      normalized: true are cut out of the normalized text;
//   3. the pre-tokenizer (Split on a literal string, any behaviour, or none) cuts words;
//   4. each word is BPE-merged by merge rank (lowest first, leftmost on ties; a heap over a linked list of
//      symbols, O(n log n) per word); characters missing from the vocabulary become <0xXX> byte tokens
//      (byte_fallback) or <unk> (fused when fuse_unk);
//   5. decoding runs the decoder chain (Replace, ByteFallback, Fuse, Strip) token by token, so decode() and
//      the streamer are the same code.
// Anything else in the file (regex patterns, other normalizers / pre-tokenizers / decoders / models,
// lstrip/rstrip/single_word added tokens) is refused with Code::Unsupported naming it: a tokenizer that
// loads tokenizes exactly as the reference does.
//
// Invalid UTF-8 from byte tokens (decode, streamer): each maximal ill-formed subsequence (the WHATWG /
// Unicode "best practice" rule, as TextDecoder and Python's errors="replace" do it) becomes one U+FFFD.
// Hugging Face's Rust ByteFallback instead turns a whole run of byte tokens that is not valid UTF-8 into
// one U+FFFD per byte; the two agree on every valid sequence.
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
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

// Scans the UTF-8 sequence starting at s[0] (n >= 1 bytes available). Returns 1 and *len = its length when
// it is complete and valid; 0 when s[0..n) is a valid but incomplete prefix (*len = n); -1 when ill-formed,
// *len = the maximal ill-formed subpart (>= 1 byte) to replace with one U+FFFD.
inline int utf8_scan(const unsigned char* s, size_t n, size_t* len) {
  const unsigned c = s[0];
  size_t need = 0;
  unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c < 0x80) {
    *len = 1;
    return 1;
  } else if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;  // no overlong forms
    if (c == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    *len = 1;
    return -1;
  }
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

// Token text -> id, the text viewed in strings that outlive the table: open addressing, linear probing, at
// most half full. Replaces std::unordered_map<std::string_view, int32_t>, whose lookups (prime modulo, a node
// per entry, a string compare in another cache line) were the largest part of loading Gemma's 262,144-token
// vocabulary and its 514,906 merges. A slot keeps the text's size and first 8 bytes, so a probe of another
// text, and the whole compare of a text of <= 8 bytes, stays in the slot. The same interface subset as the
// map: find() -> pointer (end() = nullptr) with ->second, emplace() keeping the first id of a text, reserve().
class VocabIndex {
 public:
  struct Entry {
    const char* text = nullptr;  // not owned
    uint64_t head = 0;           // its first 8 bytes, zero-padded
    uint32_t size = 0;           // its length
    int32_t second = -1;         // the id; -1: an empty slot
  };
  void reserve(size_t n) {
    if (2 * n > slots_.size()) rehash(2 * n);
  }
  const Entry* end() const { return nullptr; }
  size_t size() const { return size_; }
  const Entry* find(std::string_view k) const { return find(k, probe(k)); }
  // A lookup in two steps, so that many can be in flight: probe() hashes k and prefetches its slot, find(k,
  // probe) then finds it there (loading the merges: three lookups each, mostly cache misses).
  struct Probe {
    uint64_t hash, head;
  };
  Probe probe(std::string_view k) const {
    Probe p{0, 0};
    p.hash = hash(k, &p.head);
    if (!slots_.empty()) __builtin_prefetch(&slots_[size_t(p.hash) & mask_]);
    return p;
  }
  const Entry* find(std::string_view k, Probe p) const {
    if (slots_.empty() || k.size() > UINT32_MAX) return nullptr;
    for (size_t i = size_t(p.hash) & mask_;; i = (i + 1) & mask_) {
      const Entry& e = slots_[i];
      if (e.second < 0) return nullptr;
      if (same(e, k, p.head)) return &e;
    }
  }
  // Adds k -> id unless k is there; returns the entry and whether it was added.
  std::pair<const Entry*, bool> emplace(std::string_view k, int32_t id) {
    if (2 * (size_ + 1) > slots_.size()) rehash(std::max<size_t>(16, 2 * slots_.size()));
    uint64_t head = 0;
    for (size_t i = size_t(hash(k, &head)) & mask_;; i = (i + 1) & mask_) {
      Entry& e = slots_[i];
      if (e.second < 0) {
        e = Entry{k.data(), head, uint32_t(k.size()), id};
        ++size_;
        return {&e, true};
      }
      if (same(e, k, head)) return {&e, false};
    }
  }

 private:
  static bool same(const Entry& e, std::string_view k, uint64_t head) {
    return e.size == k.size() && e.head == head &&
           (k.size() <= 8 || std::memcmp(e.text + 8, k.data() + 8, k.size() - 8) == 0);
  }
  // FNV-1a over 8-byte words, then a finalizer (token texts are short: a few words at most); *head = the
  // first word.
  static uint64_t hash(std::string_view k, uint64_t* head) {
    uint64_t h = 0xcbf29ce484222325ull ^ k.size();
    size_t i = 0;
    for (; i + 8 <= k.size(); i += 8) {
      uint64_t w;
      std::memcpy(&w, k.data() + i, 8);
      if (i == 0) *head = w;
      h = (h ^ w) * 0x100000001b3ull;
    }
    if (k.size() > i) {
      uint64_t w = 0;
      std::memcpy(&w, k.data() + i, k.size() - i);
      if (i == 0) *head = w;
      h = (h ^ w) * 0x100000001b3ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
  }
  void rehash(size_t want) {
    size_t cap = 16;
    while (cap < want) cap <<= 1;
    std::vector<Entry> old = std::move(slots_);
    slots_.assign(cap, Entry{});
    mask_ = cap - 1;
    size_ = 0;
    for (const Entry& e : old)
      if (e.second >= 0) emplace(std::string_view(e.text, e.size), e.second);
  }
  std::vector<Entry> slots_;
  size_t mask_ = 0, size_ = 0;
};

// (left id, right id) -> (rank, merged id): open addressing, linear probing, 16 bytes a slot.
class MergeTable {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots_.assign(cap, Slot{kEmpty, 0, 0});
    mask_ = cap - 1;
  }
  // A later duplicate replaces an earlier one (tokenizers collects the merges into a HashMap).
  void put(int32_t a, int32_t b, int32_t rank, int32_t id) {
    const uint64_t key = make_key(a, b);
    for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty || slots_[i].key == key) {
        slots_[i] = Slot{key, rank, id};
        return;
      }
    }
  }
  // Rank and merged id of (a, b); false when the pair does not merge.
  bool find(int32_t a, int32_t b, int32_t* rank, int32_t* id) const {
    if (slots_.empty()) return false;
    const uint64_t key = make_key(a, b);
    for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) {
        *rank = slots_[i].rank;
        *id = slots_[i].id;
        return true;
      }
      if (slots_[i].key == kEmpty) return false;
    }
  }

 private:
  struct Slot {
    uint64_t key;
    int32_t rank;
    int32_t id;
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  static uint64_t make_key(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }
  static uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
  }
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
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
  std::vector<std::string> pieces;                     // [vocab] token text ("" for an unused id)
  std::vector<uint8_t> present;                        // [vocab] 1 where an id has a token
  detail::VocabIndex lookup;                           // model vocab: text -> id (views into pieces)
  std::unordered_map<std::string, int32_t> added_ids;  // added tokens: text -> id
  std::deque<std::string> renamed;                     // model text of ids an added token renamed
  std::vector<uint8_t> special;                        // [vocab] 1 for added tokens marked special
  std::vector<int16_t> byte_value;                     // [vocab] 0..255 for "<0xXX>" tokens, else -1

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

  bool valid_id(int32_t id) const { return id >= 0 && size_t(id) < pieces.size() && present[size_t(id)]; }

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
      auto it = lookup.find(w);
      if (it != lookup.end()) {
        ids->push_back(it->second);
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
      auto it = lookup.find(w.substr(i, len));
      if (it != lookup.end()) {
        if (pending_unk) add(unk_id), pending_unk = false;
        add(it->second);
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

  // A segment of raw text between added tokens: normalize, cut normalized added tokens, pre-tokenize, BPE.
  void encode_segment(std::string_view raw, std::vector<int32_t>* ids) const {
    if (raw.empty()) return;
    std::string s(raw);
    normalize(&s);
    auto model = [&](size_t b, size_t e) {
      std::vector<std::pair<size_t, size_t>> words{{b, e}};
      for (const SplitStep& st : pre_tokenizer) split_words(s, st, &words);
      for (const auto& w : words) bpe(std::string_view(s).substr(w.first, w.second - w.first), ids);
    };
    if (norm_added.empty()) {
      model(0, s.size());
      return;
    }
    size_t start = 0;
    for (size_t i = 0; i < s.size();) {
      int32_t id = -1;
      const size_t len = norm_added.longest(s.data() + i, s.size() - i, &id);
      if (len == 0) {
        ++i;
        continue;
      }
      if (i > start) model(start, i);
      ids->push_back(id);
      i += len;
      start = i;
    }
    if (start < s.size()) model(start, s.size());
  }

  void encode(std::string_view text, std::vector<int32_t>* ids) const {
    size_t start = 0;
    for (size_t i = 0; i < text.size();) {
      int32_t id = -1;
      const size_t len = raw_added.longest(text.data() + i, text.size() - i, &id);
      if (len == 0) {
        ++i;
        continue;
      }
      encode_segment(text.substr(start, i - start), ids);
      ids->push_back(id);
      i += len;
      start = i;
    }
    encode_segment(text.substr(start), ids);
  }
};

// ---- loading tokenizer.json ----

namespace detail {

using tok_json = nlohmann::json;

inline Status tok_string_pattern(const tok_json& j, const std::string& where, std::string* out) {
  auto pat = j.find("pattern");
  if (pat == j.end() || !pat->is_object()) return err(Code::FormatError, where, ": 'pattern' is missing");
  if (pat->contains("String") && (*pat)["String"].is_string()) {
    *out = (*pat)["String"].get<std::string>();
    if (out->empty()) return err(Code::FormatError, where, ": empty pattern");
    return Status::ok();
  }
  return err(Code::Unsupported, where, ": pattern ", pat->dump(),
             " is not supported (only {\"String\": ...} literal patterns; regex patterns are not implemented)");
}

inline Status tok_normalizer(const tok_json& j, const std::string& where, Tokenizer::Impl* t) {
  if (j.is_null()) return Status::ok();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return err(Code::FormatError, where, ": not an object with a 'type'");
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array())
      return err(Code::FormatError, where, ": Sequence without a 'normalizers' list");
    for (size_t i = 0; i < j["normalizers"].size(); ++i)
      GEMMA4_T4_TRY(tok_normalizer(j["normalizers"][i], where + "[" + std::to_string(i) + "]", t));
    return Status::ok();
  }
  if (type == "Replace") {
    Tokenizer::Impl::NormStep st{Tokenizer::Impl::NormStep::Replace, "", ""};
    GEMMA4_T4_TRY(tok_string_pattern(j, where + " (Replace)", &st.a));
    if (!j.contains("content") || !j["content"].is_string())
      return err(Code::FormatError, where, ": Replace without a string 'content'");
    st.b = j["content"].get<std::string>();
    t->normalizer.push_back(st);
    return Status::ok();
  }
  if (type == "Prepend") {
    if (!j.contains("prepend") || !j["prepend"].is_string())
      return err(Code::FormatError, where, ": Prepend without a string 'prepend'");
    t->normalizer.push_back({Tokenizer::Impl::NormStep::Prepend, j["prepend"].get<std::string>(), ""});
    return Status::ok();
  }
  return err(Code::Unsupported, where, ": normalizer type '", type,
             "' is not supported (supported: Replace with a literal pattern, Prepend, Sequence)");
}

inline Status tok_pre_tokenizer(const tok_json& j, const std::string& where, Tokenizer::Impl* t) {
  if (j.is_null()) return Status::ok();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return err(Code::FormatError, where, ": not an object with a 'type'");
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      return err(Code::FormatError, where, ": Sequence without a 'pretokenizers' list");
    for (size_t i = 0; i < j["pretokenizers"].size(); ++i)
      GEMMA4_T4_TRY(tok_pre_tokenizer(j["pretokenizers"][i], where + "[" + std::to_string(i) + "]", t));
    return Status::ok();
  }
  if (type == "Split") {
    using B = Tokenizer::Impl::SplitBehavior;
    Tokenizer::Impl::SplitStep st{"", B::Isolated};
    GEMMA4_T4_TRY(tok_string_pattern(j, where + " (Split)", &st.pattern));
    if (j.contains("invert") && j["invert"].is_boolean() && j["invert"].get<bool>())
      return err(Code::Unsupported, where, ": Split with invert: true is not supported");
    const std::string b = j.contains("behavior") && j["behavior"].is_string() ? j["behavior"].get<std::string>() : "";
    if (b == "Removed") {
      st.behavior = B::Removed;
    } else if (b == "Isolated") {
      st.behavior = B::Isolated;
    } else if (b == "MergedWithPrevious") {
      st.behavior = B::MergedWithPrevious;
    } else if (b == "MergedWithNext") {
      st.behavior = B::MergedWithNext;
    } else if (b == "Contiguous") {
      st.behavior = B::Contiguous;
    } else {
      return err(Code::FormatError, where, ": Split behavior '", b, "' is not one of Removed, Isolated, ",
                 "MergedWithPrevious, MergedWithNext, Contiguous");
    }
    t->pre_tokenizer.push_back(st);
    return Status::ok();
  }
  return err(Code::Unsupported, where, ": pre_tokenizer type '", type,
             "' is not supported (supported: Split with a literal pattern, Sequence)");
}

// Decoder chain: Replace* (before ByteFallback), ByteFallback?, Fuse?, then Strip (start only) after Fuse.
inline Status tok_decoder_step(const tok_json& j, const std::string& where, bool* fused, Tokenizer::Impl* t) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return err(Code::FormatError, where, ": not an object with a 'type'");
  const std::string type = j["type"].get<std::string>();
  if (t->strip_start > 0) return err(Code::Unsupported, where, ": decoder '", type, "' after Strip is not supported");
  if (type == "Replace") {
    if (t->dec_bytes || *fused)
      return err(Code::Unsupported, where, ": a Replace decoder after ByteFallback or Fuse is not supported");
    std::string from;
    GEMMA4_T4_TRY(tok_string_pattern(j, where + " (Replace)", &from));
    if (!j.contains("content") || !j["content"].is_string())
      return err(Code::FormatError, where, ": Replace without a string 'content'");
    t->dec_replace.emplace_back(from, j["content"].get<std::string>());
    return Status::ok();
  }
  if (type == "ByteFallback") {
    if (*fused) return err(Code::Unsupported, where, ": ByteFallback after Fuse is not supported");
    t->dec_bytes = true;
    return Status::ok();
  }
  if (type == "Fuse") {
    *fused = true;
    return Status::ok();
  }
  if (type == "Strip") {
    const int start = j.contains("start") && j["start"].is_number_integer() ? j["start"].get<int>() : 0;
    const int stop = j.contains("stop") && j["stop"].is_number_integer() ? j["stop"].get<int>() : 0;
    if (!j.contains("content") || !j["content"].is_string())
      return err(Code::FormatError, where, ": Strip without a string 'content'");
    const std::string content = j["content"].get<std::string>();
    size_t clen = 0;
    if (content.empty() ||
        detail::utf8_scan(reinterpret_cast<const unsigned char*>(content.data()), content.size(), &clen) != 1 ||
        clen != content.size())
      return err(Code::FormatError, where, ": Strip 'content' must be one character");
    if (start < 0 || stop < 0) return err(Code::FormatError, where, ": Strip start/stop must be >= 0");
    if (!*fused || stop != 0)
      return err(Code::Unsupported, where, ": Strip is supported only after Fuse and with stop = 0 (got start ", start,
                 ", stop ", stop, ")");
    t->strip_content = content;
    t->strip_start = start;
    return Status::ok();
  }
  return err(Code::Unsupported, where, ": decoder type '", type,
             "' is not supported (supported: Replace, ByteFallback, Fuse, Strip, Sequence)");
}

inline Status tok_decoder(const tok_json& j, const std::string& where, Tokenizer::Impl* t) {
  if (j.is_null()) {
    t->dec_join_space = true;  // tokenizers without a decoder: tokens joined with " "
    return Status::ok();
  }
  bool fused = false;
  if (j.is_object() && j.contains("type") && j["type"] == "Sequence") {
    if (!j.contains("decoders") || !j["decoders"].is_array())
      return err(Code::FormatError, where, ": Sequence without a 'decoders' list");
    for (size_t i = 0; i < j["decoders"].size(); ++i)
      GEMMA4_T4_TRY(tok_decoder_step(j["decoders"][i], where + "[" + std::to_string(i) + "]", &fused, t));
    return Status::ok();
  }
  return tok_decoder_step(j, where, &fused, t);
}

inline Status tok_add_piece(Tokenizer::Impl* t, int64_t id, const std::string& text, const std::string& where) {
  // Gemma: 262144 ids. The table is dense (a string per id up to the largest), so the bound also caps what a
  // hostile file can make load() allocate: 2^21 ids, ~64 MiB of empty strings (fuzzing found 2^24 -> 512 MiB).
  if (id < 0 || id >= (int64_t(1) << 21))
    return err(Code::FormatError, where, ": token id ", id, " is outside [0, 2097152)");
  if (size_t(id) >= t->pieces.size()) {
    t->pieces.resize(size_t(id) + 1);
    t->present.resize(size_t(id) + 1, 0);
  }
  t->pieces[size_t(id)] = text;
  t->present[size_t(id)] = 1;
  return Status::ok();
}

inline int byte_token_value(const std::string& s) {  // "<0xAB>" -> 0xAB, else -1 (ByteFallback's rule)
  if (s.size() != 6 || s.compare(0, 3, "<0x") != 0 || s[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(s[3]), lo = hex(s[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// Tables every backend needs once pieces/present are final.
inline void tok_finish(Tokenizer::Impl* t) {
  t->special.resize(t->pieces.size(), 0);
  t->byte_value.assign(t->pieces.size(), -1);
  for (size_t i = 0; i < t->pieces.size(); ++i)
    if (t->present[i]) t->byte_value[i] = int16_t(byte_token_value(t->pieces[i]));
}

// tokenizer.json through nlohmann/json's SAX interface: model.vocab (an object of text -> id) and model.merges
// (a list of "a b" strings or ["a", "b"] pairs) -- nearly all of Gemma's 33 MB -- are read straight into flat
// lists, everything else into a JSON tree (`rest`, without those two). Building the tree of the whole file
// took most of the load time (~1.8 s for Gemma's, issue 14). Values of other kinds under those two keys go
// to the tree as they are, so the checks below name them as before.
class TokJsonReader {
 public:
  tok_json rest;                                       // the file without model.vocab / model.merges when flat
  std::vector<std::pair<std::string, int64_t>> vocab;  // model.vocab in file order
  bool vocab_flat = false, merges_flat = false;        // read into vocab / merges_text
  std::string merges_text;                             // a then b of every merge, back to back
  struct Merge {
    uint32_t a, a_len, b, b_len;  // offsets and lengths in merges_text (at most 4 GiB of merge text)
  };
  std::vector<Merge> merges;  // in file order (= rank)
  Status status;              // a value of the wrong kind inside the flat parts

  bool null() { return value(tok_json(nullptr)); }
  bool boolean(bool v) { return value(tok_json(v)); }
  bool number_integer(tok_json::number_integer_t v) {
    if (in_ == In::Vocab) return vocab_id(static_cast<int64_t>(v));
    return value(tok_json(v));
  }
  bool number_unsigned(tok_json::number_unsigned_t v) {
    if (in_ == In::Vocab) return v > uint64_t(INT64_MAX) ? bad_vocab() : vocab_id(static_cast<int64_t>(v));
    return value(tok_json(v));
  }
  bool number_float(tok_json::number_float_t v, const tok_json::string_t&) {
    if (in_ == In::Vocab) return bad_vocab();
    return value(tok_json(v));
  }
  bool string(tok_json::string_t& v) {
    if (in_ == In::Merges) {  // "a b"
      const size_t sp = v.find(' ');
      if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos)
        return fail(err(Code::FormatError, where_, ": model.merges[", merges.size(), "] = '", v,
                        "' is not two tokens split by a space"));
      return add_merge(std::string_view(v).substr(0, sp), std::string_view(v).substr(sp + 1));
    }
    if (in_ == In::MergePair) {
      if (pair_n_ >= 2) return bad_merge();
      pair_[pair_n_++] = std::move(v);
      return true;
    }
    if (in_ == In::Vocab) return bad_vocab();
    return value(tok_json(std::move(v)));
  }
  bool binary(tok_json::binary_t&) { return value(tok_json()); }
  bool start_object(std::size_t) {
    if (in_ == In::Vocab) return bad_vocab();
    if (in_ == In::Merges || in_ == In::MergePair) return bad_merge();
    if (next_ == Next::Vocab) {
      in_ = In::Vocab;
      vocab_flat = true;
      vocab.clear();  // a second model.vocab replaces the first, as in a JSON tree
      return true;
    }
    next_ = Next::Other;
    return open(tok_json::object());
  }
  bool end_object() {
    if (in_ == In::Vocab) {
      in_ = In::None;
      return true;
    }
    return close();
  }
  bool start_array(std::size_t) {
    if (in_ == In::Vocab) return bad_vocab();
    if (in_ == In::MergePair) return bad_merge();
    if (in_ == In::Merges) {
      in_ = In::MergePair;
      pair_n_ = 0;
      return true;
    }
    if (next_ == Next::Merges) {
      in_ = In::Merges;
      merges_flat = true;
      merges.clear();
      merges_text.clear();
      return true;
    }
    next_ = Next::Other;
    return open(tok_json::array());
  }
  bool end_array() {
    if (in_ == In::MergePair) {
      if (pair_n_ != 2) return bad_merge();
      in_ = In::Merges;
      return add_merge(pair_[0], pair_[1]);
    }
    if (in_ == In::Merges) {
      in_ = In::None;
      return true;
    }
    return close();
  }
  bool key(tok_json::string_t& k) {
    if (in_ == In::Vocab) {
      vocab_key_ = std::move(k);
      return true;
    }
    // model.vocab / model.merges: the keys of the object at depth 2 under the root's "model"
    next_ = Next::Other;
    if (stack_.size() == 2 && in_model_)
      next_ = k == "vocab" ? Next::Vocab : k == "merges" ? Next::Merges : Next::Other;
    if (stack_.size() == 1) model_key_ = k == "model";
    slot_ = &(*stack_.back())[k];
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }

  void set_where(const std::string& where) { where_ = where; }
  void reserve(uint64_t file_bytes) {
    const size_t n = size_t(std::min<uint64_t>(file_bytes, uint64_t(1) << 32));
    vocab.reserve(n / 100);
    merges.reserve(n / 24);
    merges_text.reserve(n / 4);
  }

 private:
  enum class In { None, Vocab, Merges, MergePair };
  enum class Next { Other, Vocab, Merges };  // what the value after the current key is

  bool fail(Status st) {
    status = std::move(st);
    return false;
  }
  bool bad_vocab() {
    return fail(err(Code::FormatError, where_, ": model.vocab['", vocab_key_, "'] is not an integer id"));
  }
  bool bad_merge() {
    return fail(
        err(Code::FormatError, where_, ": model.merges[", merges.size(), "] is neither \"a b\" nor [\"a\", \"b\"]"));
  }
  bool vocab_id(int64_t id) {
    vocab.emplace_back(std::move(vocab_key_), id);
    return true;
  }
  bool add_merge(std::string_view a, std::string_view b) {
    if (merges_text.size() + a.size() + b.size() > UINT32_MAX)
      return fail(err(Code::FormatError, where_, ": model.merges hold more than 4 GiB of text"));
    const uint32_t at = uint32_t(merges_text.size());
    merges_text.append(a);
    merges_text.append(b);
    merges.push_back(Merge{at, uint32_t(a.size()), at + uint32_t(a.size()), uint32_t(b.size())});
    return true;
  }
  // A scalar into the tree: the root, an array element, or the value of the last key.
  bool value(tok_json v) {
    if (in_ == In::Vocab) return bad_vocab();
    if (in_ != In::None) return bad_merge();
    next_ = Next::Other;
    if (stack_.empty()) {
      rest = std::move(v);
    } else if (stack_.back()->is_array()) {
      stack_.back()->push_back(std::move(v));
    } else {
      *slot_ = std::move(v);
    }
    return true;
  }
  bool open(tok_json v) {
    tok_json* at;
    if (stack_.empty()) {
      rest = std::move(v);
      at = &rest;
    } else if (stack_.back()->is_array()) {
      stack_.back()->push_back(std::move(v));
      at = &stack_.back()->back();
    } else {
      *slot_ = std::move(v);
      at = slot_;
    }
    // Entering the root's "model" object: its keys are watched for vocab / merges.
    if (stack_.size() == 1 && model_key_ && at->is_object()) in_model_ = true;
    if (stack_.size() == 1 && !(model_key_ && at->is_object())) in_model_ = false;
    stack_.push_back(at);
    return true;
  }
  bool close() {
    if (stack_.size() == 2) in_model_ = false;
    stack_.pop_back();
    return true;
  }

  std::string where_;
  std::vector<tok_json*> stack_;  // open containers of `rest`
  tok_json* slot_ = nullptr;      // where the value of the last key goes
  In in_ = In::None;
  Next next_ = Next::Other;
  bool model_key_ = false, in_model_ = false;
  std::string vocab_key_;
  std::string pair_[2];
  int pair_n_ = 0;
};

// A file as an input iterator of chars for nlohmann/json's SAX parser, read in 256 KiB blocks: the parser
// never needs the whole file in memory (Gemma's is 33 MB, and a fresh 33 MB buffer costs its page faults and
// a copy). A read error ends the input; failed() says so.
class FileChars {
 public:
  explicit FileChars(std::FILE* f) : f_(f) { fill(); }
  bool failed() const { return failed_; }

  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = char;
    using difference_type = std::ptrdiff_t;
    using pointer = const char*;
    using reference = const char&;
    iterator() = default;
    explicit iterator(FileChars* src) : src_(src) {}
    const char& operator*() const { return src_->buf_[src_->pos_]; }
    iterator& operator++() {
      if (++src_->pos_ == src_->len_) src_->fill();
      return *this;
    }
    bool operator==(const iterator& o) const { return done() == o.done(); }
    bool operator!=(const iterator& o) const { return done() != o.done(); }

   private:
    bool done() const { return !src_ || src_->pos_ >= src_->len_; }
    FileChars* src_ = nullptr;
  };
  iterator begin() { return iterator(this); }
  iterator end() { return iterator(); }

 private:
  void fill() {
    pos_ = 0;
    len_ = std::fread(buf_.data(), 1, buf_.size(), f_);
    if (len_ == 0 && std::ferror(f_)) failed_ = true;
  }
  std::FILE* f_;
  std::vector<char> buf_ = std::vector<char>(size_t(1) << 18);
  size_t pos_ = 0, len_ = 0;
  bool failed_ = false;
};

inline Status tok_load_json(const std::string& path, Tokenizer::Impl* t) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return err(Code::IoError, "cannot open ", path, ": ", std::strerror(errno));
  TokJsonReader reader;
  reader.set_where(path);
  // Room for what a file of this size usually holds (Gemma's 33 MB: 262,144 tokens, 514,906 merges), so the
  // lists rarely regrow; reserved, not touched, memory costs nothing until used.
  struct stat st;
  if (fstat(fileno(f.get()), &st) == 0 && st.st_size > 0) reader.reserve(uint64_t(st.st_size));
  FileChars chars(f.get());
  const bool parsed = tok_json::sax_parse(chars.begin(), chars.end(), &reader);
  if (chars.failed()) return err(Code::IoError, "cannot read ", path, ": ", std::strerror(errno));
  if (!reader.status.is_ok()) return reader.status;
  if (!parsed) return err(Code::FormatError, path, ": not valid JSON");
  const tok_json& j = reader.rest;
  if (!j.is_object()) return err(Code::FormatError, path, ": not a JSON object");
  const std::string& w = path;

  auto model = j.find("model");
  if (model == j.end() || !model->is_object()) return err(Code::FormatError, w, ": no 'model' object");
  const tok_json& m = *model;
  const std::string mtype = m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "BPE";
  if (mtype != "BPE") return err(Code::Unsupported, w, ": model type '", mtype, "' is not supported (only BPE)");
  if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0)
    return err(Code::Unsupported, w, ": BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(key) && m[key].is_string() && !m[key].get<std::string>().empty())
      return err(Code::Unsupported, w, ": BPE '", key, "' is not supported");
  auto flag = [&](const char* key, bool* out) -> Status {
    if (!m.contains(key) || m[key].is_null()) return Status::ok();
    if (!m[key].is_boolean()) return err(Code::FormatError, w, ": model.", key, " must be true or false");
    *out = m[key].get<bool>();
    return Status::ok();
  };
  GEMMA4_T4_TRY(flag("byte_fallback", &t->byte_fallback));
  GEMMA4_T4_TRY(flag("fuse_unk", &t->fuse_unk));
  GEMMA4_T4_TRY(flag("ignore_merges", &t->ignore_merges));

  // vocabulary (read by the SAX reader as a flat list when it is an object)
  if (!reader.vocab_flat) return err(Code::FormatError, w, ": model.vocab is not an object");
  std::vector<std::pair<std::string, int64_t>> entries = std::move(reader.vocab);
  {
    // Ascending ids: the dense tables grow once; of two texts for one id the last in the file wins.
    int64_t max_id = -1;
    for (const auto& e : entries) max_id = std::max(max_id, e.second);
    if (max_id >= 0 && max_id < (int64_t(1) << 21)) {
      t->pieces.reserve(size_t(max_id) + 1);
      t->present.reserve(size_t(max_id) + 1);
    }
  }
  for (auto& e : entries) GEMMA4_T4_TRY(tok_add_piece(t, e.second, e.first, w + ": model.vocab"));
  // `entries` stays until `lookup` is built: it is the model's own vocabulary (added tokens may rename ids).

  // added tokens (they own their ids' text)
  struct Added {
    std::string content;
    int32_t id;
    bool normalized, special;
  };
  std::vector<Added> added;
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    const tok_json& a = j["added_tokens"];
    if (!a.is_array()) return err(Code::FormatError, w, ": 'added_tokens' is not a list");
    for (size_t i = 0; i < a.size(); ++i) {
      const std::string where = w + ": added_tokens[" + std::to_string(i) + "]";
      const tok_json& e = a[i];
      if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer() || !e.contains("content") ||
          !e["content"].is_string())
        return err(Code::FormatError, where, ": needs an integer 'id' and a string 'content'");
      Added ad{e["content"].get<std::string>(), 0, false, false};
      if (ad.content.empty()) return err(Code::FormatError, where, ": empty 'content'");
      if (utf8_invalid_at(ad.content) != std::string_view::npos)
        return err(Code::FormatError, where, ": 'content' is not valid UTF-8");
      for (const char* key : {"lstrip", "rstrip", "single_word"})
        if (e.contains(key) && e[key].is_boolean() && e[key].get<bool>())
          return err(Code::Unsupported, where, " ('", ad.content, "'): ", key, ": true is not supported");
      ad.normalized = e.contains("normalized") && e["normalized"].is_boolean() ? e["normalized"].get<bool>() : false;
      ad.special = e.contains("special") && e["special"].is_boolean() ? e["special"].get<bool>() : false;
      GEMMA4_T4_TRY(tok_add_piece(t, e["id"].get<int64_t>(), ad.content, where));
      ad.id = e["id"].get<int32_t>();
      added.push_back(std::move(ad));
    }
  }

  GEMMA4_T4_TRY(tok_normalizer(j.contains("normalizer") ? j["normalizer"] : tok_json(), w + ": normalizer", t));
  GEMMA4_T4_TRY(
      tok_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : tok_json(), w + ": pre_tokenizer", t));
  GEMMA4_T4_TRY(tok_decoder(j.contains("decoder") ? j["decoder"] : tok_json(), w + ": decoder", t));

  // lookup = the model's own vocabulary (the BPE model sees only it); views into pieces, which are final
  // once the model vocabulary and added tokens are in -- except where an added token gave an id other text.
  t->lookup.reserve(entries.size());
  for (const auto& e : entries) {
    const std::string& s = t->pieces[size_t(e.second)];
    if (s == e.first) {
      t->lookup.emplace(std::string_view(s), int32_t(e.second));
    } else {  // id renamed by an added token: the model still knows it by its own text
      t->renamed.push_back(e.first);
      t->lookup.emplace(std::string_view(t->renamed.back()), int32_t(e.second));
    }
  }
  entries = {};

  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto it = t->lookup.find(name);
    t->byte_ids[b] = it == t->lookup.end() ? -1 : it->second;
  }
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    auto it = t->lookup.find(m["unk_token"].get<std::string>());
    if (it == t->lookup.end())
      return err(Code::FormatError, w, ": model.unk_token '", m["unk_token"].get<std::string>(),
                 "' is not in the vocabulary");
    t->unk_id = it->second;
  }

  // merges: "a b" strings or [a, b] pairs (read by the SAX reader as a flat list); rank = position
  auto merges = m.find("merges");
  if (reader.merges_flat) {
    t->merges.reserve(reader.merges.size());
    // In batches: the lookups of a batch are all in flight before the first is used (each is a cache miss).
    constexpr size_t kBatch = 16;
    std::string_view a[kBatch], b[kBatch];
    std::string ab[kBatch];
    VocabIndex::Probe pa[kBatch], pb[kBatch], pab[kBatch];
    const size_t n = reader.merges.size();
    for (size_t i0 = 0; i0 < n; i0 += kBatch) {
      const size_t batch = std::min(kBatch, n - i0);
      for (size_t k = 0; k < batch; ++k) {
        const TokJsonReader::Merge& mg = reader.merges[i0 + k];
        a[k] = std::string_view(reader.merges_text.data() + mg.a, mg.a_len);
        b[k] = std::string_view(reader.merges_text.data() + mg.b, mg.b_len);
        ab[k].assign(a[k]);
        ab[k].append(b[k]);
        pa[k] = t->lookup.probe(a[k]);
        pb[k] = t->lookup.probe(b[k]);
        pab[k] = t->lookup.probe(ab[k]);
      }
      for (size_t k = 0; k < batch; ++k) {
        const size_t i = i0 + k;
        auto ia = t->lookup.find(a[k], pa[k]), ib = t->lookup.find(b[k], pb[k]), iab = t->lookup.find(ab[k], pab[k]);
        if (ia == t->lookup.end() || ib == t->lookup.end() || iab == t->lookup.end())
          return err(Code::FormatError, w, ": model.merges[", i, "] ('", a[k], "', '", b[k],
                     "') uses a token missing from the vocabulary");
        t->merges.put(ia->second, ib->second, int32_t(i), iab->second);
      }
    }
  } else if (merges != m.end() && !merges->is_null()) {
    return err(Code::FormatError, w, ": model.merges is not a list");
  }

  tok_finish(t);
  for (const Added& ad : added) {
    t->added_ids[ad.content] = ad.id;
    if (ad.special) t->special[size_t(ad.id)] = 1;
    if (ad.normalized) {
      std::string norm = ad.content;
      t->normalize(&norm);
      t->norm_added.add(norm, ad.id);
    } else {
      t->raw_added.add(ad.content, ad.id);
    }
  }
  return Status::ok();
}

inline Status tok_load_sentencepiece(const std::string& path, Tokenizer::Impl* t) {
#ifdef GEMMA4_T4_SENTENCEPIECE
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto st = sp->Load(path);
  if (!st.ok()) return err(Code::FormatError, path, ": SentencePiece cannot load it: ", st.ToString());
  const int n = sp->GetPieceSize();
  for (int i = 0; i < n; ++i) GEMMA4_T4_TRY(tok_add_piece(t, i, sp->IdToPiece(i), path));
  for (int i = 0; i < n; ++i) t->lookup.emplace(std::string_view(t->pieces[size_t(i)]), i);
  tok_finish(t);
  for (int i = 0; i < n; ++i) {
    if (sp->IsControl(i) || sp->IsUnknown(i)) t->special[size_t(i)] = 1;
    if (!sp->IsByte(i)) t->byte_value[size_t(i)] = -1;
  }
  // Decoding as SentencePiece writes pieces: "▁" -> " ", byte pieces -> bytes. Control pieces (<bos>, ...)
  // are written as their text, as tokenizer.json decoding does (SentencePiece itself drops them).
  t->dec_replace.emplace_back("\xe2\x96\x81", " ");
  t->dec_bytes = true;
  // add_dummy_prefix models (encode "a" -> "▁a") drop the leading space when decoding, as SentencePiece does.
  std::vector<std::string> probe;
  if (sp->Encode("a", &probe).ok() && !probe.empty() && probe[0].compare(0, 3, "\xe2\x96\x81") == 0) {
    t->strip_content = " ";
    t->strip_start = 1;
  }
  t->sp = std::move(sp);
  return Status::ok();
#else
  (void)t;
  return err(Code::Unsupported, path,
             ": a SentencePiece .model needs the implementation compiled with GEMMA4_T4_SENTENCEPIECE (and "
             "linked with -lsentencepiece); or load the checkpoint's tokenizer.json instead");
#endif
}

}  // namespace detail

// ---- Tokenizer ----

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Status Tokenizer::load(const std::string& path, Tokenizer* out) {
  namespace fs = std::filesystem;
  if (!out) return detail::err(Code::InvalidArgument, "Tokenizer::load: out is null");
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (fs::is_regular_file(dir / "tokenizer.json", ec)) {
      file = (dir / "tokenizer.json").string();
    } else if (fs::is_regular_file(dir / "tokenizer.model", ec)) {
      file = (dir / "tokenizer.model").string();
    } else {
      return detail::err(Code::NotFound, "no tokenizer.json or tokenizer.model in ", path);
    }
  } else if (!fs::exists(path, ec)) {
    return detail::err(Code::NotFound, "tokenizer file ", path, " does not exist");
  }
  // .json or a file starting with '{' -> tokenizer.json; anything else -> SentencePiece model (protobuf).
  bool is_json = fs::path(file).extension() == ".json";
  if (!is_json && fs::path(file).extension() != ".model") {
    std::ifstream probe(file, std::ios::binary);
    char c = 0;
    while (probe.get(c) && (c == ' ' || c == '\n' || c == '\r' || c == '\t')) {
    }
    is_json = c == '{';
  }
  try {
    auto impl = std::make_unique<Impl>();
    impl->source = file;
    Status st = is_json ? detail::tok_load_json(file, impl.get()) : detail::tok_load_sentencepiece(file, impl.get());
    if (!st) return st;
    out->impl_ = std::move(impl);
    return Status::ok();
  } catch (const std::bad_alloc&) {
    return detail::err(Code::OutOfMemory, "out of memory loading tokenizer ", file);
  } catch (const std::exception& e) {
    return detail::err(Code::FormatError, file, ": malformed tokenizer (", e.what(), ")");
  }
}

bool Tokenizer::loaded() const { return impl_ != nullptr; }

size_t Tokenizer::vocab_size() const { return impl_ ? impl_->pieces.size() : 0; }

int32_t Tokenizer::token_id(std::string_view piece) const {
  if (!impl_) return -1;
  auto it = impl_->added_ids.find(std::string(piece));
  if (it != impl_->added_ids.end()) return it->second;
  auto jt = impl_->lookup.find(piece);
  return jt == impl_->lookup.end() ? -1 : jt->second;
}

const std::string& Tokenizer::piece(int32_t id) const {
  static const std::string empty;
  return impl_ && impl_->valid_id(id) ? impl_->pieces[size_t(id)] : empty;
}

bool Tokenizer::is_special(int32_t id) const { return impl_ && impl_->valid_id(id) && impl_->special[size_t(id)]; }

Status Tokenizer::encode(std::string_view text, std::vector<int32_t>* ids) const {
  if (!impl_) return detail::err(Code::InvalidArgument, "Tokenizer::encode: no tokenizer loaded");
  if (!ids) return detail::err(Code::InvalidArgument, "Tokenizer::encode: ids is null");
  const size_t bad = detail::utf8_invalid_at(text);
  if (bad != std::string_view::npos) {
    static const char* hex = "0123456789ABCDEF";
    const unsigned char b = static_cast<unsigned char>(text[bad]);
    return detail::err(Code::InvalidArgument, "Tokenizer::encode: text is not valid UTF-8 at byte offset ", bad,
                       " (byte 0x", hex[b >> 4], hex[b & 15], ")");
  }
  try {
    std::vector<int32_t> out;
#ifdef GEMMA4_T4_SENTENCEPIECE
    if (impl_->sp) {
      std::vector<int> v;
      const auto st = impl_->sp->Encode(std::string(text), &v);
      if (!st.ok()) return detail::err(Code::InvalidArgument, "SentencePiece encode failed: ", st.ToString());
      out.assign(v.begin(), v.end());
      *ids = std::move(out);
      return Status::ok();
    }
#endif
    out.reserve(text.size() / 3 + 4);
    impl_->encode(text, &out);
    *ids = std::move(out);
    return Status::ok();
  } catch (const std::bad_alloc&) {
    return detail::err(Code::OutOfMemory, "Tokenizer::encode: out of memory (", text.size(), " bytes of text)");
  }
}

Status Tokenizer::decode(const int32_t* ids, size_t n, std::string* text) const {
  if (!impl_) return detail::err(Code::InvalidArgument, "Tokenizer::decode: no tokenizer loaded");
  if (!text || (!ids && n)) return detail::err(Code::InvalidArgument, "Tokenizer::decode: null pointer");
  Streamer s(*this);
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    Status st = s.put(ids[i], &out);
    if (!st) return detail::err(Code::InvalidArgument, "Tokenizer::decode: ids[", i, "]: ", st.message);
  }
  s.flush(&out);
  *text = std::move(out);
  return Status::ok();
}

// ---- Tokenizer::Streamer ----

Tokenizer::Streamer::Streamer(const Tokenizer& tokenizer) : impl_(tokenizer.impl_.get()) {}

void Tokenizer::Streamer::reset() {
  pending_.clear();
  count_ = 0;
  stripped_ = 0;
  strip_done_ = false;
}

void Tokenizer::Streamer::emit(std::string_view s, std::string* out) {
  if (!strip_done_ && impl_->strip_start > 0) {
    const std::string& c = impl_->strip_content;
    while (stripped_ < impl_->strip_start && s.size() >= c.size() && s.compare(0, c.size(), c) == 0) {
      s.remove_prefix(c.size());
      ++stripped_;
    }
    if (!s.empty() || stripped_ >= impl_->strip_start) strip_done_ = true;
  }
  out->append(s.data(), s.size());
}

void Tokenizer::Streamer::drain(bool final, std::string* out) {
  static const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
  size_t i = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(pending_.data());
  while (i < pending_.size()) {
    size_t len = 0;
    const int r = detail::utf8_scan(p + i, pending_.size() - i, &len);
    if (r == 1) {
      emit(std::string_view(pending_).substr(i, len), out);
    } else if (r < 0 || final) {
      emit(kReplacement, out);
    } else {
      break;  // an incomplete character: wait for its next byte token
    }
    i += len;
  }
  pending_.erase(0, i);
}

Status Tokenizer::Streamer::put(int32_t id, std::string* out_text) {
  if (!impl_) return detail::err(Code::InvalidArgument, "Tokenizer::Streamer: no tokenizer loaded");
  if (!impl_->valid_id(id))
    return detail::err(Code::InvalidArgument, "token id ", id, " is not in the vocabulary (size ", impl_->pieces.size(),
                       ")");
  if (!out_text) return detail::err(Code::InvalidArgument, "Tokenizer::Streamer::put: out_text is null");
  const size_t i = size_t(id);
  if (impl_->dec_bytes && impl_->byte_value[i] >= 0) {
    pending_.push_back(static_cast<char>(impl_->byte_value[i]));
    drain(false, out_text);
  } else {
    drain(true, out_text);
    if (impl_->dec_join_space && count_ > 0) emit(" ", out_text);
    if (impl_->dec_replace.empty()) {
      emit(impl_->pieces[i], out_text);
    } else {
      std::string s = impl_->pieces[i];
      for (const auto& r : impl_->dec_replace) detail::replace_all(&s, r.first, r.second);
      emit(s, out_text);
    }
  }
  ++count_;
  return Status::ok();
}

void Tokenizer::Streamer::flush(std::string* out_text) {
  if (out_text && impl_) drain(true, out_text);
}

}  // namespace gemma4_t4
