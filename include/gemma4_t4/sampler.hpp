// gemma4_t4 implementation part: the CPU sampler (the reference for kernels/sample.cuh).
//
// x: one row of logits, modified in place. seen: sorted unique token ids already in the session.
//   1. repetition penalty on `seen` (x / penalty when x > 0, x * penalty otherwise; once per token id)
//   2. temperature <= 0 or top_k == 1: argmax
//   3. m = max x; thresholds on x: min-p  m + T ln(min_p);  top-k  the k-th largest x;
//      top-p  the largest t with  sum_{x >= t} e^((x-m)/T) >= top_p * sum_{x >= t0} e^((x-m)/T),  where t0 is
//      the stricter of the first two; keep x >= max(thresholds) (ties kept)
//   4. u = uniform01(seed, counter) * Z; the token is the first index (in id order) whose running kept mass
//      passes u.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace gemma4_t4 {
namespace detail {

inline void apply_repetition_penalty(float* x, const int32_t* seen, size_t n, float penalty) {
  if (penalty == 1.f || penalty <= 0.f) return;
  for (size_t i = 0; i < n; ++i) {
    float& v = x[seen[i]];
    v = v > 0.f ? v / penalty : v * penalty;
  }
}

inline int sample_ref(float* x, int V, const SamplingOptions& o, const int32_t* seen, size_t nseen, uint64_t counter) {
  apply_repetition_penalty(x, seen, nseen, o.repetition_penalty);
  if (o.temperature <= 0.f || o.top_k == 1) return argmax(x, size_t(V));
  const float T = o.temperature;
  const float m = *std::max_element(x, x + V);
  float thr = -INFINITY;
  if (o.min_p > 0.f) thr = std::max(thr, m + T * std::log(o.min_p));
  if (o.top_k > 0 && o.top_k < V) {
    std::vector<float> v(x, x + V);
    std::nth_element(v.begin(), v.begin() + (o.top_k - 1), v.end(), std::greater<float>());
    thr = std::max(thr, v[size_t(o.top_k - 1)]);
  }
  if (o.top_p < 1.f) {
    std::vector<float> kept;
    for (int i = 0; i < V; ++i)
      if (x[i] >= thr) kept.push_back(x[i]);
    std::sort(kept.begin(), kept.end(), std::greater<float>());
    double z0 = 0.0;
    for (float v : kept) z0 += std::exp(double(v - m) / T);
    double cum = 0.0;
    for (float v : kept) {
      cum += std::exp(double(v - m) / T);
      if (cum >= double(o.top_p) * z0) {
        thr = std::max(thr, v);
        break;
      }
    }
  }
  double z = 0.0;
  int last = -1;
  for (int i = 0; i < V; ++i)
    if (x[i] >= thr) {
      z += std::exp(double(x[i] - m) / T);
      last = i;
    }
  const double u = uniform01(o.seed, counter) * z;
  double cum = 0.0;
  for (int i = 0; i < V; ++i)
    if (x[i] >= thr) {
      cum += std::exp(double(x[i] - m) / T);
      if (cum > u) return i;
    }
  return last;
}

}  // namespace detail
}  // namespace gemma4_t4
