// generate: one prompt in, the model's text out.
//
//   generate [options] [PROMPT...]        no PROMPT: the text is read from stdin (a terminal is told so)
//
// By default the prompt is one user turn of the Gemma 4 chat template (--raw: fed as it is) and the answer
// streams to stdout; --json prints one JSON object instead (fields in kUsage). Model and sampling flags as
// for examples/chat.cpp. Default model: the bundled tiny model (random weights: gibberish output).
// Exit status: 0 ok, 1 an error (message on stderr; with --json also in the object), 2 bad command line.

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common.hpp"
#include "gemma4_t4.hpp"

namespace {

const char kUsage[] =
    "usage: generate [options] [PROMPT...]\n"
    "\n"
    "Generates the model's answer to PROMPT (the words joined with spaces; none: read stdin to its end).\n"
    "An empty prompt (nothing but white space) is an error.\n"
    "\n";

const char kJsonHelp[] =
    "one JSON object on stdout instead of the streamed text:\n"
    "  text              the generated text (a stop token excluded)\n"
    "  tokens            its token ids\n"
    "  finish_reason     \"stop\" (an end-of-turn token), \"length\" (--max-tokens) or\n"
    "                    \"error\"\n"
    "  error             what went wrong (only when finish_reason is \"error\")\n"
    "  prompt_tokens     tokens fed before the first generated one\n"
    "  generated_tokens  tokens sampled (a stop token included)\n"
    "  timing            {ttft_ms, decode_ms, prefill_tok_s, decode_tok_s}\n"
    "  model, backend    the checkpoint directory; \"cpu\" or \"cuda\"\n"
    "Without --json the text streams to stdout and a timing line goes to stderr.";

// Pretty JSON; text that is not UTF-8 (a path from the command line) is written with U+FFFD, not thrown.
std::string dump(const nlohmann::json& j) { return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace); }

}  // namespace

int main(int argc, char** argv) {
  example::ModelArgs args;
  bool chat = true, json = false, think = false;
  std::string system;
  std::vector<std::string> words;
  args::Parser parser("generate", kUsage);
  parser.section("prompt:");
  parser.flag("--chat", &chat, "wrap the prompt in the chat template as a user turn (the default)");
  parser.flag("--raw", &chat, "feed the prompt text as it is (no template; write <bos> yourself)", false);
  parser.text("--system", "TEXT", &system, "a system turn before it (chat only)");
  parser.flag("--think", &think, "thinking mode (chat only)");
  parser.section("output:");
  parser.flag("--json", &json, kJsonHelp);
  example::add_model_flags(&parser, &args);
  parser.positional(&words);
  parser.footer("\nExit status: 0 ok, 1 an error (message on stderr), 2 bad command line.\n");
  if (const int rc = parser.parse(argc, argv); rc >= 0) return rc;
  const bool prompt_given = !words.empty();
  std::string prompt;
  for (size_t i = 0; i < words.size(); ++i) prompt += (i ? " " : "") + words[i];
  if (!prompt_given) {
    if (isatty(STDIN_FILENO))  // else it looks as if generate hangs
      std::fprintf(stderr,
                   "generate: reading the prompt from standard input (end it with Ctrl-D; or give it as "
                   "arguments: generate \"PROMPT\"; --help for usage)\n");
    prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }

  nlohmann::json out = nlohmann::json::object();
  auto fail = [&](const gemma4_t4::Status& st) {
    std::fprintf(stderr, "generate: %s: %s\n", gemma4_t4::code_name(st.code), st.message.c_str());
    if (json) {
      out["finish_reason"] = "error";
      out["error"] = std::string(gemma4_t4::code_name(st.code)) + ": " + st.message;
      std::printf("%s\n", dump(out).c_str());
    }
    return 1;
  };

  // An empty prompt (nothing but white space) is a mistake, not a request for the model's free run.
  if (prompt.find_first_not_of(" \t\r\n") == std::string::npos)
    return fail(
        gemma4_t4::Status(gemma4_t4::Code::InvalidArgument,
                          prompt_given ? "the prompt is empty" : "the prompt read from standard input is empty"));

  example::Loaded m;
  if (gemma4_t4::Status st = example::load(args, &m); !st) return fail(st);
  out["model"] = args.model;
  out["backend"] = example::backend_name(m.engine);

  std::string text = prompt;
  if (chat) {
    std::vector<gemma4_t4::Message> messages;
    if (!system.empty()) messages.push_back({"system", system});
    messages.push_back({"user", prompt});
    gemma4_t4::ChatOptions co;
    co.thinking = think;
    if (gemma4_t4::Status st = gemma4_t4::format_chat(messages, co, &text); !st) return fail(st);
  }
  std::vector<int32_t> ids;
  if (gemma4_t4::Status st = m.tokenizer.encode(text, &ids); !st) return fail(st);
  if (ids.empty()) return fail(gemma4_t4::Status(gemma4_t4::Code::InvalidArgument, "the prompt is empty"));
  gemma4_t4::Session session;
  if (gemma4_t4::Status st = m.engine.create_session(&session, m.context); !st) return fail(st);

  gemma4_t4::Tokenizer::Streamer stream(m.tokenizer);
  std::string said;
  auto on_token = [&](int32_t id) {
    std::string piece;
    if (!stream.put(id, &piece)) piece = "\xEF\xBF\xBD";  // an id the tokenizer lacks
    said += piece;
    if (!json) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
  std::vector<int32_t> tokens;
  gemma4_t4::Timing t;
  const gemma4_t4::Status st = gemma4_t4::generate(m.engine, session, ids, m.generate, on_token, &tokens, &t);
  std::string tail;
  stream.flush(&tail);
  said += tail;
  if (!json) std::printf("%s\n", tail.c_str());

  const gemma4_t4::FinishReason why = !st                                  ? gemma4_t4::FinishReason::Error
                                      : t.generated_tokens > tokens.size() ? gemma4_t4::FinishReason::Stop
                                                                           : gemma4_t4::FinishReason::Length;
  if (json) {
    out["text"] = said;
    out["tokens"] = tokens;
    out["finish_reason"] = gemma4_t4::finish_reason_name(why);
    out["prompt_tokens"] = t.prompt_tokens;
    out["generated_tokens"] = t.generated_tokens;
    out["timing"] = {{"ttft_ms", t.ttft_ms},
                     {"decode_ms", t.decode_ms},
                     {"prefill_tok_s", t.prefill_tok_s()},
                     {"decode_tok_s", t.decode_tok_s()}};
  } else {
    std::fprintf(stderr,
                 "[%zu prompt tokens, %zu generated (%s); time to first token %.2f ms, prefill %.1f tok/s, "
                 "decode %.1f tok/s]\n",
                 t.prompt_tokens, t.generated_tokens, gemma4_t4::finish_reason_name(why), t.ttft_ms, t.prefill_tok_s(),
                 t.decode_tok_s());
  }
  if (!st) return fail(st);
  if (json) std::printf("%s\n", dump(out).c_str());
  return 0;
}
