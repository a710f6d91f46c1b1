// Fuzzes format_chat. Input: one options byte (bit 0 add_bos, bit 1 add_generation_prompt, bit 2
// thinking), then messages separated by 0x1E, each "role 0x1F content 0x1F reasoning" (missing fields are
// empty). make_seeds.py turns tests/data/chat/conversations.json into this form.
#include "fuzz_common.hpp"

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t begin = 0;
  for (;;) {
    const size_t end = s.find(sep, begin);
    parts.push_back(s.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) return parts;
    begin = end + 1;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  gemma4_t4::ChatOptions options;
  options.add_bos = data[0] & 1;
  options.add_generation_prompt = data[0] & 2;
  options.thinking = data[0] & 4;
  std::vector<gemma4_t4::Message> messages;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  if (!body.empty())
    for (const std::string& record : split(body, '\x1e')) {
      const std::vector<std::string> f = split(record, '\x1f');
      gemma4_t4::Message m;
      m.role = f[0];
      if (f.size() > 1) m.content = f[1];
      if (f.size() > 2) m.reasoning = f[2];
      messages.push_back(std::move(m));
    }
  std::string out;
  (void)gemma4_t4::format_chat(messages, options, &out);
  (void)gemma4_t4::detail::strip_thinking(body);
  (void)gemma4_t4::detail::py_strip(body);
  return 0;
}
