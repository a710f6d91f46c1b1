// Loads the bundled fixture through an installed gemma4_t4 and runs one forward step.
#include <cstdio>
#include <vector>

#include "gemma4_t4.hpp"

int main() {
  gemma4_t4::Engine engine;
  gemma4_t4::LoadOptions options;
  options.backend = gemma4_t4::Backend::Cpu;
  gemma4_t4::Status st = gemma4_t4::Engine::load(FIXTURE, options, &engine);
  gemma4_t4::Session session;
  if (st) st = engine.create_session(&session, 8);
  const int32_t bos = 2;
  std::vector<float> logits;
  if (st) st = engine.forward(session, &bos, 1, gemma4_t4::Logits::Last, &logits);
  if (!st) {
    std::fprintf(stderr, "consumer: %s\n", st.message.c_str());
    return 1;
  }
  std::printf("consumer: gemma4_t4 %s, next token %d\n", GEMMA4_T4_VERSION_STRING,
              gemma4_t4::argmax(logits.data(), logits.size()));
  return 0;
}
