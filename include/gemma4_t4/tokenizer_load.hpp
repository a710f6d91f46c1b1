// gemma4_t4 implementation part: loading a Tokenizer::Impl from a Hugging Face tokenizer.json (read through
// nlohmann/json's SAX interface, the vocabulary and merges straight into flat tables) or from a SentencePiece
// .model (with GEMMA4_T4_SENTENCEPIECE). Every part of tokenizer.json this library does not implement is
// refused with Code::Unsupported naming it (tokenizer.hpp lists what is). Included through tokenizer.hpp
// inside GEMMA4_T4_IMPLEMENTATION; not a public header.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer_impl.hpp"

namespace gemma4_t4 {

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

// The "type" of a normalizer / pre-tokenizer / decoder object, or FormatError.
inline Status tok_type(const tok_json& j, const std::string& where, std::string* type) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return err(Code::FormatError, where, ": not an object with a 'type'");
  *type = j["type"].get<std::string>();
  return Status::ok();
}

// A normalizer or pre-tokenizer: null (none), a Sequence of them (the entries of its `list`, in order, each
// read the same way), or one step, which step(j, where, type) reads.
template <class Step>
Status tok_component(const tok_json& j, const std::string& where, const char* list, const Step& step) {
  if (j.is_null()) return Status::ok();
  std::string type;
  GEMMA4_T4_TRY(tok_type(j, where, &type));
  if (type != "Sequence") return step(j, where, type);
  if (!j.contains(list) || !j[list].is_array())
    return err(Code::FormatError, where, ": Sequence without a '", list, "' list");
  for (size_t i = 0; i < j[list].size(); ++i)
    GEMMA4_T4_TRY(tok_component(j[list][i], where + "[" + std::to_string(i) + "]", list, step));
  return Status::ok();
}

inline Status tok_normalizer_step(const tok_json& j, const std::string& where, const std::string& type,
                                  Tokenizer::Impl* t) {
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

inline Status tok_pre_tokenizer_step(const tok_json& j, const std::string& where, const std::string& type,
                                     Tokenizer::Impl* t) {
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

inline Status tok_normalizer(const tok_json& j, const std::string& where, Tokenizer::Impl* t) {
  return tok_component(j, where, "normalizers", [t](const tok_json& s, const std::string& w, const std::string& type) {
    return tok_normalizer_step(s, w, type, t);
  });
}

inline Status tok_pre_tokenizer(const tok_json& j, const std::string& where, Tokenizer::Impl* t) {
  return tok_component(j, where, "pretokenizers",
                       [t](const tok_json& s, const std::string& w, const std::string& type) {
                         return tok_pre_tokenizer_step(s, w, type, t);
                       });
}

// Decoder chain: Replace* (before ByteFallback), ByteFallback?, Fuse?, then Strip (start only) after Fuse.
inline Status tok_decoder_step(const tok_json& j, const std::string& where, bool* fused, Tokenizer::Impl* t) {
  std::string type;
  GEMMA4_T4_TRY(tok_type(j, where, &type));
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

}  // namespace gemma4_t4
