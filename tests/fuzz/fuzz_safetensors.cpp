// Fuzzes the safetensors reader. The first input byte picks the target:
//   even: the rest is one .safetensors file, parsed in memory (detail::parse_safetensors);
//   odd:  the rest is a model.safetensors.index.json, opened by detail::TensorStore in a directory that
//         also holds the two shards of tests/fixtures/flat_keqv (symlinks).
#include "fuzz_common.hpp"

#include <sys/stat.h>

#include <filesystem>

namespace {

namespace fs = std::filesystem;

// A directory of this process under /dev/shm with the real shards; the index is rewritten per input.
struct IndexDir {
  std::string dir;
  IndexDir() {
    dir = "/dev/shm/gemma4_t4_fuzz_index_" + std::to_string(::getpid());
    std::error_code ec;
    fs::create_directories(dir, ec);
    for (const char* shard : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
      fs::remove(dir + "/" + shard, ec);
      fs::create_symlink(std::string(GEMMA4_T4_FIXTURES "/flat_keqv/") + shard, dir + "/" + shard, ec);
      if (ec) std::abort();
    }
  }
  ~IndexDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gemma4_t4::detail;
  if (size == 0) return 0;
  if ((data[0] & 1) == 0) {
    std::vector<TensorInfo> tensors;
    if (parse_safetensors(data + 1, size - 1, "fuzz", &tensors)) {
      float sink = 0;  // touch every tensor's first and last byte: the ranges must be inside the input
      for (const TensorInfo& t : tensors)
        if (t.nbytes) sink += float(t.data[0]) + float(t.data[t.nbytes - 1]);
      if (sink < 0) std::abort();
    }
    return 0;
  }
  static IndexDir index_dir;
  {
    std::ofstream out(index_dir.dir + "/model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data + 1), std::streamsize(size - 1));
  }
  TensorStore store;
  if (store.open(index_dir.dir)) {
    float sink = 0;
    for (const auto& kv : store.tensors())
      if (kv.second.nbytes) sink += float(kv.second.data[kv.second.nbytes - 1]);
    if (sink < 0) std::abort();
  }
  return 0;
}
