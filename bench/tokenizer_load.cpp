// tokenizer_load: how long Tokenizer::load takes in a fresh process -- the cost a program pays once at start
// (the first load of a process pays the page faults of its fresh heap; a second load in the same process
// reuses that memory and measures faster, so it is not what a user sees).
//
//   tokenizer_load PATH [--runs N]     default N = 9
//
// Runs itself N times (fork + exec, each child loads PATH once and prints its wall time), then prints each
// run's wall time, minor page faults and peak RSS (from wait4) and the min / median; the load average is
// printed before and after (the machine is shared: compare runs made at similar loads).
// Exit status: 0 ok, 1 a load or a child failed, 2 bad command line.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../programs/args.hpp"
#include "gemma4_t4.hpp"

namespace {

// One load in this process: prints "<seconds>" on stdout.
int load_once(const char* path) {
  const auto t0 = std::chrono::steady_clock::now();
  gemma4_t4::Tokenizer tok;
  const gemma4_t4::Status st = gemma4_t4::Tokenizer::load(path, &tok);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!st) {
    std::fprintf(stderr, "tokenizer_load: %s\n", st.message.c_str());
    return 1;
  }
  std::printf("%.4f %zu\n", s, tok.vocab_size());
  return 0;
}

void print_loadavg(const char* when) {
  double l[3] = {0, 0, 0};
  if (getloadavg(l, 3) == 3) std::printf("load average %s: %.2f %.2f %.2f\n", when, l[0], l[1], l[2]);
}

struct Run {
  double seconds = 0;
  long minflt = 0, maxrss_kib = 0;
};

// Runs `self --child path` once; its wall time from its stdout, faults and RSS from wait4.
bool run_child(const char* self, const char* path, Run* out) {
  int fd[2];
  if (pipe(fd) != 0) return false;
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    close(fd[1]);
    execl(self, self, "--child", path, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fd[1]);
  std::string text;
  char buf[256];
  for (ssize_t n; (n = read(fd[0], buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
  close(fd[0]);
  int status = 0;
  rusage ru{};
  if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return false;
  out->seconds = std::atof(text.c_str());
  out->minflt = ru.ru_minflt;
  out->maxrss_kib = ru.ru_maxrss;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--child") == 0) return load_once(argv[2]);
  int runs = 9;
  std::vector<std::string> paths;
  args::Parser parser("tokenizer_load",
                      "usage: tokenizer_load PATH [--runs N]\n\n"
                      "Times Tokenizer::load of PATH (a tokenizer.json, a .model, or a directory) in N fresh "
                      "processes.\n\n");
  parser.integer("--runs", "N", &runs, 1, 10000, "fresh processes, each loading PATH once (default 9)");
  parser.positional(&paths);
  parser.footer("\nExit status: 0 ok, 1 a load or a child failed, 2 bad command line.\n");
  if (const int rc = parser.parse(argc, argv); rc >= 0) return rc;
  if (paths.size() != 1) {
    std::fprintf(stderr, "tokenizer_load: expected one PATH, got %zu (--help for usage)\n", paths.size());
    return 2;
  }
  const char* path = paths[0].c_str();
  print_loadavg("before");
  std::vector<Run> all;
  for (int i = 0; i < runs; ++i) {
    Run r;
    if (!run_child("/proc/self/exe", path, &r)) {
      std::fprintf(stderr, "tokenizer_load: run %d failed\n", i);
      return 1;
    }
    std::printf("run %d: %.3f s, %ld minor faults, peak RSS %.1f MiB\n", i, r.seconds, r.minflt,
                double(r.maxrss_kib) / 1024);
    all.push_back(r);
  }
  print_loadavg("after");
  std::vector<Run> by_time = all;
  std::sort(by_time.begin(), by_time.end(), [](const Run& a, const Run& b) { return a.seconds < b.seconds; });
  const Run& med = by_time[by_time.size() / 2];
  std::printf(
      "fresh-process load of %s, %d runs: min %.3f s, median %.3f s (median run: %ld minor faults, "
      "peak RSS %.1f MiB)\n",
      path, runs, by_time.front().seconds, med.seconds, med.minflt, double(med.maxrss_kib) / 1024);
  return 0;
}
