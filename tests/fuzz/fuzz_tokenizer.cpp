// Fuzzes tokenizer.json loading, then encode/decode with what loaded. Input: the tokenizer.json text, then
// optionally a NUL byte and a text to encode (default "Hello world"). Tokenizer::load only takes a path:
// the JSON goes to a memfd. The encoded ids are decoded again, whole and through a Streamer, and the
// text's bytes are also decoded as raw ids (valid and invalid ones).
#include "fuzz_common.hpp"

#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t json_size = nul ? size_t(nul - data) : size;
  const std::string text =
      nul ? std::string(reinterpret_cast<const char*>(nul + 1), size - json_size - 1) : std::string("Hello world");
  gemma4_t4::Tokenizer tok;
  {
    fuzz::MemFile file(data, json_size);
    if (!gemma4_t4::Tokenizer::load(file.path(), &tok)) return 0;
  }
  std::vector<int32_t> ids;
  std::string out;
  if (tok.encode(text, &ids)) (void)tok.decode(ids.data(), ids.size(), &out);
  gemma4_t4::Tokenizer::Streamer streamer(tok);
  for (int32_t id : ids) (void)streamer.put(id, &out);
  std::vector<int32_t> raw;  // arbitrary ids, including out-of-range and negative ones
  for (size_t i = 0; i + 1 < text.size() && raw.size() < 64; i += 2)
    raw.push_back(int32_t(int8_t(text[i])) * 256 + uint8_t(text[i + 1]));
  (void)tok.decode(raw.data(), raw.size(), &out);
  for (int32_t id : raw) {
    (void)tok.piece(id);
    (void)tok.is_special(id);
  }
  return 0;
}
