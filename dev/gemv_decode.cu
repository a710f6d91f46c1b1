// Kernel lab: the decode GEMV (kernels/gemv.cuh), a batch of 1..16 rows against weights read once per step.
//
//   lab_gemv_decode [VERSIONS] [--rows 1,8,16] [--weights fp16,w4a16] [--reps 50] [--samples 7] [--pdl]
//                   [--splits 2] [--kw 1] [--validate-only]
//
// VERSIONS: a comma list (default 1,2,3); every case is timed under each listed version that implements it.
//   1  the shipped kernels, through kernels/gemv.cuh's launcher (launch_gemv_args: what launch_gemv and
//      launch_gemv_gelu_mul call); the "+ norm" cases are that GEMV, then kernels/rmsnorm.cuh's
//      launch_residual_norm: two launches, as the CUDA backend runs them.
//   2  wide in-flight tiles: 6 k-tiles of weight loads in flight per warp (3 for gate/up, which loads two
//      matrices) instead of gemv_block's 4 / 2, where a warp's share of k-tiles passes those (elsewhere the
//      launch is version 1's). The same sums in the same order: bit-identical to version 1. "+ norm": not.
//   3  the residual norm folded into the GEMV's last block: gemv_block stores y, every thread fences, each block
//      takes a ticket from an arrival counter, and the block that draws the last one runs the residual norm
//      on the complete rows (bit-identical to version 1's separate kernel). "+ norm" cases only.
//   4  k-split over blocks (GemvArgs::ksplit) of --splits S parts (default 2; fewer where the warps would run out
//      of k-tiles), whatever gemv_store_splits would pick: the parts into a buffer of their own, summed in part
//      order by launch_residual_norm ("+ norm") or, for the plain Store cases, checked as that sum. Version 1
//      takes the engine's choice (gemv_store_splits for this GPU) in the "+ norm" cases, as layers.hpp does.
//   5  --kw K warps per 16-row tile (1, 2, 4 or 8; default 1) instead of gemv_split's choice from `in` (8 for the
//      1536-wide E2B inputs): the shipped gemv_kernel, its block partition recomputed for K. With K = 1 a block
//      owns 8 row tiles and each warp streams its tile's whole k range, no shared-memory sum at the end: the LM
//      head's 16,384 one-tile blocks (62 waves of 2 per SM on an H200) become 2,048 blocks of 8 tiles. Store and
//      gate/up cases (the "+ norm" cases: their GEMV as version 1's, unsplit). Different sums from version 1
//      where K differs (the partials are added in another order); checked against the host reference.
// Versions 2 and 3 were first measured end to end, as patches on d670ef6 (bench/RESULTS.md 2026-12-03 (c),
// dev/README.md); both lost and were reverted. They live here so that they can be re-run as the code moves.
//
// Cases: Gemma 4 E2B decode (hidden 1536): q_proj 1536 -> 2048, gate/up 1536 -> 6144 x 2 with the GELU
// product, down_proj 6144 -> 1536, the three matmuls a residual norm follows (o_proj 2048 -> 1536, down_proj,
// ple_proj 256 -> 1536) with it, the double-wide MLP of layers 15-34 (gate/up 1536 -> 12288 x 2, down 12288 ->
// 1536 + norm), and the LM head 1536 -> 262144; rows 1, 8, 16; fp16 and w4a16 weights.
//
// Validation comes first: every listed version at odd sizes (k-tile counts that take each warp split, partial
// row tiles, 1..16 rows) and at the E2B shapes, random inputs, outputs poisoned (NaN) before each launch.
// Checked against the host reference (double sums of the same fp16 weights): max |got - ref| / max |ref| per
// output, every element written and finite, nothing outside the outputs touched, version 3's counter zero
// again; versions 2 and 3 are also compared bit for bit with version 1 (printed, not required). A failure
// exits with status 1 before any timing.
// Timing: cudaEvents around --reps back-to-back calls, median of --samples; the weights rotate over copies
// that exceed 3 x L2, so they come from DRAM as in a decode step. GB/s counts weight bytes (+ scales) and is
// printed against the stream read bandwidth measured first (the bound). --pdl launches with programmatic
// dependent launch (sm_90 builds), as the backend does: a kernel's weight prefetch then overlaps the tail of
// the one before it.
#include <memory>
#include <thread>
#include <type_traits>

#include "../kernels/gemv.cuh"
#include "../kernels/rmsnorm.cuh"
#include "lab.cuh"

namespace kn = gemma4_t4::kernels;
using kn::GemvArgs;
using kn::GemvEpilogue;
using kn::GemvMat;

namespace {

// ---- version 2: wide in-flight tiles ----

// A lane's two weight rows of one matrix (gid and gid + 8 of its warp's 16-row tile; row 0 past `out`, whose
// loads are predicated off) as 16-byte units, and for w4a16 their scale groups as raw fp16 bits.
struct LaneRows {
  const uint4 *a, *b;
  const unsigned short *sa, *sb;
};

// One 16-byte unit of both rows; w4a16: the unit's scale (one per 32 columns) in both halves of a word.
struct Frag {
  uint4 a, b;
  uint32_t sa, sb;
};

template <int WL>
__device__ __forceinline__ LaneRows lane_rows(const GemvMat& g, size_t unit_a, size_t unit_b) {
  const void* w = WL == kn::kGemvW4 ? static_cast<const void*>(g.wq) : static_cast<const void*>(g.w16);
  const auto* s = reinterpret_cast<const unsigned short*>(g.s);
  return LaneRows{static_cast<const uint4*>(w) + unit_a, static_cast<const uint4*>(w) + unit_b,
                  WL == kn::kGemvW4 ? s + unit_a : nullptr, WL == kn::kGemvW4 ? s + unit_b : nullptr};
}

template <int WL>
__device__ __forceinline__ Frag load_frag(const LaneRows& r, int unit, bool oka, bool okb) {
  Frag f{kn::ld_weights(r.a + unit, oka), kn::ld_weights(r.b + unit, okb), 0u, 0u};
  if constexpr (WL == kn::kGemvW4) {
    f.sa = kn::ld_u16(r.sa + unit, oka) * 0x10001u;
    f.sb = kn::ld_u16(r.sb + unit, okb) * 0x10001u;
  }
  return f;
}

// acc[m][t] += matrix m's weights of one unit times x rows 8t..8t+7, in gemv_block's k order (w4a16: the unit's
// 4 words, then 4 mma steps each; fp16: 4 steps), so every sum is gemv_block's bit for bit. The x pairs of a
// step: the word s of the 16-byte x load (w4a16: columns (8w + 2s, 8w + 2s + 1) of the group, the GEMV word order's
// w4_pair(word, s)).
template <int NT, int WL, int M>
__device__ __forceinline__ void mma_unit(float (&acc)[M][NT][4], const Frag (&f)[M], const uint4* const (&xr)[NT],
                                         const bool (&okx)[NT], int unit, bool ok) {
  constexpr bool W4 = WL == kn::kGemvW4;
  constexpr int X = W4 ? 4 : 1;  // 16-byte x loads per unit and x row: 32 columns or 8
#pragma unroll
  for (int w = 0; w < X; ++w) {
    uint32_t xp[NT][4];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const uint4 v = kn::ld_x(xr[t] + unit * X + w, ok && okx[t]);
#pragma unroll
      for (int s = 0; s < 4; ++s) xp[t][s] = kn::u4_word(v, s);
    }
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t a0 = W4 ? kn::w4_pair(kn::u4_word(f[m].a, w), s, f[m].sa) : kn::u4_word(f[m].a, s);
        const uint32_t a1 = W4 ? kn::w4_pair(kn::u4_word(f[m].b, w), s, f[m].sb) : kn::u4_word(f[m].b, s);
#pragma unroll
        for (int t = 0; t < NT; ++t) kn::mma_16x8x8(acc[m][t], a0, a1, xp[t][s]);
      }
  }
}

// gemv_kernel's work for the Store epilogue of one matrix or GeluMul's gate and up (fp16 or w4a16 weights),
// with U k-tiles of weight loads in flight per warp: the same work split, block partition (kn::gemv_plan) and
// PDL prologue. NT: 8-row tiles of x (1: n <= 8, 2: n <= 16).
template <int NT, int WL, GemvEpilogue E, int U>
__global__ void __launch_bounds__(kn::kGemvWarps * 32, 2) gemv_wide_kernel(const GemvArgs a) {
  constexpr int M = E == GemvEpilogue::GeluMul ? 2 : 1;  // weight matrices per warp (gate and up)
  constexpr int ACC = M * NT * 4;                        // fp32 accumulators per lane
  __shared__ float red[kn::kGemvWarps][ACC][32];         // partials of each row tile's kw - 1 helper warps
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5), gid = lane >> 2, tig = lane & 3;
  const int kw = a.kw, ks = warp % kw, out = a.mat[0].out;
  const int ra = (int(blockIdx.x) * (kn::kGemvWarps / kw) + warp / kw) * 16 + gid;  // rows ra and ra + 8
  const bool oka = ra < out, okb = ra + 8 < out;
  const int units = WL == kn::kGemvW4 ? a.in / 32 : a.in / 8, ktiles = (units + 3) / 4;
  LaneRows rows[M];
#pragma unroll
  for (int m = 0; m < M; ++m)
    rows[m] = lane_rows<WL>(a.mat[m], size_t(oka ? ra : 0) * units, size_t(okb ? ra + 8 : 0) * units);
  const uint4* xr[NT];  // this lane's x row (mma column gid) of each 8-row tile
  bool okx[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    okx[t] = 8 * t + gid < a.n;
    xr[t] = reinterpret_cast<const uint4*>(a.x + size_t(okx[t] ? 8 * t + gid : 0) * a.in);
  }

  // Before pdl_enter only constants: the warp's first 2U k-tiles of weights (and scale lines) toward L2.
  for (int i = 0; i < 2 * U && ks + i * kw < ktiles; ++i) {
    const int kt = ks + i * kw, unit = 4 * kt + tig;
    if (unit >= units) break;
    const bool scales = WL == kn::kGemvW4 && tig == 0 && (i == 0 || kt % 16 == 0);  // 64 scales: a 128-byte line
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (oka) kn::prefetch_l2(rows[m].a + unit);
      if (okb) kn::prefetch_l2(rows[m].b + unit);
      if (scales && oka) kn::prefetch_l2(rows[m].sa + unit);
      if (scales && okb) kn::prefetch_l2(rows[m].sb + unit);
    }
  }
  kn::pdl_enter();

  float acc[M][NT][4] = {};
  for (int kt0 = ks; kt0 < ktiles; kt0 += kw * U) {
    Frag f[U][M];  // every weight load of the U tiles is issued before the first is used
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int unit = 4 * (kt0 + u * kw) + tig;
#pragma unroll
      for (int m = 0; m < M; ++m) f[u][m] = load_frag<WL>(rows[m], unit, unit < units && oka, unit < units && okb);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (kt0 + u * kw >= ktiles) break;  // warp-uniform: every lane reaches each mma.sync
      const int unit = 4 * (kt0 + u * kw) + tig;
      mma_unit<NT, WL, M>(acc, f[u], xr, okx, unit, unit < units);
    }
  }

  float* const mine = &acc[0][0][0];
  if (kw > 1) {  // the row tile's first warp adds the helpers' partials in warp order
    if (ks != 0) {
#pragma unroll
      for (int i = 0; i < ACC; ++i) red[warp][i][lane] = mine[i];
    }
    __syncthreads();
    if (ks != 0) return;
    for (int j = 1; j < kw; ++j) {
#pragma unroll
      for (int i = 0; i < ACC; ++i) mine[i] += red[warp + j][i][lane];
    }
  }
  // Accumulator c of tile t: output row ra + 8 (c / 2 % 2), x row 8t + 2 tig + c % 2.
#pragma unroll
  for (int c = 0; c < NT * 4; ++c) {
    const int t = c / 4, o = ra + 8 * ((c >> 1) & 1), r = 8 * t + 2 * tig + (c & 1);
    if (o >= out || r >= a.n) continue;
    if constexpr (E == GemvEpilogue::Store)
      a.mat[0].y[size_t(r) * a.mat[0].ldy + o] = acc[0][t][c % 4];
    else
      a.out16[size_t(r) * a.ld16 + o] = kn::to_half_sat(kn::gelu_tanh(acc[0][t][c % 4]) * acc[M - 1][t][c % 4]);
  }
}

template <int WL, GemvEpilogue E, int U>
cudaError_t launch_wide(const GemvArgs& a, unsigned blocks, const kn::Launch& l) {
  if (a.n <= 8) return kn::launch_kernel(gemv_wide_kernel<1, WL, E, U>, blocks, kn::kGemvWarps * 32, l, a);
  return kn::launch_kernel(gemv_wide_kernel<2, WL, E, U>, blocks, kn::kGemvWarps * 32, l, a);
}

// Version 2: a (Store of one matrix, or GeluMul's gate and up) planned as kernels/gemv.cuh plans it; the wide
// kernel when a warp's share of k-tiles passes gemv_block's in-flight count, else version 1's launch.
cudaError_t launch_gemv_wide(GemvArgs a, GemvEpilogue e, const kn::Launch& l) {
  const int nmats = e == GemvEpilogue::GeluMul ? 2 : 1;
  if ((e != GemvEpilogue::Store && e != GemvEpilogue::GeluMul) || a.count != 1 || a.mat[0].w8)
    return cudaErrorInvalidValue;
  unsigned blocks = 0;
  if (const cudaError_t err = kn::gemv_plan(a, nmats, e, true, &blocks); err != cudaSuccess || blocks == 0) return err;
  const bool w4 = a.mat[0].wq != nullptr;
  const int ktiles = ((w4 ? a.in / 32 : a.in / 8) + 3) / 4, per_warp = (ktiles + a.kw - 1) / a.kw;
  if (per_warp <= (nmats == 2 ? 2 : 4)) return kn::launch_gemv_args(a, nmats, e, l);
  if (e == GemvEpilogue::GeluMul)
    return w4 ? launch_wide<kn::kGemvW4, GemvEpilogue::GeluMul, 3>(a, blocks, l)
              : launch_wide<kn::kGemvF16, GemvEpilogue::GeluMul, 3>(a, blocks, l);
  return w4 ? launch_wide<kn::kGemvW4, GemvEpilogue::Store, 6>(a, blocks, l)
            : launch_wide<kn::kGemvF16, GemvEpilogue::Store, 6>(a, blocks, l);
}

// ---- version 3: the residual norm in the GEMV's last block ----

// launch_residual_norm's arguments (NextNorm::Norm) for the n rows of y; cols = the matrix's out.
struct NormTail {
  float* h = nullptr;             // [n, cols] fp32 residual, updated in place
  const float* w_post = nullptr;  // [cols] fp32
  const float* w_next = nullptr;  // [cols] fp32
  half* norm16 = nullptr;         // [n, cols] fp16: the next norm's output; must not overlap x
  float eps = 0.f, scalar = 1.f;
  int threads = 0;              // threads that run the norm: launch_residual_norm's block for cols
  unsigned* counter = nullptr;  // [1] arrival counter: zero before the launch, zero again after it
};

// ss plus v's squares one at a time, in norm_sumsq's order (the roundings are the separate kernel's).
__device__ __forceinline__ float add_squares(float ss, float4 v) {
  return (((ss + v.x * v.x) + v.y * v.y) + v.z * v.z) + v.w * v.w;
}

__device__ __forceinline__ void store_half4(half* o, int j, float4 v) {
  const half2 lo = __halves2half2(kn::to_half_sat(v.x), kn::to_half_sat(v.y));
  const half2 hi = __halves2half2(kn::to_half_sat(v.z), kn::to_half_sat(v.w));
  reinterpret_cast<uint2*>(o)[j] = make_uint2(kn::h2_as_u32(lo), kn::h2_as_u32(hi));
}

// One row of residual_norm_vec_kernel by threads [0, t.threads) of the block: each owns the float4 chunks that
// thread index owns there and adds them in its order; the other threads add +0 to the block sums, so the row
// equals the separate kernel's bit for bit. y (other blocks' stores) is read through L2, and each pass
// re-reads its chunks instead of holding the row in registers, which the GEMV has spent. Every thread of the
// block calls it (block_sum's barriers).
__device__ void norm_tail_row(const NormTail& t, float* hr, const float* yr, half* o, int cols) {
  const int n4 = cols / 4, tid = int(threadIdx.x);
  const auto* y4 = reinterpret_cast<const float4*>(yr);
  auto* h4 = reinterpret_cast<float4*>(hr);
  const auto* wp = reinterpret_cast<const float4*>(t.w_post);
  const auto* wn = reinterpret_cast<const float4*>(t.w_next);
  const auto chunk = [&](int k) { return tid < t.threads && tid + k * t.threads < n4 ? tid + k * t.threads : -1; };
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kn::kNormVec; ++k)
    if (const int j = chunk(k); j >= 0) ss = add_squares(ss, __ldcg(y4 + j));
  const float r = rsqrtf(kn::block_sum(ss) / cols + t.eps);
  float hs = 0.f;
#pragma unroll
  for (int k = 0; k < kn::kNormVec; ++k) {
    const int j = chunk(k);
    if (j < 0) continue;
    const float4 a = __ldcg(h4 + j), b = __ldcg(y4 + j), c = wp[j];
    const float s = t.scalar;
    const float4 v = make_float4((a.x + b.x * r * c.x) * s, (a.y + b.y * r * c.y) * s, (a.z + b.z * r * c.z) * s,
                                 (a.w + b.w * r * c.w) * s);
    h4[j] = v;
    hs = add_squares(hs, v);
  }
  const float r2 = rsqrtf(kn::block_sum(hs) / cols + t.eps);
#pragma unroll
  for (int k = 0; k < kn::kNormVec; ++k)
    if (const int j = chunk(k); j >= 0) {
      const float4 v = h4[j], w = wn[j];  // h: this thread's own stores above
      store_half4(o, j, make_float4(v.x * r2 * w.x, v.y * r2 * w.y, v.z * r2 * w.z, v.w * r2 * w.w));
    }
}

template <int NT, int WL>
__global__ void __launch_bounds__(kn::kGemvWarps * 32, 2) gemv_norm_tail_kernel(const GemvArgs a, const NormTail t) {
  __shared__ float red[kn::gemv_red_floats<NT>()];  // gemv_block's partial tiles
  __shared__ bool last;
  kn::gemv_block<NT, WL, GemvEpilogue::Store, kn::GemvX::Global>(a, int(blockIdx.x), red, nullptr, nullptr);
  __threadfence();  // this thread's y stores are visible device-wide before its block's arrival counts
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(t.counter, 1u) == gridDim.x - 1;
    if (last) *t.counter = 0u;  // every block has arrived: zero for the next launch (or graph replay)
  }
  __syncthreads();
  if (!last) return;  // block-uniform
  __threadfence();
  const int cols = a.mat[0].out;
  for (int r = 0; r < a.n; ++r)
    norm_tail_row(t, t.h + size_t(r) * cols, a.mat[0].y + size_t(r) * cols, t.norm16 + size_t(r) * cols, cols);
}

// Version 3: y = x W^T for one fp16 or w4a16 matrix (a.mat[0], ldy == out), then t's residual norm of the n rows,
// in one launch. The row shapes launch_residual_norm takes its vectorised kernel for (cols % 4 == 0, 16-byte
// aligned rows, cols <= 8192) only.
cudaError_t launch_gemv_norm_tail(GemvArgs a, NormTail t, const kn::Launch& l) {
  const GemvMat& m = a.mat[0];
  const int cols = m.out;
  if (a.count != 1 || m.w8 || m.ldy != cols || !t.counter || !kn::norm_vec_ok(cols, cols, t.h, m.y, t.w_post) ||
      !kn::norm_vec_ok(cols, cols, t.w_next, t.norm16, nullptr))
    return cudaErrorInvalidValue;
  unsigned blocks = 0;
  if (const cudaError_t e = kn::gemv_plan(a, 1, GemvEpilogue::Store, true, &blocks); e != cudaSuccess || blocks == 0)
    return e;
  t.threads = kn::norm_vec_threads(cols);
  const unsigned threads = kn::kGemvWarps * 32;
  if (m.wq)
    return a.n <= 8 ? kn::launch_kernel(gemv_norm_tail_kernel<1, kn::kGemvW4>, blocks, threads, l, a, t)
                    : kn::launch_kernel(gemv_norm_tail_kernel<2, kn::kGemvW4>, blocks, threads, l, a, t);
  return a.n <= 8 ? kn::launch_kernel(gemv_norm_tail_kernel<1, kn::kGemvF16>, blocks, threads, l, a, t)
                  : kn::launch_kernel(gemv_norm_tail_kernel<2, kn::kGemvF16>, blocks, threads, l, a, t);
}

// ---- version 5: the shipped kernel with kw warps per row tile ----

// gemv_plan's checks, then the partition (gemv_partition) again for kw (a power of two <= 8; fewer where the k-tiles
// run out, as gemv_split would), and the shipped kernel for it.
cudaError_t launch_gemv_kw(GemvArgs& a, GemvEpilogue e, int kw, const kn::Launch& l) {
  unsigned blocks = 0;
  if (const cudaError_t err = kn::gemv_plan(a, e == GemvEpilogue::GeluMul ? 2 : 1, e, true, &blocks);
      err != cudaSuccess || blocks == 0)
    return err;
  const bool w4 = a.mat[0].wq != nullptr;
  const int ktiles = kn::gemv_ktiles(a.in, w4 ? kn::kGemvW4 : kn::kGemvF16);
  while (kw > 1 && kw > ktiles) kw /= 2;
  a.kw = kw;
  blocks = kn::gemv_partition(a);
  if (e == GemvEpilogue::GeluMul)
    return w4 ? kn::launch_gemv_w<kn::kGemvW4, GemvEpilogue::GeluMul>(a, blocks, l)
              : kn::launch_gemv_w<kn::kGemvF16, GemvEpilogue::GeluMul>(a, blocks, l);
  return w4 ? kn::launch_gemv_w<kn::kGemvW4, GemvEpilogue::Store>(a, blocks, l)
            : kn::launch_gemv_w<kn::kGemvF16, GemvEpilogue::Store>(a, blocks, l);
}

// ---- problems: one operation at one shape, on the device ----

enum class Op { Store, GeluMul, StoreNorm };
constexpr int kRows = kn::kGemvMaxRows;  // every buffer holds 16 rows; a launch uses the first n
constexpr float kEps = 1e-6f, kScalar = 0.75f;
constexpr int kVersions = 5;
int g_sms = 1;     // the device's SMs (version 1's k-split choice)
int g_splits = 2;  // version 4's parts (--splits)
int g_kw = 1;      // version 5's warps per row tile (--kw)

bool implements(int version, Op op) {
  return version == 1 || (version == 2 && op != Op::StoreNorm) || (version == 3 && op == Op::StoreNorm) ||
         (version == 4 && op != Op::GeluMul) || (version == 5 && op != Op::StoreNorm);
}

// Bytes of one matrix: fp16 weights, or w4a16 words + scales.
size_t matrix_bytes(bool w4, int out, int in) {
  return w4 ? size_t(out) * in / 2 + size_t(out) * (in / 32) * 2 : size_t(out) * in * 2;
}

// One weight matrix in one layout, `copies` copies back to back (timing rotates over them).
struct Weights {
  bool w4 = false;
  int out = 0, in = 0, copies = 1;
  lab::DevBuf<half> w16;     // fp16: [copies, out, in]
  lab::DevBuf<uint32_t> wq;  // w4a16: [copies, out, in / 8] words, column 8j + k in nibble k of word j (q + 8)
  lab::DevBuf<half> s;       // w4a16: [copies, out, in / 32] fp16 scales

  void init(bool w4_, int out_, int in_, int copies_, uint64_t seed) {
    w4 = w4_, out = out_, in = in_, copies = copies_;
    const size_t n = size_t(out) * in * copies;
    if (w4) {
      wq = lab::DevBuf<uint32_t>(n / 8);
      s = lab::DevBuf<half>(n / 32);
      lab::fill_bits(wq.get(), wq.size(), seed);
      lab::fill_uniform(s.get(), s.size(), -0.01f, 0.01f, seed + 1);
    } else {
      w16 = lab::DevBuf<half>(n);
      lab::fill_uniform(w16.get(), w16.size(), -0.05f, 0.05f, seed);
    }
  }
  size_t bytes() const { return matrix_bytes(w4, out, in); }
  GemvMat mat(int copy, float* y, int ldy) const {
    GemvMat m;
    const size_t c = size_t(copy % copies) * out * in;
    m.w16 = w4 ? nullptr : w16.get() + c;
    m.wq = w4 ? wq.get() + c / 8 : nullptr;
    m.s = w4 ? s.get() + c / 32 : nullptr;
    m.out = out;
    m.y = y;
    m.ldy = ldy;
    return m;
  }
};

struct Problem {
  const char* name = "";
  Op op = Op::Store;
  bool w4 = false;
  int out = 0, in = 0, ldy = 0, ld16 = 0;
  Weights w, up;                           // the matrix (GeluMul: the gate) and GeluMul's up
  lab::DevBuf<half> x;                     // [16, in] fp16
  lab::DevBuf<float> y;                    // [16, ldy] fp32 (Store, StoreNorm; StoreNorm: ldy = out)
  lab::DevBuf<half> out16;                 // [16, ld16] fp16 (GeluMul)
  lab::DevBuf<float> h, w_post, w_next;    // [16, out], [out], [out] fp32 (StoreNorm)
  lab::DevBuf<half> norm16;                // [16, out] fp16 (StoreNorm)
  lab::DevBuf<unsigned> counter;           // [1] version 3's arrival counter
  lab::DevBuf<float> parts;                // [kGemvMaxSplit, 16, ldy] a k-split launch's parts
  mutable int last_parts = 1, last_n = 0;  // the parts (1: it wrote y) and rows of the last launch
  std::vector<float> h0;                   // h's contents before a launch (restored before each validated one)

  size_t weight_bytes() const { return w.bytes() + (op == Op::GeluMul ? up.bytes() : 0); }
};

// Outputs strided past their width where the operation allows it (Store: ldy = out + 3; GeluMul: ld16 = out + 5),
// so stores past a row's end show up as strays.
std::unique_ptr<Problem> make_problem(const char* name, Op op, bool w4, int out, int in, int copies, uint64_t seed) {
  auto p = std::make_unique<Problem>();
  p->name = name, p->op = op, p->w4 = w4, p->out = out, p->in = in;
  p->ldy = op == Op::Store ? out + 3 : out;
  p->ld16 = out + 5;
  p->w.init(w4, out, in, copies, seed);
  if (op == Op::GeluMul) p->up.init(w4, out, in, copies, seed + 2);
  p->x = lab::DevBuf<half>(size_t(kRows) * in);
  lab::fill_uniform(p->x.get(), p->x.size(), -1.f, 1.f, seed + 3);
  p->y = lab::DevBuf<float>(op == Op::GeluMul ? 0 : size_t(kRows) * p->ldy);
  p->out16 = lab::DevBuf<half>(op == Op::GeluMul ? size_t(kRows) * p->ld16 : 0);
  const size_t norm_rows = op == Op::StoreNorm ? kRows : 0;
  p->h = lab::DevBuf<float>(norm_rows * out);
  p->w_post = lab::DevBuf<float>(norm_rows ? out : 0);
  p->w_next = lab::DevBuf<float>(norm_rows ? out : 0);
  p->norm16 = lab::DevBuf<half>(norm_rows * out);
  p->counter = lab::DevBuf<unsigned>(1);
  p->parts = lab::DevBuf<float>(op == Op::GeluMul ? 0 : size_t(kn::kGemvMaxSplit) * kRows * p->ldy);
  LAB_CHECK(cudaMemset(p->counter.get(), 0, sizeof(unsigned)));
  if (norm_rows) {
    lab::fill_uniform(p->h.get(), p->h.size(), -2.f, 2.f, seed + 4);
    lab::fill_uniform(p->w_post.get(), size_t(out), 0.5f, 1.5f, seed + 5);
    lab::fill_uniform(p->w_next.get(), size_t(out), 0.5f, 1.5f, seed + 6);
    p->h0 = p->h.download();
  }
  return p;
}

GemvArgs gemv_args(const Problem& p, int n, int copy) {
  GemvArgs a;
  a.x = p.x.get();
  a.n = n;
  a.in = p.in;
  a.count = 1;
  a.mat[0] = p.w.mat(copy, p.y.get(), p.ldy);
  if (p.op == Op::GeluMul) a.mat[1] = p.up.mat(copy, nullptr, 0);
  a.out16 = p.out16.get();
  a.ld16 = p.ld16;
  return a;
}

// Version `version` of p's operation for n rows on weight copy `copy`.
cudaError_t run(int version, const Problem& p, int n, int copy, const kn::Launch& l) {
  GemvArgs a = gemv_args(p, n, copy);
  const GemvEpilogue e = p.op == Op::GeluMul ? GemvEpilogue::GeluMul : GemvEpilogue::Store;
  p.last_parts = 1;
  p.last_n = n;
  if (version == 2) return launch_gemv_wide(a, e, l);
  if (version == 3) {
    NormTail t;
    t.h = p.h.get(), t.w_post = p.w_post.get(), t.w_next = p.w_next.get(), t.norm16 = p.norm16.get();
    t.eps = kEps, t.scalar = kScalar, t.counter = p.counter.get();
    return launch_gemv_norm_tail(a, t, l);
  }
  if (version == 5) return launch_gemv_kw(a, e, g_kw, l);
  // the k-split: version 4's --splits (at most one k-tile per warp), version 1's the engine's in the "+ norm" cases
  const int wl = p.w4 ? kn::kGemvW4 : kn::kGemvF16;
  const int ktiles = kn::gemv_ktiles(p.in, wl), kw = kn::gemv_split(ktiles);
  int parts = version == 4 ? std::max(1, std::min(g_splits, ktiles / kw)) : 1;
  if (version == 1 && p.op == Op::StoreNorm) parts = kn::gemv_store_splits(p.out, p.in, wl, g_sms);
  if (parts > 1) {
    a.ksplit = parts;
    a.split_ld = size_t(kRows) * p.ldy;
    a.mat[0].y = p.parts.get();
    p.last_parts = parts;
  }
  const cudaError_t err = kn::launch_gemv_args(a, e == GemvEpilogue::GeluMul ? 2 : 1, e, l);
  if (err != cudaSuccess || p.op != Op::StoreNorm) return err;
  return kn::launch_residual_norm(p.h.get(), a.mat[0].y, p.w_post.get(), n, p.out, kEps, kScalar, kn::NextNorm::Norm,
                                  p.w_next.get(), p.norm16.get(), l, parts, a.split_ld);
}

// ---- host reference ----

// Copy 0 of a matrix on the host, and its rows as the kernels multiply them: fp16 as stored; w4a16
// (nibble - 8) * scale rounded once to fp16 (w4_pair's half2 multiply of exact operands), the random words read in
// the GEMV word order the kernels take.
struct HostWeights {
  bool w4 = false;
  int out = 0, in = 0;
  std::vector<half> w16, s;  // [out, in] | [out, in / 32]
  std::vector<uint32_t> wq;  // [out, in / 8]

  explicit HostWeights(const Weights& w) : w4(w.w4), out(w.out), in(w.in) {
    const size_t n = size_t(out) * in;
    if (w4) {
      wq = w.wq.download(n / 8);
      s = w.s.download(n / 32);
    } else {
      w16 = w.w16.download(n);
    }
  }
  void row(int o, float* dst) const {
    for (int i = 0; i < in; ++i) {
      const size_t k = size_t(o) * in + i;
      if (!w4) {
        dst[i] = __half2float(w16[k]);
        continue;
      }
      const int c =
          int(k % 8);  // the GEMV word order (kernels/mma.cuh w4_gemv_word): column 2s, 2s + 1 in nibble s, s + 4
      const int q = int((wq[k / 8] >> (4 * (c % 2 == 0 ? c / 2 : 4 + c / 2))) & 0xFu) - 8;
      dst[i] = __half2float(__float2half_rn(float(q) * __half2float(s[k / 32])));
    }
  }
};

// y[r, o] = sum_i x[r, i] W[o, i] for r < n: launch_gemv's operation in double. x: [n, in]; y: [n, out].
std::vector<double> gemv_ref(const HostWeights& W, const std::vector<float>& x, int n) {
  std::vector<double> y(size_t(n) * W.out);
  lab::parallel_for(W.out, [&](int o) {
    std::vector<float> w(size_t(W.in));
    W.row(o, w.data());
    for (int r = 0; r < n; ++r) {
      double s = 0;
      for (int i = 0; i < W.in; ++i) s += double(w[size_t(i)]) * x[size_t(r) * W.in + i];
      y[size_t(r) * W.out + o] = s;
    }
  });
  return y;
}

// out16[r, o] = gelu_tanh(x Wg[o]) * (x Wu[o]): launch_gemv_gelu_mul's operation. [n, out]
std::vector<double> gemv_gelu_mul_ref(const HostWeights& gate, const HostWeights& up, const std::vector<float>& x,
                                      int n) {
  std::vector<double> g = gemv_ref(gate, x, n);
  const std::vector<double> u = gemv_ref(up, x, n);
  for (size_t i = 0; i < g.size(); ++i) g[i] = lab::gelu_tanh_ref(g[i]) * u[i];
  return g;
}

// h[r] = (h[r] + norm(y[r]) * w_post) * scalar, norm16[r] = norm(h[r]) * w_next, norm(v) = v / sqrt(mean(v^2) +
// eps): launch_residual_norm's operation with NextNorm::Norm. h, y, norm16: [n, cols].
void residual_norm_ref(std::vector<double>* h, const std::vector<double>& y, const std::vector<float>& w_post, int n,
                       int cols, float eps, float scalar, const std::vector<float>& w_next,
                       std::vector<double>* norm16) {
  norm16->assign(size_t(n) * cols, 0.0);
  const auto rnorm = [&](const double* v) {
    double ss = 0;
    for (int c = 0; c < cols; ++c) ss += v[c] * v[c];
    return 1.0 / std::sqrt(ss / cols + eps);
  };
  for (int r = 0; r < n; ++r) {
    double* hr = h->data() + size_t(r) * cols;
    const double ry = rnorm(y.data() + size_t(r) * cols);
    for (int c = 0; c < cols; ++c) hr[c] = (hr[c] + y[size_t(r) * cols + c] * ry * w_post[size_t(c)]) * scalar;
    const double rh = rnorm(hr);
    for (int c = 0; c < cols; ++c) (*norm16)[size_t(r) * cols + c] = hr[c] * rh * w_next[size_t(c)];
  }
}

// The reference outputs of p for all 16 rows (row r depends on x row r only; a launch of n rows is checked
// against the first n).
struct Reference {
  std::vector<double> y, act, h, norm16;  // [16, out] each, as p.op has them
};

Reference reference(const Problem& p) {
  Reference ref;
  std::vector<float> x(p.x.size());
  const std::vector<half> x16 = p.x.download();
  for (size_t i = 0; i < x.size(); ++i) x[i] = __half2float(x16[i]);
  const HostWeights W(p.w);
  if (p.op == Op::GeluMul) {
    ref.act = gemv_gelu_mul_ref(W, HostWeights(p.up), x, kRows);
    return ref;
  }
  ref.y = gemv_ref(W, x, kRows);
  if (p.op == Op::StoreNorm) {
    ref.h.assign(p.h0.begin(), p.h0.end());
    residual_norm_ref(&ref.h, ref.y, p.w_post.download(), kRows, p.out, kEps, kScalar, p.w_next.download(),
                      &ref.norm16);
  }
  return ref;
}

// ---- validation ----

struct Outputs {  // everything a launch left in p's output buffers
  std::vector<float> y, h;
  std::vector<half> out16, norm16;
  unsigned counter = 0;
};

Outputs collect(const Problem& p) {
  Outputs o;
  o.y = p.y.download();
  if (p.last_parts > 1) {  // y as the parts' sum (in part order) for rows < n and columns < out; elsewhere part
                           // 0's element, or a non-poison value where any part's element there was written
    const std::vector<float> parts = p.parts.download();
    const size_t ld = size_t(kRows) * p.ldy;
    for (size_t k = 0; k < o.y.size(); ++k) {
      const bool region = int(k / size_t(p.ldy)) < p.last_n && int(k % size_t(p.ldy)) < p.out;
      float v = parts[k];
      bool written = false;
      for (int q = 1; q < p.last_parts; ++q) {
        if (region) v += parts[size_t(q) * ld + k];
        uint32_t b;
        std::memcpy(&b, &parts[size_t(q) * ld + k], 4);
        written = written || (!region && b != 0xFFFFFFFFu);
      }
      o.y[k] = written ? 0.f : v;
    }
  }
  o.h = p.h.download();
  o.out16 = p.out16.download();
  o.norm16 = p.norm16.download();
  o.counter = p.counter.download()[0];
  return o;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

float as_float(float v) { return v; }
float as_float(half v) { return __half2float(v); }

// Rows [0, n) x columns [0, cols) of a [16, ld] buffer against ref ([16, cols]); every other element must
// still hold its value in `outside` (same shape as got), or the poison when that is null.
template <typename T>
lab::Error check_region(const std::vector<T>& got, int ld, int n, int cols, const std::vector<double>& ref,
                        const std::common_type_t<std::vector<T>>* outside) {  // not deduced: may be nullptr
  std::vector<float> in_region;
  size_t stray = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    const int r = int(k / size_t(ld)), c = int(k % size_t(ld));
    if (r < n && c < cols) {
      in_region.push_back(as_float(got[k]));
      continue;
    }
    unsigned char poison[sizeof(T)];
    std::memset(poison, 0xFF, sizeof(T));
    stray += std::memcmp(&got[k], outside ? static_cast<const void*>(&(*outside)[k]) : poison, sizeof(T)) != 0;
  }
  lab::Error e = lab::max_rel_error(in_region, std::vector<double>(ref.begin(), ref.begin() + size_t(n) * cols));
  e.stray = stray;
  return e;
}

struct VersionStats {
  lab::Tally y{"y fp32", 1e-4}, act{"gate/up out16 fp16", 2e-3}, h{"h fp32", 1e-4}, norm{"norm16 fp16", 2e-3};
  int launches = 0, unsupported = 0, compared = 0, identical = 0, counter_failures = 0;
  bool ok() const {
    return y.failures + act.failures + h.failures + norm.failures + counter_failures + unsupported == 0;
  }
};

// Every listed version of p at each n of `rows` (version 1 also runs unlisted, as the bitwise baseline).
void validate(Problem& p, const std::vector<int>& rows, const std::vector<int>& versions,
              std::vector<VersionStats>* stats, const kn::Launch& l) {
  const Reference ref = reference(p);
  for (int n : rows) {
    Outputs base;
    for (int v = 1; v <= kVersions; ++v) {
      const bool listed = std::find(versions.begin(), versions.end(), v) != versions.end();
      if (!implements(v, p.op) || (!listed && v != 1)) continue;
      p.y.poison();
      p.parts.poison();
      p.out16.poison();
      p.norm16.poison();
      if (p.op == Op::StoreNorm) p.h.upload(p.h0);
      const std::string where = std::string(p.name) + (p.w4 ? " w4a16" : " fp16") + " out " + std::to_string(p.out) +
                                " in " + std::to_string(p.in) + " rows " + std::to_string(n) + ", version " +
                                std::to_string(v);
      VersionStats& st = (*stats)[size_t(v)];
      const cudaError_t err = run(v, p, n, 0, l);
      if (err != cudaSuccess) {
        std::printf("  FAIL %s: launch returned %s\n", where.c_str(), cudaGetErrorString(err));
        ++st.unsupported;
        continue;
      }
      LAB_CHECK(cudaDeviceSynchronize());
      const Outputs got = collect(p);
      if (v == 1) base = got;
      if (!listed) continue;
      ++st.launches;
      if (p.op == Op::Store) st.y.add(check_region(got.y, p.ldy, n, p.out, ref.y, nullptr), where);
      if (p.op == Op::GeluMul) st.act.add(check_region(got.out16, p.ld16, n, p.out, ref.act, nullptr), where);
      if (p.op == Op::StoreNorm) {
        if (p.last_parts == 1) st.y.add(check_region(got.y, p.ldy, n, p.out, ref.y, nullptr), where);
        st.h.add(check_region(got.h, p.out, n, p.out, ref.h, &p.h0), where);
        st.norm.add(check_region(got.norm16, p.out, n, p.out, ref.norm16, nullptr), where);
      }
      if (got.counter != 0 && ++st.counter_failures <= 8)
        std::printf("  FAIL %s: arrival counter %u after the launch (must be 0)\n", where.c_str(), got.counter);
      if (v != 1) {
        ++st.compared;
        st.identical += same_bits(got.y, base.y) && same_bits(got.h, base.h) && same_bits(got.out16, base.out16) &&
                        same_bits(got.norm16, base.norm16);
      }
    }
  }
}

// ---- the cases ----

struct Case {
  const char* name;
  Op op;
  int out, in;
};

// Gemma 4 E2B decode (hidden 1536, MLP 6144, PLE 256, 8 query heads of 256 on sliding layers, vocab 262144).
const Case kE2B[] = {
    {"q_proj", Op::Store, 2048, 1536},
    {"gate/up + GELU", Op::GeluMul, 6144, 1536},
    {"down_proj", Op::Store, 1536, 6144},
    {"o_proj + norm", Op::StoreNorm, 1536, 2048},
    {"down_proj + norm", Op::StoreNorm, 1536, 6144},
    {"gate/up wide", Op::GeluMul, 12288, 1536},
    {"down wide + norm", Op::StoreNorm, 1536, 12288},
    {"ple_proj + norm", Op::StoreNorm, 1536, 256},
    {"LM head", Op::Store, 262144, 1536},
};

// Odd sizes. in: k-tile counts 1, 2, 12, 49, 193 (fp16) and 1, 2, 4, 17, 49 (w4a16): every work split (1, 2, 4
// warps per row tile, 8 by the fallback where no power of two divides), partial last k-tiles, warp shares past
// version 2's thresholds (the E2B shapes add 8 warps dividing 48 k-tiles). out: partial 16-row tiles; "+ norm"
// rows keep cols % 4 == 0 (the vectorised norm both versions take).
const std::vector<int> kOddInF16 = {8, 40, 376, 1544, 6152};
const std::vector<int> kOddInW4 = {32, 256, 416, 2080, 6176};
const std::vector<int> kOddOut = {7, 33, 1000, 2051};
const std::vector<int> kOddCols = {36, 1004, 1540};
const std::vector<int> kOddRows = {1, 2, 3, 8, 9, 13, 16};

const char* kAbout[] = {
    "",
    "shipped: kernels/gemv.cuh launch_gemv_args (+ launch_residual_norm: two launches)",
    "wide in-flight tiles: 6 (gate/up: 3) k-tiles of weight loads per warp where the share passes 4 (2)",
    "residual norm in the GEMV's last block (arrival counter; + norm cases only)",
    "k-split over --splits blocks per row tile (parts summed by the residual norm; not gate/up)",
    "--kw warps per row tile (default 1) instead of gemv_split's choice: the shipped kernel, repartitioned",
};

int usage(const char* argv0) {
  std::printf(
      "usage: %s [VERSIONS] [--rows 1,8,16] [--weights fp16,w4a16] [--reps 50] [--samples 7] [--pdl] "
      "[--splits 2] [--kw 1] [--validate-only]\n  VERSIONS: comma list of 1..%d (default 1,2,3,4)\n",
      argv0, kVersions);
  for (int v = 1; v <= kVersions; ++v) std::printf("  %d  %s\n", v, kAbout[v]);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> rows = {1, 8, 16};
  bool fp16 = true, w4 = true, pdl = false;
  lab::CommonArgs common;
  common.versions = {1, 2, 3, 4};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (common.take(argc, argv, &i, kVersions)) continue;
    std::vector<int> sp;
    if (arg == "--splits" && i + 1 < argc && lab::parse_ints(argv[++i], &sp) && sp.size() == 1 && sp[0] >= 1 &&
        sp[0] <= kn::kGemvMaxSplit) {
      g_splits = sp[0];
      continue;
    }
    if (arg == "--kw" && i + 1 < argc && lab::parse_ints(argv[++i], &sp) && sp.size() == 1 &&
        (sp[0] == 1 || sp[0] == 2 || sp[0] == 4 || sp[0] == 8)) {
      g_kw = sp[0];
      continue;
    }
    if (arg == "--rows" && i + 1 < argc && lab::parse_ints(argv[++i], &rows)) continue;
    if (arg == "--weights" && i + 1 < argc) {
      const std::string w = argv[++i];
      fp16 = w.find("fp16") != std::string::npos;
      w4 = w.find("w4a16") != std::string::npos;
      if (fp16 || w4) continue;
    }
    if (arg == "--pdl") {
      pdl = true;
      continue;
    }
    return usage(argv[0]);
  }
  const std::vector<int>& versions = common.versions;
  const int reps = common.reps, samples = common.samples;
  const bool validate_only = common.validate_only;
  if (std::any_of(rows.begin(), rows.end(), [](int n) { return n < 1 || n > kRows; })) return usage(argv[0]);

  cudaDeviceProp prop;
  LAB_CHECK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  if (pdl && !kn::pdl_supported(0)) {
    std::printf("--pdl: this build / device has no programmatic dependent launch (sm_90 code needed); off\n");
    pdl = false;
  }
  cudaStream_t stream;
  LAB_CHECK(cudaStreamCreate(&stream));
  const kn::Launch launch(stream, pdl);
  std::printf("lab_gemv_decode on %s (sm_%d%d, %d SMs, L2 %d MiB), PDL %s\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, pdl ? "on" : "off");
  for (int v : versions) std::printf("  version %d: %s\n", v, kAbout[v]);
  std::vector<bool> layouts;
  if (fp16) layouts.push_back(false);
  if (w4) layouts.push_back(true);

  // ---- validate
  std::printf("\nvalidating (random inputs, outputs poisoned; max |got - ref| / max |ref| against the host)\n");
  std::vector<VersionStats> stats(kVersions + 1);
  uint64_t seed = 100;
  for (bool q : layouts) {
    for (int in : q ? kOddInW4 : kOddInF16) {
      for (int out : kOddOut)
        for (Op op : {Op::Store, Op::GeluMul}) {
          auto p = make_problem(op == Op::Store ? "odd" : "odd gate/up", op, q, out, in, 1, seed += 10);
          validate(*p, kOddRows, versions, &stats, launch);
        }
      for (int cols : kOddCols) {
        auto p = make_problem("odd + norm", Op::StoreNorm, q, cols, in, 1, seed += 10);
        validate(*p, kOddRows, versions, &stats, launch);
      }
    }
    for (const Case& c : kE2B) {
      auto p = make_problem(c.name, c.op, q, c.out, c.in, 1, seed += 10);
      validate(*p, rows, versions, &stats, launch);
    }
  }
  bool ok = true;
  for (int v : versions) {
    const VersionStats& s = stats[size_t(v)];
    std::printf("  version %d: %d launches", v, s.launches);
    for (const lab::Tally* t : {&s.y, &s.act, &s.h, &s.norm})
      if (t->checks) std::printf("; %s max rel err %.2e (tol %.0e)", t->what.c_str(), t->max_rel, t->tol);
    if (v != 1) std::printf("; bit-identical to version 1 in %d of %d", s.identical, s.compared);
    std::printf(": %s\n", s.ok() ? "OK" : "FAILED");
    ok = ok && s.ok();
  }
  if (!ok) return 1;
  if (validate_only) return 0;

  // ---- time
  const double bound = lab::stream_read_gbs(stream);
  std::printf(
      "\nstream read %.0f GB/s (1 GiB, median of 5): the bound. Per version: us per call (median of %d x %d calls), "
      "GB/s of weight bytes (+ scales), %% of the bound; weights rotated over copies > 3 x L2\n",
      bound, samples, reps);
  std::printf("%-17s %-6s %6s %6s %4s", "case", "weight", "out", "in", "rows");
  for (int v : versions) std::printf(" | v%d %7s %6s %4s", v, "us", "GB/s", "%bw");
  std::printf("\n");
  for (const Case& c : kE2B)
    for (bool q : layouts) {
      const size_t one = (c.op == Op::GeluMul ? 2 : 1) * matrix_bytes(q, c.out, c.in);
      const int copies = int(std::max<size_t>(1, 3 * size_t(prop.l2CacheSize) / one + 1));
      auto p = make_problem(c.name, c.op, q, c.out, c.in, copies, seed += 10);
      for (int n : rows) {
        std::printf("%-17s %-6s %6d %6d %4d", c.name, q ? "w4a16" : "fp16", c.out, c.in, n);
        for (int v : versions) {
          if (!implements(v, c.op)) {
            std::printf(" | %10s %6s %4s", "-", "-", "-");
            continue;
          }
          const double us = lab::median_us([&](int i) { LAB_CHECK(run(v, *p, n, i, launch)); }, reps, samples, stream);
          const double gbs = double(p->weight_bytes()) / us / 1e3;
          std::printf(" | %10.2f %6.0f %3.0f%%", us, gbs, 100 * gbs / bound);
        }
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  LAB_CHECK(cudaStreamDestroy(stream));
  return 0;
}
