// server_reference: what the library's own generate() gives for requests the server tests send -- the
// reference their responses must equal. Written apart from the server's code on purpose: prompts built with
// format_chat / Tokenizer::encode, one fresh session and one generate() call per request, the text decoded in
// one piece afterwards (Tokenizer::decode) and cut at the first stop string by searching the decoded prefixes.
//
//   server_reference REQUESTS.json            prints a JSON array, one object per request
//
// Each request: {"messages": [{"role", "content"}...] | "prompt": "text" | "prompt_ids": [ids], "thinking": bool,
// "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "ignore_eos",
// "stop": [strings]}; unset sampling fields take the tiny model's generation_config.json (examples/tiny), as the
// server's do. Each answer: {"prompt_tokens", "token_ids", "content", "reasoning", "finish_reason",
// "completion_tokens"}: token_ids and completion_tokens stop at the token that completed a stop string.
#include <algorithm>
#include <atomic>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "gemma4_t4.hpp"

using nlohmann::json;

namespace {

// ids -> (content, reasoning): special tokens left out; with thinking, <|channel>...<channel|> is reasoning
// (its leading "thought\n" dropped).
void split_text(const gemma4_t4::Tokenizer& tok, const std::vector<int32_t>& ids, bool thinking, std::string* content,
                std::string* reasoning) {
  const int32_t open = thinking ? tok.token_id("<|channel>") : -1, close = thinking ? tok.token_id("<channel|>") : -1;
  std::vector<int32_t> c, r;
  std::vector<std::vector<int32_t>> thoughts;
  bool in = false;
  for (int32_t id : ids) {
    if (open >= 0 && id == open && !in) {
      in = true;
      thoughts.emplace_back();
    } else if (close >= 0 && id == close && in) {
      in = false;
    } else if (!tok.is_special(id)) {
      (in ? thoughts.back() : c).push_back(id);
    }
  }
  tok.decode(c.data(), c.size(), content);
  reasoning->clear();
  for (const auto& t : thoughts) {
    std::string s;
    tok.decode(t.data(), t.size(), &s);
    if (s.rfind("thought\n", 0) == 0) s.erase(0, 8);
    *reasoning += s;
  }
}

// generate() alone for one request.
gemma4_t4::Status answer(const example::Loaded& m, const json& q, json* answer) {
  std::vector<int32_t> prompt;
  const bool thinking = q.value("thinking", false);
  if (q.contains("messages")) {
    std::vector<gemma4_t4::Message> msgs;
    for (const json& mj : q["messages"]) msgs.push_back({mj["role"], mj["content"]});
    gemma4_t4::ChatOptions chat;
    chat.thinking = thinking;
    m.tokenizer.encode(gemma4_t4::format_chat(msgs, chat), &prompt);
  } else if (q.contains("prompt")) {
    m.tokenizer.encode(q["prompt"].get<std::string>(), &prompt);
    if (prompt.empty() || prompt[0] != m.engine.config().bos_token_id)
      prompt.insert(prompt.begin(), m.engine.config().bos_token_id);
  } else {
    prompt = q["prompt_ids"].get<std::vector<int32_t>>();
  }
  gemma4_t4::GenerateOptions g = m.generate;
  gemma4_t4::SamplingOptions& s = g.sampling;
  s.temperature = q.value("temperature", s.temperature);
  s.top_p = q.value("top_p", s.top_p);
  s.top_k = q.value("top_k", s.top_k);
  s.min_p = q.value("min_p", s.min_p);
  s.repetition_penalty = q.value("repetition_penalty", s.repetition_penalty);
  s.seed = q.value("seed", uint64_t(0));
  g.max_new_tokens = q.value("max_tokens", 16);
  if (q.value("ignore_eos", false)) {
    g.stop_at_eos = false;
    g.stop_tokens.clear();
  }
  gemma4_t4::Session session;
  std::vector<int32_t> out;
  gemma4_t4::Timing timing;
  if (gemma4_t4::Status st = m.engine.create_session(&session, m.context); !st) return st;
  if (gemma4_t4::Status st = gemma4_t4::generate(m.engine, session, prompt, g, nullptr, &out, &timing); !st) return st;
  std::string finish = timing.generated_tokens > out.size() ? "stop" : "length";
  size_t completion = timing.generated_tokens;
  std::string content, reasoning;
  split_text(m.tokenizer, out, thinking, &content, &reasoning);
  const std::vector<std::string> stops = q.value("stop", std::vector<std::string>());
  if (!stops.empty()) {
    for (size_t i = 1; i <= out.size(); ++i) {
      std::string c, r;
      split_text(m.tokenizer, std::vector<int32_t>(out.begin(), out.begin() + std::ptrdiff_t(i)), thinking, &c, &r);
      size_t at = std::string::npos;
      for (const std::string& stop : stops) at = std::min(at, c.find(stop));
      if (at == std::string::npos) continue;
      content = c.substr(0, at);
      reasoning = r;
      out.resize(i);
      completion = i;
      finish = "stop";
      break;
    }
  }
  *answer = json{{"prompt_tokens", prompt.size()}, {"token_ids", out},        {"content", content},
                 {"reasoning", reasoning},         {"finish_reason", finish}, {"completion_tokens", completion}};
  return gemma4_t4::Status::ok();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: server_reference REQUESTS.json\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  std::stringstream ss;
  ss << in.rdbuf();
  const json requests = json::parse(ss.str(), nullptr, false);
  if (!in || requests.is_discarded() || !requests.is_array()) {
    std::cerr << "server_reference: " << argv[1] << " is not a JSON array\n";
    return 1;
  }
  example::ModelArgs args;
  args.cpu = true;
  example::Loaded m;
  if (gemma4_t4::Status st = example::load(args, &m); !st) {
    std::cerr << "server_reference: " << st.message << "\n";
    return 1;
  }
  // one request per thread at a time (the engine is shared, each session is the thread's own)
  std::vector<json> answers(requests.size());
  std::vector<std::string> errors(requests.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < requests.size();)
      if (gemma4_t4::Status st = answer(m, requests[i], &answers[i]); !st) errors[i] = st.message;
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < std::max(1u, std::min(8u, std::thread::hardware_concurrency())); ++t)
    pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (const std::string& e : errors)
    if (!e.empty()) {
      std::cerr << "server_reference: " << e << "\n";
      return 1;
    }
  std::cout << json(answers).dump(1, ' ', false, json::error_handler_t::replace) << "\n";
  return 0;
}
