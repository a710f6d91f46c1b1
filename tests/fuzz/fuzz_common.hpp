// Shared by the libFuzzer harnesses in tests/fuzz/ (see README.md there). Each harness is its own
// implementation unit: the library is compiled into it, CPU backend only, so the sanitizers and the
// fuzzer's coverage instrumentation see all of the library code.
#pragma once

#define GEMMA4_T4_NO_CUDA
#define GEMMA4_T4_IMPLEMENTATION
#include "gemma4_t4.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
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

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) std::abort();
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace fuzz
