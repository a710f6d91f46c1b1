// gemma4_t4 implementation part: loading a Tokenizer::Impl from a Hugging Face tokenizer.json (read in one pass
// by tokenizer_json.hpp, the vocabulary and merges straight into their tables, the rest checked here) or from a
// SentencePiece .model (with GEMMA4_T4_SENTENCEPIECE). Every part of tokenizer.json this library does not
// implement is refused with Code::Unsupported naming it (tokenizer.hpp lists what is). Included through
// tokenizer.hpp inside GEMMA4_T4_IMPLEMENTATION; not a public header.
#pragma once

#include <sys/stat.h>

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

#include "tokenizer_json.hpp"

namespace gemma4_t4 {

namespace detail {

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

inline Status tok_add_piece(Tokenizer::Impl* t, int64_t id, std::string_view text, const std::string& where) {
  // Gemma: 262144 ids. The id table is dense (a record offset per id up to the largest), so the bound also
  // caps what a hostile file can make load() allocate.
  if (id < 0 || id >= kMaxTokenIds)
    return err(Code::FormatError, where, ": token id ", id, " is outside [0, ", kMaxTokenIds, ")");
  if (size_t(id) >= t->piece_at.size()) t->piece_at.resize(size_t(id) + 1, 0);
  uint32_t& at = t->piece_at[size_t(id)];
  if (at != 0 && t->texts.at(at) == text) return Status::ok();  // the id has this text already
  at = t->texts.add(text);
  if (at == 0) return err(Code::FormatError, where, ": the token texts pass 4 GiB");
  return Status::ok();
}

inline int byte_token_value(std::string_view s) {  // "<0xAB>" -> 0xAB, else -1 (ByteFallback's rule)
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

// Tables every backend needs once the id -> text table is final.
inline void tok_finish(Tokenizer::Impl* t) {
  const size_t n = t->vocab_size();
  t->special.resize(n, 0);
  t->byte_value.assign(n, -1);
  for (size_t i = 0; i < n; ++i)
    if (t->piece_at[i] != 0) t->byte_value[i] = int16_t(byte_token_value(t->texts.at(t->piece_at[i])));
}

inline Status tok_load_json(const std::string& path, Tokenizer::Impl* t) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return err(Code::IoError, "cannot open ", path, ": ", std::strerror(errno));
  struct stat st;
  const uint64_t bytes = fstat(fileno(f.get()), &st) == 0 && st.st_size > 0 ? uint64_t(st.st_size) : 0;
  TokJsonReader reader(t, path);
  GEMMA4_T4_TRY(reader.read(f.get(), bytes));
  f.reset();
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

  // vocabulary: read into t->texts, t->piece_at and t->lookup (the model's own vocabulary, which the BPE
  // model sees; added tokens below may give an id other text, not the model another text -> id)
  if (!reader.vocab_seen) return err(Code::FormatError, w, ": model.vocab is not an object");
  GEMMA4_T4_TRY(reader.bad_id);

  // added tokens (they own their ids' text): checked by the reader
  if (auto a = j.find("added_tokens"); a != j.end() && !a->is_null())
    return err(Code::FormatError, w, ": 'added_tokens' is not a list");
  GEMMA4_T4_TRY(reader.added_error);
  for (const TokAdded& ad : reader.added) GEMMA4_T4_TRY(tok_add_piece(t, ad.id, ad.content, w + ": added_tokens"));

  GEMMA4_T4_TRY(tok_normalizer(j.contains("normalizer") ? j["normalizer"] : tok_json(), w + ": normalizer", t));
  GEMMA4_T4_TRY(
      tok_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : tok_json(), w + ": pre_tokenizer", t));
  GEMMA4_T4_TRY(tok_decoder(j.contains("decoder") ? j["decoder"] : tok_json(), w + ": decoder", t));

  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    t->byte_ids[size_t(b)] = t->lookup.find(name, t->texts);
  }
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    const std::string unk = m["unk_token"].get<std::string>();
    t->unk_id = t->lookup.find(unk, t->texts);
    if (t->unk_id < 0) return err(Code::FormatError, w, ": model.unk_token '", unk, "' is not in the vocabulary");
  }

  // merges: "a b" strings or [a, b] pairs (resolved into ids by the reader); rank = position
  if (reader.merges_seen) {
    GEMMA4_T4_TRY(reader.merge_error);
  } else if (auto merges = m.find("merges"); merges != m.end() && !merges->is_null()) {
    return err(Code::FormatError, w, ": model.merges is not a list");
  }

  tok_finish(t);
  for (const TokAdded& ad : reader.added) {
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
  t->lookup.reserve(size_t(n), t->texts);
  for (int i = 0; i < n; ++i) t->lookup.add(t->piece_at[size_t(i)], i, t->texts);
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
