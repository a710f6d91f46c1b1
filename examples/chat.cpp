// chat: talk to a Gemma 4 model in the terminal. The answer streams as it is generated; each turn feeds the
// session only the tokens it does not hold yet (examples/conversation.hpp); Ctrl-C stops an answer.
//
//   chat [--model DIR] [--tokenizer PATH] [--cpu] [--max-context N] [sampling flags] [--max-tokens N]
//
// Commands: /reset, /system TEXT, /stats, /think on|off, /help, /quit. Ctrl-C during an answer stops that
// answer; Ctrl-C at the prompt discards the line typed so far; Ctrl-D on an empty line (end of input) leaves.
// At a terminal the prompt has line editing and history through libedit (GEMMA4_T4_LIBEDIT, the default
// CMake build); without it, or when standard input is not a terminal, lines are read as they come.
// Default model: the bundled tiny model (random weights: gibberish, but every part of the program runs).
// Exit status: 0 ok, 1 the model or tokenizer did not load (message on stderr), 2 bad command line.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <clocale>
#include <cstdio>
#include <string>

#ifdef GEMMA4_T4_LIBEDIT
#include <histedit.h>
#endif

#include "common.hpp"
#include "conversation.hpp"
#include "gemma4_t4.hpp"

namespace {

const char kUsage[] =
    "usage: chat [options]\n"
    "\n"
    "Talks to a Gemma 4 model: type a message, press Enter, the answer streams back.\n"
    "\n"
    "commands:\n"
    "  /reset           forget the conversation (the system prompt stays)\n"
    "  /system TEXT     set the system prompt (/system alone clears it)\n"
    "  /stats           timing of the last answer: time to first token, prefill and decode tok/s\n"
    "  /think on|off    let the model think before it answers (Gemma 4 thinking mode)\n"
    "  /help            this list\n"
    "  /quit            leave (so does Ctrl-D on an empty line)\n"
    "Ctrl-C during an answer stops that answer; at the prompt it discards the line typed so far.\n"
#ifdef GEMMA4_T4_LIBEDIT
    "At a terminal the prompt has line editing (arrow keys, Emacs keys) and history (up and down).\n"
#endif
    "\n";

const char kCommands[] =
    "/reset, /system TEXT, /stats, /think on|off, /help, /quit; Ctrl-C stops an answer, Ctrl-D leaves\n";

// Set by SIGINT, read by the token callback and the plain line reader. A lock-free atomic is
// async-signal-safe.
std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) { g_interrupted.store(true); }

// SIGINT without SA_RESTART: a blocked read() at the plain prompt returns (EINTR), so Ctrl-C discards the line.
void install_sigint() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
}

// Line: a line (without its newline); End: end of input (Ctrl-D on an empty line); Interrupted: Ctrl-C, the
// line typed so far discarded.
enum class Input { Line, End, Interrupted };

// The prompt's line reader: libedit at a terminal when built with it, else plain reads of standard input.
class LineReader {
 public:
  explicit LineReader(const char* prog) {
#ifdef GEMMA4_T4_LIBEDIT
    if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) return;
    std::setlocale(LC_CTYPE, "");  // libedit decodes and shows UTF-8 input by the locale
    el_ = el_init(prog, stdin, stdout, stderr);
    hist_ = history_init();
    if (!el_ || !hist_) {  // no editing then, but chat still works
      close();
      return;
    }
    HistEvent ev;
    history(hist_, &ev, H_SETSIZE, 1000);
    history(hist_, &ev, H_SETUNIQUE, 1);
    el_set(el_, EL_EDITOR, "emacs");
    el_set(el_, EL_PROMPT, &LineReader::prompt);
    el_set(el_, EL_HIST, history, hist_);
    el_set(el_, EL_CLIENTDATA, this);
    // Ctrl-C while editing reaches the editor as a key (the terminal's ISIG is off in its edit mode) and is
    // bound to a function that ends the line as discarded: no signal races the editor's own reads.
    el_set(el_, EL_SETTY, "-d", "-isig", nullptr);
    el_set(el_, EL_ADDFN, "chat-discard-line", "discard the line typed so far (Ctrl-C)", &LineReader::on_ctrl_c);
    el_set(el_, EL_BIND, "^C", "chat-discard-line", nullptr);
#else
    (void)prog;
#endif
  }
  ~LineReader() { close(); }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  Input read(std::string* line) {
    line->clear();
#ifdef GEMMA4_T4_LIBEDIT
    if (el_) {
      discarded_ = false;
      int count = 0;
      const char* got = el_gets(el_, &count);
      if (discarded_) {
        std::printf("^C\n");
        return Input::Interrupted;
      }
      if (!got || count <= 0) {
        if (count < 0 && errno == EINTR) return Input::Interrupted;  // SIGINT from elsewhere (kill -INT)
        return Input::End;
      }
      line->assign(got, static_cast<size_t>(count));
      while (!line->empty() && (line->back() == '\n' || line->back() == '\r')) line->pop_back();
      if (line->find_first_not_of(" \t") != std::string::npos) {
        HistEvent ev;
        history(hist_, &ev, H_ENTER, line->c_str());
      }
      return Input::Line;
    }
#endif
    return read_plain(line);
  }

  // Whether the reader shows its own prompt (libedit); else the caller prints it.
  bool edits() const {
#ifdef GEMMA4_T4_LIBEDIT
    return el_ != nullptr;
#else
    return false;
#endif
  }

  static constexpr const char* kPrompt = "you> ";

 private:
  // Plain reads: Ctrl-C interrupts the read (SIGINT without SA_RESTART) and the terminal drops the line.
  static Input read_plain(std::string* line) {
    for (;;) {
      if (g_interrupted.load()) return Input::Interrupted;
      errno = 0;
      const int c = std::getc(stdin);
      if (c == EOF) {
        const bool eintr = std::ferror(stdin) && errno == EINTR;
        std::clearerr(stdin);
        if (g_interrupted.load()) return Input::Interrupted;
        if (eintr) continue;  // another signal
        return line->empty() ? Input::End : Input::Line;
      }
      if (c == '\n') return Input::Line;
      line->push_back(static_cast<char>(c));
    }
  }

#ifdef GEMMA4_T4_LIBEDIT
  static const char* prompt(EditLine*) { return kPrompt; }

  static unsigned char on_ctrl_c(EditLine* el, int) {
    void* self = nullptr;
    el_get(el, EL_CLIENTDATA, &self);
    static_cast<LineReader*>(self)->discarded_ = true;
    const LineInfo* li = el_line(el);
    el_cursor(el, static_cast<int>(li->lastchar - li->cursor));  // to the end, so "^C" follows the text
    return CC_NEWLINE;
  }

  void close() {
    if (el_) el_end(el_);
    if (hist_) history_end(hist_);
    el_ = nullptr;
    hist_ = nullptr;
  }

  EditLine* el_ = nullptr;
  History* hist_ = nullptr;
  bool discarded_ = false;
#else
  void close() {}
#endif
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

void print_stats(const example::TurnStats& st, bool any, const gemma4_t4::Session& session) {
  if (!any) {
    std::printf("(no answer yet)\n");
    return;
  }
  const gemma4_t4::Timing& t = st.timing;
  std::printf("last answer: %zu tokens%s\n", st.tokens.size(), st.stopped_by_caller ? " (stopped)" : "");
  std::printf("  time to first token  %.2f ms\n", t.ttft_ms);
  std::printf("  prefill              %.1f tok/s (%zu new tokens; %zu reused from the session of %zu)\n",
              t.prefill_tok_s(), st.prefilled, st.reused, st.prompt_tokens);
  std::printf("  decode               %.1f tok/s (%zu tokens after the first in %.2f ms)\n", t.decode_tok_s(),
              t.generated_tokens > 0 ? t.generated_tokens - 1 : 0, t.decode_ms);
  std::printf("  context              %zu of %zu tokens\n", session.position(), session.max_context());
}

}  // namespace

int main(int argc, char** argv) {
  example::ModelArgs args;
  args::Parser parser("chat", kUsage);
  example::add_model_flags(&parser, &args);
  parser.footer("\nExit status: 0 ok, 1 the model or tokenizer did not load, 2 bad command line.\n");
  if (const int rc = parser.parse(argc, argv); rc >= 0) return rc;

  example::Loaded m;
  if (gemma4_t4::Status st = example::load(args, &m); !st) {
    std::fprintf(stderr, "chat: %s: %s\n", gemma4_t4::code_name(st.code), st.message.c_str());
    return 1;
  }
  gemma4_t4::Session session;
  if (gemma4_t4::Status st = m.engine.create_session(&session, m.context); !st) {
    std::fprintf(stderr, "chat: %s: %s\n", gemma4_t4::code_name(st.code), st.message.c_str());
    return 1;
  }
  example::Conversation conv(m.engine, m.tokenizer, std::move(session));

  const gemma4_t4::ModelConfig& cfg = m.engine.config();
  const gemma4_t4::SamplingOptions& so = m.generate.sampling;
  std::printf("gemma4_t4 %s chat: %s (%s backend, %d layers, vocab %d), context %zu tokens\n", GEMMA4_T4_VERSION_STRING,
              args.model.c_str(), example::backend_name(m.engine), cfg.num_layers, cfg.vocab_size, m.context);
  std::printf(
      "tokenizer %s; sampling: temperature %g, top-k %d, top-p %g, min-p %g, repeat penalty %g, seed %llu; "
      "at most %d tokens an answer\n",
      m.tokenizer_path.c_str(), so.temperature, so.top_k, so.top_p, so.min_p, so.repetition_penalty,
      static_cast<unsigned long long>(so.seed), m.generate.max_new_tokens);
  if (!args.model_given)
    std::printf(
        "(the bundled tiny model has random weights: its answers are gibberish; --model DIR for a real "
        "Gemma 4)\n");
  std::printf("%s", kCommands);

  install_sigint();
  LineReader reader("chat");
  example::TurnStats last;
  bool answered = false;
  std::string line;
  for (;;) {
    g_interrupted.store(false);
    std::printf("\n%s", reader.edits() ? "" : LineReader::kPrompt);  // libedit writes its prompt itself
    std::fflush(stdout);
    const Input in = reader.read(&line);
    if (in == Input::Interrupted) {  // Ctrl-C at the prompt: the line is gone, the program goes on
      if (!reader.edits()) std::printf("\n");
      continue;
    }
    if (in == Input::End) {  // Ctrl-D on an empty line, or the end of piped input
      std::printf("\n");
      break;
    }
    const std::string text = trim(line);
    if (text.empty()) continue;
    if (text[0] == '/') {
      const size_t sp = text.find(' ');
      const std::string cmd = text.substr(0, sp);
      const std::string rest = sp == std::string::npos ? "" : trim(text.substr(sp + 1));
      if (cmd == "/quit" || cmd == "/exit") break;
      if (cmd == "/help") {
        std::printf("%s", kCommands);
      } else if (cmd == "/reset") {
        conv.reset();
        std::printf("(conversation reset)\n");
      } else if (cmd == "/system") {
        conv.set_system(rest);
        std::printf(rest.empty() ? "(system prompt cleared)\n" : "(system prompt set)\n");
      } else if (cmd == "/stats") {
        print_stats(last, answered, conv.session());
      } else if (cmd == "/think" && (rest == "on" || rest == "off")) {
        conv.set_thinking(rest == "on");
        std::printf("(thinking %s)\n", rest.c_str());
      } else {
        std::printf("unknown command '%s'; the commands: %s", text.c_str(), kCommands);
      }
      continue;
    }

    std::printf("gemma> ");
    std::fflush(stdout);
    auto on_text = [](const std::string& piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return !g_interrupted.load();
    };
    const gemma4_t4::Status st = conv.ask(text, m.generate, on_text, nullptr, &last);
    std::clearerr(stdout);  // a write cut short by Ctrl-C (EINTR) must not stop later output
    if (!st) {
      std::printf("\n");
      std::fprintf(stderr, "chat: %s: %s\n", gemma4_t4::code_name(st.code), st.message.c_str());
      if (st.code == gemma4_t4::Code::ContextOverflow)
        std::fprintf(stderr, "chat: the conversation no longer fits: /reset, or start with a larger --max-context\n");
      continue;
    }
    answered = true;
    std::printf(last.stopped_by_caller ? " [stopped]\n" : "\n");
  }
  return 0;
}
