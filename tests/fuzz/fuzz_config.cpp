// Fuzzes config.json parsing: the input is the text of a config.json (detail::parse_config, in memory).
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  gemma4_t4::ModelConfig cfg;
  (void)gemma4_t4::detail::parse_config(text, "fuzz/config.json", &cfg);
  return 0;
}
