// gemma4_t4 implementation part: the chat format (format_chat) and generation_config.json
// (load_generation_config). Included by gemma4_t4.hpp inside GEMMA4_T4_IMPLEMENTATION; not a public header.
//
// format_chat reproduces, byte for byte, what Google's Gemma 4 chat template renders (the copy in
// tests/data/chat/gemma4_e2b_chat_template.jinja2, rendered the way transformers does: jinja2 with
// trim_blocks + lstrip_blocks) for text-only conversations without tools. The template's rules, in the
// order it applies them:
//   - `bos_token` first ("<bos>" as text: the tokenizer does not add BOS).
//   - A system turn when thinking is on or the FIRST message is "system"/"developer":
//     `<|turn>system\n` [`<|think|>\n`] [first message's content | trim] `<turn|>\n`.
//   - Every other message: `<|turn>{role}\n` (role "assistant" is written "model"; other roles as given),
//     the content (`| trim`; model turns first drop every `<|channel>...<channel|>` thinking block, then
//     trim), `<turn|>\n`. Continuations: a model-role message directly after a message whose raw role is
//     "assistant" opens no new turn, and a model-role message directly before a raw "assistant" message
//     does not close its turn (the template compares the raw role strings, so "model" and "assistant" are
//     not interchangeable here).
//   - A message's `reasoning` is written as `<|channel>thought\n{reasoning}\n<channel|>` before its content
//     only when the message comes after the last user message (an agent's turn still in progress).
//   - `<|turn>model\n` when add_generation_prompt.
// Python's str.strip() (jinja's `trim`) removes Unicode whitespace, not just ASCII: py_strip below does the
// same on UTF-8.
#pragma once

#include <cstdint>
#include <filesystem>
#include <system_error>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace gemma4_t4 {
namespace detail {

// ---- python-compatible strip on UTF-8 ----

// The code points for which Python's str.isspace() is true (what str.strip() and jinja's `trim` remove).
inline bool py_isspace(uint32_t cp) {
  if (cp <= 0x20) return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20);
  switch (cp) {
    case 0x85:
    case 0xa0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202f:
    case 0x205f:
    case 0x3000: return true;
    default: return cp >= 0x2000 && cp <= 0x200a;
  }
}

// Decodes one well-formed UTF-8 code point at s[i]; returns its byte length, 0 when the bytes there are not
// a well-formed sequence (those never count as whitespace).
inline size_t utf8_decode(const std::string& s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  size_t len;
  uint32_t v;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if (c >= 0xc2 && c <= 0xdf) {
    len = 2, v = c & 0x1fu;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3, v = c & 0x0fu;
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4, v = c & 0x07u;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xc0u) != 0x80u) return 0;
    v = v << 6 | (b(i + k) & 0x3fu);
  }
  const uint32_t min = len == 2 ? 0x80u : len == 3 ? 0x800u : 0x10000u;
  if (v < min || v > 0x10ffffu || (v >= 0xd800u && v <= 0xdfffu)) return 0;
  *cp = v;
  return len;
}

// s.strip() as Python computes it, on UTF-8 text.
inline std::string py_strip(const std::string& s) {
  size_t begin = 0, end = s.size();
  while (begin < end) {
    uint32_t cp;
    const size_t len = utf8_decode(s, begin, &cp);
    if (len == 0 || !py_isspace(cp)) break;
    begin += len;
  }
  while (end > begin) {
    size_t start = end - 1;  // back up to the lead byte of the last code point (at most 3 continuations)
    while (start > begin && end - start < 4 && (static_cast<uint8_t>(s[start]) & 0xc0u) == 0x80u) --start;
    uint32_t cp;
    const size_t len = utf8_decode(s, start, &cp);
    if (len == 0 || start + len != end || !py_isspace(cp)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

// The template's strip_thinking macro: split on `<channel|>`, keep of each part what precedes its first
// `<|channel>` (all of it when there is none), join, trim.
inline std::string strip_thinking(const std::string& text) {
  static const std::string close = "<channel|>", open = "<|channel>";
  std::string result;
  size_t pos = 0;
  for (;;) {
    const size_t next = text.find(close, pos);
    const std::string part = text.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    result += part.substr(0, part.find(open));
    if (next == std::string::npos) break;
    pos = next + close.size();
  }
  return py_strip(result);
}

}  // namespace detail

// ---- format_chat ----
// Public functions: defined here, in the one implementation unit (declared in gemma4_t4.hpp).

Status format_chat(const std::vector<Message>& messages, const ChatOptions& options, std::string* out) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r == "system" || r == "developer" || r == "user" || r == "assistant" || r == "model") continue;
    if (r == "tool")
      return detail::err(Code::Unsupported, "format_chat: message ", i,
                         " has role 'tool': tool calls and tool responses are not supported; render such "
                         "conversations with the official chat template instead");
    return detail::err(Code::InvalidArgument, "format_chat: message ", i, " has role '", r,
                       "'; expected system, developer, user, assistant or model");
  }

  std::string s = options.add_bos ? "<bos>" : "";
  size_t first = 0;  // messages[first..] are the loop messages (the first system message is consumed)
  const bool leading_system = !messages.empty() && (messages[0].role == "system" || messages[0].role == "developer");
  if (options.thinking || leading_system) {
    s += "<|turn>system\n";
    if (options.thinking) s += "<|think|>\n";
    if (leading_system) {
      s += detail::py_strip(messages[0].content);
      first = 1;
    }
    s += "<turn|>\n";
  }

  size_t last_user = SIZE_MAX;  // SIZE_MAX: no user message (the template's -1)
  for (size_t i = first; i < messages.size(); ++i)
    if (messages[i].role == "user") last_user = i;

  for (size_t i = first; i < messages.size(); ++i) {
    const Message& m = messages[i];
    const bool model = m.role == "assistant" || m.role == "model";
    const bool continues_previous = model && i > first && messages[i - 1].role == "assistant";
    const bool continues_into_next = model && i + 1 < messages.size() && messages[i + 1].role == "assistant";
    if (!continues_previous) s += "<|turn>" + std::string(model ? "model" : m.role) + "\n";
    if (!m.reasoning.empty() && (last_user == SIZE_MAX || i > last_user))
      s += "<|channel>thought\n" + m.reasoning + "\n<channel|>";
    s += model ? detail::strip_thinking(m.content) : detail::py_strip(m.content);
    if (!continues_into_next) s += "<turn|>\n";
  }
  if (options.add_generation_prompt) s += "<|turn>model\n";
  *out = std::move(s);
  return Status::ok();
}

std::string format_chat(const std::vector<Message>& messages, const ChatOptions& options) {
  std::string s;
  if (!format_chat(messages, options, &s)) return std::string();
  return s;
}

// ---- generation_config.json ----

Status load_generation_config(const std::string& dir, SamplingOptions* defaults, std::vector<int>* eos) {
  using json = nlohmann::json;
  const std::string path = detail::path_join(dir, "generation_config.json");
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) return Status::ok();  // caller's defaults stand
  std::string text;
  if (status.type() != std::filesystem::file_type::regular || !detail::read_text_file(path, &text))
    return detail::err(Code::IoError, path, ": cannot read (not a readable regular file",
                       ec ? ": " + ec.message() : std::string(), ")");
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return detail::err(Code::FormatError, path, ": not valid JSON");
  if (!j.is_object()) return detail::err(Code::FormatError, path, ": expected a JSON object, got ", j.type_name());

  SamplingOptions o = defaults ? *defaults : SamplingOptions();
  double v = 0;
  GEMMA4_T4_TRY(detail::json_float(j, "temperature", o.temperature, path, &v));
  o.temperature = static_cast<float>(v);
  GEMMA4_T4_TRY(detail::json_int(j, "top_k", o.top_k, 0, 1 << 30, path, &o.top_k));
  GEMMA4_T4_TRY(detail::json_float(j, "top_p", o.top_p, path, &v));
  o.top_p = static_cast<float>(v);
  GEMMA4_T4_TRY(detail::json_float(j, "min_p", o.min_p, path, &v));
  o.min_p = static_cast<float>(v);
  GEMMA4_T4_TRY(detail::json_float(j, "repetition_penalty", o.repetition_penalty, path, &v));
  if (v <= 0) return detail::err(Code::FormatError, path, ": 'repetition_penalty' = ", v, " must be > 0");
  o.repetition_penalty = static_cast<float>(v);
  bool do_sample = true;
  GEMMA4_T4_TRY(detail::json_bool(j, "do_sample", true, path, &do_sample));
  if (!do_sample) o.temperature = 0.f;  // Hugging Face: do_sample false = greedy whatever the temperature

  std::vector<int> ids;
  auto it = j.find("eos_token_id");
  const bool has_eos = it != j.end() && !it->is_null();
  if (has_eos) {
    const json one = json::array({*it});
    const json& list = it->is_array() ? *it : one;
    for (const json& e : list) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX)
        return detail::err(Code::FormatError, path, ": 'eos_token_id' must be a token id or a list of them, got ",
                           it->dump());
      ids.push_back(e.get<int>());
    }
  }
  if (defaults) *defaults = o;
  if (eos && has_eos) *eos = std::move(ids);
  return Status::ok();
}

}  // namespace gemma4_t4
