// The OpenAI protocol of examples/server.cpp: request bodies parsed and checked into a Request (every field's
// type and range, each refusal an OpenAI-style error), the text a generation produces (special tokens left out,
// the thinking channel split off as reasoning, stop strings matched across token boundaries), and the JSON of
// responses, stream chunks and errors. No HTTP and no threads here: tests/test_server_openai.cpp drives it.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "gemma4_t4.hpp"

namespace server {

using Json = nlohmann::json;

// JSON text of j; strings that are not UTF-8 become U+FFFD instead of throwing.
inline std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// ---- errors ------------------------------------------------------------------------------------------------

// {"error": {"message", "type", "param", "code"}} with an HTTP status, as OpenAI's API answers.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string code;   // short machine-readable reason: "invalid_json", "context_length_exceeded", ...
  std::string param;  // the offending field, "" = none
};

inline ApiError api_error(int status, std::string code, std::string message, std::string param = "") {
  ApiError e;
  e.status = status;
  e.code = std::move(code);
  e.message = std::move(message);
  e.param = std::move(param);
  e.type = status == 401   ? "authentication_error"
           : status == 429 ? "rate_limit_error"
           : status >= 500 ? "server_error"
                           : "invalid_request_error";
  return e;
}

inline Json error_json(const ApiError& e) {
  Json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return Json{{"error", err}};
}

// ---- requests ----------------------------------------------------------------------------------------------

// Whether the JSON text nests arrays and objects at most `limit` deep (strings skipped). Checked before parsing:
// a body of a million '[' is valid JSON that would exhaust the stack of the code building and freeing the tree.
inline bool json_depth_ok(const std::string& text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

enum class Endpoint { Chat, Completion };

// What the server knows when it checks a request.
struct ServerInfo {
  std::string model_name;               // the one model served ("model" must name it when given)
  size_t context = 0;                   // tokens a session holds (prompt + completion)
  int default_max_tokens = 512;         // when the request sets none (capped by the room left)
  int vocab_size = 0;                   // prompt ids must be below it
  int bos_id = 2;                       // prepended to /v1/completions prompts (as HF tokenizers add BOS)
  gemma4_t4::GenerateOptions defaults;  // sampling defaults (generation_config.json), stop tokens
};

// One request, checked. The prompt is still text (tokenized by the caller) unless prompt_ids is set.
struct Request {
  Endpoint endpoint = Endpoint::Chat;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::vector<gemma4_t4::Message> messages;
  bool thinking = false;            // chat_template_kwargs.enable_thinking
  std::string prompt_text;          // completions: the prompt as text, or
  std::vector<int32_t> prompt_ids;  // as token ids (then prompt_is_ids)
  bool prompt_is_ids = false;
  int max_tokens = -1;  // -1 = not given
  gemma4_t4::SamplingOptions sampling;
  bool seed_given = false;
  std::vector<std::string> stop;
  bool ignore_eos = false;          // vLLM's extension: generate past the end-of-turn tokens
  bool skip_special_tokens = true;  // vLLM's extension: special tokens' text left out of the output
  bool add_special_tokens = true;   // completions: prepend <bos> (vLLM's extension; false: the prompt as is)
  bool return_token_ids = false;    // the sampled ids in each choice ("token_ids"), for load generators
};

namespace detail {

// A field that may be absent or null (= absent). *err gets a 400 naming it when its type is wrong.
template <typename F>
bool optional_field(const Json& body, const char* name, F&& take, const char* want, ApiError* err) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return true;
  if (!take(*it)) {
    *err = api_error(400, "invalid_type", std::string("'") + name + "' must be " + want, name);
    return false;
  }
  return true;
}

inline bool get_bool(const Json& j, bool* out) {
  if (!j.is_boolean()) return false;
  *out = j.get<bool>();
  return true;
}

inline bool get_float(const Json& j, double lo, double hi, float* out) {
  if (!j.is_number()) return false;
  const double v = j.get<double>();
  if (!(v >= lo && v <= hi)) return false;
  *out = float(v);
  return true;
}

// A JSON integer in [lo, hi] (1.0 is not an integer here).
inline bool get_int(const Json& j, int64_t lo, int64_t hi, int64_t* out) {
  int64_t v = 0;
  if (j.is_number_unsigned()) {
    if (j.get<uint64_t>() > uint64_t(INT64_MAX)) return false;
    v = int64_t(j.get<uint64_t>());
  } else if (j.is_number_integer()) {
    v = j.get<int64_t>();
  } else {
    return false;
  }
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

// A seed: any 64-bit integer, signed or not.
inline bool get_seed(const Json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
  } else if (j.is_number_integer()) {
    *out = uint64_t(j.get<int64_t>());
  } else {
    return false;
  }
  return true;
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts (joined).
inline bool content_text(const Json& c, std::string* out, std::string* why, bool* unsupported) {
  if (c.is_null()) return true;
  if (c.is_string()) {
    *out = c.get<std::string>();
    return true;
  }
  if (!c.is_array()) {
    *why = "must be a string or an array of text parts";
    return false;
  }
  for (const Json& part : c) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      *why = "has a part that is not an object with a string 'type'";
      return false;
    }
    if (part["type"].get<std::string>() != "text") {
      *why = "has a part of type '" + part["type"].get<std::string>() + "': only text is supported";
      *unsupported = true;
      return false;
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      *why = "has a text part without a string 'text'";
      return false;
    }
    *out += part["text"].get<std::string>();
  }
  return true;
}

}  // namespace detail

// Checks a request body (already parsed JSON) for `endpoint`; false with *err (400 or 404) when it is refused.
// Fields of OpenAI's API this server does not implement are refused when they ask for something (n > 1,
// logprobs, tools, penalties other than 0, ...) and ignored when they are at their neutral value; fields it
// does not know are ignored, as vLLM does.
inline bool parse_request(const Json& body, Endpoint endpoint, const ServerInfo& info, Request* out, ApiError* err) {
  using detail::optional_field;
  Request r;
  r.endpoint = endpoint;
  r.sampling = info.defaults.sampling;
  if (!body.is_object()) {
    *err = api_error(400, "invalid_type", "the request body must be a JSON object");
    return false;
  }
  // model: optional; when given it must be the served model
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) {
      *err = api_error(400, "invalid_type", "'model' must be a string", "model");
      return false;
    }
    if (it->get<std::string>() != info.model_name) {
      *err = api_error(
          404, "model_not_found",
          "The model '" + it->get<std::string>() + "' does not exist; this server serves '" + info.model_name + "'",
          "model");
      return false;
    }
  }
  // the prompt
  if (endpoint == Endpoint::Chat) {
    auto it = body.find("messages");
    if (it == body.end() || !it->is_array() || it->empty()) {
      *err = api_error(400, "invalid_type", "'messages' must be a non-empty array", "messages");
      return false;
    }
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& m = (*it)[i];
      const std::string where = "messages[" + std::to_string(i) + "]";
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
        *err = api_error(400, "invalid_type", where + " must be an object with a string 'role'", where);
        return false;
      }
      gemma4_t4::Message msg;
      msg.role = m["role"].get<std::string>();
      if (msg.role != "system" && msg.role != "developer" && msg.role != "user" && msg.role != "assistant") {
        *err =
            api_error(400, "invalid_role",
                      where + " has role '" + msg.role + "': supported roles are system, developer, user and assistant",
                      where + ".role");
        return false;
      }
      std::string why;
      bool unsupported = false;
      if (!detail::content_text(m.contains("content") ? m["content"] : Json(), &msg.content, &why, &unsupported)) {
        *err =
            api_error(400, unsupported ? "unsupported" : "invalid_type", where + ".content " + why, where + ".content");
        return false;
      }
      if (m.contains("tool_calls") && !m["tool_calls"].is_null() && !m["tool_calls"].empty()) {
        *err = api_error(400, "unsupported", where + ": tool calls are not supported", where + ".tool_calls");
        return false;
      }
      r.messages.push_back(std::move(msg));
    }
    if (auto kw = body.find("chat_template_kwargs"); kw != body.end() && !kw->is_null()) {
      if (!kw->is_object()) {
        *err = api_error(400, "invalid_type", "'chat_template_kwargs' must be an object", "chat_template_kwargs");
        return false;
      }
      if (!optional_field(
              *kw, "enable_thinking", [&](const Json& j) { return detail::get_bool(j, &r.thinking); }, "a boolean",
              err))
        return false;
    }
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) {
      *err = api_error(400, "invalid_type", "'prompt' is required", "prompt");
      return false;
    }
    const Json* p = &*it;
    if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];  // [one]
    if (p->is_string()) {
      r.prompt_text = p->get<std::string>();
    } else if (p->is_array() && !p->empty() &&
               std::all_of(p->begin(), p->end(), [](const Json& x) { return x.is_number_integer(); })) {
      r.prompt_is_ids = true;
      for (const Json& x : *p) {
        const int64_t id =
            x.is_number_unsigned() ? int64_t(std::min<uint64_t>(x.get<uint64_t>(), INT64_MAX)) : x.get<int64_t>();
        if (id < 0 || id >= info.vocab_size) {
          *err = api_error(400, "invalid_value",
                           "'prompt' has token id " + std::to_string(id) + ", outside the vocabulary [0, " +
                               std::to_string(info.vocab_size) + ")",
                           "prompt");
          return false;
        }
        r.prompt_ids.push_back(int32_t(id));
      }
    } else if (p->is_array() && p->size() > 1) {
      *err =
          api_error(400, "unsupported", "'prompt' holds several prompts: this server takes one per request", "prompt");
      return false;
    } else {
      *err = api_error(400, "invalid_type", "'prompt' must be a string or an array of token ids", "prompt");
      return false;
    }
    if (!optional_field(
            body, "add_special_tokens", [&](const Json& j) { return detail::get_bool(j, &r.add_special_tokens); },
            "a boolean", err))
      return false;
    bool echo = false;
    if (!optional_field(
            body, "echo", [&](const Json& j) { return detail::get_bool(j, &echo); }, "a boolean", err))
      return false;
    if (echo) {
      *err = api_error(400, "unsupported", "'echo' is not supported", "echo");
      return false;
    }
    if (auto s = body.find("suffix"); s != body.end() && !s->is_null() && !(s->is_string() && s->empty())) {
      *err = api_error(400, "unsupported", "'suffix' is not supported", "suffix");
      return false;
    }
  }
  // output and sampling
  if (!optional_field(
          body, "stream", [&](const Json& j) { return detail::get_bool(j, &r.stream); }, "a boolean", err))
    return false;
  if (auto so = body.find("stream_options"); so != body.end() && !so->is_null()) {
    if (!so->is_object()) {
      *err = api_error(400, "invalid_type", "'stream_options' must be an object", "stream_options");
      return false;
    }
    if (!optional_field(
            *so, "include_usage", [&](const Json& j) { return detail::get_bool(j, &r.include_usage); }, "a boolean",
            err))
      return false;
  }
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    int64_t v = 0;
    if (!optional_field(
            body, name, [&](const Json& j) { return detail::get_int(j, 1, 1 << 30, &v); }, "an integer >= 1", err))
      return false;
    if (v > 0) r.max_tokens = int(v);  // max_completion_tokens, when both are given
  }
  gemma4_t4::SamplingOptions& s = r.sampling;
  if (!optional_field(
          body, "temperature", [&](const Json& j) { return detail::get_float(j, 0, 100, &s.temperature); },
          "a number in [0, 100]", err) ||
      !optional_field(
          body, "top_p", [&](const Json& j) { return detail::get_float(j, 0, 1, &s.top_p); }, "a number in [0, 1]",
          err) ||
      !optional_field(
          body, "min_p", [&](const Json& j) { return detail::get_float(j, 0, 1, &s.min_p); }, "a number in [0, 1]",
          err) ||
      !optional_field(
          body, "repetition_penalty",
          [&](const Json& j) { return detail::get_float(j, 1e-3, 100, &s.repetition_penalty); },
          "a number in [0.001, 100]", err))
    return false;
  int64_t top_k = -2, n = 1;
  if (!optional_field(
          body, "top_k", [&](const Json& j) { return detail::get_int(j, -1, 1 << 30, &top_k); },
          "an integer >= -1 (-1 and 0: off)", err))
    return false;
  if (top_k != -2) s.top_k = int(std::max<int64_t>(top_k, 0));
  if (!optional_field(
          body, "seed", [&](const Json& j) { return r.seed_given = detail::get_seed(j, &s.seed); }, "an integer", err))
    return false;
  if (!optional_field(
          body, "n", [&](const Json& j) { return detail::get_int(j, 1, 1 << 20, &n); }, "an integer >= 1", err))
    return false;
  if (n != 1) {
    *err = api_error(400, "unsupported", "'n' must be 1: this server returns one choice per request", "n");
    return false;
  }
  if (auto st = body.find("stop"); st != body.end() && !st->is_null()) {
    if (st->is_string()) {
      r.stop.push_back(st->get<std::string>());
    } else if (st->is_array() && st->size() <= 16 &&
               std::all_of(st->begin(), st->end(), [](const Json& x) { return x.is_string(); })) {
      for (const Json& x : *st) r.stop.push_back(x.get<std::string>());
    } else {
      *err = api_error(400, "invalid_type", "'stop' must be a string or an array of at most 16 strings", "stop");
      return false;
    }
    if (std::any_of(r.stop.begin(), r.stop.end(), [](const std::string& x) { return x.size() > 256; })) {
      *err = api_error(400, "invalid_value", "a 'stop' string is longer than 256 bytes", "stop");
      return false;
    }
    r.stop.erase(std::remove(r.stop.begin(), r.stop.end(), std::string()), r.stop.end());
  }
  if (!optional_field(
          body, "ignore_eos", [&](const Json& j) { return detail::get_bool(j, &r.ignore_eos); }, "a boolean", err) ||
      !optional_field(
          body, "skip_special_tokens", [&](const Json& j) { return detail::get_bool(j, &r.skip_special_tokens); },
          "a boolean", err) ||
      !optional_field(
          body, "return_token_ids", [&](const Json& j) { return detail::get_bool(j, &r.return_token_ids); },
          "a boolean", err))
    return false;
  // asked-for features this server does not have
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    float v = 0;
    if (!optional_field(
            body, name, [&](const Json& j) { return detail::get_float(j, -2, 2, &v); }, "a number in [-2, 2]", err))
      return false;
    if (v != 0) {
      *err = api_error(400, "unsupported", std::string("'") + name + "' is not supported (use 'repetition_penalty')",
                       name);
      return false;
    }
  }
  for (const char* name : {"logprobs", "top_logprobs", "logit_bias", "tools", "functions", "best_of"}) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null() || (it->is_boolean() && !it->get<bool>()) ||
        ((it->is_array() || it->is_object()) && it->empty()) || (std::string(name) == "best_of" && *it == 1))
      continue;
    *err = api_error(400, "unsupported", std::string("'") + name + "' is not supported", name);
    return false;
  }
  if (auto rf = body.find("response_format"); rf != body.end() && !rf->is_null()) {
    if (!rf->is_object() || rf->value("type", std::string()) != "text") {
      *err = api_error(400, "unsupported", "'response_format' other than {\"type\": \"text\"} is not supported",
                       "response_format");
      return false;
    }
  }
  *out = std::move(r);
  return true;
}

// ---- output text -------------------------------------------------------------------------------------------

// Turns sampled token ids into the text a client sees, one token at a time:
//   - special tokens (Tokenizer::is_special) are left out, unless keep_special;
//   - with `reasoning` (thinking on), what the model writes between <|channel> and <channel|> is reasoning, not
//     content (its leading "thought\n" dropped);
//   - content stops at the first occurrence of any stop string (not included), which may span tokens: text that
//     could be the start of a stop string is held back until it is known not to be.
// Text is always whole UTF-8 characters (Tokenizer::Streamer).
class TextOutput {
 public:
  TextOutput(const gemma4_t4::Tokenizer& tok, std::vector<std::string> stop, bool keep_special, bool reasoning)
      : tok_(tok), content_(tok), thought_(tok), stop_(std::move(stop)), keep_special_(keep_special) {
    if (reasoning) {
      open_ = tok.token_id("<|channel>");
      close_ = tok.token_id("<channel|>");
    }
  }

  // Appends the text id makes final to *content / *reasoning. true: a stop string matched -- the content ends
  // there and later ids must not be put.
  bool put(int32_t id, std::string* content, std::string* reasoning) {
    if (stopped_) return true;
    if (open_ >= 0 && id == open_ && !in_thought_) {
      flush_content(false, content);
      in_thought_ = true;
      thought_head_.clear();
      head_done_ = false;
      return false;
    }
    if (close_ >= 0 && id == close_ && in_thought_) {
      std::string piece;
      thought_.flush(&piece);
      thought_text(piece, true, reasoning);
      in_thought_ = false;
      return false;
    }
    if (!keep_special_ && tok_.is_special(id)) return false;
    std::string piece;
    if (in_thought_) {
      thought_.put(id, &piece);
      thought_text(piece, false, reasoning);
      return false;
    }
    content_.put(id, &piece);
    held_ += piece;
    return emit(content);
  }

  // End of generation: the held-back text is final (no stop string matched it).
  void finish(std::string* content, std::string* reasoning) {
    if (stopped_) return;
    if (in_thought_) {
      std::string piece;
      thought_.flush(&piece);
      thought_text(piece, true, reasoning);
    }
    flush_content(true, content);
  }

  bool stopped() const { return stopped_; }

 private:
  void flush_content(bool final, std::string* content) {
    std::string piece;
    content_.flush(&piece);
    held_ += piece;
    if (emit(content) || !final) return;
    *content += held_;
    held_.clear();
  }

  // Moves what is safe from held_ to *content; true when a stop string matched.
  bool emit(std::string* content) {
    size_t first = std::string::npos;
    for (const std::string& s : stop_) first = std::min(first, held_.find(s));
    if (first != std::string::npos) {
      *content += held_.substr(0, first);
      held_.clear();
      stopped_ = true;
      return true;
    }
    // keep the longest tail of held_ that is a proper prefix of a stop string (for each, the earliest start)
    size_t keep = 0;
    const size_t n = held_.size();
    for (const std::string& s : stop_)
      for (size_t p = n - std::min(n, s.size() - 1); p < n; ++p)
        if (held_.compare(p, n - p, s, 0, n - p) == 0) {
          keep = std::max(keep, n - p);
          break;
        }
    *content += held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return false;
  }

  // Reasoning text: drop a leading "thought\n" (what Gemma 4 writes after <|channel>).
  void thought_text(const std::string& piece, bool final, std::string* reasoning) {
    static const std::string kHead = "thought\n";
    if (head_done_) {
      *reasoning += piece;
      return;
    }
    thought_head_ += piece;
    if (thought_head_.size() < kHead.size() && kHead.compare(0, thought_head_.size(), thought_head_) == 0 && !final)
      return;  // could still be the head
    head_done_ = true;
    if (thought_head_.compare(0, kHead.size(), kHead) == 0) thought_head_.erase(0, kHead.size());
    *reasoning += thought_head_;
    thought_head_.clear();
  }

  const gemma4_t4::Tokenizer& tok_;
  gemma4_t4::Tokenizer::Streamer content_, thought_;
  std::vector<std::string> stop_;  // none empty
  bool keep_special_ = false;
  int32_t open_ = -1, close_ = -1;
  bool in_thought_ = false, head_done_ = false, stopped_ = false;
  std::string held_;          // content not yet emitted (could start a stop string)
  std::string thought_head_;  // reasoning until its head is known
};

// ---- responses ---------------------------------------------------------------------------------------------

// Usage of one request: prompt tokens; completion tokens = tokens sampled (an end-of-turn token included, tokens
// after a stop string's match not).
inline Json usage_json(size_t prompt, size_t completion, size_t cached) {
  Json u = {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
  u["prompt_tokens_details"] = {{"cached_tokens", cached}};
  return u;
}

// The fields every response and chunk of one request share.
struct ResponseHead {
  std::string id;  // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;
  std::string model;
  Endpoint endpoint = Endpoint::Chat;
};

inline Json head_json(const ResponseHead& h, bool chunk) {
  const char* object =
      h.endpoint == Endpoint::Chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return Json{
      {"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model}, {"system_fingerprint", nullptr}};
}

// One stream chunk: a delta of content / reasoning (and the ids behind it when asked), or, with finish_reason,
// the last choice chunk. role_chunk: the chat stream's first chunk, {"role": "assistant", "content": ""}.
inline Json chunk_json(const ResponseHead& h, const std::string& content, const std::string& reasoning,
                       const char* finish_reason, const std::vector<int32_t>* ids, bool role_chunk, bool usage_null) {
  Json j = head_json(h, true);
  Json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (finish_reason) choice["finish_reason"] = finish_reason;
  if (h.endpoint == Endpoint::Chat) {
    Json delta = Json::object();
    if (role_chunk) {
      delta["role"] = "assistant";
      delta["content"] = "";
    }
    if (!content.empty()) delta["content"] = content;
    if (!reasoning.empty()) delta["reasoning_content"] = reasoning;
    choice["delta"] = delta;
  } else {
    choice["text"] = content;
  }
  if (ids) choice["token_ids"] = *ids;
  j["choices"] = Json::array({choice});
  if (usage_null) j["usage"] = nullptr;
  return j;
}

// The non-streamed response.
inline Json response_json(const ResponseHead& h, const std::string& content, const std::string& reasoning,
                          const char* finish_reason, const std::vector<int32_t>* ids, const Json& usage) {
  Json j = head_json(h, false);
  Json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  if (h.endpoint == Endpoint::Chat) {
    Json msg = {{"role", "assistant"}, {"content", content}};
    if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
    choice["message"] = msg;
  } else {
    choice["text"] = content;
  }
  if (ids) choice["token_ids"] = *ids;
  j["choices"] = Json::array({choice});
  j["usage"] = usage;
  return j;
}

}  // namespace server
