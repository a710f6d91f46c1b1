// Shared by the libFuzzer harnesses in tests/fuzz/ (see README.md there). Each harness is its own
// implementation unit: the library is compiled into it, CPU backend only, so the sanitizers and the
// fuzzer's coverage instrumentation see all of the library code.
#pragma once

#define GEMMA4_T4_NO_CUDA
#define GEMMA4_T4_IMPLEMENTATION
#include "gemma4_t4.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace fuzz {

// An anonymous in-memory file (memfd) holding one input, for the loaders that only take a path. path() is
// /proc/self/fd/N: a regular file to stat/open/mmap, gone when the object is.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("gemma4_t4_fuzz", MFD_CLOEXEC);
    if (fd_ < 0) std::abort();  // the harness, not the library, failed
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) std::abort();
      done += size_t(n);
    }
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_ = -1;
};

// ---- files beside the input ----
// The harnesses read the repository's fixtures and what make_seeds.py writes into the seeds' data/ folder.
// Both folders are fixed at build time (GEMMA4_T4_FIXTURES, GEMMA4_T4_FUZZ_DATA) and overridden by the
// environment variables of the same names, so that the binaries also run from a copied folder
// (tools/fuzz_campaign.sh).

inline std::string env_or(const char* name, const char* built_in) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : std::string(built_in);
}

inline const std::string& fixtures_dir() {
  static const std::string dir = env_or("GEMMA4_T4_FIXTURES", GEMMA4_T4_FIXTURES);
  return dir;
}

inline const std::string& data_dir() {
  static const std::string dir = env_or("GEMMA4_T4_FUZZ_DATA", GEMMA4_T4_FUZZ_DATA);
  return dir;
}

inline bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A file the harness cannot run without: a missing one stops the run with a message (not a finding).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz harness: cannot read %s (set GEMMA4_T4_FIXTURES / GEMMA4_T4_FUZZ_DATA)\n", path.c_str());
    std::exit(2);
  }
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace fuzz
