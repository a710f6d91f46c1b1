// gemma4_t4 implementation part: Tokenizer and Tokenizer::Streamer, the tokenizer's public side (its tables and
// encoding: tokenizer_impl.hpp; loading: tokenizer_load.hpp; reading tokenizer.json: tokenizer_json.hpp).
// Included by gemma4_t4.hpp inside GEMMA4_T4_IMPLEMENTATION; not a public header.
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

#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "tokenizer_impl.hpp"
#include "tokenizer_load.hpp"

namespace gemma4_t4 {

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

size_t Tokenizer::vocab_size() const { return impl_ ? impl_->vocab_size() : 0; }

int32_t Tokenizer::token_id(std::string_view piece) const {
  if (!impl_) return -1;
  auto it = impl_->added_ids.find(std::string(piece));
  if (it != impl_->added_ids.end()) return it->second;
  return impl_->lookup.find(piece, impl_->texts);
}

const std::string& Tokenizer::piece(int32_t id) const {
  static const std::string empty;
  if (!impl_ || !impl_->valid_id(id)) return empty;
  const Impl& t = *impl_;
  std::call_once(t.piece_strings_once, [&t] {
    t.piece_strings.resize(t.vocab_size());
    for (size_t i = 0; i < t.piece_strings.size(); ++i)
      if (t.valid_id(int32_t(i))) t.piece_strings[i] = t.piece_text(int32_t(i));
  });
  return t.piece_strings[size_t(id)];
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
    return detail::err(Code::InvalidArgument, "token id ", id, " is not in the vocabulary (size ", impl_->vocab_size(),
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
      emit(impl_->piece_text(id), out_text);
    } else {
      std::string s(impl_->piece_text(id));
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
