// A fresh directory under the system temp dir, unique per process and call, removed (with its contents)
// when it goes out of scope. Shared by the tests that write files.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>

namespace testutil {

class TempDir {
 public:
  TempDir() {
    static std::atomic<unsigned> counter{0};
    std::random_device rd;
    for (int attempt = 0;; ++attempt) {
      path_ = std::filesystem::temp_directory_path() / ("gemma4_t4_test_" + std::to_string(::getpid()) + "_" +
                                                        std::to_string(counter++) + "_" + std::to_string(rd()));
      std::error_code ec;
      if (std::filesystem::create_directory(path_, ec)) break;
      if (attempt > 100)
        throw std::runtime_error("cannot create a temp dir under " + std::filesystem::temp_directory_path().string());
    }
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace testutil
