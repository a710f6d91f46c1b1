// The conversation logic of examples/chat.cpp, in a header so that tests/test_conversation.cpp can run it.
//
// Each turn renders the whole conversation with format_chat (the template re-renders earlier turns:
// thinking stripped from model turns, text trimmed) and encodes it. When the tokens the session already
// holds are a prefix of that encoding, only the rest is fed; otherwise (a changed system prompt, thinking
// switched, an answer whose text encodes to other tokens than the ones sampled) the session is rewound and
// the whole conversation is fed again. Either way the model sees exactly the rendered conversation.
#pragma once

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gemma4_t4.hpp"

namespace example {

// What the last turn did.
struct TurnStats {
  gemma4_t4::Timing timing;        // prompt_tokens = the tokens fed this turn (`prefilled`)
  size_t prompt_tokens = 0;        // the whole rendered conversation, this turn's user message included
  size_t reused = 0;               // of those, already in the session
  size_t prefilled = 0;            // of those, fed this turn
  std::vector<int32_t> tokens;     // the answer's tokens (a stop token excluded)
  bool stopped_by_caller = false;  // on_text returned false
};

class Conversation {
 public:
  // The session must be empty or hold nothing this conversation relies on (it is rewound when needed).
  Conversation(const gemma4_t4::Engine& engine, const gemma4_t4::Tokenizer& tokenizer, gemma4_t4::Session session)
      : engine_(&engine), tokenizer_(&tokenizer), session_(std::move(session)) {}

  void set_system(std::string text) { system_ = std::move(text); }  // "" = no system turn
  void set_thinking(bool on) { thinking_ = on; }
  const std::string& system() const { return system_; }
  bool thinking() const { return thinking_; }
  const std::vector<gemma4_t4::Message>& history() const { return history_; }
  const gemma4_t4::Session& session() const { return session_; }

  // Forgets the history (the system prompt stays) and rewinds the session.
  void reset() {
    history_.clear();
    held_.clear();
    session_.reset();
  }

  // One turn: the user's message in, the model's answer out (*answer, may be null). on_text (may be empty)
  // receives the answer's text as it streams, whole UTF-8 characters at a time ("" while a character's
  // bytes are still coming); false stops the answer, which is kept as far as it got. On error the history
  // is unchanged and the session is rewound (the next turn feeds the whole conversation).
  gemma4_t4::Status ask(const std::string& user, const gemma4_t4::GenerateOptions& options,
                        const std::function<bool(const std::string& text)>& on_text, std::string* answer,
                        TurnStats* stats) {
    using namespace gemma4_t4;
    TurnStats local;
    TurnStats& st = stats ? *stats : local;
    st = TurnStats();
    std::vector<Message> messages;
    if (!system_.empty()) messages.push_back({"system", system_});
    messages.insert(messages.end(), history_.begin(), history_.end());
    messages.push_back({"user", user});
    ChatOptions chat;
    chat.thinking = thinking_;
    std::string text;
    if (Status s = format_chat(messages, chat, &text); !s) return s;
    std::vector<int32_t> ids;
    if (Status s = tokenizer_->encode(text, &ids); !s) return s;

    const bool prefix = held_.size() < ids.size() && session_.position() == held_.size() &&
                        std::equal(held_.begin(), held_.end(), ids.begin());
    if (!prefix) {
      session_.reset();
      held_.clear();
    }
    st.prompt_tokens = ids.size();
    st.reused = held_.size();
    const std::vector<int32_t> feed(ids.begin() + long(held_.size()), ids.end());
    st.prefilled = feed.size();

    gemma4_t4::Tokenizer::Streamer stream(*tokenizer_);
    std::string said;
    auto on_token = [&](int32_t id) {
      std::string piece;
      if (!stream.put(id, &piece)) piece = "\xEF\xBF\xBD";  // an id the tokenizer lacks: U+FFFD
      said += piece;
      const bool go_on = !on_text || on_text(piece);
      st.stopped_by_caller |= !go_on;
      return go_on;
    };
    Status s = generate(*engine_, session_, feed, options, on_token, &st.tokens, &st.timing);
    std::string tail;
    stream.flush(&tail);
    if (!tail.empty()) {
      said += tail;
      if (on_text) on_text(tail);
    }
    if (!s) {
      session_.reset();
      held_.clear();
      return s;
    }
    held_ = std::move(ids);  // generate() fed every answer token it kept
    held_.insert(held_.end(), st.tokens.begin(), st.tokens.end());
    if (session_.position() != held_.size()) {  // cannot happen; never reuse a cache we cannot account for
      session_.reset();
      held_.clear();
    }
    history_.push_back({"user", user});
    history_.push_back({"model", said});
    if (answer) *answer = std::move(said);
    return Status::ok();
  }

 private:
  const gemma4_t4::Engine* engine_;
  const gemma4_t4::Tokenizer* tokenizer_;
  gemma4_t4::Session session_;
  std::string system_;
  bool thinking_ = false;
  std::vector<gemma4_t4::Message> history_;
  std::vector<int32_t> held_;  // the tokens the session holds, in order
};

}  // namespace example
