// gemma4_t4 kernel lab: the host-only part of dev/lab.cuh (no CUDA), so that a lab file's CPU self-check builds with
// a plain C++ compiler (dev/gemm_w4.cu -DGEMM_W4_HOST_ONLY).
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

namespace lab {

// body(i) for i in [0, count) on every host core (the host references).
inline void parallel_for(int count, const std::function<void(int)>& body) {
  const int nt = std::max(1, std::min(int(std::thread::hardware_concurrency()), 64));
  std::vector<std::thread> pool;
  for (int t = 0; t < nt; ++t)
    pool.emplace_back([&, t] {
      for (int i = t; i < count; i += nt) body(i);
    });
  for (std::thread& th : pool) th.join();
}

// Gemma's GELU (tanh form) in double: the host references' gelu_tanh (kernels/common.cuh).
inline double gelu_tanh_ref(double v) {
  return 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

}  // namespace lab
