// gemma4_t4 implementation part: host threads for the CPU backend's matmuls and the CUDA backend's PLE gathers.
#pragma once

#include <algorithm>
#include <functional>
#include <system_error>
#include <thread>
#include <vector>

namespace gemma4_t4 {
namespace detail {

// Runs fn(begin, end) over [0, n) split across hardware threads when the work is large enough.
inline void parallel_for(size_t n, double work, const std::function<void(size_t, size_t)>& fn) {
  unsigned hw = std::thread::hardware_concurrency();
  unsigned T = std::max(1u, std::min(hw, 32u));
  if (T == 1 || work < 2e5 || n < 2) {
    fn(0, n);
    return;
  }
  T = static_cast<unsigned>(std::min<size_t>(T, n));
  std::vector<std::thread> pool;
  pool.reserve(T - 1);
  const size_t step = (n + T - 1) / T;
  for (unsigned t = 1; t < T; ++t) {
    const size_t b = t * step, e = std::min(n, b + step);
    if (b >= e) continue;
    try {
      pool.emplace_back(fn, b, e);
    } catch (const std::system_error&) {  // no thread to be had (resource limits): this part here
      fn(b, e);
    }
  }
  fn(0, std::min(n, step));
  for (auto& th : pool) th.join();
}

}  // namespace detail
}  // namespace gemma4_t4
