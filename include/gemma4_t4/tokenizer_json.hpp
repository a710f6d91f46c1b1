// gemma4_t4 implementation part: reading Hugging Face's tokenizer.json in one pass -- the file through one
// reused buffer (TokInput), its top-level keys scanned in any order (TokJsonReader): the vocabulary and the
// merges go straight into Tokenizer::Impl's tables as they are read, added_tokens one entry at a time, every
// other part through nlohmann/json for tokenizer_load.hpp to check. Included by tokenizer_load.hpp inside
// GEMMA4_T4_IMPLEMENTATION; not a public header.
#pragma once

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer_impl.hpp"

namespace gemma4_t4 {

namespace detail {

using tok_json = nlohmann::json;

// One entry of added_tokens (path and i: for messages), checked; its id is not yet given its text.
struct TokAdded {
  std::string content;
  int32_t id;
  bool normalized, special;
};
inline Status tok_added_token(const tok_json& e, const std::string& path, size_t i, TokAdded* out) {
  auto where = [&] { return path + ": added_tokens[" + std::to_string(i) + "]"; };
  auto id = e.is_object() ? e.find("id") : e.end();
  auto content = e.is_object() ? e.find("content") : e.end();
  if (id == e.end() || !id->is_number_integer() || content == e.end() || !content->is_string())
    return err(Code::FormatError, where(), ": needs an integer 'id' and a string 'content'");
  *out = TokAdded{content->get<std::string>(), 0, false, false};
  if (out->content.empty()) return err(Code::FormatError, where(), ": empty 'content'");
  if (utf8_invalid_at(out->content) != std::string_view::npos)
    return err(Code::FormatError, where(), ": 'content' is not valid UTF-8");
  for (const char* key : {"lstrip", "rstrip", "single_word"}) {
    auto v = e.find(key);
    if (v != e.end() && v->is_boolean() && v->get<bool>())
      return err(Code::Unsupported, where(), " ('", out->content, "'): ", key, ": true is not supported");
  }
  auto normalized = e.find("normalized"), special = e.find("special");
  out->normalized = normalized != e.end() && normalized->is_boolean() && normalized->get<bool>();
  out->special = special != e.end() && special->is_boolean() && special->get<bool>();
  const int64_t id64 = id->get<int64_t>();
  if (id64 < 0 || id64 >= kMaxTokenIds)
    return err(Code::FormatError, where(), ": token id ", id64, " is outside [0, ", kMaxTokenIds, ")");
  out->id = int32_t(id64);
  return Status::ok();
}

// ---- reading tokenizer.json ----

// The file front to back through one 256 KiB buffer: reading Gemma's 33 MB whole into a fresh buffer costs
// more in page faults than all the parsing (measured on a 2-core VM: 0.14 s against 0.004 s in blocks, 0.016
// s mapped). A JSON scanner over it: byte by byte (peek / get) and, in its loops, over the buffered bytes.
class TokInput {
 public:
  explicit TokInput(std::FILE* f) : f_(f) {}
  bool failed() const { return failed_; }
  int peek() { return p_ < end_ || fill() ? static_cast<unsigned char>(*p_) : -1; }
  int get() { return p_ < end_ || fill() ? static_cast<unsigned char>(*p_++) : -1; }
  bool eat(char c) {
    if (peek() != static_cast<unsigned char>(c)) return false;
    ++p_;
    return true;
  }
  void skip_ws() {
    for (;;) {
      while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
      if (p_ < end_ || !fill()) return;
    }
  }
  static bool value_start(int c) {
    return c == '"' || c == '{' || c == '[' || c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n';
  }

  // A JSON string after its opening quote, unescaped, appended to *out. false: not valid JSON -- what
  // nlohmann/json refuses: a control character, a bad escape or surrogate, ill-formed UTF-8, no closing quote.
  bool string(std::string* out) {
    for (;;) {
      const char* q = p_;
      while (q < end_ && plain(*q)) ++q;
      out->append(p_, size_t(q - p_));
      p_ = q;
      if (p_ == end_) {
        if (fill()) continue;
        return false;  // the end of the file
      }
      const int c = static_cast<unsigned char>(*p_++);
      if (c == '"') return true;
      if (c == '\\') {
        if (!escape(out)) return false;
      } else if (c >= 0x80) {
        if (!utf8_char(c, out)) return false;
      } else {
        return false;  // a control character
      }
    }
  }

  // A JSON number. Integer (*v) when nlohmann/json reads it as an integer that fits int64; Other when it is
  // a valid number that does not (a fraction, an exponent, out of range); Invalid when it is no number.
  enum class Number { Integer, Other, Invalid };
  Number number(int64_t* v) {
    const bool neg = eat('-');
    int c = peek();
    if (c < '0' || c > '9') return Number::Invalid;
    uint64_t mag = 0;
    bool integer = true;
    if (c == '0') {
      ++p_;
    } else {
      while ((c = peek()) >= '0' && c <= '9') {
        ++p_;
        const unsigned d = unsigned(c - '0');
        if (mag > (UINT64_MAX - d) / 10) integer = false;  // beyond uint64: a float to nlohmann/json
        mag = mag * 10 + d;
      }
    }
    if (eat('.')) {
      if (!digits()) return Number::Invalid;
      integer = false;
    }
    c = peek();
    if (c == 'e' || c == 'E') {
      ++p_;
      if (!eat('+')) eat('-');
      if (!digits()) return Number::Invalid;
      integer = false;
    }
    if (!integer || mag > uint64_t(INT64_MAX) + (neg ? 1 : 0)) return Number::Other;
    *v = neg ? (mag == 0 ? 0 : -int64_t(mag - 1) - 1) : int64_t(mag);
    return Number::Integer;
  }

  // One JSON value, its text appended to *raw unchecked: nlohmann/json parses it. false: not valid JSON.
  bool skip_value(std::string* raw) {
    int c = peek();
    if (!value_start(c)) return false;
    if (c != '"' && c != '{' && c != '[') {  // a number or a literal: up to the next delimiter
      for (;;) {
        const char* q = p_;
        while (q < end_ && !delimiter(*q)) ++q;
        raw->append(p_, size_t(q - p_));
        p_ = q;
        if (p_ < end_ || !fill()) return true;
      }
    }
    size_t depth = 0;
    for (;;) {
      const char* q = p_;
      while (q < end_ && !structural(*q)) ++q;
      raw->append(p_, size_t(q - p_));
      p_ = q;
      if (p_ == end_) {
        if (fill()) continue;
        return false;
      }
      c = static_cast<unsigned char>(*p_++);
      raw->push_back(char(c));
      if (c == '"') {
        if (!raw_string(raw)) return false;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else {
        --depth;  // } or ]: brackets that do not pair up are nlohmann/json's to refuse
      }
      if (depth == 0) return true;
    }
  }

 private:
  static bool plain(char c) {  // a string byte that stands for itself
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x80 && c != '"' && c != '\\';
  }
  static bool delimiter(char c) {
    return c == ',' || c == '}' || c == ']' || c == ' ' || c == '\n' || c == '\r' || c == '\t';
  }
  static bool structural(char c) { return c == '"' || c == '{' || c == '}' || c == '[' || c == ']'; }

  bool fill() {
    if (failed_ || eof_) return false;
    const size_t n = std::fread(buf_.data(), 1, buf_.size(), f_);
    if (n == 0) {
      failed_ = std::ferror(f_) != 0;
      eof_ = true;
      return false;
    }
    p_ = buf_.data();
    end_ = p_ + n;
    return true;
  }
  bool digits() {
    int c = peek();
    if (c < '0' || c > '9') return false;
    while ((c = peek()) >= '0' && c <= '9') ++p_;
    return true;
  }
  bool hex4(uint32_t* cp) {
    *cp = 0;
    for (int i = 0; i < 4; ++i) {
      const int c = get();
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) return false;
      *cp = *cp << 4 | uint32_t(d);
    }
    return true;
  }
  bool escape(std::string* out) {
    const int c = get();
    switch (c) {
      case '"':
      case '\\':
      case '/': out->push_back(char(c)); return true;
      case 'b': out->push_back('\b'); return true;
      case 'f': out->push_back('\f'); return true;
      case 'n': out->push_back('\n'); return true;
      case 'r': out->push_back('\r'); return true;
      case 't': out->push_back('\t'); return true;
      case 'u': break;
      default: return false;
    }
    uint32_t cp = 0;
    if (!hex4(&cp)) return false;
    if (cp >= 0xD800 && cp <= 0xDBFF) {  // a high surrogate: a low one must follow
      uint32_t lo = 0;
      if (!eat('\\') || !eat('u') || !hex4(&lo) || lo < 0xDC00 || lo > 0xDFFF) return false;
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
      return false;
    }
    if (cp < 0x80) {
      out->push_back(char(cp));
    } else if (cp < 0x800) {
      const char s[2] = {char(0xC0 | cp >> 6), char(0x80 | (cp & 0x3F))};
      out->append(s, 2);
    } else if (cp < 0x10000) {
      const char s[3] = {char(0xE0 | cp >> 12), char(0x80 | (cp >> 6 & 0x3F)), char(0x80 | (cp & 0x3F))};
      out->append(s, 3);
    } else {
      const char s[4] = {char(0xF0 | cp >> 18), char(0x80 | (cp >> 12 & 0x3F)), char(0x80 | (cp >> 6 & 0x3F)),
                         char(0x80 | (cp & 0x3F))};
      out->append(s, 4);
    }
    return true;
  }
  // A multi-byte UTF-8 character after its first byte `lead` (utf8_scan's rules, which are nlohmann/json's).
  bool utf8_char(int lead, std::string* out) {
    size_t need = 0;  // continuation bytes; the allowed range of the first of them
    unsigned lo = 0, hi = 0;
    if (lead < 0 || !utf8_lead(unsigned(lead), &need, &lo, &hi)) return false;
    out->push_back(char(lead));
    for (size_t i = 0; i < need; ++i) {
      const int c = get();
      if (c < int(i == 0 ? lo : 0x80) || c > int(i == 0 ? hi : 0xBF)) return false;
      out->push_back(char(c));
    }
    return true;
  }
  // The rest of a string after its opening quote, appended to *raw as it is.
  bool raw_string(std::string* raw) {
    for (;;) {
      const char* q = p_;
      while (q < end_ && *q != '"' && *q != '\\') ++q;
      raw->append(p_, size_t(q - p_));
      p_ = q;
      if (p_ == end_) {
        if (fill()) continue;
        return false;
      }
      const char c = *p_++;
      raw->push_back(c);
      if (c == '"') return true;
      const int e = get();  // the escaped character (never the closing quote)
      if (e < 0) return false;
      raw->push_back(char(e));
    }
  }

  std::FILE* f_;
  std::vector<char> buf_ = std::vector<char>(size_t(1) << 18);
  const char* p_ = nullptr;
  const char* end_ = nullptr;
  bool failed_ = false, eof_ = false;
};

// tokenizer.json into a Tokenizer::Impl in one pass. model.vocab and model.merges -- nearly all of Gemma's
// 33 MB -- go straight into the tables: their texts into the arena, the vocabulary's index built as the
// vocabulary ends (its size known then), the three lookups of each merge done in batches as the merges are
// read. Every other value is cut out as text and parsed by nlohmann/json into `rest`, where the checks after
// reading find it as in a tree of the whole file. (A tree of the whole file took ~1.8 s for Gemma's, and
// nlohmann/json's SAX interface, character by character, ~0.3 s; issue 14.)
class TokJsonReader {
 public:
  TokJsonReader(Tokenizer::Impl* t, std::string where) : t_(t), where_(std::move(where)) {}

  tok_json rest;                // the file without model.vocab, model.merges and an added_tokens list
  bool vocab_seen = false;      // model.vocab was an object, read into t->texts / piece_at / lookup
  bool merges_seen = false;     // model.merges was a list, read into t->merges
  Status bad_id;                // the first vocabulary id out of range
  Status merge_error;           // the first merge of a token missing from the vocabulary
  std::vector<TokAdded> added;  // added_tokens (a list), checked, in file order, up to
  Status added_error;           //   the first entry that failed its check

  // Reads the whole file. Errors of the reading itself: IoError; FormatError for invalid JSON, a value of the
  // wrong kind in model.vocab / model.merges, or model / model.vocab / model.merges given twice (a second one
  // would replace the first after the tables were built from it). bad_id, merge_error and added_error are
  // left to the caller, which reports them in the order of its checks.
  Status read(std::FILE* f, uint64_t file_bytes) {
    // Room for what a file of this size usually holds (Gemma's 33 MB: 2.6 MB of texts, 262,144 tokens,
    // 514,906 merges), so that nothing regrows; reserved, not touched, memory costs nothing until used.
    const size_t n = size_t(std::min<uint64_t>(file_bytes, uint64_t(1) << 32));
    t_->texts.reserve(n / 8);
    vocab_ids_.reserve(n / 100);
    TokInput in(f);
    in_ = &in;
    const bool ok = root();
    in_ = nullptr;
    if (in.failed()) return err(Code::IoError, "cannot read ", where_, ": ", std::strerror(errno));
    if (!status_.is_ok()) return status_;
    if (!ok) return err(Code::FormatError, where_, ": not valid JSON");
    return Status::ok();
  }

 private:
  static constexpr size_t kBatch = 32;  // merges resolved together (their lookups in flight at once)
  struct Merge {
    uint32_t at, a_len, b_len;  // a then b in pending_text_
  };

  bool fail(Status st) {
    status_ = std::move(st);
    return false;
  }
  bool bad_vocab() { return fail(err(Code::FormatError, where_, ": model.vocab['", key_, "'] is not an integer id")); }
  bool bad_merge() {
    return fail(
        err(Code::FormatError, where_, ": model.merges[", merge_count_, "] is neither \"a b\" nor [\"a\", \"b\"]"));
  }
  // ": value" after a key, up to the value
  bool colon() {
    in_->skip_ws();
    if (!in_->eat(':')) return false;
    in_->skip_ws();
    return true;
  }
  // After a member or element: true and *more when a ',' follows, true and !*more at `close`.
  bool next(char close, bool* more) {
    in_->skip_ws();
    *more = in_->eat(',');
    if (*more) {
      in_->skip_ws();
      return true;
    }
    return in_->eat(close);
  }
  // A value for the tree, cut out and parsed by nlohmann/json.
  bool value(tok_json* out) {
    raw_.clear();
    if (!in_->skip_value(&raw_)) return false;
    *out = tok_json::parse(raw_, nullptr, false);
    return !out->is_discarded();
  }

  bool root() {
    TokInput& in = *in_;
    if (in.peek() == 0xEF && !(in.get() == 0xEF && in.get() == 0xBB && in.get() == 0xBF))
      return false;  // a UTF-8 byte order mark is skipped (as nlohmann/json does), a broken one refused
    in.skip_ws();
    if (in.peek() != '{') {  // not an object (an error later), if it is JSON at all
      if (!value(&rest)) return false;
    } else {
      in.get();
      rest = tok_json::object();
      in.skip_ws();
      for (bool more = !in.eat('}'); more;) {
        std::string key;
        if (!in.eat('"') || !in.string(&key) || !colon()) return false;
        if (key == "added_tokens") {  // a later one replaces an earlier one, as in a tree
          added.clear();
          added_error = Status::ok();
          rest.erase(key);
        }
        if (key == "added_tokens" && in.peek() == '[') {
          if (!added_tokens()) return false;
        } else if (key == "model" && in.peek() == '{') {
          if (model_seen_) return fail(err(Code::FormatError, where_, ": 'model' is given twice"));
          model_seen_ = true;
          tok_json model = tok_json::object();
          if (!model_object(&model)) return false;
          rest[key] = std::move(model);
        } else if (!value(&rest[key])) {
          return false;
        }
        if (!next('}', &more)) return false;
      }
    }
    in.skip_ws();
    return in.peek() < 0;  // nothing but white space after it
  }

  bool model_object(tok_json* model) {
    TokInput& in = *in_;
    in.get();  // {
    in.skip_ws();
    for (bool more = !in.eat('}'); more;) {
      std::string key;
      if (!in.eat('"') || !in.string(&key) || !colon()) return false;
      const int c = in.peek();
      if (key == "vocab" && c == '{') {
        if (vocab_seen) return fail(err(Code::FormatError, where_, ": model.vocab is given twice"));
        vocab_seen = true;
        if (!vocab()) return false;
      } else if (key == "merges" && c == '[') {
        if (merges_seen) return fail(err(Code::FormatError, where_, ": model.merges is given twice"));
        merges_seen = true;
        if (!merges()) return false;
      } else if (!value(&(*model)[key])) {
        return false;
      }
      if (!next('}', &more)) return false;
    }
    return true;
  }

  // added_tokens: [{"id": 0, "content": "<pad>", ...}, ...], an entry at a time: each is cut out, parsed by
  // nlohmann/json, checked and kept as a TokAdded (a tree of Gemma's 6,415 entries took 30 ms and 5 MB).
  bool added_tokens() {
    TokInput& in = *in_;
    in.get();  // [
    in.skip_ws();
    for (bool more = !in.eat(']'); more;) {
      tok_json e;
      if (!value(&e)) return false;
      if (added_error.is_ok()) {
        TokAdded ad;
        added_error = tok_added_token(e, where_, added.size(), &ad);
        if (added_error.is_ok()) added.push_back(std::move(ad));
      }
      if (!next(']', &more)) return false;
    }
    return true;
  }

  // model.vocab: {"text": id, ...}. The texts go into the arena in file order, the ids into vocab_ids_.
  bool vocab() {
    TokInput& in = *in_;
    in.get();  // {
    vocab_first_ = t_->texts.end();
    in.skip_ws();
    for (bool more = !in.eat('}'); more;) {
      key_.clear();
      if (!in.eat('"') || !in.string(&key_) || !colon()) return false;
      const int c = in.peek();
      int64_t id = 0;
      if (c == '-' || (c >= '0' && c <= '9')) {
        const TokInput::Number kind = in.number(&id);
        if (kind == TokInput::Number::Invalid) return false;
        if (kind == TokInput::Number::Other) return bad_vocab();
      } else {
        return TokInput::value_start(c) ? bad_vocab() : false;
      }
      if (id < 0 || id >= kMaxTokenIds) {
        if (bad_id.is_ok())
          bad_id =
              err(Code::FormatError, where_, ": model.vocab: token id ", id, " is outside [0, ", kMaxTokenIds, ")");
        id = 0;
      }
      if (t_->texts.add(key_) == 0)
        return fail(err(Code::FormatError, where_, ": model.vocab: the token texts pass 4 GiB"));
      vocab_ids_.push_back(int32_t(id));
      if (!next('}', &more)) return false;
    }
    vocab_end();
    return true;
  }

  // The vocabulary is complete: the id -> text table and the text -> id index, each allocated once at its
  // size; then any merges read before the vocabulary are resolved.
  void vocab_end() {
    if (!bad_id.is_ok()) return;  // the load fails: no tables
    int32_t max_id = -1;
    for (const int32_t id : vocab_ids_) max_id = std::max(max_id, id);
    int32_t max_added = max_id;  // added tokens read before (where tokenizers writes them) may add ids
    for (const TokAdded& ad : added) max_added = std::max(max_added, ad.id);
    t_->piece_at.reserve(size_t(max_added + 1));
    t_->piece_at.assign(size_t(max_id + 1), 0);
    VocabIndex& index = t_->lookup;
    const TextArena& texts = t_->texts;
    index.reserve(vocab_ids_.size(), texts);
    // In file order: of two texts for one id the last wins, of two ids for one text the first. In batches:
    // the slots of a batch are fetched together.
    constexpr size_t kAddBatch = 16;
    uint32_t off[kAddBatch];
    VocabIndex::Probe probe[kAddBatch];
    uint32_t at = vocab_first_;
    for (size_t i0 = 0; i0 < vocab_ids_.size(); i0 += kAddBatch) {
      const size_t n = std::min(kAddBatch, vocab_ids_.size() - i0);
      for (size_t k = 0; k < n; ++k, at = texts.next(at)) {
        off[k] = at;
        probe[k] = index.probe(texts.at(at));
      }
      for (size_t k = 0; k < n; ++k) {
        const int32_t id = vocab_ids_[i0 + k];
        t_->piece_at[size_t(id)] = off[k];
        index.add(off[k], id, probe[k], texts);
      }
    }
    vocab_count_ = vocab_ids_.size();
    vocab_ids_ = {};
    index_ready_ = true;
    resolve_merges();
  }

  // model.merges: ["a b", ...] or [["a", "b"], ...]. Each merge's texts go to pending_text_, a then b back to
  // back (so that "ab" is a view too); resolved into ids a batch at a time once the vocabulary is known.
  bool merges() {
    TokInput& in = *in_;
    in.get();  // [
    in.skip_ws();
    for (bool more = !in.eat(']'); more;) {
      if (merge_count_ >= MergeTable::kMaxMerges)
        return fail(err(Code::Unsupported, where_, ": model.merges: more than ", MergeTable::kMaxMerges,
                        " merges are not supported"));
      const int c = in.peek();
      const size_t at = pending_text_.size();
      size_t len[2] = {0, 0};
      if (c == '"') {  // "a b"
        in.get();
        if (!in.string(&pending_text_)) return false;
        const std::string_view v(pending_text_.data() + at, pending_text_.size() - at);
        const size_t sp = v.find(' ');
        if (sp == std::string_view::npos || v.find(' ', sp + 1) != std::string_view::npos)
          return fail(err(Code::FormatError, where_, ": model.merges[", merge_count_, "] = '", v,
                          "' is not two tokens split by a space"));
        len[0] = sp;
        len[1] = v.size() - sp - 1;
        pending_text_.erase(at + sp, 1);
      } else if (c == '[') {  // ["a", "b"]
        in.get();
        in.skip_ws();
        int n = 0;
        for (bool more_in = !in.eat(']'); more_in;) {
          const int e = in.peek();
          if (e != '"') return TokInput::value_start(e) ? bad_merge() : false;
          if (n == 2) return bad_merge();
          in.get();
          const size_t before = pending_text_.size();
          if (!in.string(&pending_text_)) return false;
          len[n++] = pending_text_.size() - before;
          if (!next(']', &more_in)) return false;
        }
        if (n != 2) return bad_merge();
      } else {
        return TokInput::value_start(c) ? bad_merge() : false;
      }
      add_merge(at, len[0], len[1]);
      if (!next(']', &more)) return false;
    }
    resolve_merges();
    return true;
  }

  void add_merge(size_t at, size_t a_len, size_t b_len) {
    ++merge_count_;
    if (merge_error.is_ok() && pending_text_.size() > UINT32_MAX)  // only when they come before the vocabulary
      merge_error = err(Code::FormatError, where_, ": model.merges hold more than 4 GiB of text");
    // Not kept when the load fails anyway: after a missing token, or with a vocabulary that had a bad id.
    if (!merge_error.is_ok() || (vocab_seen && !index_ready_)) {
      pending_text_.resize(at);
      return;
    }
    pending_.push_back(Merge{uint32_t(at), uint32_t(a_len), uint32_t(b_len)});
    if (index_ready_ && pending_.size() == kBatch) resolve_merges();
  }

  // The pending merges into (left, right, merged) ids, kBatch at a time: the lookups of a batch are all in
  // flight before the first is used (each is a cache miss or two: slot, then text).
  void resolve_merges() {
    if (!index_ready_ || pending_.empty()) return;
    const VocabIndex& index = t_->lookup;
    const TextArena& texts = t_->texts;
    MergeTable& table = t_->merges;
    // Sized once for two merges per token (Gemma: 514,906 for 262,144; Llama 2: 61,249 for 32,000); grows
    // past that.
    if (table.size() == 0) table.reserve(2 * vocab_count_);
    for (size_t i0 = 0; i0 < pending_.size() && merge_error.is_ok(); i0 += kBatch) {
      const size_t n = std::min(kBatch, pending_.size() - i0);
      std::string_view s[kBatch][3];  // a, b, ab
      VocabIndex::Probe probe[kBatch][3];
      for (size_t k = 0; k < n; ++k) {
        const Merge& m = pending_[i0 + k];
        const char* a = pending_text_.data() + m.at;
        s[k][0] = std::string_view(a, m.a_len);
        s[k][1] = std::string_view(a + m.a_len, m.b_len);
        s[k][2] = std::string_view(a, m.a_len + m.b_len);
        for (int j = 0; j < 3; ++j) probe[k][j] = index.probe(s[k][j]);
      }
      for (size_t k = 0; k < n; ++k)
        for (int j = 0; j < 3; ++j) index.prefetch_text(probe[k][j], texts);
      int32_t id[kBatch][3];
      size_t found = 0;
      for (; found < n; ++found) {
        for (int j = 0; j < 3; ++j) id[found][j] = index.find(s[found][j], probe[found][j], texts);
        if (id[found][0] < 0 || id[found][1] < 0 || id[found][2] < 0) {
          merge_error = err(Code::FormatError, where_, ": model.merges[", table.size() + found, "] ('", s[found][0],
                            "', '", s[found][1], "') uses a token missing from the vocabulary");
          break;
        }
        table.prefetch(id[found][0], id[found][1]);
      }
      for (size_t k = 0; k < found; ++k) table.add(id[k][0], id[k][1], id[k][2]);
    }
    pending_.clear();
    pending_text_.clear();
  }

  Tokenizer::Impl* t_;
  std::string where_;
  TokInput* in_ = nullptr;
  Status status_;    // an error found while reading
  std::string raw_;  // the text of a value for the tree
  std::string key_;  // the vocabulary text being read
  bool model_seen_ = false;
  uint32_t vocab_first_ = 0;        // the arena record of the vocabulary's first text
  size_t vocab_count_ = 0;          // entries in the vocabulary
  std::vector<int32_t> vocab_ids_;  // [vocab entries] ids in file order (0 where out of range)
  bool index_ready_ = false;        // t->lookup holds the vocabulary
  size_t merge_count_ = 0;          // merges read
  std::string pending_text_;        // texts of the merges not yet resolved
  std::vector<Merge> pending_;      // the merges not yet resolved (usually fewer than kBatch)
};
}  // namespace detail

}  // namespace gemma4_t4
