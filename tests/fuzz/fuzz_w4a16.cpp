// Fuzzes the w4a16 path from file to floats: the input is a model.safetensors, opened by detail::TensorStore
// (through a memfd), bound by detail::WeightBinder with the config of tests/fixtures/w4a16, and every row of
// every linear is unpacked (detail::linear_row -> unpack_w4_row for the pack-quantized ones).
#include "fuzz_common.hpp"

namespace {

const gemma4_t4::ModelConfig& fixture_config() {
  static const gemma4_t4::ModelConfig cfg = [] {
    gemma4_t4::ModelConfig c;
    const std::string path = GEMMA4_T4_FIXTURES "/w4a16/config.json";
    if (!gemma4_t4::detail::parse_config(fuzz::read_file(path), path, &c)) std::abort();
    return c;
  }();
  return cfg;
}

void unpack_all(const gemma4_t4::detail::LinearW& w, std::vector<float>* row) {
  if (w.out <= 0 || w.in <= 0) return;
  row->assign(size_t(w.in), 0.f);  // [in] fp32
  for (int o = 0; o < w.out; ++o) gemma4_t4::detail::linear_row(w, o, row->data());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gemma4_t4::detail;
  const gemma4_t4::ModelConfig& cfg = fixture_config();
  fuzz::MemFile file(data, size);
  TensorStore store;
  if (!store.open(file.path())) return 0;
  Weights w;
  if (!WeightBinder(store, cfg, "fuzz").bind(&w)) return 0;
  std::vector<float> row;
  unpack_all(w.ple_model_proj, &row);
  for (const LayerW& l : w.layers)
    for (const LinearW* lin : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.ple_gate, &l.ple_proj})
      unpack_all(*lin, &row);
  return 0;
}
