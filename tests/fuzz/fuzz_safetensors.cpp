// Fuzzes the safetensors reader. The first input byte picks the target:
//   even: the rest is one .safetensors file, parsed in memory (detail::parse_safetensors);
//   odd:  the rest is a model.safetensors.index.json, opened by detail::TensorStore in a directory that
//         also holds (symlinks) the two shards of tests/fixtures/flat_keqv (model-0000N-of-00002.safetensors,
//         3.5 KB headers) and the two micro shards make_seeds.py writes to data/ (micro-0000N-of-00002).
#include "fuzz_common.hpp"

#include <sys/stat.h>

#include <filesystem>

namespace {

namespace fs = std::filesystem;

// A directory of this process under /dev/shm with the shards; the index is rewritten per input.
struct IndexDir {
  std::string dir;
  IndexDir() {
    dir = "/dev/shm/gemma4_t4_fuzz_index_" + std::to_string(::getpid());
    std::error_code ec;
    fs::create_directories(dir, ec);
    int linked = 0;
    for (const char* n : {"1", "2"}) {
      const std::string shard = std::string("-0000") + n + "-of-00002.safetensors";
      for (const std::string& from :
           {fuzz::fixtures_dir() + "/flat_keqv/model" + shard, fuzz::data_dir() + "/micro" + shard}) {
        const std::string to = dir + "/" + fs::path(from).filename().string();
        fs::remove(to, ec);
        if (!fuzz::is_file(from)) {
          std::fprintf(stderr, "fuzz_safetensors: no shard %s (GEMMA4_T4_FIXTURES / GEMMA4_T4_FUZZ_DATA)\n",
                       from.c_str());
          continue;
        }
        fs::create_symlink(fs::absolute(from), to, ec);
        if (!ec) ++linked;
      }
    }
    if (linked == 0) std::exit(2);
  }
  ~IndexDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

IndexDir* g_index_dir = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static IndexDir index_dir;
  g_index_dir = &index_dir;
  return 0;
}

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
  {
    std::ofstream out(g_index_dir->dir + "/model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data + 1), std::streamsize(size - 1));
  }
  TensorStore store;
  if (store.open(g_index_dir->dir)) {
    float sink = 0;
    for (const auto& kv : store.tensors())
      if (kv.second.nbytes) sink += float(kv.second.data[kv.second.nbytes - 1]);
    if (sink < 0) std::abort();
  }
  return 0;
}
