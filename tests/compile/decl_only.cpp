// Compile-only test (a): the declaration part of gemma4_t4.hpp builds with a plain host C++17 compiler and
// pulls in neither CUDA nor nlohmann/json (users include it everywhere; only the implementation needs those).
#include "gemma4_t4.hpp"

#if defined(NLOHMANN_JSON_VERSION_MAJOR) || defined(INCLUDE_NLOHMANN_JSON_HPP_)
#error "the declaration part of gemma4_t4.hpp must not include nlohmann/json.hpp"
#endif
#if defined(__CUDA_RUNTIME_H__) || defined(__CUDA_RUNTIME_API_H__) || defined(__cuda_cuda_h__)
#error "the declaration part of gemma4_t4.hpp must not include CUDA headers"
#endif
#ifdef GEMMA4_T4_IMPLEMENTATION_DONE
#error "the implementation section must stay off without GEMMA4_T4_IMPLEMENTATION"
#endif

// Use the public surface so that its declarations are actually instantiated.
int decl_only_use() {
  gemma4_t4::LoadOptions options;
  gemma4_t4::Status status(gemma4_t4::Code::NotFound, "x");
  decltype(&gemma4_t4::Engine::load) load = nullptr;  // the signature resolves without the implementation
  (void)load;
  return static_cast<int>(options.max_context) + (status ? 1 : 0) + static_cast<int>(gemma4_t4::Logits::Last);
}
