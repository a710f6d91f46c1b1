// gemma4_t4 kernels: per-head RMSNorm + RoPE, written to a contiguous buffer (queries) or into a
// session's KV cache (keys, values).
//
// For each (row r, head h): x = in[r, h*d : (h+1)*d] (fp32, matmul output)
//   x = x * (mean(x^2) + eps)^-0.5 * w          (w == nullptr: no weight, Gemma 4's v_norm)
//   rotate-half RoPE at position pos[r]: channel i pairs with i + d/2, angle pos * inv_freq[i];
//   inv_freq[i] == 0 leaves the pair alone (proportional RoPE's unrotated tail); inv_freq == nullptr: no RoPE.
// Destination: out[r, h, :] (fp16) when `out` is set, else the cache of the row's sequence:
//   cache[seq[r] * layers + layer] + (slot * heads + h) * d, slot = pos[r] % capacity[seq[r] * layers + layer]
//   (full layers have capacity >= every position, so the slot is the position; sliding layers use a ring).
// One launch serves up to three targets of the same head dim (a layer's q, k and v: 8 + 1 + 1 heads on
// E2B), each with its own input, weight, RoPE table and destination: grid (rows, total heads).
// parts > 1 (a split-K int4 GEMM's partial tiles, gemm_w4.cuh keep_parts): x = in_0 + in_1 + ... in part order,
// part p at in + p * part_ld for every target -- the sums the GEMM's reduce kernel would have written.
// Block: max(32, d/2) threads, one channel pair each. sm_75 safe; static shared memory 132 B.
//
// The arithmetic of one channel pair (head_pair_*) is shared with attention.cuh's heads mode (AttnHeads), which
// normalises a decode row's heads inside the attention launch, and is written out operation by operation with
// explicit rounding (__fmul_rn, __fmaf_rn, ...: neither nvcc nor ptxas contracts those into other fmas): with the
// same source alone, nvcc contracted `vb * c + va * s` differently in the two kernels (here va * s rounded and
// vb * c fused into the fma, there the other way round). The operations are the ones nvcc had compiled this kernel's
// expressions to (its PTX before this change): sum of squares fma(va, va, vb * vb); r = rsqrt(ss / d + eps); x * (r *
// w); rotation va c - vb s with both products rounded, fma(vb, c, va s). Its sum of squares must also be added in
// block_sum's order (common.cuh block_sums) to give the same floats.
#pragma once

#include "common.cuh"

namespace gemma4_t4 {
namespace kernels {

// Where K/V rows of a batch go: per (sequence, layer) cache bases and capacities. Device pointers.
struct KvTarget {
  half* const* base = nullptr;    // [seqs * layers] -> [capacity, heads, d] fp16
  const int* capacity = nullptr;  // [seqs * layers] slots
  const int* seq = nullptr;       // [rows] sequence of each row
  int layer = 0;
  int layers = 0;
};

// One target of a launch: a [rows, ld_in] fp32 matmul output whose `heads` heads of d channels are
// normalised (+ roped) and written to `out` or, when out is null, into the caches kv.base.
struct HeadNormTarget {
  const float* in = nullptr;  // [rows, ld_in] fp32; head h at columns h*d .. h*d + d - 1
  int ld_in = 0;
  int heads = 0;
  const float* w = nullptr;         // [d] fp32, or nullptr: no weight (v_norm)
  const float* inv_freq = nullptr;  // [d/2] fp32, or nullptr: no RoPE
  half* out = nullptr;              // [rows, heads, d] fp16, or nullptr: into kv
  KvTarget kv;
};

constexpr int kHeadNormMaxTargets = 3;  // q, k, v of one layer

struct HeadNormArgs {
  HeadNormTarget t[kHeadNormMaxTargets];
  int count = 0;
  int d = 0;
  float eps = 0.f;
  const int* pos = nullptr;  // [rows]
  int parts = 1;             // the targets' inputs: sums of `parts` arrays, part p at in + p * part_ld floats
  size_t part_ld = 0;
};

// ---- one channel pair (i, i + d/2) of a head ----

// What a pair needs besides its two values: the weights (1 without: v_norm) and the rotation at the row's
// position (rot false: none, or an unrotated pair of proportional RoPE). Constants of the pass: read before
// pdl_enter.
struct HeadPair {
  float wa = 1.f, wb = 1.f;  // w[i], w[i + d/2]
  float s = 0.f, c = 1.f;    // sin, cos of pos * inv_freq[i]
  bool rot = false;
};

__device__ __forceinline__ void head_pair_weights(HeadPair& h, const float* w, int i, int half_d) {
  if (w) {
    h.wa = w[i];
    h.wb = w[i + half_d];
  }
}

__device__ __forceinline__ void head_pair_rope(HeadPair& h, const float* inv_freq, int i, int pos) {
  h.rot = inv_freq && inv_freq[i] != 0.f;
  if (h.rot) sincosf(__fmul_rn(float(pos), inv_freq[i]), &h.s, &h.c);
}

// The pair's term of the head's sum of squares (the terms are added by block_sum, or block_sums in its order).
__device__ __forceinline__ float head_pair_ss(float va, float vb) { return __fmaf_rn(va, va, __fmul_rn(vb, vb)); }

// 1 / rms of a head of d channels from its sum of squares (__fdiv_rn: a division also where d is a compile-time
// constant; nvcc would otherwise fold / 256 + eps into one fma).
__device__ __forceinline__ float head_norm_scale(float ss, int d, float eps) {
  return rsqrtf(__fadd_rn(__fdiv_rn(ss, float(d)), eps));
}

// The pair normalised (x * (r * w)) and rotated.
__device__ __forceinline__ void head_pair_apply(const HeadPair& h, float r, float& va, float& vb) {
  va = __fmul_rn(va, __fmul_rn(r, h.wa));
  vb = __fmul_rn(vb, __fmul_rn(r, h.wb));
  if (h.rot) {
    const float a2 = __fsub_rn(__fmul_rn(va, h.c), __fmul_rn(vb, h.s));
    vb = __fmaf_rn(vb, h.c, __fmul_rn(va, h.s));
    va = a2;
  }
}

// ---- kernel ----

// Grid (rows, sum of the targets' heads): blockIdx.y walks the heads of target 0, then 1, then 2.
// PDL prologue: everything but x -- the weights, the RoPE table, the row's position and its cache slot, all
// written by the host or by kernels at least two launches back (common.cuh) -- is read, and the rotation
// computed, before pdl_enter; after it only x's loads and the block's one reduction.
static __global__ void head_norm_rope_kernel(const HeadNormArgs a) {
  GEMMA4_T4_KTRACE_SCOPE(kKtHeadNorm, 0);
  const int row = blockIdx.x, half_d = a.d / 2, d = a.d;
  // Target and head of this block; constant indices only (a dynamic index into the parameter array would
  // copy it to local memory).
  int hh = blockIdx.y;
  int ti = 0;
  if (a.count > 1 && hh >= a.t[0].heads) {
    hh -= a.t[0].heads;
    ti = 1;
    if (a.count > 2 && hh >= a.t[1].heads) {
      hh -= a.t[1].heads;
      ti = 2;
    }
  }
  const HeadNormTarget t = ti == 0 ? a.t[0] : (ti == 1 ? a.t[1] : a.t[2]);
  const int i = threadIdx.x;
  const bool active = i < half_d;
  HeadPair hp;
  half* dst = nullptr;
  if (active) {
    head_pair_weights(hp, t.w, i, half_d);
    const int p = a.pos[row];
    head_pair_rope(hp, t.inv_freq, i, p);
    if (t.out) {
      dst = t.out + (size_t(row) * t.heads + hh) * d;
    } else {
      const int idx = t.kv.seq[row] * t.kv.layers + t.kv.layer;
      const int slot = p % t.kv.capacity[idx];
      dst = t.kv.base[idx] + (size_t(slot) * t.heads + hh) * d;
    }
  }
  pdl_enter();
  const float* x = t.in + size_t(row) * t.ld_in + size_t(hh) * d;
  float va = active ? sum_parts(x + i, a.parts, a.part_ld) : 0.f;
  float vb = active ? sum_parts(x + i + half_d, a.parts, a.part_ld) : 0.f;
  const float r = head_norm_scale(block_sum(head_pair_ss(va, vb)), d, a.eps);
  if (!active) return;
  head_pair_apply(hp, r, va, vb);
  dst[i] = to_half_sat(va);
  dst[i + half_d] = to_half_sat(vb);
}

inline int head_norm_threads(int d) { return ((d / 2 + 31) / 32) * 32; }

// Up to kHeadNormMaxTargets targets of one head dim d (q, k and v of a layer) in one launch.
// parts (>= 1): every target's input is the sum of that many arrays, part p at in + p * part_ld floats.
inline cudaError_t launch_head_norm_rope_multi(const HeadNormTarget* targets, int count, int rows, int d, float eps,
                                               const int* pos, const Launch& launch, int parts = 1,
                                               size_t part_ld = 0) {
  if (rows <= 0) return cudaSuccess;
  if (count < 1 || count > kHeadNormMaxTargets || d < 2 || d % 2 != 0 || parts < 1 || (parts > 1 && part_ld == 0))
    return cudaErrorInvalidValue;
  HeadNormArgs a;
  int heads = 0;
  for (int i = 0; i < count; ++i) {
    if (targets[i].heads < 0) return cudaErrorInvalidValue;
    a.t[i] = targets[i];
    heads += targets[i].heads;
  }
  if (heads == 0) return cudaSuccess;
  a.count = count;
  a.d = d;
  a.eps = eps;
  a.pos = pos;
  a.parts = parts;
  a.part_ld = part_ld;
  return launch_kernel(head_norm_rope_kernel, dim3(rows, heads), head_norm_threads(d), launch, a);
}

inline cudaError_t launch_head_norm_rope(const float* in, int ld_in, int rows, int heads, int d, const float* w,
                                         float eps, const float* inv_freq, const int* pos, half* out,
                                         const KvTarget& kv, const Launch& launch) {
  HeadNormTarget t;
  t.in = in;
  t.ld_in = ld_in;
  t.heads = heads;
  t.w = w;
  t.inv_freq = inv_freq;
  t.out = out;
  t.kv = kv;
  return launch_head_norm_rope_multi(&t, 1, rows, d, eps, pos, launch);
}

}  // namespace kernels
}  // namespace gemma4_t4
