// Kernel lab: the w4a16 matmul for more than 16 rows (issue 17): batched decode (17..256 rows) and prefill.
//
//   Y[M, N] fp32 = X[M, K] fp16 (row stride ldx) x W^T,   W [N, K] int4 (compressed-tensors, symmetric, group 32
//   along K) with fp16 group scales: w[n][k] = (u - 8) * S[n][k / 32], u the stored nibble (GEMMA4.md).
//
//   lab_gemm_w4 [VERSIONS] [--m 32,64,128,256,2048,4096] [--reps 20] [--samples 5] [--validate-only]
//               [--self-check]
//
// VERSIONS: a comma list (default 1..15; 16..22 when listed).
//   1  what the CUDA backend does today for passes of more than 16 rows (cuda/layers.hpp mm()): the whole matrix
//      dequantised to fp16 (kernels/gemv.cuh launch_dequant_w4), then cublasGemmEx (fp16 in, fp32 compute and out).
//   2  gemm_w4_kernel, tile 128 x 128 x 32: 8 warps as 2 (m) x 4 (n), warp tile 64 x 32; 24.5 KiB smem (2 blocks
//      per T4 SM).
//   3  the same with a 64-deep k-tile (two scale groups per warp per tile): 45.0 KiB (1 block per T4 SM), twice
//      the math between barriers, for GPUs where a 32-deep tile drains before the next one lands.
//   4  tile 128 x 64 x 64: warps 2 (m) x 2 (n) x 2 (k, one scale group each, summed through smem at the end).
//   5  tile 32|64 x 64 x 128 (32 rows when M <= 32): warps 1 x 2 x 4 (k): more blocks for few rows.
//   6  the shipped launcher, kernels/gemm_w4.cuh launch_gemm_w4 (LoadOptions::w4_matmul = TensorCore, and Auto's
//      rows): by shape, from this lab's runs: since 2026-12-04 (e) M <= 256 -> 12, but 3 when N <= 2048 and
//      K >= 2048 at 65..128 rows; more -> 2 (before: M <= 256 -> 3 when N <= 2048 and K >= 2048, else 5; before
//      that by M: <= 64 -> 5, <= 256 -> 4, else 2).
//   7..9  versions 4, 3, 5 with two k-tiles' loads in flight in registers (Cfg::PF = 2) instead of one: a load has
//      two tiles' math to land in (on an H200 one tile's math is shorter than a load's latency).
//   10 tile 128 x 32 x 64, warps 4 (m) x 1 x 2 (k), two k-tiles in flight: twice the blocks of version 4.
//   11 version 2's tile at one block per SM (registers uncapped), two k-tiles in flight.
//   12..15 gemm_w4x_kernel (kernels/gemm_w4.cuh since 12 shipped; notes in "versions 12..15" below and at XCfg
//      there): occupancy (2 blocks of 8 warps per SM on sm_80+,
//      <= 128 registers), the lop3 dequant (13 instead of 15 instructions per word, bit-identical weights):
//   12 tile 64 x 128 x 64, warps 1 x 4 x 2 (warp 64 x 32: v5's warp tile); gemm_w4::XSmall, in the dispatch since
//      2026-12-04 (e) (version 6 above: 33..256 rows but N <= 2048 with K >= 2048 at 65..128 rows, which take 3).
//   13 tile 128 x 64 x 64, warps 1 x 4 x 2, warp 128 x 16 (MT 8, NT 2): a dequantised pair feeds 8 m16 tiles, one
//      block holds all of 65..128 rows (m16 tiles past M skipped).
//   14 tile 128 x 128 x 32, warps 1 x 8 x 1, warp 128 x 16: no k-warps (no in-block reduction), X re-used by 128 n.
//   15 version 13 with split-K filling two blocks per SM (gemm_w4_splits_for at 2 x the SM count).
//   16 version 12 (the shipped XSmall) with split-K filling two blocks per SM: the candidate for o_proj / down_proj
//      at 65..128 rows, where 12 at the engine's split (24 tiles, 6 splits) lost to 3 (12 tiles, 11 splits) and 15
//      gained on 13 that way (2026-12-04 (e)).
//   17 the MLP's gate and up projections and the GELU product in one launch (kernels/gemm_w4.cuh gemm_w4x_glu_kernel):
//      act16[m, o] = half(gelu_tanh(x . Wg[o]) * (x . Wu[o])), fp16 out (row stride ld16). Version 12's tile and
//      math (XSmall: 64 x 128 x 64, warps 1 x 4 x 2, 2 blocks per SM on sm_80+), its 128 accumulator columns being
//      64 outputs of gate and the same 64 of up (a warp: n8 tiles j0, j0 + 1 of both, so g and u of one (m, o) sit in
//      one lane's registers); the epilogue is gelu_mul_kernel's expression (to_half_sat(gelu_tanh(g) * u)), so the
//      output equals v12 unsplit + gelu_mul bit for bit (checked in the validation, printed, not fatal). No split-K
//      (the GELU is nonlinear): E2B's N = 6144 / 12288 makes 96 / 192 tiles per 64 rows. Gate/up shapes only.
//      32 KiB smem, 145 / 128 registers (sm_75 / sm_90), 0 spills: each thread's weight and scale sources are formed
//      once and moved by kb0 per k-tile (with two matrices the shipped per-tile maps spilled 16 bytes on sm_90).
//   18 what the engine does for those rows today, three launches (cuda/layers.hpp gate()): gate GEMM and up GEMM to
//      fp32 through the shipped launch_gemm_w4 with the engine's split-K (= version 12 at 33..256 rows), then
//      kernels/elementwise.cuh launch_gelu_mul into the fp16 act. The baseline of 17; gate/up shapes only.
//   19 version 17 on a narrower, deeper tile (kernels/gemm_w4.cuh GluNarrow, shipped at <= 64 rows where 17 leaves
//      SMs idle: gemm_w4_glu_narrow): 64 rows x 32 outputs of gate and the same 32 of up x 128 k, warps 1 x 2 x 4
//      (each warp version 17's math), 43 KiB smem. Twice the blocks of 17 (E2B's gate/up at <= 64 rows: 96 blocks of 17
//      on 132 SMs, 192 of these) and half the k-tiles per block; its output equals XNarrow unsplit + gelu_mul bit for
//      bit (checked as 17's).
//   20..22 versions 12, 17 and 19 with the other load form of the k loop (XCfg LEAN): 20, 21 = 12, 17 with every
//      k-tile's loads predicated and zeroed past K (the form before 2026-12-06; 12, 17 now load the k-tiles inside K
//      without predicates, rows past M and super-rows past N clamped to the last valid ones, the weight sources formed
//      once), 22 = 19 lean (19 keeps the predicated form: lean it spills 76 bytes on sm_90, this way 28). The same sums
//      bit for bit. Why: the ncu source profile of 17 at 128 rows (H100) has 12% of its instructions HMMA; per k-tile
//      and warp ~231 instructions for 32 HMMA, ~85 of them the next k-tile's loads and stores (addresses, selects,
//      predicates, zeroing moves; bench/RESULTS.md 2026-12-06).
// Versions 17..19, 21, 22 print in the gate/up rows of the timing table, for the whole gate + up + GELU (twice the
// flops and weight bytes of a single GEMM column; the Y bytes are the fp16 act). Versions 2..11 split K across blocks
// where their tiles leave SMs idle, as the engine does (gemm_w4_splits_for). The kernel, the layout's index maps and
// the configurations of versions 2, 3, 5 are kernels/gemm_w4.cuh's (moved there; the versions call its
// launch_gemm_w4_cfg<C>, version 4 and 7..11 with this file's configurations); the layout and kernel notes below are
// kept here for the lab's readers (the header has the same text). Versions 2..6 read the weights in the GEMM layout
// below (built once from the checkpoint layout by kernels/gemm_w4.cuh launch_repack_w4_gemm, the load-time repack) and
// never make an fp16 copy.
//
// ---- the GEMM weight layout (the one-time repack; why not the checkpoint's) ----
// The checkpoint's words (kept as they are on the GPU today: kernels/gemv.cuh, cuda/weights.hpp) hold 8
// consecutive k of one row. An mma B fragment (m16n8k8: b0 = W[n g][k 2t, 2t+1]) needs, per lane, k pairs
// (2t, 2t+1) of row g: from the checkpoint words a lane would unpack 8 nibbles to use 2, or shuffle. So the
// weights are repacked once so that one 32-bit word is exactly what a lane multiplies for one n8 tile and one
// scale group, and one 16-byte shared load is what it multiplies for 4 n8 tiles:
//   wp  [N/32][K/32][32 lanes][4 j] u32: nb = n / 32 (a "super-row" of 32 n), kb = k / 32 (a scale group),
//       lane = 4 g + t, j = n8 tile; word (nb, kb, lane, j), nibble s (0..3) = u of W[32 nb + 8 j + g][32 kb +
//       8 s + 2 t], nibble s + 4 = u of the next k. kernels/mma.cuh's w4_pair(word, s, scale) then yields the
//       half2 (k 8s + 2t, 8s + 2t + 1) of n 8j + g: b0 of k8-step s. 512 bytes per (nb, kb) unit.
//   sp  [N/32][K/32][8 g][4 j] fp16: S[32 nb + 8 j + g][kb]; a lane reads its 4 scales (one per j) as 8 bytes.
//   Same bytes as the checkpoint layout (N K / 2 + N K / 16). A block's (BN x BK) weight tile is BN / 32 runs of
//   BK / 32 contiguous units: plain 16-byte loads, copied to shared memory as they are; no index arithmetic per
//   weight. Requires N % 32 == 0 and K % 32 == 0 (every Gemma 4 linear). The GEMV (<= 16 rows) could read this
//   layout as well; until it does, a backend would keep both or convert the GEMV.
//
// ---- the kernel ----
// X is the mma's A operand (16 m x 16 k via ldmatrix.x4 from a padded [BM][BK + 8] smem tile: conflict-free
// rows), the dequantised weights are B (n8 tiles; w4_pair = OR the nibbles into 1024.0's mantissa, subtract
// 1032.0 (exact), times the fp16 scale (one rounding): the same fp16 weight launch_dequant_w4 builds), fp32
// accumulators; m16n8k16 on sm_80+, two m16n8k8 on sm_75 (kernels/mma.cuh mma_16x8x16). 256 threads, warps
// WM (m) x WN (n) x WK (k); a warp owns MT m16 tiles x 4 n8 tiles (one super-row) and, per k-tile, GPW scale
// groups (BK = 32 WK GPW). Pipeline without cp.async (sm_75): tile kt + 1's 16-byte global loads (X through L1,
// weights and scales L1::no_allocate) are issued into registers before tile kt's math from shared memory, then
// stored to the other of two smem stages; one __syncthreads per k-tile. The WK k-warps' accumulators are summed
// through smem (tree, fixed order: deterministic), and fragments go straight to Y as float2 (a row's 4 lanes
// write 32 contiguous bytes). Rows past M and groups past K are loaded as zeros, columns past N not stored.
//
// Validation first: every listed version at odd sizes (M 17, 33, 100, 257; N 32..1056 with partial n tiles; K
// 32..2080 with partial k tiles; ldx = K + 8, ldy = N + 2) and at the E2B shapes (M 33 and 257), random inputs,
// Y poisoned with NaN (and one row past M, and the ldy padding, checked untouched), against gemm_w4_ref (double
// sums of the same fp16 weights): max |got - ref| / max |ref| <= 1e-3 per launch, every element finite; the first
// failing element is printed as (m, n) got / ref. Any failure: exit 1 before timing. Versions 17 and 18: the same
// odd sizes (N: outputs of each matrix, ld16 = N + 2) and gate/up 6144 and 12288 x 1536 at M 33, 64, 77, 100, 128,
// 256, against gemm_w4_glu_ref (the two double sums, then gelu_tanh and the product in double, saturated as
// to_half_sat); the fp16 act poisoned (NaN) with its border checked, its fp16 rounding inside the same 1e-3.
// Timing: cudaEvents around --reps calls, median of --samples, weights rotated over copies > 3 x L2 (as in a decode
// step); TFLOP/s against a stated fp16 tensor-core peak per GPU (dense, from the datasheets: H100/H200 989, A100
// 312, L4 121, T4 65), GB/s (weights + scales + X + Y bytes) against the measured stream read bandwidth, and
// %bound = max(flops / peak, bytes / bandwidth) / time.
//
// A CPU-only self-check of the repack and of the kernel's index math (fragment by fragment, from the PTX ISA's
// fragment layouts; version 17's gate | up tile maps, warp map and GELU epilogue pairing included) runs first, and
// alone with --self-check; it also builds with g++ (no GPU, no nvcc):
//   g++ -std=c++17 -O2 -x c++ -DGEMM_W4_HOST_ONLY -I/usr/local/cuda/include dev/gemm_w4.cu -o /tmp/gemm_w4_host
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../kernels/gemm_w4.cuh"  // without nvcc: the layout's index maps and configurations only
#ifndef GEMM_W4_HOST_ONLY
#include <cublas_v2.h>

#include "../kernels/elementwise.cuh"  // version 18's launch_gelu_mul
#include "../kernels/gemv.cuh"
#include "lab.cuh"
#else
#include "lab_host.hpp"  // lab.cuh's host part (lab.cuh needs nvcc)
#endif

namespace {

// The GEMM layout's index maps, the configuration template and the shipped configurations (CfgLarge, CfgDeep,
// CfgSmall, CfgTiny) are kernels/gemm_w4.cuh's (namespace gemm_w4); the self-check emulates them.
using namespace gemma4_t4::kernels::gemm_w4;  // NOLINT(google-build-using-namespace)

// The host repack (what a backend would run once at load; the lab runs the same maps on the device).
void repack_host(const std::vector<uint32_t>& wq, const std::vector<uint16_t>& s, int N, int K,
                 std::vector<uint32_t>* wp, std::vector<uint16_t>* sp) {
  wp->resize(size_t(N) * K / 8);
  sp->resize(size_t(N) * K / 32);
  for (size_t w = 0; w < wp->size(); ++w) (*wp)[w] = repack_word(wq.data(), N, K, w);
  for (size_t i = 0; i < sp->size(); ++i) (*sp)[i] = repack_scale(s.data(), N, K, i);
}

// ---- host reference ----

inline float h2f(uint16_t b) {
  __half_raw r;
  r.x = b;
  return __half2float(__half(r));
}
inline uint16_t f2h(float v) { return static_cast<__half_raw>(__float2half_rn(v)).x; }

// y[m][n] = sum_k x[m][k] w[n][k] in double, w = fp16((u - 8) * S[n][k / 32]) (the fp16 weight every version
// multiplies). The operation's arguments in the CHECKPOINT layout (the definition): x [M, ldx] fp16 bits,
// wq [N, K/8], s [N, K/32] fp16 bits; y [M, N].
std::vector<double> gemm_w4_ref(const std::vector<uint16_t>& x, int ldx, int M, int N, int K,
                                const std::vector<uint32_t>& wq, const std::vector<uint16_t>& s) {
  std::vector<double> y(size_t(M) * N);
  std::vector<float> xf(size_t(M) * K);
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k) xf[size_t(m) * K + k] = h2f(x[size_t(m) * ldx + k]);
  lab::parallel_for(N, [&](int n) {
    std::vector<float> w(static_cast<size_t>(K));
    for (int k = 0; k < K; ++k) {
      const int q = int(ckpt_nibble(wq.data(), K, n, k)) - 8;
      w[size_t(k)] = h2f(f2h(float(q) * h2f(s[size_t(n) * (K / 32) + k / 32])));
    }
    for (int m = 0; m < M; ++m) {
      const float* xr = xf.data() + size_t(m) * K;
      double acc = 0;
      for (int k = 0; k < K; ++k) acc += double(w[size_t(k)]) * xr[k];
      y[size_t(m) * N + n] = acc;
    }
  });
  return y;
}

// gelu_tanh(g) u in double, saturated to fp16's range as to_half_sat (kernels/common.cuh) does before it rounds.
double gelu_mul_ref(double g, double u) {
  const double v = lab::gelu_tanh_ref(g) * u;
  return std::min(std::max(v, -65504.0), 65504.0);
}

// Versions 17, 18: act[m][o] = gelu_tanh(g) u, g = x . Wg[o], u = x . Wu[o] (gemm_w4_ref's double sums of the fp16
// weights): [M, N]. wq_g / wq_u [N, K/8], s_g / s_u [N, K/32] as gemm_w4_ref's.
std::vector<double> gemm_w4_glu_ref(const std::vector<uint16_t>& x, int ldx, int M, int N, int K,
                                    const std::vector<uint32_t>& wq_g, const std::vector<uint16_t>& s_g,
                                    const std::vector<uint32_t>& wq_u, const std::vector<uint16_t>& s_u) {
  std::vector<double> act = gemm_w4_ref(x, ldx, M, N, K, wq_g, s_g);
  const std::vector<double> u = gemm_w4_ref(x, ldx, M, N, K, wq_u, s_u);
  for (size_t i = 0; i < act.size(); ++i) act[i] = gelu_mul_ref(act[i], u[i]);
  return act;
}

// ---- CPU self-check: the repack and the kernel's index maps, one fragment at a time ----

// w4_pair on the host, as values: (u_s - 8) * scale and (u_{s+4} - 8) * scale rounded to fp16.
void host_w4_pair(uint32_t word, int s, uint16_t scale, float* lo, float* hi) {
  *lo = h2f(f2h(float(int((word >> (4 * s)) & 0xFu) - 8) * h2f(scale)));
  *hi = h2f(f2h(float(int((word >> (4 * (s + 4))) & 0xFu) - 8) * h2f(scale)));
}

// One k-tile's X part of a "smem" stage as every kernel's tile load fills it (x_unit; zeros past M and K).
template <class C>
void fill_x(const std::vector<uint16_t>& x, int ldx, int M, int K, int m0, int kb0, std::vector<uint16_t>* xs) {
  for (int idx = 0; idx < C::kXLoads; ++idx) {
    int row, col;
    x_unit(idx, C::BK, &row, &col);
    const bool ok = m0 + row < M && kb0 * 32 + col < K;
    for (int e = 0; e < 8; ++e)
      (*xs)[size_t(row) * C::XS + col + e] = ok ? x[size_t(m0 + row) * ldx + kb0 * 32 + col + e] : 0;
  }
}

// One k-tile's X and W parts of a "smem" stage as gemm_w4_kernel's tile load fills them (x_unit, w_unit; zeros past
// M, K and N). emulate_x fills W through its tile source map (one matrix, or gate | up).
template <class C>
void fill_xw(const std::vector<uint16_t>& x, int ldx, int M, int N, int K, const std::vector<uint32_t>& wp, int m0,
             int nb0, int kb0, std::vector<uint16_t>* xs, std::vector<uint32_t>* ws) {
  const int NB = N / 32, KG = K / 32;
  fill_x<C>(x, ldx, M, K, m0, kb0, xs);
  for (int idx = 0; idx < C::kWLoads; ++idx) {
    int sr, gi;
    const size_t src = w_unit(idx, C::G, nb0, kb0, KG, &sr, &gi);
    const bool ok = nb0 + sr < NB && kb0 + gi < KG;
    for (int e = 0; e < 4; ++e) (*ws)[size_t(idx) * 4 + e] = ok ? wp[src * 4 + e] : 0;
  }
}

// ldmatrix.x4 of m16 tile i, k16 half h of group gi, for warp row wm, from the emulated X stage: register r of lane
// (g, t) = row g, halves 2t, 2t+1 of the matrix whose rows lanes 8r..8r+7 address; A[16][16] rebuilt from all
// lanes' registers per m16n8k16's A layout.
template <class C>
void emulate_a(const std::vector<uint16_t>& xs, int wm, int i, int gi, int h, float (&A)[16][16]) {
  float a_reg[32][4][2];
  for (int lane = 0; lane < 32; ++lane)
    for (int r = 0; r < 4; ++r) {
      int row, col;
      a_addr(8 * r + (lane >> 2), wm * C::MT * 16, i, gi, h, &row, &col);
      for (int e = 0; e < 2; ++e) a_reg[lane][r][e] = h2f(xs[size_t(row) * C::XS + col + 2 * (lane & 3) + e]);
    }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int e = 0; e < 2; ++e) {
      A[g][2 * t + e] = a_reg[lane][0][e];
      A[g + 8][2 * t + e] = a_reg[lane][1][e];
      A[g][2 * t + 8 + e] = a_reg[lane][2][e];
      A[g + 8][2 * t + 8 + e] = a_reg[lane][3][e];
    }
  }
}

// m16n8k16 in double into every lane's C fragment: lane (g, t)'s c0, c1 = (row g, n 2t, 2t+1), c2, c3 = row g + 8,
// at acc[lane * stride + c] (stride: the accumulators per lane).
void emulate_mma(const float (&A)[16][16], const float (&B)[16][8], double* acc, int stride) {
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int c = 0; c < 4; ++c) {
      const int r = g + 8 * (c >> 1), n = 2 * t + (c & 1);
      double d = 0;
      for (int k = 0; k < 16; ++k) d += double(A[r][k]) * B[k][n];
      acc[size_t(lane) * stride + c] += d;
    }
  }
}

// Emulates kernel C on the CPU for one problem: the same tile-load maps into two "smem" stages, ldmatrix.x4
// and m16n8k16 (two m16n8k8) per the PTX ISA's fragment layouts, the same epilogue map. Sums in double.
template <class C>
std::vector<double> emulate(const std::vector<uint16_t>& x, int ldx, int M, int N, int K,
                            const std::vector<uint32_t>& wp, const std::vector<uint16_t>& sp) {
  std::vector<double> y(size_t(M) * N, std::nan(""));
  const int NB = N / 32, KG = K / 32, KT = (KG + C::G - 1) / C::G;
  std::vector<uint16_t> xs(size_t(C::BM) * C::XS);
  std::vector<uint32_t> ws(size_t(C::kWBytes) / 4);
  std::vector<uint16_t> ss(size_t(C::kSBytes) / 2);
  for (int by = 0; by * C::BM < M; ++by)
    for (int bx = 0; bx * C::BN < N; ++bx) {
      const int m0 = by * C::BM, nb0 = bx * (C::BN / 32);
      // acc[warp mn][lane][MT][4][4], summed over the k-warps (the kernel's reduction)
      std::vector<double> acc(size_t(C::WM * C::WN) * 32 * C::kAcc, 0.0);
      for (int kt = 0; kt < KT; ++kt) {
        const int kb0 = kt * C::G;
        fill_xw<C>(x, ldx, M, N, K, wp, m0, nb0, kb0, &xs, &ws);
        for (int idx = 0; idx < C::kSLoads; ++idx) {
          int sr, gi;
          const size_t src = s_unit(idx, C::G, nb0, kb0, KG, &sr, &gi);
          const bool ok = nb0 + sr < NB && kb0 + gi < KG;
          for (int e = 0; e < 8; ++e) ss[size_t(idx) * 8 + e] = ok ? sp[src * 8 + e] : 0;
        }
        for (int warp = 0; warp < 8; ++warp) {
          const int wmn = warp % (C::WM * C::WN), ks = warp / (C::WM * C::WN), wm = wmn / C::WN, wn = wmn % C::WN;
          for (int q = 0; q < C::GPW; ++q) {
            const int gi = ks + C::WK * q;
            if (kb0 + gi >= KG) continue;
            for (int h = 0; h < 2; ++h)
              for (int i = 0; i < C::MT; ++i) {
                float A[16][16];
                emulate_a<C>(xs, wm, i, gi, h, A);
                for (int j = 0; j < 4; ++j) {
                  float B[16][8];  // [k][n]: b0 = (k 2t, 2t+1; n g), b1 = (k 2t+8, 2t+9; n g)
                  for (int lane = 0; lane < 32; ++lane) {
                    const int g = lane >> 2, t = lane & 3;
                    const uint32_t word = ws[size_t(b_word(wn, gi, C::G, lane, j))];
                    const uint16_t sc = ss[size_t(b_scale(wn, gi, C::G, lane, j))];
                    host_w4_pair(word, 2 * h, sc, &B[2 * t][g], &B[2 * t + 1][g]);
                    host_w4_pair(word, 2 * h + 1, sc, &B[2 * t + 8][g], &B[2 * t + 9][g]);
                  }
                  emulate_mma(A, B, &acc[size_t(wmn) * 32 * C::kAcc + (i * 4 + j) * 4], C::kAcc);
                }
              }
          }
        }
      }
      for (int wmn = 0; wmn < C::WM * C::WN; ++wmn)
        for (int lane = 0; lane < 32; ++lane)
          for (int i = 0; i < C::MT; ++i)
            for (int j = 0; j < 4; ++j)
              for (int c = 0; c < 4; ++c) {
                const int wm = wmn / C::WN, wn = wmn % C::WN, g = lane >> 2, t = lane & 3;
                const int row = m0 + wm * C::MT * 16 + 16 * i + g + 8 * (c >> 1);
                const int col = (nb0 + wn) * 32 + 8 * j + 2 * t + (c & 1);
                if (row < M && col < N)
                  y[size_t(row) * N + col] = acc[(size_t(wmn) * 32 + lane) * C::kAcc + (i * 4 + j) * 4 + c];
              }
    }
  return y;
}

// The version configurations (see the header): 2, 3, 5 are the shipped ones (kernels/gemm_w4.cuh); 4, 7..11 live here.
using CfgMid = Cfg<4, 2, 2, 2, 1, 1>;         // v4: 128 x 64 x 64 (shipped for 65..256 rows until 2026-12-04)
using CfgMid2 = Cfg<4, 2, 2, 2, 1, 1, 2>;     // v7: v4 with two k-tiles in flight
using CfgDeep2 = Cfg<4, 2, 4, 1, 2, 1, 2>;    // v8: v3 likewise
using CfgSmall2 = Cfg<4, 1, 2, 4, 1, 1, 2>;   // v9: v5 (M > 32) likewise
using CfgNarrow2 = Cfg<2, 4, 1, 2, 1, 1, 2>;  // v10: 128 x 32 x 64, warps 4 x 1 x 2 (warp 32 x 32), two in flight
using CfgLarge2 = Cfg<4, 2, 4, 1, 1, 1, 2>;   // v11: v2 at one block per SM, two in flight

// ---- versions 12..15: the reworked kernel (gemm_w4x), host part: configuration, dequant, emulation ----
// What the profile of the shipped kernel (v5 / v3 tiles at 128 rows, H200) says and what these versions change:
// it issues on ~37% of cycles at 2 warps per scheduler (one 8-warp block per SM at 160-176 registers), stalled on
// fixed-latency dependencies (the dequant chain, ldmatrix -> mma), not on global memory. So:
//  - occupancy: on sm_80+ every XCfg is compiled with __launch_bounds__(256, 2) (<= 128 registers, 0 spills) and
//    <= 41 KiB static smem: two blocks (16 warps, 4 per scheduler) per SM; on sm_75 with min blocks 1 (a T4 SM's
//    64 KiB holds one block of v12, v13 or v15 anyway; v14 would spill at 128 there). Fewer registers in flight:
//    one X row/column pair per thread instead of kXL pointers, v12's scales as 4-byte words (kSSep);
//  - dequant (w4x_pairs): per 32-bit word (4 half2 of B) 1 shift + 4 lop3 + 2 hsub2 + 2 hfma2 + 4 hmul2 = 13
//    instructions instead of w4_pair's 3 shifts + 4 and/or + 4 hsub2 + 4 hmul2 = 15: the odd nibble pairs are taken
//    in place (mask 0x00F000F0 -> 1024 + 16 u) and brought to u - 8 by one hfma2 (x / 16 - 72, exact), the even ones
//    as before (1024 + u - 1032); then the scale (one rounding). Every intermediate is exact, so B is bit-identical
//    to w4_pair's (and to launch_dequant_w4's fp16 weight). Not folded: (1024 + u) s - 1032 s as one hfma2 would
//    round 1032 s to fp16 first, an error of up to ~0.4 s per weight, the same for a whole group (simulated with
//    this lab's inputs at 16 x 64 x 1536: 3.6e-2 of max |ref|, 36 times the lab's tolerance);
//  - MT = 8, NT = 2 (a warp 128 rows x 16 n): each dequantised half2 feeds 8 m16 tiles instead of 4, at the cost of
//    one ldmatrix per 2 mma instead of per 4 (ldmatrix is one instruction, the half2 3.25);
//  - one block covers 128 rows (v13..15), so at 65..128 rows no two blocks dequantise the same weights; m16 tiles
//    wholly past M are skipped (the tile's math has a half-MT instantiation: 33..64 rows in a 128-row tile).
// Instruction estimate per warp per 32-k scale group (sm_90: m16n8k16 = 1 HMMA; sm_75: twice the HMMA); "copy":
// the tile's global loads + shared stores per thread per k-tile (each warp does one group per k-tile in all of
// these), without their address arithmetic, predicates and the barrier:
//   v5  (MT 4, NT 4): 32 HMMA, 8 LDSM, 60 dequant, LDS.128 + LDS.64 + 4 PRMT, copy 6 + 6: ~2.7 other per HMMA
//   v12 (MT 4, NT 4): 32 HMMA, 8 LDSM, 52 dequant, the same 6,                 copy 4 + 4: ~2.3 other per HMMA
//   v13, v15 (MT 8, NT 2): 32 HMMA, 16 LDSM, 26 dequant, LDS.64 + LDS.32 + 2 PRMT, copy 5 + 5: ~1.8 per HMMA
//   v14 (MT 8, NT 2): as v13, copy 3 + 3 (and a barrier per group):             ~1.6 other per HMMA
// MT, NT: m16 / n8 tiles per warp (NT 2: half a super-row, n8 tiles j0, j0 + 1; 4: a whole one); WM, WN, WK: warps
// along m, n, k (8 in all); GPW: scale groups per warp per k-tile; MINB: __launch_bounds__ min blocks per SM;
// SLOTS: blocks per SM that split-K fills (1: the engine's gemm_w4_splits_for; MINB: every resident slot).
// v12: XSmall (64 x 128 x 64, 1 x 4 x 2: v5's warp tile, 2 blocks per SM) is kernels/gemm_w4.cuh's, shipped
using XTall = XCfg<8, 2, 1, 4, 2, 1, 2>;                 // v13: 128 x 64 x 64, 1 x 4 x 2, warp 128 x 16
using XWide = XCfg<8, 2, 1, 8, 1, 1, 2>;                 // v14: 128 x 128 x 32, 1 x 8 x 1, warp 128 x 16 (no k-warps)
using XTallFill = XCfg<8, 2, 1, 4, 2, 1, 2, 2>;          // v15: v13, split-K to fill both blocks of every SM
using XSmallPred = XCfg<4, 4, 1, 4, 2, 1, 2, 1, false>;  // v20: v12, every k-tile predicated
using GluSmallPred = GluCfg<XSmallPred>;                 // v21: v17 likewise
using GluNarrowLean = GluCfg<XCfg<4, 4, 1, 2, 4, 1, 2, 1, true>>;  // v22: v19 lean
// v16: XSmallFill (v12 likewise) is kernels/gemm_w4.cuh's, shipped for N <= 2048 with a long K

template <class C, class = void>
struct IsX : std::false_type {};
template <class C>
struct IsX<C, std::void_t<decltype(C::sr_of(0))>> : std::true_type {};  // emulated by emulate_x

// w4x_pairs on the host, bit for bit: pair s (0..3) of a word from the lop3 path (s >= 2 from word >> 8; odd s
// masked in place, 1024 + 16 u, then x / 16 - 72; even s 1024 + u - 1032), times the scale, rounded to fp16.
void host_w4x_pair(uint32_t word, int s, uint16_t scale, float* lo, float* hi) {
  const uint32_t w = s >= 2 ? word >> 8 : word;
  const uint32_t v = (w & (s % 2 ? 0x00F000F0u : 0x000F000Fu)) | 0x64006400u;
  float q[2];
  for (int e = 0; e < 2; ++e) {
    const float f = h2f(uint16_t(v >> (16 * e)));
    q[e] = s % 2 ? f * (1.f / 16) - 72.f : f - 1032.f;  // exact in fp16 as in fp32
  }
  *lo = h2f(f2h(q[0] * h2f(scale)));
  *hi = h2f(f2h(q[1] * h2f(scale)));
}

// The emulated part of the reworked kernels' tile sources (kernels/gemm_w4.cuh W4xOneMatrix, W4xGateUp), for
// emulate_x. EmuOneMatrix: gemm_w4x_kernel's, the block's BN / 32 super-rows of one matrix, a warp's NT n8 tiles
// from j0_of(wn) in super-row sr_of(wn), the sums as they are.
template <class C>
struct EmuOneMatrix {
  static constexpr int kSuperRows = C::BN / 32;  // output super-rows per block
  static constexpr int kOutNT = C::NT;           // output n8 tiles per warp
  static int sr_of(int wn) { return C::sr_of(wn); }
  static int j0_of(int wn) { return C::j0_of(wn); }
  // W tile unit idx (16 bytes) of the k-tile at group kb0 -> its matrix, global unit, super-row nb, group gi in the
  // tile (w_unit)
  static size_t w_src(int idx, int nb0, int kb0, int KG, int* mat, int* nb, int* gi) {
    int sr;
    const size_t src = w_unit(idx, C::G, nb0, kb0, KG, &sr, gi);
    *mat = 0;
    *nb = nb0 + sr;
    return src;
  }
  // the same for S tile word idx (4 bytes): word idx % 4 of 16-byte unit idx / 4 (s_unit)
  static size_t s_src(int idx, int nb0, int kb0, int KG, int* mat, int* nb, int* gi) {
    int sr;
    const size_t src = s_unit(idx / 4, C::G, nb0, kb0, KG, &sr, gi) * 4 + idx % 4;
    *mat = 0;
    *nb = nb0 + sr;
    return src;
  }
  // accumulator n8 tile j of the warp at (sr, j0) -> the tile super-row t and n8 tile jj of its B
  static void b_tile(int sr, int j0, int j, int* t, int* jj) {
    *t = sr;
    *jj = j0 + j;
  }
  // output n8 tile j (< kOutNT) of m16 tile i, fragment element c, from a lane's kAcc accumulators a
  static double out(const double* a, int i, int j, int c) { return a[(i * C::NT + j) * 4 + c]; }
};

// Emulates gemm_w4x_tile<C, Src> on the CPU, Map being Src's emulated part (EmuOneMatrix, EmuGateUp): the X tile map
// and Map's W / S maps into a "smem" stage (zeros past M, N and K; S as 4-byte words, the kSSep configurations' loads:
// the others' 16-byte S unit u is words 4u..4u+3 of the same map, the same bytes), a warp's B n8 tiles from Map,
// w4x_pairs' dequant, ldmatrix.x4 and m16n8k16 per the PTX ISA's fragment layouts, and Map's epilogue. wp, sp: the
// matrices Map reads (one; gate and up). Sums in double.
template <class C, class Map = EmuOneMatrix<C>>
std::vector<double> emulate_x(const std::vector<uint16_t>& x, int ldx, int M, int N, int K,
                              const std::vector<uint32_t>* wp, const std::vector<uint16_t>* sp) {
  std::vector<double> y(size_t(M) * N, std::nan(""));
  const int NB = N / 32, KG = K / 32, KT = (KG + C::G - 1) / C::G;
  std::vector<uint16_t> xs(size_t(C::BM) * C::XS);
  std::vector<uint32_t> ws(size_t(C::kWBytes) / 4);
  std::vector<uint16_t> ss(size_t(C::kSBytes) / 2);
  for (int by = 0; by * C::BM < M; ++by)
    for (int bx = 0; bx * 32 * Map::kSuperRows < N; ++bx) {
      const int m0 = by * C::BM, nb0 = bx * Map::kSuperRows;
      std::vector<double> acc(size_t(C::WM * C::WN) * 32 * C::kAcc, 0.0);
      for (int kt = 0; kt < KT; ++kt) {
        const int kb0 = kt * C::G;
        fill_x<C>(x, ldx, M, K, m0, kb0, &xs);
        for (int idx = 0; idx < C::kWLoads; ++idx) {
          int mat, nb, gi;
          const size_t src = Map::w_src(idx, nb0, kb0, KG, &mat, &nb, &gi);
          const bool ok = nb < NB && kb0 + gi < KG;
          for (int e = 0; e < 4; ++e) ws[size_t(idx) * 4 + e] = ok ? wp[mat][src * 4 + e] : 0;
        }
        for (int idx = 0; idx < C::kSWords; ++idx) {
          int mat, nb, gi;
          const size_t src = Map::s_src(idx, nb0, kb0, KG, &mat, &nb, &gi);
          const bool ok = nb < NB && kb0 + gi < KG;
          for (int e = 0; e < 2; ++e) ss[size_t(idx) * 2 + e] = ok ? sp[mat][src * 2 + e] : 0;
        }
        for (int warp = 0; warp < 8; ++warp) {
          const int wmn = warp % (C::WM * C::WN), ks = warp / (C::WM * C::WN), wm = wmn / C::WN, wn = wmn % C::WN;
          const int sr = Map::sr_of(wn), j0 = Map::j0_of(wn);
          for (int q = 0; q < C::GPW; ++q) {
            const int gi = ks + C::WK * q;
            if (kb0 + gi >= KG) continue;
            for (int h = 0; h < 2; ++h)
              for (int i = 0; i < C::MT; ++i) {
                float A[16][16];
                emulate_a<C>(xs, wm, i, gi, h, A);
                for (int j = 0; j < C::NT; ++j) {
                  int t, jj;
                  Map::b_tile(sr, j0, j, &t, &jj);
                  float B[16][8];
                  for (int lane = 0; lane < 32; ++lane) {
                    const int g = lane >> 2, tq = lane & 3;
                    const uint32_t word = ws[size_t(b_word(t, gi, C::G, lane, jj))];
                    const uint16_t sc = ss[size_t(b_scale(t, gi, C::G, lane, jj))];
                    host_w4x_pair(word, 2 * h, sc, &B[2 * tq][g], &B[2 * tq + 1][g]);
                    host_w4x_pair(word, 2 * h + 1, sc, &B[2 * tq + 8][g], &B[2 * tq + 9][g]);
                  }
                  emulate_mma(A, B, &acc[size_t(wmn) * 32 * C::kAcc + (i * C::NT + j) * 4], C::kAcc);
                }
              }
          }
        }
      }
      for (int wmn = 0; wmn < C::WM * C::WN; ++wmn)
        for (int lane = 0; lane < 32; ++lane)
          for (int i = 0; i < C::MT; ++i)
            for (int j = 0; j < Map::kOutNT; ++j)
              for (int c = 0; c < 4; ++c) {
                const int wm = wmn / C::WN, wn = wmn % C::WN, g = lane >> 2, t = lane & 3;
                const int row = m0 + wm * C::MT * 16 + 16 * i + g + 8 * (c >> 1);
                const int col = (nb0 + Map::sr_of(wn)) * 32 + 8 * (Map::j0_of(wn) + j) + 2 * t + (c & 1);
                if (row < M && col < N)
                  y[size_t(row) * N + col] = Map::out(&acc[(size_t(wmn) * 32 + lane) * C::kAcc], i, j, c);
              }
    }
  return y;
}

// ---- version 17: gate/up + GELU in one launch, host part: configuration, tile maps, emulation ----
// The block's weight tile is a base XCfg's (v17: XSmall, 4 super-rows x G groups), filled from two matrices: tile
// super-rows [0, SRM) are gate's super-rows nb0 .. nb0 + SRM - 1, [SRM, 2 SRM) up's same ones (SRM = BN / 64), so
// the smem stage, the loads per thread and the math per warp are the base's. A warp's NT = 4 n8 tiles are n8 tiles
// j0, j0 + 1 of output super-row osr in gate (accumulators j 0, 1) and in up (j 2, 3): g and u of one output sit in
// one lane (the epilogue needs no exchange). Its B operand: two 8-byte words and two 4-byte scale words instead of
// one 16-byte and one 8-byte shared load (the dequant, ldmatrix and mma counts are v12's).
// Shipped as kernels/gemm_w4.cuh's gemm_w4x_glu_kernel: gemm_w4x_kernel's block program (gemm_w4x_tile) with the
// tile source W4xGateUp (the gate | up source map, the warp map osr_of / oj0_of over both halves, the GELU product
// to fp16 as the epilogue, no split-K), the load sources formed once and moved by kb0 per k-tile.
// EmuGateUp: W4xGateUp's emulated part for emulate_x, the sources formed as the kernel forms them (k-tile 0's + kb0
// groups), and the epilogue's gelu_mul_ref on the (double) accumulators of one lane: act [M, N] in double.
template <class C>
struct EmuGateUp {
  static constexpr int kSuperRows = C::SRM, kOutNT = C::NTO;
  static int sr_of(int wn) { return C::osr_of(wn); }
  static int j0_of(int wn) { return C::oj0_of(wn); }
  static size_t w_src(int idx, int nb0, int kb0, int KG, int* mat, int* nb, int* gi) {
    return glu_w_unit(idx, C::G, C::SRM, nb0, 0, KG, mat, nb, gi) + size_t(kb0) * kGluWUnitsPerGroup;
  }
  static size_t s_src(int idx, int nb0, int kb0, int KG, int* mat, int* nb, int* gi) {
    return glu_s_unit(idx / 4, C::G, C::SRM, nb0, 0, KG, mat, nb, gi) * 4 + idx % 4 + size_t(kb0) * kGluSWordsPerGroup;
  }
  // accumulator n8 tile j: j / NTO the matrix (tile super-rows [0, SRM) gate, [SRM, 2 SRM) up), j % NTO after j0
  static void b_tile(int osr, int j0, int j, int* t, int* jj) {
    *t = j / C::NTO * C::SRM + osr;
    *jj = j0 + j % C::NTO;
  }
  // output n8 tile j < NTO: gelu_mul_ref of gate's (n8 tile j) and up's (j + NTO) sums of one output
  static double out(const double* a, int i, int j, int c) {
    return gelu_mul_ref(a[(i * C::NT + j) * 4 + c], a[(i * C::NT + j + C::NTO) * 4 + c]);
  }
};

void random_problem(std::mt19937* rng, int M, int N, int K, int ldx, std::vector<uint16_t>* x,
                    std::vector<uint32_t>* wq, std::vector<uint16_t>* s) {
  std::uniform_real_distribution<float> ux(-1.f, 1.f), us(0.002f, 0.02f);
  x->assign(size_t(M) * ldx, f2h(1e4f));  // padding past K: large, so reading it would show
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k) (*x)[size_t(m) * ldx + k] = f2h(ux(*rng));
  wq->resize(size_t(N) * K / 8);
  for (uint32_t& w : *wq) w = uint32_t((*rng)());
  s->resize(size_t(N) * K / 32);
  for (uint16_t& v : *s) v = f2h(us(*rng));
}

// An emulated result against its reference: max |got - ref| / max |ref| <= 1e-9 (both in double; only the order of
// the sums differs) and every element written (the emulators start from NaN).
bool compare_emulated(const char* name, int M, int N, int K, const std::vector<double>& ref,
                      const std::vector<double>& got) {
  double max_ref = 0, max_err = 0;
  size_t nonfinite = 0, worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(ref[i]));
    const double d = std::fabs(got[i] - ref[i]);
    if (!std::isfinite(d)) {  // never written
      if (nonfinite++ == 0) worst = i;
      continue;
    }
    if (d > max_err && nonfinite == 0) worst = i;
    max_err = std::max(max_err, d);
  }
  const double rel = max_err / std::max(max_ref, 1e-30);
  const bool bad = nonfinite > 0 || rel > 1e-9;
  std::printf("  self-check %-6s M %4d N %4d K %4d: max rel err %.2e%s", name, M, N, K, rel, bad ? "  FAIL" : "\n");
  if (bad)
    std::printf(" (%zu not written) at (m %zu, n %zu): emulated %.6g, reference %.6g\n", nonfinite, worst / size_t(N),
                worst % size_t(N), got[worst], ref[worst]);
  return !bad;
}

template <class C>
bool self_check_one(const char* name, int M, int N, int K, std::mt19937* rng) {
  const int ldx = K + 8;
  std::vector<uint16_t> x, s, sp;
  std::vector<uint32_t> wq, wp;
  random_problem(rng, M, N, K, ldx, &x, &wq, &s);
  repack_host(wq, s, N, K, &wp, &sp);
  const std::vector<double> ref = gemm_w4_ref(x, ldx, M, N, K, wq, s);
  std::vector<double> got;
  if constexpr (IsX<C>::value)
    got = emulate_x<C>(x, ldx, M, N, K, &wp, &sp);
  else
    got = emulate<C>(x, ldx, M, N, K, wp, sp);
  return compare_emulated(name, M, N, K, ref, got);
}

// Version 17's maps: emulate_x with EmuGateUp against gemm_w4_glu_ref (gate and up drawn independently, one X).
template <class C>
bool self_check_glu(const char* name, int M, int N, int K, std::mt19937* rng) {
  const int ldx = K + 8;
  std::vector<uint16_t> x, x_unused, s[2], sp[2];
  std::vector<uint32_t> wq[2], wp[2];
  random_problem(rng, M, N, K, ldx, &x, &wq[0], &s[0]);
  random_problem(rng, M, N, K, ldx, &x_unused, &wq[1], &s[1]);
  for (int mat = 0; mat < 2; ++mat) repack_host(wq[mat], s[mat], N, K, &wp[mat], &sp[mat]);
  const std::vector<double> ref = gemm_w4_glu_ref(x, ldx, M, N, K, wq[0], s[0], wq[1], s[1]);
  return compare_emulated(name, M, N, K, ref, emulate_x<C, EmuGateUp<C>>(x, ldx, M, N, K, wp, sp));
}

// The repack against the checkpoint nibbles directly (every nibble of a few sizes), then every configuration's
// index maps through emulate() at sizes with partial m, n and k tiles.
bool self_check() {
  std::printf("CPU self-check (repack + the kernel's tile, fragment and epilogue maps, emulated)\n");
  std::mt19937 rng(1234);
  bool ok = true;
  for (const int N : {32, 96}) {
    for (const int K : {32, 160}) {
      std::vector<uint16_t> x, s, sp;
      std::vector<uint32_t> wq, wp;
      random_problem(&rng, 1, N, K, K, &x, &wq, &s);
      repack_host(wq, s, N, K, &wp, &sp);
      size_t wrong = 0;
      for (int n = 0; n < N; ++n)
        for (int k = 0; k < K; ++k) {  // where the header says W[n][k] and S[n][k / 32] are
          const int nb = n / 32, j = n % 32 / 8, g = n % 8, kb = k / 32, s8 = k % 32 / 8, t = k % 8 / 2, hi = k % 2;
          const size_t unit = size_t(nb) * (K / 32) + kb;
          const uint32_t word = wp[(unit * 32 + 4 * g + t) * 4 + j];
          wrong += ((word >> (4 * (s8 + 4 * hi))) & 0xFu) != ckpt_nibble(wq.data(), K, n, k);
          wrong += sp[unit * 32 + g * 4 + j] != s[size_t(n) * (K / 32) + kb];
        }
      std::printf("  repack N %d K %d: %zu wrong nibbles or scales\n", N, K, wrong);
      ok = ok && wrong == 0;
    }
  }
  {  // versions 12..15's lop3 dequant against w4_pair: every nibble in every pair position, 4096 random scales
    size_t wrong = 0;
    std::uniform_real_distribution<float> us(-0.05f, 0.05f);
    for (int r = 0; r < 4096; ++r) {
      const uint16_t sc = r < 2 ? f2h(r ? 1e-7f : 65504.f) : f2h(us(rng));  // a subnormal and the largest too
      for (uint32_t u = 0; u < 16; ++u)
        for (int s = 0; s < 4; ++s) {
          const uint32_t mask = (0xFu << (4 * s)) | (0xFu << (4 * (s + 4)));
          const uint32_t word = (uint32_t(rng()) & ~mask) | (u << (4 * s)) | ((15 - u) << (4 * (s + 4)));
          float lo, hi, lo_x, hi_x;
          host_w4_pair(word, s, sc, &lo, &hi);
          host_w4x_pair(word, s, sc, &lo_x, &hi_x);
          wrong += std::memcmp(&lo, &lo_x, 4) != 0 || std::memcmp(&hi, &hi_x, 4) != 0;
        }
    }
    std::printf("  lop3 dequant (v12..15) against w4_pair: %zu of %d pairs differ\n", wrong, 4096 * 64);
    ok = ok && wrong == 0;
  }
  ok = self_check_one<CfgLarge>("v2", 17, 96, 96, &rng) && ok;
  ok = self_check_one<CfgLarge>("v2", 130, 160, 32, &rng) && ok;
  ok = self_check_one<CfgDeep>("v3", 33, 96, 160, &rng) && ok;
  ok = self_check_one<CfgMid>("v4", 129, 96, 96, &rng) && ok;
  ok = self_check_one<CfgSmall>("v5", 65, 96, 416, &rng) && ok;
  ok = self_check_one<CfgTiny>("v5/32", 17, 160, 160, &rng) && ok;
  ok = self_check_one<CfgNarrow2>("v10", 130, 96, 160, &rng) && ok;
  ok = self_check_one<XSmall>("v12", 65, 160, 416, &rng) && ok;
  ok = self_check_one<XSmall>("v12", 17, 288, 96, &rng) && ok;
  ok = self_check_one<XTall>("v13", 129, 160, 160, &rng) && ok;
  ok = self_check_one<XTall>("v13", 40, 96, 96, &rng) && ok;
  ok = self_check_one<XWide>("v14", 130, 160, 96, &rng) && ok;
  ok = self_check_glu<GluSmall>("v17", 65, 96, 416, &rng) && ok;  // partial m, n (one super-row) and k tiles
  ok = self_check_glu<GluSmall>("v17", 17, 160, 96, &rng) && ok;
  ok = self_check_glu<GluNarrow>("v19", 65, 96, 416, &rng) && ok;
  ok = self_check_glu<GluNarrow>("v19", 17, 160, 96, &rng) && ok;
  ok = self_check_glu<GluSmall>("v17", 130, 32, 64, &rng) && ok;
  std::printf("  self-check: %s\n", ok ? "OK" : "FAILED");
  return ok;
}

}  // namespace

#ifdef GEMM_W4_HOST_ONLY
int main() { return self_check() ? 0 : 1; }
#else

namespace {

namespace kn = gemma4_t4::kernels;

using kn::GemmW4Args;  // the kernel (versions 2..6): kernels/gemm_w4.cuh's gemm_w4_kernel<C>, any C

// ---- problems ----

// One shape: X, `copies` copies of the weights in both layouts, Y with a poisoned border.
struct Problem {
  const char* name = "";
  int M = 0, N = 0, K = 0, ldx = 0, ldy = 0, copies = 1;
  lab::DevBuf<half> x;       // [M, ldx] fp16
  lab::DevBuf<uint32_t> wq;  // [copies, N, K/8] checkpoint words
  lab::DevBuf<half> s;       // [copies, N, K/32] fp16 scales
  lab::DevBuf<uint32_t> wp;  // [copies, N*K/8] the GEMM layout
  lab::DevBuf<half> sp;      // [copies, N*K/32]
  lab::DevBuf<half> deq;     // [N, K] fp16: version 1's dequantised copy
  lab::DevBuf<float> y;      // [M + 1, ldy] fp32: row M and columns N..ldy-1 must stay poisoned
};

// `copies` copies of a random N x K matrix in the checkpoint layout (wq [copies, N, K/8], s [copies, N, K/32]) and in
// the GEMM layout (wp, sp: launch_repack_w4_gemm, the engine's load-time repack).
void make_weights(int N, int K, int copies, uint64_t seed, lab::DevBuf<uint32_t>* wq, lab::DevBuf<half>* s,
                  lab::DevBuf<uint32_t>* wp, lab::DevBuf<half>* sp) {
  const size_t nk = size_t(N) * K;
  *wq = lab::DevBuf<uint32_t>(nk / 8 * copies);
  *s = lab::DevBuf<half>(nk / 32 * copies);
  *wp = lab::DevBuf<uint32_t>(nk / 8 * copies);
  *sp = lab::DevBuf<half>(nk / 32 * copies);
  lab::fill_bits(wq->get(), wq->size(), seed);
  lab::fill_uniform(s->get(), s->size(), 0.002f, 0.02f, seed + 1);
  for (int c = 0; c < copies; ++c) {
    LAB_CHECK(kn::launch_repack_w4_gemm(wq->get() + nk / 8 * c, s->get() + nk / 32 * c, N, K, wp->get() + nk / 8 * c,
                                        sp->get() + nk / 32 * c, kn::Launch()));
  }
}

// X [M, ldx] fp16, uniform in [-1, 1); the row padding NaN: a version that read past K (into a zero weight) would
// turn a row NaN.
lab::DevBuf<half> make_x(int M, int K, int ldx, uint64_t seed) {
  lab::DevBuf<half> x(size_t(M) * ldx);
  lab::fill_uniform(x.get(), x.size(), -1.f, 1.f, seed);
  if (ldx > K) LAB_CHECK(cudaMemset2D(x.get() + K, size_t(ldx) * 2, 0xFF, size_t(ldx - K) * 2, size_t(M)));
  return x;
}

std::unique_ptr<Problem> make_problem(const char* name, int M, int N, int K, int ldx, int ldy, int copies,
                                      uint64_t seed) {
  auto p = std::make_unique<Problem>();
  p->name = name, p->M = M, p->N = N, p->K = K, p->ldx = ldx, p->ldy = ldy, p->copies = copies;
  p->x = make_x(M, K, ldx, seed);
  make_weights(N, K, copies, seed + 1, &p->wq, &p->s, &p->wp, &p->sp);
  p->deq = lab::DevBuf<half>(size_t(N) * K);
  p->y = lab::DevBuf<float>(size_t(M + 1) * ldy);
  LAB_CHECK(cudaDeviceSynchronize());
  return p;
}

// Versions 17, 18: the MLP's gate and up projections of one X (N outputs each), the fp16 act with a poisoned border,
// and version 18's intermediates.
struct GluProblem {
  const char* name = "";
  int M = 0, N = 0, K = 0, ldx = 0, ld16 = 0, copies = 1;
  lab::DevBuf<half> x;          // [M, ldx] fp16
  lab::DevBuf<uint32_t> wq[2];  // gate, up: [copies, N, K/8] checkpoint words
  lab::DevBuf<half> s[2];       // gate, up: [copies, N, K/32] fp16 scales
  lab::DevBuf<uint32_t> wp[2];  // gate, up: [copies, N*K/8] the GEMM layout
  lab::DevBuf<half> sp[2];      // gate, up: [copies, N*K/32]
  lab::DevBuf<half> out;        // [M + 1, ld16] fp16 act: row M and columns N..ld16-1 must stay poisoned
  lab::DevBuf<float> yg, yu;    // [M, N] fp32: version 18's gate and up GEMM outputs
  lab::DevBuf<half> act;        // [M, N] fp16: v18 gelu_mul out where ld16 != N (then copied), the bit check's
};

std::unique_ptr<GluProblem> make_glu_problem(const char* name, int M, int N, int K, int ldx, int ld16, int copies,
                                             uint64_t seed) {
  auto p = std::make_unique<GluProblem>();
  p->name = name, p->M = M, p->N = N, p->K = K, p->ldx = ldx, p->ld16 = ld16, p->copies = copies;
  p->x = make_x(M, K, ldx, seed);
  for (int mat = 0; mat < 2; ++mat)
    make_weights(N, K, copies, seed + 1 + 2 * mat, &p->wq[mat], &p->s[mat], &p->wp[mat], &p->sp[mat]);
  p->out = lab::DevBuf<half>(size_t(M + 1) * ld16);
  p->yg = lab::DevBuf<float>(size_t(M) * N);
  p->yu = lab::DevBuf<float>(size_t(M) * N);
  p->act = lab::DevBuf<half>(size_t(M) * N);
  LAB_CHECK(cudaDeviceSynchronize());
  return p;
}

const char* kAbout[] = {
    "",
    "today's path: launch_dequant_w4 (whole matrix -> fp16), then cublasGemmEx (fp32 compute, fp32 out)",
    "gemm_w4 128 x 128 x 32, warps 2 x 4 x 1 (warp 64 x 32), 24.5 KiB smem",
    "gemm_w4 128 x 128 x 64, warps 2 x 4 x 1, 2 groups per warp per tile, 45.0 KiB smem",
    "gemm_w4 128 x 64 x 64, warps 2 x 2 x 2 (k-split in the block), 40.5 KiB smem",
    "gemm_w4 64 x 64 x 128 (32 x 64 x 128 for M <= 32), warps 1 x 2 x 4 (k-split in the block)",
    "the shipped launch_gemm_w4, by shape: M <= 256 -> 12 (3 for N <= 2048, K >= 2048 at 65..128 rows); more -> 2",
    "v4 (128 x 64 x 64) with two k-tiles in flight (Cfg::PF = 2)",
    "v3 (128 x 128 x 64) with two k-tiles in flight",
    "v5 (64 x 64 x 128; 32 x 64 x 128 for M <= 32 as v5) with two k-tiles in flight",
    "128 x 32 x 64, warps 4 x 1 x 2 (warp 32 x 32), two k-tiles in flight",
    "v2 (128 x 128 x 32) at one block per SM, two k-tiles in flight",
    "gemm_w4x 64 x 128 x 64, warps 1 x 4 x 2 (warp 64 x 32 as v5), lop3 dequant, 2 blocks per SM (<= 128 regs)",
    "gemm_w4x 128 x 64 x 64, warps 1 x 4 x 2, warp 128 x 16 (MT 8, NT 2), lop3 dequant, 2 blocks per SM",
    "gemm_w4x 128 x 128 x 32, warps 1 x 8 x 1, warp 128 x 16, lop3 dequant, 2 blocks per SM",
    "v13 with split-K filling 2 blocks per SM (gemm_w4_splits_for at 2 x SMs)",
    "v12 with split-K filling 2 blocks per SM (gemm_w4_splits_for at 2 x SMs)",
    "gate/up + GELU in one launch: v12's tile, 64 outputs of gate + the same 64 of up, fp16 act (gate/up rows)",
    "gate/up + GELU as the engine: launch_gemm_w4 gate, up (fp32, engine split-K), launch_gelu_mul (gate/up rows)",
    "gate/up + GELU in one launch: 64 x 128 x 128 tile, warps 1 x 2 x 4, 32 outputs of gate + up (GluNarrow)",
    "v12 with every k-tile's loads predicated (XCfg LEAN false, the form before 2026-12-06)",
    "v17 with every k-tile's loads predicated (gate/up rows)",
    "v19 lean: the k-tiles inside K without predicates (gate/up rows)",
};
constexpr int kVersions = 22;
constexpr bool is_glu(int v) { return (v >= 17 && v <= 19) || v == 21 || v == 22; }  // the gate/up + GELU versions
constexpr bool glu_narrow(int v) { return v == 19 || v == 22; }  // on XNarrow's tile (else XSmall's)

// Versions 2..11 split K across blocks as the engine does (kernels/gemm_w4.cuh gemm_w4_splits_for: when the tiles
// leave SMs idle), into a partials buffer of the engine's size (cuda/workspace.hpp kGemmPartFloats).
constexpr size_t kPartFloats = size_t(4) << 20;
int g_sms = 1;
float* g_part = nullptr;

template <class C>
cudaError_t launch_split(GemmW4Args a, const kn::Launch& l) {
  a.splits = kn::gemm_w4_splits_for(kn::GemmW4Tile{C::BM, C::BN, C::BK}, a.m, a.n, a.k, g_sms, kPartFloats);
  a.part = g_part;
  return kn::launch_gemm_w4_cfg<C>(a, l);
}

// ---- versions 12..15: the reworked kernel (gemm_w4x; configuration and notes: XCfg above) ----

// launch_gemm_w4_cfg for an XCfg (the same contract; also M ldx < 2^31: 32-bit X offsets), split-K as C::SLOTS
// says: the engine's rule (gemm_w4_splits_for) with SLOTS blocks per SM to fill.
template <class C>
cudaError_t launch_gemm_w4x(GemmW4Args a, const kn::Launch& l) {
  if (a.m < 0 || a.n % 32 != 0 || a.k % 32 != 0 || a.ldx % 8 != 0 || a.ldy % 2 != 0 || a.ldx < a.k || a.ldy < a.n ||
      int64_t(a.m) * a.ldx >= (int64_t(1) << 31) || reinterpret_cast<uintptr_t>(a.x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.y) % 8 != 0 || reinterpret_cast<uintptr_t>(a.wp) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.sp) % 16 != 0)
    return cudaErrorInvalidValue;
  if (a.m == 0 || a.n == 0) return cudaSuccess;
  if (a.k == 0) return cudaErrorInvalidValue;
  a.splits = kn::gemm_w4_splits_for(kn::GemmW4Tile{C::BM, C::BN, C::BK}, a.m, a.n, a.k, g_sms * C::SLOTS, kPartFloats);
  a.part = g_part;
  const dim3 grid(kn::ceil_div(size_t(a.n), C::BN), kn::ceil_div(size_t(a.m), C::BM), unsigned(a.splits));
  if (grid.y > 65535) return cudaErrorInvalidValue;
  if (const cudaError_t e = kn::launch_kernel(kn::gemm_w4x_kernel<C>, grid, C::kThreads, l, a);
      e != cudaSuccess || a.splits == 1)
    return e;
  return kn::launch_kernel(kn::gemm_w4_reduce_kernel, kn::ceil_div(size_t(a.m) * (a.n / 4), 256), 256, l, a.part,
                           a.splits, a.m, a.n, a.y, a.ldy);
}

// ---- versions 17, 18: gate/up + GELU (17: kernels/gemm_w4.cuh's launch_gemm_w4_glu) ----

// The gate or up GEMM of p (mat 0, 1) into yg / yu, weight copy c: the engine's (launch_gemm_w4, its split-K), or
// unsplit at the base tile of version 17 (XSmall) or 19 (XNarrow, narrow): the sums that version makes.
cudaError_t glu_gemm(GluProblem& p, int mat, size_t c, bool unsplit, const kn::Launch& l, bool narrow = false) {
  const size_t nk = size_t(p.N) * p.K;
  GemmW4Args a;
  a.x = p.x.get(), a.ldx = p.ldx, a.m = p.M, a.n = p.N, a.k = p.K;
  a.wp = p.wp[mat].get() + nk / 8 * c, a.sp = p.sp[mat].get() + nk / 32 * c;
  a.y = (mat ? p.yu : p.yg).get(), a.ldy = p.N;
  if (unsplit) return narrow ? kn::launch_gemm_w4_cfg<XNarrow>(a, l) : kn::launch_gemm_w4_cfg<XSmall>(a, l);
  a.splits = kn::gemm_w4_splits(a.m, a.n, a.k, g_sms, kPartFloats);  // as cuda/layers.hpp mm()
  a.part = g_part;
  return kn::launch_gemm_w4(a, l);
}

// Version v (17, 18, 19) of p for its M rows on weight copy `copy`, into p.out. unsplit (18 only; the bit-identity
// check): v12 (narrow: XNarrow) without split-K, the sums version 17 (19) makes, and the act into p.act ([M, N]; out
// untouched).
cudaError_t run_glu(int v, GluProblem& p, int copy, const kn::Launch& l, bool unsplit = false, bool narrow = false) {
  const size_t nk = size_t(p.N) * p.K, c = size_t(copy % p.copies);
  if (v == 17 || v == 19 || v == 21 || v == 22) {
    kn::GemmW4GluArgs a;
    a.x = p.x.get(), a.ldx = p.ldx, a.m = p.M, a.n = p.N, a.k = p.K;
    for (int mat = 0; mat < 2; ++mat)
      a.wp[mat] = p.wp[mat].get() + nk / 8 * c, a.sp[mat] = p.sp[mat].get() + nk / 32 * c;
    a.out = p.out.get(), a.ld16 = p.ld16;
    switch (v) {
      case 17: return kn::launch_gemm_w4_glu_cfg<GluSmall>(a, l);
      case 19: return kn::launch_gemm_w4_glu_cfg<GluNarrow>(a, l);
      case 21: return kn::launch_gemm_w4_glu_cfg<GluSmallPred>(a, l);
      default: return kn::launch_gemm_w4_glu_cfg<GluNarrowLean>(a, l);
    }
  }
  if (v != 18) return cudaErrorInvalidValue;
  for (int mat = 0; mat < 2; ++mat)
    if (const cudaError_t e = glu_gemm(p, mat, c, unsplit, l, narrow); e != cudaSuccess) return e;
  // launch_gelu_mul writes [M, N] packed: straight into out at ld16 == N (every timed case), else into act and
  // copied (the validation's padded ld16 only)
  half* act = p.ld16 == p.N && !unsplit ? p.out.get() : p.act.get();
  if (const cudaError_t e = kn::launch_gelu_mul(p.yg.get(), p.yu.get(), size_t(p.M) * p.N, act, l); e != cudaSuccess)
    return e;
  if (act == p.out.get() || unsplit) return cudaSuccess;
  return cudaMemcpy2DAsync(p.out.get(), size_t(p.ld16) * 2, act, size_t(p.N) * 2, size_t(p.N) * 2, size_t(p.M),
                           cudaMemcpyDeviceToDevice, l.stream);
}

// Version v of p for its M rows on weight copy `copy`.
cudaError_t run(int v, Problem& p, int copy, cublasHandle_t blas, const kn::Launch& l) {
  const size_t nk = size_t(p.N) * p.K, c = size_t(copy % p.copies);
  if (v == 1) {
    if (const cudaError_t e =
            kn::launch_dequant_w4(p.wq.get() + nk / 8 * c, p.s.get() + nk / 32 * c, p.N, p.K, p.deq.get(), l);
        e != cudaSuccess)
      return e;
    const float alpha = 1.f, beta = 0.f;
    const cublasStatus_t st =
        cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, p.N, p.M, p.K, &alpha, p.deq.get(), CUDA_R_16F, p.K, p.x.get(),
                     CUDA_R_16F, p.ldx, &beta, p.y.get(), CUDA_R_32F, p.ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return st == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
  }
  GemmW4Args a;
  a.x = p.x.get(), a.ldx = p.ldx, a.m = p.M, a.n = p.N, a.k = p.K;
  a.wp = p.wp.get() + nk / 8 * c, a.sp = p.sp.get() + nk / 32 * c;
  a.y = p.y.get(), a.ldy = p.ldy;
  switch (v) {
    case 2: return launch_split<CfgLarge>(a, l);
    case 3: return launch_split<CfgDeep>(a, l);
    case 4: return launch_split<CfgMid>(a, l);
    case 5: return p.M <= 32 ? launch_split<CfgTiny>(a, l) : launch_split<CfgSmall>(a, l);
    case 6:  // the shipped launcher, split as cuda/layers.hpp mm() does
      a.splits = kn::gemm_w4_splits(a.m, a.n, a.k, g_sms, kPartFloats);
      a.part = g_part;
      return kn::launch_gemm_w4(a, l);
    case 7: return launch_split<CfgMid2>(a, l);
    case 8: return launch_split<CfgDeep2>(a, l);
    case 9: return p.M <= 32 ? launch_split<CfgTiny>(a, l) : launch_split<CfgSmall2>(a, l);
    case 10: return launch_split<CfgNarrow2>(a, l);
    case 11: return launch_split<CfgLarge2>(a, l);
    case 12: return launch_gemm_w4x<XSmall>(a, l);
    case 13: return launch_gemm_w4x<XTall>(a, l);
    case 14: return launch_gemm_w4x<XWide>(a, l);
    case 15: return launch_gemm_w4x<XTallFill>(a, l);
    case 16: return launch_gemm_w4x<XSmallFill>(a, l);
    case 20: return launch_gemm_w4x<XSmallPred>(a, l);
    default: return cudaErrorInvalidValue;
  }
}

// ---- validation ----

struct Stats {
  double max_rel = 0;
  int launches = 0, failures = 0;
  size_t bit_checked = 0, bit_diff = 0;  // version 17: outputs compared with v12 unsplit + gelu_mul, and differing
};

// A failed launch of version v on a problem: printed and counted (a launch and a failure of st). True when it failed.
bool launch_failed(cudaError_t e, int v, const char* name, int M, int N, int K, Stats* st) {
  if (e == cudaSuccess) return false;
  std::printf("  FAIL version %d, %s M %d N %d K %d: launch returned %s\n", v, name, M, N, K, cudaGetErrorString(e));
  ++st->launches, ++st->failures;
  return true;
}

constexpr double kTol = 1e-3;  // max |got - ref| / max |ref|: fp32 sums of up to 12288 fp16 products (and, for
                               // 17 / 18, the fp16 act's rounding: <= 2^-11 of |ref|)

// An output of M x N (row stride ld, M + 1 rows allocated) against ref [M, N]: got(i) the value of element i of the
// buffer, poisoned(i) whether it still holds the poison; elements of row M and of columns N..ld-1 must.
bool check_out(const char* name, int M, int N, int K, int ld, int v, const std::function<double(size_t)>& got,
               const std::function<bool(size_t)>& poisoned, const std::vector<double>& ref, Stats* st) {
  double max_ref = 0;
  for (double r : ref) max_ref = std::max(max_ref, std::fabs(r));
  double max_err = 0;
  size_t nonfinite = 0, stray = 0, worst = 0;
  long first_nan = -1, first_bad = -1;
  for (int m = 0; m <= M; ++m)
    for (int n = 0; n < ld; ++n) {
      const size_t i = size_t(m) * ld + n;
      if (m == M || n >= N) {
        stray += !poisoned(i);
        continue;
      }
      const size_t r = size_t(m) * N + n;
      const double y = got(i);
      if (!std::isfinite(y)) {
        if (nonfinite++ == 0) first_nan = long(r);
        continue;
      }
      const double d = std::fabs(y - ref[r]);
      if (d > max_err) max_err = d, worst = r;
      if (first_bad < 0 && d > kTol * max_ref) first_bad = long(r);
    }
  const double rel = max_ref > 0 ? max_err / max_ref : max_err;
  ++st->launches;
  st->max_rel = std::max(st->max_rel, rel);
  const bool ok = nonfinite == 0 && stray == 0 && rel <= kTol;
  if (!ok && ++st->failures <= 8) {
    std::printf(
        "  FAIL version %d, %s M %d N %d K %d: %zu non-finite, %zu changed outside the output, max rel err %.3g (tol "
        "%.0e)\n",
        v, name, M, N, K, nonfinite, stray, rel, kTol);
    for (long r : {first_nan, first_bad, long(worst)}) {
      if (r < 0) continue;
      const int m = int(r / N), n = int(r % N);
      std::printf("    (m %d, n %d): got %.6g, reference %.6g\n", m, n, got(size_t(m) * ld + n), ref[size_t(r)]);
    }
  }
  return ok;
}

// Y's rows [0, M) x columns [0, N) against ref; the rest of the [M + 1, ldy] buffer must still be the poison.
bool check(const Problem& p, int v, const std::vector<double>& ref, Stats* st) {
  const std::vector<float> y = p.y.download();
  return check_out(
      p.name, p.M, p.N, p.K, p.ldy, v, [&](size_t i) { return double(y[i]); },
      [&](size_t i) {
        uint32_t bits;
        std::memcpy(&bits, &y[i], 4);
        return bits == 0xFFFFFFFFu;
      },
      ref, st);
}

template <typename T>
std::vector<uint16_t> as_bits(const std::vector<T>& v) {
  std::vector<uint16_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 2);
  return b;
}

void validate(Problem& p, const std::vector<int>& versions, std::vector<Stats>* stats, cublasHandle_t blas,
              const kn::Launch& l) {
  const std::vector<double> ref =
      gemm_w4_ref(as_bits(p.x.download()), p.ldx, p.M, p.N, p.K, p.wq.download(size_t(p.N) * p.K / 8),
                  as_bits(p.s.download(size_t(p.N) * p.K / 32)));
  for (int v : versions) {
    p.y.poison();
    const cudaError_t e = run(v, p, 0, blas, l);
    Stats& st = (*stats)[size_t(v)];
    if (launch_failed(e, v, p.name, p.M, p.N, p.K, &st)) continue;
    LAB_CHECK(cudaDeviceSynchronize());
    check(p, v, ref, &st);
  }
}

// Versions 17, 18 on p against gemm_w4_glu_ref: the act (and versions 18's fp32 intermediates) poisoned before each
// launch, out's border checked. Version 17 is also compared bit for bit with v12 unsplit + gelu_mul (counted in
// Stats, printed, not a failure: the claim is equality, the contract the tolerance).
void validate_glu(GluProblem& p, const std::vector<int>& versions, std::vector<Stats>* stats, const kn::Launch& l) {
  const size_t nk = size_t(p.N) * p.K;
  const std::vector<double> ref =
      gemm_w4_glu_ref(as_bits(p.x.download()), p.ldx, p.M, p.N, p.K, p.wq[0].download(nk / 8),
                      as_bits(p.s[0].download(nk / 32)), p.wq[1].download(nk / 8), as_bits(p.s[1].download(nk / 32)));
  for (int v : versions) {
    p.out.poison(), p.yg.poison(), p.yu.poison(), p.act.poison();
    const cudaError_t e = run_glu(v, p, 0, l);
    Stats& st = (*stats)[size_t(v)];
    if (launch_failed(e, v, p.name, p.M, p.N, p.K, &st)) continue;
    LAB_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> out = as_bits(p.out.download());
    check_out(
        p.name, p.M, p.N, p.K, p.ld16, v, [&](size_t i) { return double(h2f(out[i])); },
        [&](size_t i) { return out[i] == 0xFFFFu; }, ref, &st);
    if (v == 18) continue;
    LAB_CHECK(run_glu(18, p, 0, l, /*unsplit=*/true, /*narrow=*/glu_narrow(v)));
    LAB_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> act = as_bits(p.act.download());
    for (int m = 0; m < p.M; ++m)
      for (int n = 0; n < p.N; ++n) st.bit_diff += act[size_t(m) * p.N + n] != out[size_t(m) * p.ld16 + n];
    st.bit_checked += size_t(p.M) * p.N;
  }
}

// ---- the cases ----

struct Shape {
  const char* name;
  int n, k;
};
// Gemma 4 E2B (hidden 1536, 8 x 256 query heads, 1 KV head, MLP 6144, double-wide MLP 12288).
const Shape kE2B[] = {
    {"q_proj", 2048, 1536}, {"k/v_proj", 256, 1536},   {"gate/up", 6144, 1536},    {"gate/up wide", 12288, 1536},
    {"o_proj", 1536, 2048}, {"down_proj", 1536, 6144}, {"down wide", 1536, 12288},
};
// Odd: N super-rows 1, 3, 5, 33, 7 (partial 64- and 128-wide n tiles); K groups 1, 13, 3, 49, 65 (partial 64-
// and 128-deep k tiles).
const Shape kOdd[] = {{"odd", 32, 32}, {"odd", 96, 416}, {"odd", 160, 96}, {"odd", 1056, 1568}, {"odd", 224, 2080}};
const int kOddM[] = {17, 33, 100, 257};
const int kE2BM[] = {33, 257};
const int kGluM[] = {33, 64, 77, 100, 128, 256};  // versions 17, 18 at the E2B gate/up shapes
bool is_gate_up(const Shape& s) { return std::strncmp(s.name, "gate/up", 7) == 0; }

// Dense fp16 tensor-core peak (fp32 accumulate where the datasheet gives it), TFLOP/s; 0: unknown.
double peak_tflops(const std::string& name) {
  const struct {
    const char* key;
    double tf;
  } table[] = {{"H200", 989}, {"H100", 989}, {"A100", 312}, {"L40S", 362}, {"L4", 121}, {"A10", 125}, {"T4", 65}};
  for (const auto& e : table)
    if (name.find(e.key) != std::string::npos) return e.tf;
  return 0;
}

int usage(const char* argv0) {
  std::printf(
      "usage: %s [VERSIONS] [--m 32,64,128,256,2048,4096] [--reps 20] [--samples 5] [--validate-only] "
      "[--self-check]\n  VERSIONS: comma list of 1..%d (default 1..15)\n",
      argv0, kVersions);
  for (int v = 1; v <= kVersions; ++v) std::printf("  %d  %s\n", v, kAbout[v]);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ms = {32, 64, 128, 256, 2048, 4096};
  lab::CommonArgs common;
  common.versions = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  common.reps = 20;
  common.samples = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (common.take(argc, argv, &i, kVersions)) continue;
    if (arg == "--m" && i + 1 < argc && lab::parse_ints(argv[++i], &ms)) continue;
    if (arg == "--self-check") return self_check() ? 0 : 1;
    return usage(argv[0]);
  }
  const std::vector<int>& versions = common.versions;
  std::vector<int> single, glu;  // single GEMMs (1..16, 20); gate/up + GELU (17..19, 21, 22)
  for (int v : versions) (is_glu(v) ? glu : single).push_back(v);
  const int reps = common.reps, samples = common.samples;
  const bool validate_only = common.validate_only;
  if (std::any_of(ms.begin(), ms.end(), [](int m) { return m < 1; })) return usage(argv[0]);

  if (!self_check()) return 1;
  cudaDeviceProp prop;
  LAB_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  LAB_CHECK(cudaStreamCreate(&stream));
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    std::printf("cublasCreate failed\n");
    return 2;
  }
  cublasSetStream(blas, stream);
  const kn::Launch launch(stream);
  std::printf("\nlab_gemm_w4 on %s (sm_%d%d, %d SMs, L2 %d MiB)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.l2CacheSize >> 20);
  g_sms = prop.multiProcessorCount;
  lab::DevBuf<float> part(kPartFloats);
  g_part = part.get();
  for (int v : versions) std::printf("  version %d: %s\n", v, kAbout[v]);

  // ---- validate
  std::printf("\nvalidating (random inputs, Y poisoned; max |got - ref| / max |ref| against the host, tol %.0e)\n",
              kTol);
  std::vector<Stats> stats(kVersions + 1);
  uint64_t seed = 100;
  if (!single.empty()) {
    for (const Shape& s : kOdd)
      for (int m : kOddM) {
        auto p = make_problem(s.name, m, s.n, s.k, s.k + 8, s.n + 2, 1, seed += 10);
        validate(*p, single, &stats, blas, launch);
      }
    for (const Shape& s : kE2B)
      for (int m : kE2BM) {
        auto p = make_problem(s.name, m, s.n, s.k, s.k, s.n, 1, seed += 10);
        validate(*p, single, &stats, blas, launch);
      }
  }
  if (!glu.empty()) {
    for (const Shape& s : kOdd)
      for (int m : kOddM) {
        auto p = make_glu_problem(s.name, m, s.n, s.k, s.k + 8, s.n + 2, 1, seed += 10);
        validate_glu(*p, glu, &stats, launch);
      }
    for (const Shape& s : kE2B)
      for (int m : kGluM) {
        if (!is_gate_up(s)) continue;
        auto p = make_glu_problem(s.name, m, s.n, s.k, s.k, s.n, 1, seed += 10);
        validate_glu(*p, glu, &stats, launch);
      }
  }
  bool ok = true;
  for (int v : versions) {
    const Stats& s = stats[size_t(v)];
    std::printf("  version %d: %d launches, max rel err %.2e: %s\n", v, s.launches, s.max_rel,
                s.failures ? "FAILED" : "OK");
    if (s.bit_checked)
      std::printf("    bit for bit against v12 unsplit + gelu_mul: %zu of %zu act elements differ%s\n", s.bit_diff,
                  s.bit_checked, s.bit_diff ? " (MISMATCH: not a failure; see validate_glu)" : "");
    ok = ok && s.failures == 0;
  }
  if (!ok) return 1;
  if (validate_only) return 0;

  // ---- time
  const double bw = lab::stream_read_gbs(stream), peak = peak_tflops(prop.name);
  std::printf(
      "\nstream read %.0f GB/s (measured), fp16 tensor peak %s TFLOP/s (stated, dense). Per version: us per call "
      "(median of %d x %d), TFLOP/s, GB/s (weights + scales + X + Y), %% of bound = max(flops / peak, bytes / "
      "bandwidth) / time; weights rotated over copies > 3 x L2%s\n",
      bw, peak > 0 ? std::to_string(int(peak)).c_str() : "unknown", samples, reps,
      glu.empty()
          ? ""
          : ". v17, v18: gate/up rows only, the whole gate + up + GELU (2 x a GEMM's flops and weights; Y = the "
            "fp16 act)");
  std::printf("%-13s %5s %5s %5s", "shape", "N", "K", "M");
  for (int v : versions) std::printf(" | v%-2d %7s %6s %5s %4s", v, "us", "TF/s", "GB/s", "%bd");
  std::printf("\n");
  for (const Shape& s : kE2B) {
    const bool gate_up = is_gate_up(s) && !glu.empty();
    if (single.empty() && !gate_up) continue;
    for (int m : ms) {
      const size_t wbytes = size_t(s.n) * s.k / 2 + size_t(s.n) * (s.k / 32) * 2;
      const int copies = int(std::min<size_t>(64, 3 * size_t(prop.l2CacheSize) / wbytes + 1));
      const int glu_copies = int(std::min<size_t>(64, 3 * size_t(prop.l2CacheSize) / (2 * wbytes) + 1));
      std::unique_ptr<Problem> p;
      std::unique_ptr<GluProblem> q;
      if (!single.empty()) p = make_problem(s.name, m, s.n, s.k, s.k, s.n, copies, seed += 10);
      if (gate_up) q = make_glu_problem(s.name, m, s.n, s.k, s.k, s.n, glu_copies, seed += 10);
      std::printf("%-13s %5d %5d %5d", s.name, s.n, s.k, m);
      for (int v : versions) {
        if (is_glu(v) && !q) {
          std::printf(" | %11s %6s %5s %4s", "-", "-", "-", "-");
          continue;
        }
        const double flops = (is_glu(v) ? 4.0 : 2.0) * m * s.n * s.k;
        const double bytes = is_glu(v) ? 2.0 * double(wbytes) + 2.0 * m * s.k + 2.0 * m * s.n
                                       : double(wbytes) + 2.0 * m * s.k + 4.0 * m * s.n;
        const double bound_us = std::max(peak > 0 ? flops / (peak * 1e6) : 0.0, bytes / (bw * 1e3));
        const double us = lab::median_us(
            [&](int i) { LAB_CHECK(is_glu(v) ? run_glu(v, *q, i, launch) : run(v, *p, i, blas, launch)); }, reps,
            samples, stream);
        std::printf(" | %11.2f %6.1f %5.0f %3.0f%%", us, flops / us / 1e6, bytes / us / 1e3, 100 * bound_us / us);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  cublasDestroy(blas);
  LAB_CHECK(cudaStreamDestroy(stream));
  return 0;
}
#endif
