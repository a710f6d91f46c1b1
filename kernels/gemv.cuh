// gemma4_t4 kernels: decode matmuls (a batch of 1..32 rows against weights read once), on tensor cores.
//
//   y[r, o] = sum_i x[r, i] * W[o, i]     x: [n, in] fp16 (row stride in, 16-byte aligned), n <= 32
// Weights, three layouts (all 16-byte aligned):
//   fp16   W [out, in] row-major; in % 8 == 0 (16-byte rows).
//   int8   W8 [out, in] int8 row-major + per-row fp32 scales R [out]: y = R[o] * (x . W8[o]); in % 16 == 0;
//          Store epilogue only (the quantized LM head, LoadOptions::lm_head).
//   w4a16  the compressed-tensors words (Wq [out, in/8] u32, column 8j+k = nibble k of word j holding q + 8;
//          scales S [out, in/32] fp16; w = (nibble - 8) * S[o, i/32]; in % 32 == 0), each word reordered in place
//          once at load (launch_w4_gemv_order; mma.cuh w4_gemv_word): columns 8j + 2s and 8j + 2s + 1 in nibbles
//          s and s + 4. One 16-byte load = 4 words = 32 columns = exactly one scale group, so the rows stay where
//          they are; the scales are only converted (bf16 -> fp16).
// Epilogues (one kernel, the epilogue a template parameter):
//   Store     y_i[r, o] = x W_i^T for up to 3 matrices sharing x (q/k/v): fp32, row stride ldy_i
//   GeluMul   out16[r, o] = half(gelu_tanh(x Wg[o]) * (x Wu[o]))        (MLP gate/up; Wg, Wu: [I, in])
//   GeluPle   out16[r, o] = half(gelu_tanh(x Wg[o]) * ple[r, layer, o])  (PLE gate; ple: [n, L, D], D = out)
//
// Math: m16n8k8 tensor-core mma (sm_75's tensor-core shape; sm_80+ run it too; w4a16 takes two steps as one
// m16n8k16 on sm_80+, mma_16x8x16), A = 16 weight rows x 8 columns
// (fp16; w4a16 dequantised in registers: two nibbles -> half2 by OR-ing them into the mantissa of 1024.0,
// minus 1032.0 -- exact -- times the fp16 scale, one rounding: the same fp16 weight the prefill path's
// dequant_w4 builds (w4_pairs4: a word's four pairs with one shift); int8: two bytes, offset by 128, into the
// mantissa of 1024.0 minus 1152.0 -- exact, the row scale applied to the fp32 sum), B = 8 columns x 8 input rows of
// x (fp16, as stored), fp32 accumulation. Rows past
// n and columns past `in` enter as zeros (A and B both, so no NaN * 0). The tensor cores make the FMAs free; what is
// left per weight byte is the load and, for w4a16, ~1.5 integer/half2 ops per weight. Fragment mapping (lane = 4 * gid
// + tig): the reduction order over k is free, so each lane's 16-byte load of weight row gid (and gid + 8) is used as it
// is, and x is fetched to match:
//   fp16   k-tile = 32 columns; lane's 16-byte unit u = 4 * tile + tig holds columns 8u..8u+7 of its rows;
//          mma step s (0..3) uses the half2 (8u + 2s, 8u + 2s + 1) of the weight rows and of x.
//   w4a16  k-tile = 128 columns; unit u = 4 * tile + tig = scale group u, columns 32u..32u+31; word w,
//          step s (16 steps) uses nibbles (s, s + 4) = columns (32u + 8w + 2s, 32u + 8w + 2s + 1) (the GEMV word
//          order), so the x pair is word s of the 16-byte x load as it is (the checkpoint's order took one byte_perm
//          per x pair and 8-row tile, 4 of ~32 instructions per word at one row and 16 of ~50 at 32). On sm_80+ steps s
//          and s + 1 of a word are one m16n8k16 (k 0..7 step s, k 8..15 step s + 1): half the mma instructions.
//          Measured on an H100 (E2B, bench/RESULTS.md 2026-12-06 (g)): +2.4 / +1.2 / +2.2 / +1.9% total tok/s at 1 / 8
//          / 16 / 32 sessions; the same pairs in the fp16 layout lost (-2.9% at 16 sessions, -1.6% at 32), so fp16 and
//          int8 stay m16n8k8. The sums round differently from two m16n8k8 (the Turing-only build's), the same way at
//          every row count.
//   int8   k-tile = 64 columns; unit u = 4 * tile + tig holds columns 16u..16u+15; step s (8 steps) uses
//          bytes (2s, 2s + 1) and the x half2 at columns 16u + 2s (x read as two 16-byte loads).
// Work split: a warp owns a 16-row tile and every kw-th k-tile (kw = 1, 2, 4 or 8 warps per row tile,
// chosen from `in`, halved where that fits a w4a16 launch into one wave: gemv_wave_kw); a block of 8 warps owns
// 8 / kw row tiles; blocks are partitioned over the matrices' row tiles. Each warp issues the weight loads of U k-tiles
// (U = 4; 2 for gate/up, which loads two matrices; halved past 16 rows, where the accumulators need the registers: no
// spills at 128) before it uses any: 128 B per lane, 4 KiB per warp in flight (2 KiB past 16 rows; 16-byte loads that
// skip L1); x (tiny, re-read by every row tile) stays in L1. The kw warps' partial tiles are summed through shared
// memory in warp order. __launch_bounds__(256, 2) caps registers at 128 (2 blocks = 16 warps per sm_75 SM).
// Past 16 rows a launch that leaves SMs short (gemv_halves) runs as two 16-row halves (gemv_halves_kernel: twice
// the blocks, each at U = 4); larger ones take all 32 rows per block at U = 2.
// Determinism: a row's result depends only on its own x row and the weights (column n of an mma depends
// only on column n of B; kw on `in`, the outputs and the SM count), so batched decode equals one-row decode bit for bit
// (tested), and a matrix of a multi-matrix launch equals its own launch_gemv. The GELU epilogues compute
// the expression of gelu_mul / ple_gate (elementwise.cuh) on the fp32 dot products.
// Precision vs the CUDA-core GEMV this replaced: w4a16 weights are rounded to fp16 once (as prefill always
// did) and the fp32 sums run in tensor-core order: results move by ~1e-4 relative, well inside the tests'
// fp16 tolerances.
// k-split across blocks (GemvArgs::ksplit; Store of one matrix): a 1536-row matrix with a long k (down_proj) makes
// 96 row-tile blocks, fewer than an H200's 132 SMs. gemv_store_splits then gives each row tile 2-4 blocks, block
// bid = row-tile block * ksplit + part, whose warps take every (kw * ksplit)-th k-tile from part * kw + ks; part p
// stores its partial sums at y + p * split_ld, and the reader adds the parts in part order (kernels/rmsnorm.cuh
// launch_residual_norm: the residual projections o_proj, down_proj). Still a function of `in` and the GPU only.
// sm_75 safe: static shared memory <= 16 KiB, no cp.async. Spills (ptxas, 2026-12-06 (h)): none but the 17..32-row
// w4a16 instantiations at the 128-register cap: Store 4 bytes on sm_75 and 24 on sm_90, gate/up 4 on sm_90 (31eb9e1:
// Store 16 bytes on sm_90 only).
#pragma once

#include "common.cuh"
#include "mma.cuh"

namespace gemma4_t4 {
namespace kernels {

constexpr int kGemvWarps = 8;     // warps per block
constexpr int kGemvMaxRows = 32;  // input rows (decode batch) per launch
constexpr int kGemvMaxMats = 3;   // matrices of one multi-matrix launch
constexpr int kGemvMaxSplit = 4;  // blocks splitting one row tile's k-tiles (GemvArgs::ksplit)
// Launches that would take more blocks than this (the LM head: 262,144 outputs) split a row tile's k-tiles over at
// most 2 warps: 4x fewer, longer-lived blocks. Measured (dev/gemv_decode.cu version 5, H200, PDL, us per call at 1 /
// 8 rows): fp16 LM head 238 / 239 at 8 warps (16,384 blocks), 202 / 219 at 2 (4,096: 91% of the stream read
// bandwidth), 216 / 250 at 1; w4a16 101 / 105 at 4 warps, 95 / 100 at 2. Matrices of up to 12,288 outputs lose at
// 2 warps (fp16 gate/up 12288: 22.5 -> 26.6 us), so they keep gemv_split's choice.
constexpr int kGemvManyBlocks = 4096;

// One weight matrix of a launch: w16 xor (wq, s) xor (w8, rs).
struct GemvMat {
  const half* w16 = nullptr;     // [out, in] fp16, or
  const uint32_t* wq = nullptr;  // [out, in / 8] packed int4
  const half* s = nullptr;       // [out, in / 32] fp16 scales
  int out = 0;                   // output features
  float* y = nullptr;            // Store: [n, ldy] fp32
  int ldy = 0;
  const int8_t* w8 = nullptr;  // [out, in] int8, or
  const float* rs = nullptr;   // [out] fp32 row scales of w8
};

// Weight layouts (gemv_kernel's WL).
constexpr int kGemvF16 = 0, kGemvW4 = 1, kGemvW8 = 2;

// Head (the persistent decode kernel's LM head, kernels/decode_step.cuh): y = softcap(x W^T), and each row's
// largest logit as a packed (order-preserving key << 32 | ~index) in the caller's shared best[] (atomicMax: the
// first index wins a tie).
enum class GemvEpilogue { Store, GeluMul, GeluPle, Head };

// Where a GEMV block reads its x rows from.
enum class GemvX {
  Global,    // written by an earlier kernel: the read-only path (ld.global.nc), cached in L1
  Coherent,  // written earlier in the same kernel by other blocks (persistent decode): through L2 (ld.cg)
  Shared,    // staged in the calling block's shared memory: [n][ldx] fp16
};

struct GemvArgs {
  const half* x = nullptr;  // [n, in] fp16
  int n = 0, in = 0;
  GemvMat mat[kGemvMaxMats];               // Store: mat[0..count); GeluMul: gate, up; GeluPle: gate
  int count = 1;                           // outputs the blocks are partitioned over (Store); 1 for the GELU epilogues
  int first_block[kGemvMaxMats + 1] = {};  // blocks of output i: [first_block[i], first_block[i + 1])
  int kw = 1;                              // warps splitting the k-tiles of one 16-row tile: 1, 2, 4, 8
  int ksplit = 1;                          // blocks splitting them further (Store of one matrix)
  int halves = -1;        // 17..32 rows: -1 gemv_halves decides, 0 one block per row tile, 1 two 16-row halves
  size_t split_ld = 0;    // ksplit > 1: part p of the sums at y + p * split_ld floats
  half* out16 = nullptr;  // GeluMul, GeluPle: [n, ld16] fp16
  int ld16 = 0;
  const float* ple = nullptr;  // GeluPle: [n, ple_ld] fp32; row r's gate multiplier at ple_off + o
  int ple_ld = 0, ple_off = 0;
  int ldx = 0;          // GemvX::Shared: x row stride (halves)
  float softcap = 0.f;  // Head: x = tanh(x / softcap) * softcap (0: none)
};

// Whether a launch of 17..32 rows in `blocks` blocks (its partition) runs as two 16-row halves (gemv_halves_kernel)
// on a GPU of `sms` SMs: where the launch alone fills at most a wave of two blocks per SM (gemv_store_splits' count).
// Measured on an H100 (132 SMs; E2B at 24 and 32 sessions, quick_bench, bench/RESULTS.md 2026-12-05 (g)): halving the
// 8..192-block launches +5% (w4a16) and +7.5% (fp16) at 32 sessions; halving the 384..768-block gate/up launches as
// well lost 2-10% against that (the second half's weights come back through L2 a wave later).
inline bool gemv_halves(unsigned blocks, int sms) { return sms > 0 && blocks <= 2u * unsigned(sms); }

// Packed (order-preserving key of v, ~index): the larger logit wins, the first index on a tie.
__device__ __forceinline__ unsigned long long argmax_key(float v, int index) {
  const uint32_t b = __float_as_uint(v);
  const uint32_t k = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<unsigned long long>(k) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(index));
}
__device__ __forceinline__ int argmax_index(unsigned long long key) {
  return int(0xFFFFFFFFu - static_cast<uint32_t>(key & 0xFFFFFFFFull));
}

// Shared memory of gemv_block's reduction: [kGemvWarps][NT * 4][32] fp32 (one matrix at a time).
template <int NT>
__host__ __device__ constexpr int gemv_red_floats() {
  return kGemvWarps * NT * 4 * 32;
}

// Block `bid` of a GEMV launch (the block partition of launch_gemv_args): NT 8-row tiles of x (1: n <= 8, 2:
// n <= 16, 4: n <= 32), WL the weight layout (kGemvF16 / W4 / W8), E the epilogue, XS where x is read from. red:
// gemv_red_floats<NT>() floats of shared memory; xs: x in shared memory (XS == Shared); best: Head's [n]
// packed row maxima in shared memory. A GemvX::Global block starts with the PDL prologue: each warp's first U
// k-tiles of weights loaded into registers and the next U prefetched into L2 before pdl_enter, so only x's loads
// wait for the predecessor (measured: +7% at one session, +3-6% at 8-16, H200; bench/RESULTS.md 2026-12-04 (d));
// GeluPle's ple multipliers (written at the step's start, common.cuh's two-launch rule) are read there too.
template <int NT, int WL, GemvEpilogue E, GemvX XS>
__device__ __forceinline__ void gemv_block(const GemvArgs& a, int bid, float* red, const half* xs,
                                           unsigned long long* best) {
  constexpr bool W4 = WL == kGemvW4, W8 = WL == kGemvW8;
  static_assert(!W8 || E == GemvEpilogue::Store, "int8 weights: Store epilogue only");
  constexpr int M = E == GemvEpilogue::GeluMul ? 2 : 1;  // weight matrices per warp (gate and up)
  // k-tiles of weight loads in flight per warp: 4 KiB per warp up to 16 rows; past them the NT = 4 accumulators
  // take the registers, and the 32 x rows re-read per weight tile keep the SM's load pipes busy instead
  constexpr int U = (M == 2 ? 2 : 4) / (NT > 2 ? 2 : 1);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
  const int kw = a.kw, ks = warp & (kw - 1), mt = warp / kw;
  // k-split: block bid is part `part` of row-tile block `tb`; the warp takes every KW-th k-tile from kk on
  const int S = a.ksplit, tb = bid / S, part = bid - tb * S;
  const int kk = part * kw + ks, KW = kw * S;
  // The block's output (constant indices only: a dynamic index into the parameter array would copy it to
  // local memory).
  const int mi = (a.count > 1 && tb >= a.first_block[1]) ? ((a.count > 2 && tb >= a.first_block[2]) ? 2 : 1) : 0;
  const GemvMat g0 = mi == 0 ? a.mat[0] : (mi == 1 ? a.mat[1] : a.mat[2]);
  const int first = mi == 0 ? a.first_block[0] : (mi == 1 ? a.first_block[1] : a.first_block[2]);
  const GemvMat g[2] = {g0, a.mat[1]};  // g[1]: the up matrix of GeluMul (same out and in as the gate)
  const int out = g0.out;
  const int row0 = (tb - first) * (16 * (kGemvWarps / kw)) + mt * 16;
  const int ra = row0 + gid, rb = ra + 8;  // this lane's two weight rows
  const bool oka = ra < out, okb = rb < out;
  const int units = W4 ? a.in / 32 : (W8 ? a.in / 16 : a.in / 8);  // 16-byte units per weight row
  const int ktiles = (units + 3) / 4;

  const uint4 *wa[M], *wb[M];
  const unsigned short *sa[M], *sb[M];  // w4a16 scales as raw fp16 bits
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const size_t ia = size_t(oka ? ra : 0) * units, ib = size_t(okb ? rb : 0) * units;
    if (W4) {
      wa[m] = reinterpret_cast<const uint4*>(g[m].wq) + ia;
      wb[m] = reinterpret_cast<const uint4*>(g[m].wq) + ib;
      sa[m] = reinterpret_cast<const unsigned short*>(g[m].s) + ia;
      sb[m] = reinterpret_cast<const unsigned short*>(g[m].s) + ib;
    } else {
      const uint4* w = W8 ? reinterpret_cast<const uint4*>(g[m].w8) : reinterpret_cast<const uint4*>(g[m].w16);
      wa[m] = w + ia;
      wb[m] = w + ib;
      sa[m] = sb[m] = nullptr;
    }
  }
  const uint4* xr[NT];  // this lane's x row (B column gid) of each 8-row tile
  bool okx[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const int r = t * 8 + gid;
    okx[t] = r < a.n;
    xr[t] = XS == GemvX::Shared ? reinterpret_cast<const uint4*>(xs + size_t(okx[t] ? r : 0) * a.ldx)
                                : reinterpret_cast<const uint4*>(a.x + size_t(okx[t] ? r : 0) * a.in);
  }
  // x: 16 bytes from where XS says (zeros when !ok)
  auto load_x = [](const uint4* p, bool ok) -> uint4 {
    if constexpr (XS == GemvX::Global) return ld_x(p, ok);
    if constexpr (XS == GemvX::Coherent) return ld_cg(p, ok);
    return ok ? *p : make_uint4(0u, 0u, 0u, 0u);
  };

  // The U k-tiles' weight loads from kt0 on, all issued before any is used (the bytes in flight).
  uint4 qa[U][M], qb[U][M];
  uint32_t sca[U][M], scb[U][M];  // w4a16: fp16 scale in both halves
  const auto load_tiles = [&](int kt0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int unit = (kt0 + u * KW) * 4 + tig;
      const bool ok = unit < units;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        qa[u][m] = ld_weights(wa[m] + unit, ok && oka);
        qb[u][m] = ld_weights(wb[m] + unit, ok && okb);
        if (W4) {
          const uint32_t s0 = ld_u16(sa[m] + unit, ok && oka), s1 = ld_u16(sb[m] + unit, ok && okb);
          sca[u][m] = s0 | (s0 << 16);
          scb[u][m] = s1 | (s1 << 16);
        } else {
          sca[u][m] = scb[u][m] = 0u;
        }
      }
    }
  };

  bool loaded = false;  // the first U tiles are in registers already
  // GeluPle's multipliers of this lane's outputs (the ple rows, written at the start of the step): read in the
  // PDL prologue when x is Global and there are at most 16 rows (32 rows' 16 floats would spill at 128
  // registers); otherwise in the epilogue
  constexpr bool kPlePre = E == GemvEpilogue::GeluPle && XS == GemvX::Global && NT <= 2;
  float plev[kPlePre ? NT : 1][2][2] = {};
  if constexpr (XS == GemvX::Global) {
    if constexpr (kPlePre) {
      if (ks == 0) {
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int o = ra + 8 * h, r = t * 8 + 2 * tig + j;
              if (o < out && r < a.n) plev[t][h][j] = __ldcg(a.ple + size_t(r) * a.ple_ld + a.ple_off + o);
            }
      }
    }
    // PDL prologue (kernels/common.cuh): the weights are constants, so while the previous kernel finishes, this
    // warp loads its first U k-tiles of them (and their scales) into registers and pulls the next U into L2; x is
    // read only after pdl_enter().
    load_tiles(kk);
    loaded = true;
    for (int i = U, kt = kk + U * KW; i < 2 * U && kt < ktiles; ++i, kt += KW) {
      const int unit = kt * 4 + tig;
      if (unit >= units) break;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (oka) prefetch_l2(wa[m] + unit);
        if (okb) prefetch_l2(wb[m] + unit);
        if (W4 && tig == 0 && (i == U || (kt & 15) == 0)) {  // 64 scale units: a 128-byte line
          if (oka) prefetch_l2(sa[m] + unit);
          if (okb) prefetch_l2(sb[m] + unit);
        }
      }
    }
    pdl_enter();
  }

  float acc[M][NT][4];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[m][t][c] = 0.f;

  for (int kt0 = kk; kt0 < ktiles; kt0 += KW * U) {
    if (!loaded) load_tiles(kt0);
    loaded = false;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kt = kt0 + u * KW;
      if (kt >= ktiles) break;  // warp-uniform: every lane reaches each warp-wide mma
      const int unit = kt * 4 + tig;
      const bool ok = unit < units;
      if (W4) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          uint4 xb[NT];  // x pairs for steps s = 0..3: word s = columns (8w + 2s, 8w + 2s + 1) of the group
#pragma unroll
          for (int t = 0; t < NT; ++t) xb[t] = load_x(xr[t] + unit * 4 + w, ok && okx[t]);
#pragma unroll
          for (int m = 0; m < M; ++m) {
            uint32_t pa[4], pb[4];  // w4_pair(word, s) of the two rows, s = 0..3
            w4_pairs4(u4_word(qa[u][m], w), sca[u][m], pa);
            w4_pairs4(u4_word(qb[u][m], w), scb[u][m], pb);
#pragma unroll
            for (int s = 0; s < 4; s += 2) {  // steps s, s + 1 as one k16 mma (two k8 on sm_75, in that order)
              const uint32_t a4[4] = {pa[s], pb[s], pa[s + 1], pb[s + 1]};
#pragma unroll
              for (int t = 0; t < NT; ++t) mma_16x8x16(acc[m][t], a4, u4_word(xb[t], s), u4_word(xb[t], s + 1));
            }
          }
        }
      } else if (W8) {
        uint4 xv[NT][2];  // columns 16 unit .. 16 unit + 15
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          xv[t][0] = load_x(xr[t] + 2 * unit, ok && okx[t]);
          xv[t][1] = load_x(xr[t] + 2 * unit + 1, ok && okx[t]);
        }
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int s = 0; s < 8; ++s) {
            const uint32_t a0 = w8_pair(u4_word(qa[u][m], s / 2), s & 1);
            const uint32_t a1 = w8_pair(u4_word(qb[u][m], s / 2), s & 1);
#pragma unroll
            for (int t = 0; t < NT; ++t) mma_16x8x8(acc[m][t], a0, a1, u4_word(xv[t][s / 4], s % 4));
          }
      } else {
        uint4 xv[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) xv[t] = load_x(xr[t] + unit, ok && okx[t]);
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int s = 0; s < 4; ++s)
#pragma unroll
            for (int t = 0; t < NT; ++t)
              mma_16x8x8(acc[m][t], u4_word(qa[u][m], s), u4_word(qb[u][m], s), u4_word(xv[t], s));
      }
    }
  }

  if (kw > 1) {  // the row tile's first warp sums the others' partials, in warp order; a matrix at a time
    float(*const rd)[NT * 4][32] = reinterpret_cast<float(*)[NT * 4][32]>(red);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (m > 0) __syncthreads();  // the first warps are done reading the previous matrix's partials
      if (ks != 0) {
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
          for (int c = 0; c < 4; ++c) rd[warp][t * 4 + c][lane] = acc[m][t][c];
      }
      __syncthreads();
      if (ks == 0)
        for (int j = 1; j < kw; ++j)
#pragma unroll
          for (int t = 0; t < NT; ++t)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[m][t][c] += rd[warp + j][t * 4 + c][lane];
    }
    if (ks != 0) return;
  }

  // Lane (gid, tig) holds C[row gid + 8h][x row 8t + 2tig + j] in acc[.][t][2h + j].
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int o = ra + 8 * h, r = t * 8 + 2 * tig + j;
        if (o >= out || r >= a.n) continue;
        const float v = acc[0][t][2 * h + j];
        if (E == GemvEpilogue::Store) {
          g0.y[size_t(part) * a.split_ld + size_t(r) * g0.ldy + o] = W8 ? v * g0.rs[o] : v;
        } else if (E == GemvEpilogue::GeluMul) {
          a.out16[size_t(r) * a.ld16 + o] = to_half_sat(gelu_tanh(v) * acc[M - 1][t][2 * h + j]);
        } else if (E == GemvEpilogue::GeluPle) {
          const float pm = kPlePre ? plev[kPlePre ? t : 0][h][j] : __ldcg(a.ple + size_t(r) * a.ple_ld + a.ple_off + o);
          a.out16[size_t(r) * a.ld16 + o] = to_half_sat(gelu_tanh(v) * pm);
        } else {
          g0.y[size_t(r) * g0.ldy + o] = a.softcap > 0.f ? tanhf(v / a.softcap) * a.softcap : v;
        }
      }
  if constexpr (E == GemvEpilogue::Head) {  // each x row's best logit of this tile -> best[r]
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int r = t * 8 + 2 * tig + j;
        unsigned long long k = 0;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int o = ra + 8 * h;
          const float v = acc[0][t][2 * h + j];
          if (o < out) k = max(k, argmax_key(a.softcap > 0.f ? tanhf(v / a.softcap) * a.softcap : v, o));
        }
#pragma unroll
        for (int off = 4; off < 32; off <<= 1) k = max(k, __shfl_xor_sync(0xffffffffu, k, off));
        if (gid == 0 && r < a.n && k) atomicMax(best + r, k);
      }
  }
}

// NT: 8-row tiles of x (1: n <= 8, 2: n <= 16, 4: n <= 32). WL: weight layout (kGemvF16 / W4 / W8). E: epilogue.
template <int NT, int WL, GemvEpilogue E>
__global__ void __launch_bounds__(kGemvWarps * 32, 2) gemv_kernel(const GemvArgs a) {
  GEMMA4_T4_KTRACE_SCOPE(kKtGemv, NT * 100 + WL * 10 + int(E));
  __shared__ float red[gemv_red_floats<NT>()];  // partial tiles of the kw - 1 helper warps
  gemv_block<NT, WL, E, GemvX::Global>(a, int(blockIdx.x), red, nullptr, nullptr);
}

// A launch of 17..32 rows as two 16-row halves: block b runs x rows [16 h, 16 h + 16), h = b & 1, of block b / 2 of
// the launch's partition (gemv_block at NT 2). The two halves of a weight tile are neighbours in the grid, so they run
// side by side and the second reads the tile from L2. What it buys over one NT 4 block: twice the blocks and warps
// on the SMs (a launch of E2B's shapes at 32 rows fills 8..384 blocks: the PLE gate's 8 run on 8 SMs), and NT 2's
// weight loads in flight (U k-tiles per warp, halved at NT 4). The sums are NT 4's bit for bit: a row's result
// depends only on its x row, the weights and the k order, and the k order (kw, ksplit) is the shape's alone.
// b = a's arguments for half `second` (0: x rows [0, 16), 1: rows [16, n)) of a launch of 17..32 rows: x, the outputs
// (y, out16) and the ple rows moved 16 rows on, n cut. Constant indices only (gemv_block's rule): b stays in registers.
__device__ __forceinline__ void gemv_half_args(const GemvArgs& a, GemvArgs& b, bool second) {
  b = a;
  if (second) {
    b.x += size_t(16) * a.in;
    b.n = a.n - 16;
#pragma unroll
    for (int i = 0; i < kGemvMaxMats; ++i)
      if (b.mat[i].y) b.mat[i].y += size_t(16) * a.mat[i].ldy;
    if (b.out16) b.out16 += size_t(16) * a.ld16;
    if (b.ple) b.ple += size_t(16) * a.ple_ld;
  } else {
    b.n = 16;
  }
}

template <int WL, GemvEpilogue E>
__global__ void __launch_bounds__(kGemvWarps * 32, 2) gemv_halves_kernel(const GemvArgs a) {
  GEMMA4_T4_KTRACE_SCOPE(kKtGemvHalves, WL * 10 + int(E));
  __shared__ float red[gemv_red_floats<2>()];
  GemvArgs b;
  gemv_half_args(a, b, blockIdx.x & 1u);
  gemv_block<2, WL, E, GemvX::Global>(b, int(blockIdx.x >> 1), red, nullptr, nullptr);
}

// Warps splitting one row tile's k-tiles: a power of two <= 8 that divides them if one does (no warp
// idles at the end), else the largest one <= ktiles. A function of `in` only (see Determinism above); gemv_plan
// caps it at 2 for launches of more than kGemvManyBlocks blocks and halves it where the launch would take a second,
// partial wave (gemv_wave_kw).
inline int gemv_split(int ktiles) {
  for (int kw = kGemvWarps; kw > 1; kw /= 2)
    if (ktiles % kw == 0) return kw;
  int kw = 1;
  while (kw * 2 <= ktiles && kw * 2 <= kGemvWarps) kw *= 2;
  return kw;
}

template <int WL, GemvEpilogue E>
inline cudaError_t launch_gemv_w(const GemvArgs& a, unsigned blocks, const Launch& launch) {
  if (a.n <= 8) return launch_kernel(gemv_kernel<1, WL, E>, blocks, kGemvWarps * 32, launch, a);
  if (a.n <= 16) return launch_kernel(gemv_kernel<2, WL, E>, blocks, kGemvWarps * 32, launch, a);
  if (a.halves == 1 || (a.halves < 0 && gemv_halves(blocks, device_sms())))
    return launch_kernel(gemv_halves_kernel<WL, E>, 2 * blocks, kGemvWarps * 32, launch, a);
  return launch_kernel(gemv_kernel<4, WL, E>, blocks, kGemvWarps * 32, launch, a);
}

inline bool gemv_aligned(const void* p) { return is_aligned(p, 16); }

// Columns per 16-byte unit of a weight row in layout wl, and k-tiles (4 units each) of a row of `in` columns.
inline int gemv_unit_cols(int wl) { return wl == kGemvW4 ? 32 : (wl == kGemvW8 ? 16 : 8); }
inline int gemv_ktiles(int in, int wl) { return (in / gemv_unit_cols(wl) + 3) / 4; }

// Weight rows one block covers with kw warps per 16-row tile.
inline int gemv_block_rows(int kw) { return 16 * (kGemvWarps / kw); }

// The block partition of a launch for its kw, count and ksplit: first_block, and the block count.
inline unsigned gemv_partition(GemvArgs& a) {
  const int rows_per_block = gemv_block_rows(a.kw);
  a.first_block[0] = 0;
  for (int i = 0; i < kGemvMaxMats; ++i)
    a.first_block[i + 1] = a.first_block[i] + (i < a.count ? int(ceil_div(size_t(a.mat[i].out), rows_per_block)) : 0);
  return unsigned(a.first_block[a.count]) * unsigned(a.ksplit);
}

// Warps per row tile for a w4a16 launch of `blocks` row-tile blocks at gemv_split's kw on a GPU of `sms` SMs: half as
// many where the blocks fill more than one and at most two waves of two blocks per SM (one wave of twice the rows per
// block instead of a second, partial wave), else kw. Measured on H100s (bench/RESULTS.md 2026-12-06 (f); E2B w4a16
// gate/up of 12,288 outputs: 384 -> 192 blocks): +1.0 / +1.9 / +3.0 / -0.2% and +1.5 / +3.3 / +2.7 / 0.0% total tok/s
// at 1 / 8 / 16 / 32 sessions in two leases; the per-block timeline (kernels/ktrace.cuh) had shown that launch's second
// wave released 7-14 us after its first. fp16 weights keep kw (their gate/up of 6,144, 384 -> 192 blocks: +0.1 / 0.0 /
// +1.0 / -1.4%). A function of the shape and the GPU only (Determinism above).
inline int gemv_wave_kw(int kw, int wl, int blocks, int sms) {
  return wl == kGemvW4 && sms > 0 && kw > 1 && blocks > 2 * sms && blocks <= 4 * sms ? kw / 2 : kw;
}

// Checks the shapes and fills kw and the block partition of a launch (or of the persistent decode kernel's
// items): *blocks = the block count (0: nothing to do). mats: a.count outputs (Store, Head) or the gate [, up]
// of a GELU epilogue (`nmats` matrices to check). x_given: a.x must be a 16-byte aligned buffer (not for x
// rows a persistent block builds itself).
inline cudaError_t gemv_plan(GemvArgs& a, int nmats, GemvEpilogue e, bool x_given, unsigned* blocks) {
  *blocks = 0;
  if (a.n <= 0) return cudaSuccess;
  if (a.n > kGemvMaxRows || nmats < 1 || nmats > kGemvMaxMats || a.count < 1 || a.count > nmats || a.halves < -1 ||
      a.halves > 1)
    return cudaErrorInvalidValue;
  int total_out = 0;
  for (int i = 0; i < nmats; ++i) {
    if (a.mat[i].out < 0) return cudaErrorInvalidValue;
    total_out += a.mat[i].out;
  }
  if (total_out == 0) return cudaSuccess;
  const int wl = a.mat[0].w16 ? kGemvF16 : (a.mat[0].wq ? kGemvW4 : kGemvW8);
  if (a.in <= 0 || a.in % gemv_unit_cols(wl) != 0 || (x_given && !gemv_aligned(a.x))) return cudaErrorInvalidValue;
  if (wl == kGemvW8 && e != GemvEpilogue::Store) return cudaErrorInvalidValue;
  const bool stores = e == GemvEpilogue::Store || e == GemvEpilogue::Head;
  for (int i = 0; i < nmats; ++i) {
    const GemvMat& m = a.mat[i];
    const int set =
        int(m.w16 != nullptr) + int(m.wq != nullptr || m.s != nullptr) + int(m.w8 != nullptr || m.rs != nullptr);
    bool ok = set == 1;  // exactly one layout, the same for every matrix of the launch
    if (wl == kGemvF16) ok = ok && m.w16 && gemv_aligned(m.w16);
    if (wl == kGemvW4) ok = ok && m.wq && m.s && gemv_aligned(m.wq);
    if (wl == kGemvW8) ok = ok && m.w8 && m.rs && gemv_aligned(m.w8);
    if (!ok) return cudaErrorInvalidValue;
    if (stores && m.out > 0 && (!m.y || m.ldy < m.out)) return cudaErrorInvalidValue;
  }
  if (!stores && (!a.out16 || a.ld16 < a.mat[0].out)) return cudaErrorInvalidValue;
  if (e == GemvEpilogue::GeluMul && a.mat[1].out != a.mat[0].out) return cudaErrorInvalidValue;
  if (e == GemvEpilogue::GeluPle && !a.ple) return cudaErrorInvalidValue;

  const int ktiles = gemv_ktiles(a.in, wl);
  a.kw = gemv_split(ktiles);
  gemv_partition(a);  // the row-tile blocks at that split
  if (a.first_block[a.count] > kGemvManyBlocks)
    a.kw = std::min(a.kw, 2);
  else
    a.kw = gemv_wave_kw(a.kw, wl, a.first_block[a.count], device_sms());
  if (a.ksplit < 1 || (a.ksplit > 1 && (e != GemvEpilogue::Store || a.count != 1 || a.kw * a.ksplit > ktiles ||
                                        a.split_ld < size_t(a.n) * size_t(a.mat[0].ldy))))
    return cudaErrorInvalidValue;
  *blocks = gemv_partition(a);
  return cudaSuccess;
}

// Blocks splitting the k-tiles of a one-matrix Store GEMV (GemvArgs::ksplit) on a GPU of `sms` SMs: none where the
// row tiles alone fill a wave of two blocks per SM; else as many parts as still fit that wave, then more past it
// only while a warp's share stays above 6 k-tiles (at most kGemvMaxSplit parts; each warp keeps a k-tile).
// Measured (dev/gemv_decode.cu version 4, H200, one row, us per call for 1 / 2 / 3 / 4 parts): w4a16 down_proj
// 6144 -> 1536 6.0 / 4.6 / 7.0 / 6.6 (this rule: 2), fp16 11.8 / 9.1 / 8.3 / 7.2 (4); w4a16 12288 -> 1536 with its
// residual norm, 2 / 3 parts: 11.5 / 12.2 (2). A function of the shape and the GPU only, never of the row count, so
// batched decode still equals one-row decode bit for bit.
inline int gemv_store_splits(int out, int in, int wl, int sms) {
  if (out <= 0 || in <= 0 || in % gemv_unit_cols(wl) != 0 || sms <= 0) return 1;
  const int ktiles = gemv_ktiles(in, wl), kw = gemv_split(ktiles);
  const long long tiles = ceil_div(size_t(out), size_t(gemv_block_rows(kw)));
  if (tiles >= 2LL * sms) return 1;
  int s = 1;
  while (s < kGemvMaxSplit && kw * (s + 1) <= ktiles && tiles * (s + 1) <= 2LL * sms) ++s;
  while (s < kGemvMaxSplit && kw * (s + 1) <= ktiles && (ktiles + kw * s - 1) / (kw * s) > 6) ++s;
  return s;
}

// Checks the shapes, fills kw and the block partition, launches.
inline cudaError_t launch_gemv_args(GemvArgs& a, int nmats, GemvEpilogue e, const Launch& launch) {
  unsigned blocks = 0;
  if (const cudaError_t err = gemv_plan(a, nmats, e, true, &blocks); err != cudaSuccess || blocks == 0) return err;
  if (e == GemvEpilogue::Head) return cudaErrorInvalidValue;  // the persistent decode kernel's only
  const int wl = a.mat[0].w16 ? kGemvF16 : (a.mat[0].wq ? kGemvW4 : kGemvW8);
  switch (e) {
    case GemvEpilogue::Store:
      if (wl == kGemvW8) return launch_gemv_w<kGemvW8, GemvEpilogue::Store>(a, blocks, launch);
      return wl == kGemvW4 ? launch_gemv_w<kGemvW4, GemvEpilogue::Store>(a, blocks, launch)
                           : launch_gemv_w<kGemvF16, GemvEpilogue::Store>(a, blocks, launch);
    case GemvEpilogue::GeluMul:
      return wl == kGemvW4 ? launch_gemv_w<kGemvW4, GemvEpilogue::GeluMul>(a, blocks, launch)
                           : launch_gemv_w<kGemvF16, GemvEpilogue::GeluMul>(a, blocks, launch);
    case GemvEpilogue::GeluPle:
      return wl == kGemvW4 ? launch_gemv_w<kGemvW4, GemvEpilogue::GeluPle>(a, blocks, launch)
                           : launch_gemv_w<kGemvF16, GemvEpilogue::GeluPle>(a, blocks, launch);
    case GemvEpilogue::Head: break;
  }
  return cudaErrorInvalidValue;
}

// y = x W^T for one matrix. W16 xor (Wq, S): exactly one weight layout is set. y: [n, ldy] fp32. ksplit > 1: the
// sum in ksplit parts, part p into y + p * split_ld (split_ld >= n * ldy floats), for the reader to add in part
// order (launch_residual_norm's parts).
inline cudaError_t launch_gemv(const half* W16, const uint32_t* Wq, const half* S, const half* x, int n, int out,
                               int in, float* y, int ldy, const Launch& launch, int ksplit = 1, size_t split_ld = 0) {
  GemvArgs a;
  a.x = x;
  a.n = n;
  a.in = in;
  a.mat[0] = GemvMat{W16, Wq, S, out, y, ldy};
  a.count = 1;
  a.ksplit = ksplit;
  a.split_ld = split_ld;
  return launch_gemv_args(a, 1, GemvEpilogue::Store, launch);
}

// y_i = x W_i^T for `count` (1..3) matrices of one layout sharing x and `in`, in one launch.
inline cudaError_t launch_gemv_multi(const GemvMat* mats, int count, const half* x, int n, int in,
                                     const Launch& launch) {
  if (count < 1 || count > kGemvMaxMats) return cudaErrorInvalidValue;
  GemvArgs a;
  a.x = x;
  a.n = n;
  a.in = in;
  for (int i = 0; i < count; ++i) a.mat[i] = mats[i];
  a.count = count;
  return launch_gemv_args(a, count, GemvEpilogue::Store, launch);
}

// out16[r, o] = half(gelu_tanh(x gate[o]) * (x up[o])). gate, up: [I, in] of one layout (their y unused);
// out16: [n, ld16] fp16, must not overlap x.
inline cudaError_t launch_gemv_gelu_mul(const GemvMat& gate, const GemvMat& up, const half* x, int n, int in,
                                        half* out16, int ld16, const Launch& launch) {
  GemvArgs a;
  a.x = x;
  a.n = n;
  a.in = in;
  a.mat[0] = gate;
  a.mat[1] = up;
  a.count = 1;
  a.out16 = out16;
  a.ld16 = ld16;
  return launch_gemv_args(a, 2, GemvEpilogue::GeluMul, launch);
}

// out16[r, o] = half(gelu_tanh(x gate[o]) * ple[(r * L + layer) * D + o]), D = gate.out. ple: [n, L, D]
// fp32 (launch_ple_gate's layout); out16: [n, D] fp16, must not overlap x.
inline cudaError_t launch_gemv_gelu_ple(const GemvMat& gate, const half* x, int n, int in, const float* ple, int L,
                                        int layer, half* out16, const Launch& launch) {
  GemvArgs a;
  a.x = x;
  a.n = n;
  a.in = in;
  a.mat[0] = gate;
  a.count = 1;
  a.out16 = out16;
  a.ld16 = gate.out;
  a.ple = ple;
  a.ple_ld = L * gate.out;
  a.ple_off = layer * gate.out;
  if (layer < 0 || layer >= L) return a.n <= 0 ? cudaSuccess : cudaErrorInvalidValue;
  return launch_gemv_args(a, 1, GemvEpilogue::GeluPle, launch);
}

// y = R[o] * (x . W8[o]) for one int8 matrix with per-row scales (the quantized LM head). y: [n, ldy] fp32.
inline cudaError_t launch_gemv_w8(const int8_t* W8, const float* R, const half* x, int n, int out, int in, float* y,
                                  int ldy, const Launch& launch) {
  GemvArgs a;
  a.x = x;
  a.n = n;
  a.in = in;
  a.mat[0].w8 = W8;
  a.mat[0].rs = R;
  a.mat[0].out = out;
  a.mat[0].y = y;
  a.mat[0].ldy = ldy;
  a.count = 1;
  return launch_gemv_args(a, 1, GemvEpilogue::Store, launch);
}

// ---- the PLE branch in one launch (decode passes of <= 32 rows; the engine's gate(Ple) + residual(Ple) take it for
// w4a16 at <= 16 rows, where it measured faster: cuda/layers.hpp ple_fused) ----
// The per-layer input branch is two matmuls around a narrow middle: act = half(gelu_tanh(x Wg^T) * ple[l]) has D
// columns (256 on E2B and E4B), and per_layer_projection y = act Wp^T takes them back to H. As two GEMV launches the
// GPU drained and filled between two ~200 KB matrices (w4a16). Here block (s, p) computes act's columns
// [32 s, 32 s + 32) -- gemv_block's GeluPle on the gate's rows [32 s, 32 s + 32) as a matrix of its own, its act rows
// into shared memory -- and then that K-slice's share of the projection for outputs [256 p, 256 p + 256):
//   part_s[r, o] = sum_{i in [32 s, 32 s + 32)} act[r, i] Wp[o, i]         (fp32, tensor cores, 4 m16n8k8 steps)
// at parts + s part_ld. The residual norm adds the D / 32 parts in slice order (launch_residual_norm's parts), so a
// row's y depends on its own x row only: batched decode equals one-row decode bit for bit. Against the two launches:
// the same act where the GEMV's gemv_split picks 4 warps per row tile (w4a16 with H a multiple of 512: E2B's 1536),
// and y summed as D / 32 slice sums instead of one k-loop (rounding only). Every block of slice s recomputes the
// slice's act (32 x H gate weights, from L2 after the first block), so a block costs what one GeluPle block of the
// two-launch path did, plus the projection's 256 x 32 weights, which it loads into registers before pdl_enter with the
// gate's. Lane (gid, tig) of warp w, output tile i: weight rows o = 256 p + 16 (2 w + i) + gid (+ 8); w4a16: word tig
// of the slice's scale group (8 columns: step st uses nibbles st, st + 4, as gemv_block's w4a16 steps), fp16: 16 bytes
// at column 8 tig (step st: the half2 st); the act pairs come from shared memory in the same order.
constexpr int kPleSlice = 32;                                 // act columns per block: one w4a16 scale group of Wp
constexpr int kPleOutTiles = 2;                               // 16-output tiles of the projection per warp
constexpr int kPleBlockOut = kGemvWarps * 16 * kPleOutTiles;  // projection outputs per block (256)
constexpr int kPleMaxSlices = 16;                             // D <= 512

struct PleFusedArgs {
  GemvArgs gate;  // launch_gemv_gelu_ple's arguments: x, n, in = H, mat[0] = the gate [D, H], ple, ple_ld, ple_off
  GemvMat proj;   // per_layer_projection [H, D] in the gate's layout (out = H; y unused)
  int d = 0;      // D
  float* parts = nullptr;  // slice s's partial products [n, H] at parts + s part_ld
  size_t part_ld = 0;
};

// Whether launch_ple_fused takes a branch of D per-layer columns, and the parts it leaves for D (0: it does not).
inline bool ple_fused_shape(int d) { return d > 0 && d % kPleSlice == 0 && d / kPleSlice <= kPleMaxSlices; }
inline int ple_fused_parts(int d) { return ple_fused_shape(d) ? d / kPleSlice : 0; }

// NT: 8-row tiles of x (1: n <= 8, 2: n <= 16); Halves: n 17..32 as two 16-row halves (block b: rows [16 (b & 1),
// ...) of block b / 2), as gemv_halves_kernel.
template <int NT, int WL, bool Halves>
__global__ void __launch_bounds__(kGemvWarps * 32, 2) ple_fused_kernel(const PleFusedArgs a) {
  GEMMA4_T4_KTRACE_SCOPE(kKtPleFused, NT * 100 + WL * 10 + int(Halves));
  constexpr bool W4 = WL == kGemvW4;
  constexpr int R = NT * 8, AS = kPleSlice + 8;  // act rows; act row stride in halves (16-byte aligned rows)
  __shared__ float red[gemv_red_floats<NT>()];
  __shared__ __align__(16) half act[R][AS];
  GemvArgs g = a.gate;  // constant indices only (gemv_block's rule); its out16 is set below, after the half's move
  unsigned bx = blockIdx.x;
  int r0 = 0;  // the block's first row of the pass
  if constexpr (Halves) {
    r0 = bx & 1u ? 16 : 0;
    gemv_half_args(a.gate, g, bx & 1u);
    bx >>= 1;
  }
  const int H = g.in, D = a.d, slices = D / kPleSlice;
  const int s = int(bx % unsigned(slices)), p = int(bx / unsigned(slices));
  // the gate's slice s as a matrix of kPleSlice rows: two 16-row tiles of 4 warps each
  if constexpr (W4) {
    g.mat[0].wq += size_t(kPleSlice) * s * (H / 8);
    g.mat[0].s += size_t(kPleSlice) * s * (H / 32);
  } else {
    g.mat[0].w16 += size_t(kPleSlice) * s * H;
  }
  g.mat[0].out = kPleSlice;
  g.ple_off += kPleSlice * s;
  g.out16 = &act[0][0];
  g.ld16 = AS;
  g.kw = kGemvWarps * 16 / kPleSlice;
  g.count = 1;
  g.ksplit = 1;
  g.first_block[0] = 0;
  g.first_block[1] = 1;

  // the projection's weights of this block (constants: before gemv_block's pdl_enter)
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, gid = lane >> 2, tig = lane & 3;
  // the projection's output row of this lane's output tile i, row half h
  const auto out_row = [&](int i, int h) { return kPleBlockOut * p + 16 * (warp * kPleOutTiles + i) + gid + 8 * h; };
  uint4 pw[kPleOutTiles][2];
  uint32_t ps[kPleOutTiles][2];
#pragma unroll
  for (int i = 0; i < kPleOutTiles; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int o = out_row(i, h);
      const bool ok = o < a.proj.out;
      const size_t row = size_t(ok ? o : 0);
      if constexpr (W4) {
        const uint32_t* w = a.proj.wq + row * (D / 8) + (kPleSlice / 8) * s + tig;
        pw[i][h] = make_uint4(ok ? __ldg(w) : 0u, 0u, 0u, 0u);
        const uint32_t sc = ld_u16(reinterpret_cast<const unsigned short*>(a.proj.s) + row * (D / 32) + s, ok);
        ps[i][h] = sc | (sc << 16);
      } else {
        pw[i][h] = ld_weights(reinterpret_cast<const uint4*>(a.proj.w16 + row * D + kPleSlice * s + 8 * tig), ok);
        ps[i][h] = 0u;
      }
    }
  // rows past n stay zero (B columns whose products are never stored); gemv_block's reduction barrier orders this
  // before its epilogue writes the act rows
  for (int i = int(threadIdx.x); i < R * AS / 8; i += int(blockDim.x))
    reinterpret_cast<uint4*>(&act[0][0])[i] = make_uint4(0u, 0u, 0u, 0u);
  static_assert(kGemvWarps * 16 / kPleSlice > 1, "gemv_block's k-warp reduction is the barrier before its epilogue");

  gemv_block<NT, WL, GemvEpilogue::GeluPle, GemvX::Global>(g, 0, red, nullptr, nullptr);
  __syncthreads();  // the slice's act rows are in shared memory

  uint32_t xb[NT][4];  // act pairs of step st for B column gid of each 8-row tile
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const uint4 v = *reinterpret_cast<const uint4*>(&act[8 * t + gid][8 * tig]);
    // columns (8 tig + 2 st, 8 tig + 2 st + 1): fp16 words, and the w4a16 GEMV word order's pairs
    xb[t][0] = v.x, xb[t][1] = v.y, xb[t][2] = v.z, xb[t][3] = v.w;
  }
  float acc[kPleOutTiles][NT][4];
#pragma unroll
  for (int i = 0; i < kPleOutTiles; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][t][c] = 0.f;
#pragma unroll
  for (int st = 0; st < 4; ++st)
#pragma unroll
    for (int i = 0; i < kPleOutTiles; ++i) {
      const uint32_t a0 = W4 ? w4_pair(pw[i][0].x, st, ps[i][0]) : u4_word(pw[i][0], st);
      const uint32_t a1 = W4 ? w4_pair(pw[i][1].x, st, ps[i][1]) : u4_word(pw[i][1], st);
#pragma unroll
      for (int t = 0; t < NT; ++t) mma_16x8x8(acc[i][t], a0, a1, xb[t][st]);
    }
  float* const part = a.parts + size_t(s) * a.part_ld;
#pragma unroll
  for (int i = 0; i < kPleOutTiles; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int o = out_row(i, h), r = 8 * t + 2 * tig + j;
          if (o < H && r < g.n) part[size_t(r0 + r) * H + o] = acc[i][t][2 * h + j];
        }
}

// The PLE branch of a decode pass: parts + s part_ld ([n, in] fp32, s < gate.out / 32) = slice s's share of
// per_layer_projection(half(gelu_tanh(x gate^T) * ple[:, layer])), for the reader to add in slice order. gate: [D, in],
// proj: [in, D], one layout (fp16 or w4a16; their y unused); ple: [n, L, D] fp32 (launch_ple_gate's layout).
inline cudaError_t launch_ple_fused(const GemvMat& gate, const GemvMat& proj, const half* x, int n, int in,
                                    const float* ple, int L, int layer, float* parts, size_t part_ld,
                                    const Launch& launch) {
  if (n <= 0) return cudaSuccess;
  const int D = gate.out;
  const bool w4 = gate.wq != nullptr;
  const bool layouts = w4 ? (gate.s && proj.wq && proj.s && !gate.w16 && !proj.w16)
                          : (gate.w16 && proj.w16 && !gate.s && !proj.wq && !proj.s);
  if (n > kGemvMaxRows || !layouts || gate.w8 || proj.w8 || !ple_fused_shape(D) || proj.out != in || in <= 0 ||
      in % gemv_unit_cols(w4 ? kGemvW4 : kGemvF16) != 0 || layer < 0 || layer >= L || !ple || !parts || !x ||
      !gemv_aligned(x) || !gemv_aligned(w4 ? static_cast<const void*>(gate.wq) : gate.w16) ||
      !gemv_aligned(w4 ? static_cast<const void*>(proj.wq) : proj.w16) || part_ld < size_t(n) * size_t(in))
    return cudaErrorInvalidValue;
  PleFusedArgs a;
  a.gate.x = x;
  a.gate.n = n;
  a.gate.in = in;
  a.gate.mat[0] = gate;
  a.gate.ple = ple;
  a.gate.ple_ld = L * D;
  a.gate.ple_off = layer * D;
  a.proj = proj;
  a.d = D;
  a.parts = parts;
  a.part_ld = part_ld;
  const unsigned blocks = unsigned(ple_fused_parts(D)) * ceil_div(size_t(in), size_t(kPleBlockOut));
  const dim3 block(kGemvWarps * 32);
  if (w4) {
    if (n <= 8) return launch_kernel(ple_fused_kernel<1, kGemvW4, false>, blocks, block, launch, a);
    if (n <= 16) return launch_kernel(ple_fused_kernel<2, kGemvW4, false>, blocks, block, launch, a);
    return launch_kernel(ple_fused_kernel<2, kGemvW4, true>, 2 * blocks, block, launch, a);
  }
  if (n <= 8) return launch_kernel(ple_fused_kernel<1, kGemvF16, false>, blocks, block, launch, a);
  if (n <= 16) return launch_kernel(ple_fused_kernel<2, kGemvF16, false>, blocks, block, launch, a);
  return launch_kernel(ple_fused_kernel<2, kGemvF16, true>, 2 * blocks, block, launch, a);
}

// ---- quantizing fp16 rows at load (LoadOptions::lm_head): the arithmetic of weights.hpp's
// quantize_row_int8 / quantize_row_int4 (IEEE division and rint, so host and device agree bit for bit) ----

// One warp per row: scale = max|w| / 127, q = clamp(rint(w / scale), -127, 127).
static __global__ void quantize_int8_kernel(const half* __restrict__ W, int out, int in, int8_t* __restrict__ q,
                                            float* __restrict__ scale) {
  pdl_enter();
  const int row = int(blockIdx.x) * (blockDim.x / 32) + int(threadIdx.x / 32), lane = int(threadIdx.x & 31);
  if (row >= out) return;
  const half* w = W + size_t(row) * in;
  float amax = 0.f;
  for (int i = lane; i < in; i += 32) amax = fmaxf(amax, fabsf(__half2float(w[i])));
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = __fdiv_rn(amax, 127.f);
  if (lane == 0) scale[row] = s;
  for (int i = lane; i < in; i += 32)
    q[size_t(row) * in + i] =
        s > 0.f ? int8_t(fminf(127.f, fmaxf(-127.f, rintf(__fdiv_rn(__half2float(w[i]), s))))) : int8_t(0);
}

// One thread per group of 32: scale = fp16(max|w| / 7), q = clamp(rint(w / scale), -8, 7) packed as the
// w4a16 layout (q + 8; column 8j + k in nibble k of word j as the checkpoint holds it, then w4_gemv_word's order).
static __global__ void quantize_int4_kernel(const half* __restrict__ W, int out, int in, uint32_t* __restrict__ Wq,
                                            half* __restrict__ S) {
  pdl_enter();
  const int groups = in / 32;
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(out) * groups) return;
  const half* w = W + idx * 32;  // group idx of the row-major matrix: in % 32 == 0
  float amax = 0.f;
  for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(__half2float(w[i])));
  const half sh = __float2half_rn(__fdiv_rn(amax, 7.f));
  const float s = __half2float(sh);
  S[idx] = sh;
  for (int j = 0; j < 4; ++j) {
    uint32_t word = 0;
    for (int k = 0; k < 8; ++k) {
      const float v = s > 0.f ? fminf(7.f, fmaxf(-8.f, rintf(__fdiv_rn(__half2float(w[8 * j + k]), s)))) : 0.f;
      word |= uint32_t(int(v) + 8) << (4 * k);
    }
    Wq[idx * 4 + j] = w4_gemv_word(word);
  }
}

inline cudaError_t launch_quantize_int8(const half* W, int out, int in, int8_t* q, float* scale, const Launch& launch) {
  if (out <= 0) return cudaSuccess;
  if (in <= 0) return cudaErrorInvalidValue;
  return launch_kernel(quantize_int8_kernel, ceil_div(size_t(out), 8), 256, launch, W, out, in, q, scale);
}

inline cudaError_t launch_quantize_int4(const half* W, int out, int in, uint32_t* Wq, half* S, const Launch& launch) {
  const size_t groups = size_t(out) * (in / 32);
  if (in % 32 != 0) return cudaErrorInvalidValue;
  if (groups == 0) return cudaSuccess;
  return launch_kernel(quantize_int4_kernel, ceil_div(groups, 256), 256, launch, W, out, in, Wq, S);
}

// The load-time reorder of a w4a16 matrix's device copy (n words, in place) from the checkpoint's word order into
// the GEMV word order (mma.cuh w4_gemv_word), which every kernel reading Wq expects: one thread per word.
static __global__ void w4_gemv_order_kernel(uint32_t* __restrict__ Wq, size_t n) {
  pdl_enter();
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) Wq[i] = w4_gemv_word(Wq[i]);
}

inline cudaError_t launch_w4_gemv_order(uint32_t* Wq, size_t words, const Launch& launch) {
  if (words == 0) return cudaSuccess;
  return launch_kernel(w4_gemv_order_kernel, ceil_div(words, 256), 256, launch, Wq, words);
}

// Prefill path for w4a16: unpack to fp16 tiles for cuBLAS. out16: [out, in] fp16. One thread per scale group.
static __global__ void dequant_w4_kernel(const uint32_t* __restrict__ Wq, const half* __restrict__ S, int out, int in,
                                         half* __restrict__ out16) {
  pdl_enter();
  // one thread per scale group: a 16-byte load of 4 words (32 columns) -> four 16-byte stores
  const int groups = in / 32;
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(out) * groups) return;
  const uint4 w4 = __ldg(reinterpret_cast<const uint4*>(Wq) + idx);
  const float s = __half2float(S[idx]);  // S is [out, in / 32]: the same index
  const uint32_t words[4] = {w4.x, w4.y, w4.z, w4.w};
  uint4* dst = reinterpret_cast<uint4*>(out16) + idx * 4;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t h[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      // columns 2k, 2k + 1: nibbles k, k + 4 (the GEMV word order)
      const half2 v = __halves2half2(__float2half_rn(float(int((words[q] >> (4 * k)) & 0xFu) - 8) * s),
                                     __float2half_rn(float(int((words[q] >> (4 * k + 16)) & 0xFu) - 8) * s));
      h[k] = *reinterpret_cast<const uint32_t*>(&v);
    }
    dst[q] = make_uint4(h[0], h[1], h[2], h[3]);
  }
}

inline cudaError_t launch_dequant_w4(const uint32_t* Wq, const half* S, int out, int in, half* out16,
                                     const Launch& launch) {
  const size_t groups = size_t(out) * (in / 32);
  if (groups == 0) return cudaSuccess;
  if (in % 32 != 0) return cudaErrorInvalidValue;
  return launch_kernel(dequant_w4_kernel, ceil_div(groups, 256), 256, launch, Wq, S, out, in, out16);
}

}  // namespace kernels
}  // namespace gemma4_t4
