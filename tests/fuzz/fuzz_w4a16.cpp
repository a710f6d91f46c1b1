// Fuzzes the w4a16 path from file to floats: the input is a model.safetensors, indexed by detail::TensorStore
// (open_memory: in place, so a read past the input hits AddressSanitizer's redzone), bound by
// detail::WeightBinder against each micro config, and every row of every linear that bound is unpacked
// (detail::linear_row -> unpack_w4_row for the pack-quantized ones).
//
// The configs are the data/w4a16_config_*.json that make_seeds.py writes (two micro models of width 32 that
// differ in layout and features; their seeds are 13-20 KB). Without them the harness binds against
// tests/fixtures/w4a16/config.json, whose 600 KB checkpoint fuzzes ~30x slower.
#include "fuzz_common.hpp"

#include <algorithm>
#include <filesystem>

namespace {

std::vector<gemma4_t4::ModelConfig> g_configs;  // set once in LLVMFuzzerInitialize

void unpack_all(const gemma4_t4::detail::LinearW& w, std::vector<float>* row) {
  if (w.out <= 0 || w.in <= 0) return;
  row->assign(size_t(w.in), 0.f);  // [in] fp32
  for (int o = 0; o < w.out; ++o) gemma4_t4::detail::linear_row(w, o, row->data());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  namespace fs = std::filesystem;
  std::vector<std::string> paths;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fuzz::data_dir(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("w4a16_config", 0) == 0 && e.path().extension() == ".json") paths.push_back(e.path().string());
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) {
    paths.push_back(fuzz::fixtures_dir() + "/w4a16/config.json");
    std::fprintf(stderr, "fuzz_w4a16: no w4a16_config*.json in %s (GEMMA4_T4_FUZZ_DATA): binding against %s\n",
                 fuzz::data_dir().c_str(), paths.back().c_str());
  }
  for (const std::string& path : paths) {
    g_configs.emplace_back();
    const gemma4_t4::Status st = gemma4_t4::detail::parse_config(fuzz::read_file(path), path, &g_configs.back());
    if (!st) {
      std::fprintf(stderr, "fuzz_w4a16: %s\n", st.message.c_str());
      std::exit(2);
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gemma4_t4::detail;
  TensorStore store;
  if (!store.open_memory(data, size, "fuzz")) return 0;
  std::vector<float> row;
  for (const gemma4_t4::ModelConfig& cfg : g_configs) {
    Weights w;
    if (!WeightBinder(store, cfg, "fuzz").bind(&w)) continue;
    if (w.file_bytes() > size || !(w.decode_bytes() > 0)) std::abort();  // what was bound lies in the input
    unpack_all(w.ple_model_proj, &row);
    for (const LayerW& l : w.layers)
      for (const LinearW* lin : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.ple_gate, &l.ple_proj})
        unpack_all(*lin, &row);
  }
  return 0;
}
