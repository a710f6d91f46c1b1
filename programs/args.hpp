// The command-line parser of this repository's programs (examples/: chat, generate, generate_ids; bench/:
// bench, quick_bench, soak, tokenizer_load). Not part of the library: a program declares its flags once --
// name, value, range, help line -- and gets the parsing, the errors and the --help text from that one list.
//
//   args::Parser p("generate", "usage: generate [options] [PROMPT...]\n\n...");
//   p.section("output:");
//   p.flag("--json", &json, "one JSON object on stdout instead of the streamed text");
//   p.integer("--max-tokens", "N", &max_tokens, 0, 1 << 24, "most tokens per answer (default 512)");
//   p.positional(&words);                              // without it, a word that is not a flag is an error
//   p.footer("\nExit status: 0 ok, 1 an error, 2 bad command line.\n");
//   if (const int rc = p.parse(argc, argv); rc >= 0) return rc;   // 0 after --help, 2 after a bad command line
//
// --help / -h print the help to stdout. Errors go to stderr, one line naming the program, the flag, what it
// expected and what it got: "bench: --tokens: expected an integer from 2 to 16777216, got 'x' (--help for
// usage)". A flag may be given more than once (the last one wins; lists are replaced, not appended to).
// Values are whole arguments (`--tokens 8`; `--tokens=8` is not a form this parser reads).
#pragma once

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace args {

// The type a flag stores: T, also for a std::optional<T> target (which stays empty unless the flag is given).
template <class T>
struct Value {
  using type = T;
};
template <class T>
struct Value<std::optional<T>> {
  using type = T;
};
template <class T>
using value_t = typename Value<T>::type;

// Parses a whole decimal integer of type T in [lo, hi]; false for anything else (sign, garbage, overflow).
template <class T>
bool parse_integer(const char* s, T lo, T hi, T* out) {
  static_assert(std::is_integral<T>::value, "parse_integer: T must be an integer type");
  if (!s || !*s) return false;
  errno = 0;
  char* end = nullptr;
  if (std::is_unsigned<T>::value) {
    if (*s == '-') return false;  // strtoull would wrap "-1" around
    const unsigned long long v = std::strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < static_cast<unsigned long long>(lo) ||
        v > static_cast<unsigned long long>(hi))
      return false;
    *out = static_cast<T>(v);
  } else {
    const long long v = std::strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < static_cast<long long>(lo) || v > static_cast<long long>(hi)) return false;
    *out = static_cast<T>(v);
  }
  return true;
}

// Parses a whole decimal number in [lo, hi]; false for anything else (NaN included).
inline bool parse_number(const char* s, double lo, double hi, double* out) {
  if (!s || !*s) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (errno != 0 || *end != '\0' || !(v >= lo && v <= hi)) return false;
  *out = v;
  return true;
}

// "an integer from 1 to 4096", "an integer >= 0" (hi at the type's maximum or past 2^40: no upper bound said).
template <class T>
std::string integer_range(T lo, T hi) {
  const bool open = hi == std::numeric_limits<T>::max() || static_cast<long double>(hi) >= 1099511627776.0L;
  const std::string l = std::to_string(lo);
  return open ? ">= " + l : "from " + l + " to " + std::to_string(hi);
}

inline std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

class Parser {
 public:
  // Sets the value from the argument's text; returns "" or what was expected ("an integer >= 1").
  using Setter = std::function<std::string(const char* value)>;

  // program: names it in error messages; head: the help text before the flags (usage line, description).
  Parser(std::string program, std::string head) : program_(std::move(program)), head_(std::move(head)) {}

  // A heading line in the help, before the flags declared after it ("sampling:").
  void section(std::string title) { items_.push_back(Item{std::move(title), "", "", true, nullptr, nullptr}); }
  // Text printed after the flags (exit status, notes).
  void footer(std::string text) { footer_ += std::move(text); }
  // Column where the help of each flag starts (default 23); a longer flag puts its help on the next line.
  void help_column(size_t column) { column_ = column; }

  // A switch: sets *out = value.
  void flag(const char* name, bool* out, const char* help, bool value = true) {
    add(name, "", help, nullptr, [out, value] { *out = value; });
  }
  // A value kept as it is.
  void text(const char* name, const char* metavar, std::string* out, const char* help) {
    add(name, metavar, help, [out](const char* v) {
      *out = v;
      return std::string();
    });
  }

  // An integer in [lo, hi], into a T or a std::optional<T> (set only when given).
  template <class T>
  void integer(const char* name, const char* metavar, T* out, value_t<T> lo, value_t<T> hi, const char* help) {
    add(name, metavar, help, [out, lo, hi](const char* v) {
      value_t<T> x{};
      if (!parse_integer(v, lo, hi, &x)) return "an integer " + integer_range(lo, hi);
      *out = x;
      return std::string();
    });
  }

  // A number in [lo, hi], into a float, a double or an optional of one (set only when given).
  template <class T>
  void number(const char* name, const char* metavar, T* out, double lo, double hi, const char* help) {
    add(name, metavar, help, [out, lo, hi](const char* v) {
      double x = 0;
      if (!parse_number(v, lo, hi, &x)) return "a number from " + number_text(lo) + " to " + number_text(hi);
      *out = static_cast<value_t<T>>(x);
      return std::string();
    });
  }

  // Comma-separated integers, each in [lo, hi], at least one ("512,4096").
  template <class T>
  void list(const char* name, const char* metavar, std::vector<T>* out, value_t<T> lo, value_t<T> hi,
            const char* help) {
    add(name, metavar, help, [out, lo, hi](const char* v) {
      std::vector<T> got;
      const std::string s = v;
      for (size_t start = 0; start <= s.size();) {
        size_t comma = s.find(',', start);
        if (comma == std::string::npos) comma = s.size();
        T x{};
        if (!parse_integer(s.substr(start, comma - start).c_str(), lo, hi, &x))
          return "comma-separated integers, each " + integer_range(lo, hi);
        got.push_back(x);
        start = comma + 1;
      }
      *out = std::move(got);
      return std::string();
    });
  }

  // One of a few words, each standing for a value: p.choice("--lm-head", "KIND", &head, {{"f16", F16}, ...}).
  template <class T>
  void choice(const char* name, const char* metavar, T* out,
              std::initializer_list<std::pair<const char*, value_t<T>>> words, const char* help) {
    std::vector<std::pair<std::string, T>> w(words.begin(), words.end());
    add(name, metavar, help, [out, w](const char* v) {
      std::string expected = "one of";
      for (size_t i = 0; i < w.size(); ++i) {
        if (w[i].first == v) {
          *out = w[i].second;
          return std::string();
        }
        expected += (i ? ", " : " ") + w[i].first;
      }
      return expected;
    });
  }

  // Any other kind of value: set returns "" or what was expected.
  void custom(const char* name, const char* metavar, Setter set, const char* help) {
    add(name, metavar, help, std::move(set));
  }

  // Arguments that are not flags (a lone "-" is one) go to *out in order; without this they are errors.
  void positional(std::vector<std::string>* out) { positional_ = out; }

  // The help text: head, the flags in the order declared (with their sections; --help before the first
  // section, or last when there are none), the footer.
  std::string help() const {
    std::string help_flag = "  --help";
    help_flag.resize(column_, ' ');
    help_flag += "show this text\n";
    std::string s = head_;
    bool listed_help = false;
    for (const Item& it : items_) {
      if (it.heading) {
        if (!listed_help) s += help_flag;
        listed_help = true;
        s += it.name + "\n";
        continue;
      }
      std::string left = "  " + it.name + (it.metavar.empty() ? "" : " " + it.metavar);
      if (left.size() + 1 > column_) {
        s += left + "\n";
        left.clear();
      }
      left.resize(column_, ' ');
      s += left;
      for (char ch : it.help) s += ch == '\n' ? "\n" + std::string(column_, ' ') : std::string(1, ch);
      s += "\n";
    }
    if (!listed_help) s += help_flag;
    return s + footer_;
  }

  // Parses argv[1..argc). Returns -1 when the program should go on; else the exit status: 0 after printing the
  // help (--help, -h), 2 after printing what is wrong with the command line.
  int parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::fputs(help().c_str(), stdout);
        return 0;
      }
      Item* it = find(a);
      if (!it) {
        if (positional_ && (a.size() < 2 || a[0] != '-')) {
          positional_->push_back(a);
          continue;
        }
        return error(positional_ || a.rfind("-", 0) == 0 ? "unknown option '" + a + "'"
                                                         : "unexpected argument '" + a + "'");
      }
      if (it->action) {
        it->action();
        continue;
      }
      if (i + 1 >= argc) return error(a + ": expected " + it->metavar + ", got nothing");
      const char* v = argv[++i];
      const std::string expected = it->set(v);
      if (!expected.empty()) return error(a + ": expected " + expected + ", got '" + v + "'");
    }
    return -1;
  }

 private:
  struct Item {
    std::string name, metavar, help;
    bool heading = false;
    Setter set;                    // valued flags
    std::function<void()> action;  // switches
  };

  void add(const char* name, const char* metavar, const char* help, Setter set, std::function<void()> action = {}) {
    items_.push_back(Item{name, metavar, help, false, std::move(set), std::move(action)});
  }

  Item* find(const std::string& name) {
    for (Item& it : items_)
      if (!it.heading && it.name == name) return &it;
    return nullptr;
  }

  int error(const std::string& what) const {
    std::fprintf(stderr, "%s: %s (--help for usage)\n", program_.c_str(), what.c_str());
    return 2;
  }

  std::string program_, head_, footer_;
  std::vector<Item> items_;
  std::vector<std::string>* positional_ = nullptr;
  size_t column_ = 23;
};

}  // namespace args
