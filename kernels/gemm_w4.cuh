// gemma4_t4 kernels: the w4a16 matmul for passes of more than 32 rows (batched decode past 32 sessions, prefill)
// on tensor cores, from a GEMM layout the weights are repacked into once at load (issue 17; lab: dev/gemm_w4.cu).
//
//   Y[M, N] fp32 = X[M, K] fp16 (row stride ldx) x W^T,   W [N, K] int4 (compressed-tensors, symmetric, group 32
//   along K) with fp16 group scales: w[n][k] = (u - 8) * S[n][k / 32], u the stored nibble.
//
// ---- the GEMM weight layout (the one-time repack; why not the checkpoint's) ----
// The checkpoint's words (kernels/gemv.cuh's layout, kept for the <= 16-row GEMV) hold 8 consecutive k of one row.
// An mma B fragment (m16n8k8: b0 = W[n g][k 2t, 2t+1]) needs, per lane, k pairs (2t, 2t+1) of row g: from the
// checkpoint words a lane would unpack 8 nibbles to use 2, or shuffle. So the weights are repacked once so that
// one 32-bit word is exactly what a lane multiplies for one n8 tile and one scale group, and one 16-byte shared
// load is what it multiplies for 4 n8 tiles:
//   wp  [N/32][K/32][32 lanes][4 j] u32: nb = n / 32 (a "super-row" of 32 n), kb = k / 32 (a scale group),
//       lane = 4 g + t, j = n8 tile; word (nb, kb, lane, j), nibble s (0..3) = u of W[32 nb + 8 j + g][32 kb +
//       8 s + 2 t], nibble s + 4 = u of the next k. mma.cuh's w4_pair(word, s, scale) then yields the half2
//       (k 8s + 2t, 8s + 2t + 1) of n 8j + g: b0 of k8-step s. 512 bytes per (nb, kb) unit.
//   sp  [N/32][K/32][8 g][4 j] fp16: S[32 nb + 8 j + g][kb]; a lane reads its 4 scales (one per j) as 8 bytes.
//   Same bytes as the checkpoint layout (N K / 2 + N K / 16). A block's (BN x BK) weight tile is BN / 32 runs of
//   BK / 32 contiguous units: plain 16-byte loads, copied to shared memory as they are; no index arithmetic per
//   weight. Requires N % 32 == 0 and K % 32 == 0. launch_repack_w4_gemm builds it on the device from the
//   checkpoint words; the index maps (namespace gemm_w4) are plain host/device functions, so the lab's CPU
//   self-check emulates the kernel with the very same maps (this part compiles without nvcc).
//
// ---- the kernel ----
// X is the mma's A operand (16 m x 16 k via ldmatrix.x4 from a padded [BM][BK + 8] smem tile: conflict-free
// rows), the dequantised weights are B (n8 tiles; w4_pair = OR the nibbles into 1024.0's mantissa, subtract
// 1032.0 (exact), times the fp16 scale (one rounding): the same fp16 weight launch_dequant_w4 builds), fp32
// accumulators; m16n8k16 on sm_80+, two m16n8k8 on sm_75 (mma.cuh mma_16x8x16). 256 threads, warps WM (m) x
// WN (n) x WK (k); a warp owns MT m16 tiles x 4 n8 tiles (one super-row) and, per k-tile, GPW scale groups
// (BK = 32 WK GPW). Pipeline without cp.async (sm_75): tile kt + 1's 16-byte global loads (X through L1, weights
// and scales L1::no_allocate) are issued into registers before tile kt's math from shared memory, then stored to
// the other of two smem stages; one __syncthreads per k-tile. Cfg::PF = 2 keeps tiles kt + 1 and kt + 2 in
// flight (two register sets), so a load has two tiles' math to land in instead of one. The WK k-warps' accumulators are
// summed through smem (tree, fixed order: deterministic), and fragments go straight to Y as float2 (a row's 4 lanes
// write 32 contiguous bytes). Rows past M and groups past K are loaded as zeros, columns past N not stored. Static smem
// <= 45 KiB (sm_75 without opt-in), no cp.async.
// The reworked kernel, gemm_w4x_kernel (XCfg; lab version 12 = XSmall): the same layout, maps and pipeline, at two
// blocks per SM on sm_80+ (<= 128 registers), one X row / column per thread instead of one pointer per load, the
// dequant in 13 instead of 15 instructions per word (mma.cuh w4x_pairs: lop3, the odd nibble pairs without a shift;
// bit-identical weights) and m16 tiles wholly past M skipped; ncu on the first kernel at 128 rows (H200) showed
// 37% of issue slots busy at 2 warps per scheduler, stalled on fixed-latency dependencies, not on memory.
// launch_gemm_w4 picks the tile by shape (measured in the lab, gemm_w4_by_shape): M <= 32: 32 x 64 x 128; <= 256:
// XSmall's 64 x 128 x 64, its split-K filling two blocks per SM for N <= 2048 with a long K; more: 128 x 128 x 32.
// The MLP's gate and up at 33..256 rows: one launch with the GELU product as its epilogue (gemm_w4x_glu_kernel).
// A row's result depends on the tile configuration (the k-split sums), so it is deterministic for a given shape
// but not equal across M buckets.
// Split-K across blocks (GemmW4Args::splits, chosen by gemm_w4_splits): a decode pass of 33..256 rows against
// E2B's N = 256..2048 matrices makes 4..32 output tiles, so blocks along K write partial tiles that a second
// kernel sums in split order (deterministic; the splits depend on the shape and the SM count only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__) || defined(GEMMA4_T4_EMU)  // GEMMA4_T4_EMU: dev/emu.hpp
#include "common.cuh"
#include "mma.cuh"
#define GEMMA4_T4_GEMM_W4_HD __host__ __device__
#else
#define GEMMA4_T4_GEMM_W4_HD
#endif

namespace gemma4_t4 {
namespace kernels {
namespace gemm_w4 {

// ---- the GEMM layout: index maps shared by the repack, the kernel and the lab's CPU self-check ----
// Nibble u (0..15) of W[n][k] in the checkpoint layout: wq [N, K/8] u32, column 8j + i in bits 4i..4i+3 of word j.
GEMMA4_T4_GEMM_W4_HD inline uint32_t ckpt_nibble(const uint32_t* wq, int K, int n, int k) {
  return (wq[size_t(n) * (K / 8) + k / 8] >> (4 * (k % 8))) & 0xFu;
}

// Word w of wp (N x K / 8 words): built from the checkpoint words (see this file's header).
GEMMA4_T4_GEMM_W4_HD inline uint32_t repack_word(const uint32_t* wq, int N, int K, size_t w) {
  (void)N;
  const int KG = K / 32;
  const int j = int(w % 4), lane = int(w / 4 % 32), g = lane >> 2, t = lane & 3;
  const size_t unit = w / 128;
  const int kb = int(unit % size_t(KG)), nb = int(unit / size_t(KG));
  const int n = 32 * nb + 8 * j + g;
  uint32_t word = 0;
  for (int s = 0; s < 4; ++s) {
    const int k = 32 * kb + 8 * s + 2 * t;
    word |= ckpt_nibble(wq, K, n, k) << (4 * s);
    word |= ckpt_nibble(wq, K, n, k + 1) << (4 * (s + 4));
  }
  return word;
}

// Scale i of sp (N x K / 32): S[32 nb + 8 j + g][kb], S [N, K/32] (raw fp16 bits).
GEMMA4_T4_GEMM_W4_HD inline uint16_t repack_scale(const uint16_t* s, int N, int K, size_t i) {
  (void)N;
  const int KG = K / 32;
  const int q = int(i % 32), g = q / 4, j = q % 4;
  const size_t unit = i / 32;
  const int kb = int(unit % size_t(KG)), nb = int(unit / size_t(KG));
  return s[size_t(32 * nb + 8 * j + g) * KG + kb];
}

// A kernel configuration: 8 warps as WM (m) x WN (n) x WK (k); a warp computes MT m16 tiles x 4 n8 tiles (32 n:
// one super-row) over GPW scale groups of every k-tile. MINB: __launch_bounds__ min blocks per SM. PF: k-tiles
// whose global loads are in flight in registers during a tile's math (1 or 2; 2 takes a second register set).
template <int MT_, int WM_, int WN_, int WK_, int GPW_, int MINB_, int PF_ = 1>
struct Cfg {
  static constexpr bool kX = false;  // gemm_w4_kernel's configuration
  static constexpr int MT = MT_, NT = 4, WM = WM_, WN = WN_, WK = WK_, GPW = GPW_, MINB = MINB_, PF = PF_;
  static_assert(PF == 1 || PF == 2, "1 or 2 k-tiles in flight");
  static constexpr int kThreads = 256;
  static_assert(WM * WN * WK == 8, "8 warps");
  static_assert(WK == 1 || WK == 2 || WK == 4 || WK == 8, "k-warps: a power of two (tree reduction)");
  static constexpr int BM = WM * MT * 16;  // rows of X per block
  static constexpr int BN = WN * 32;       // outputs per block
  static constexpr int G = WK * GPW;       // scale groups per k-tile
  static constexpr int BK = 32 * G;        // k per tile
  static constexpr int XS = BK + 8;        // smem row stride of the X tile, halves (16 B pad: ldmatrix conflict-free)
  static constexpr int kXBytes = BM * XS * 2, kWBytes = BN * BK / 2, kSBytes = BN * G * 2;
  static constexpr int kStage = kXBytes + kWBytes + kSBytes;
  static constexpr int kXLoads = BM * BK / 8, kWLoads = BN * BK / 32, kSLoads = BN * G / 8;  // 16-byte units
  // Per thread in flight: kXL X units, kWL weight-or-scale units (units [0, kWLoads) are W, then S: one register
  // set serves both, as in v2 only 144 of the 256 threads load either).
  static constexpr int kXL = (kXLoads + 255) / 256, kWL = (kWLoads + kSLoads + 255) / 256;
  static constexpr int kAcc = MT * NT * 4;  // fp32 accumulators per lane
  static constexpr int kRedBytes = (WK / 2) * WM * WN * kAcc * 32 * 4;
  static_assert(2 * kStage <= 48 * 1024, "static shared memory <= 48 KiB (sm_75 without opt-in)");
  static_assert(kRedBytes <= 2 * kStage, "the k-warp reduction reuses the stages");
  static_assert(kXBytes % 16 == 0 && kWBytes % 16 == 0 && kSBytes % 16 == 0, "16-byte aligned smem parts");
};

// Tile-load maps (kernel and self-check): unit idx of a k-tile's X / W / S tile -> where it comes from.
// X: row, column (halves) inside the tile; smem at row * XS + col.
GEMMA4_T4_GEMM_W4_HD inline void x_unit(int idx, int bk, int* row, int* col) {
  *row = idx / (bk / 8);
  *col = idx % (bk / 8) * 8;
}
// W and S: super-row sr of the tile and group gi of the tile; global 16-byte unit (from wp or sp as uint4).
// smem: unit idx (the tile is copied as it is).
GEMMA4_T4_GEMM_W4_HD inline size_t w_unit(int idx, int G, int nb0, int kb0, int KG, int* sr, int* gi) {
  *sr = idx / (G * 32);
  const int r = idx % (G * 32);
  *gi = r / 32;
  return (size_t(nb0 + *sr) * KG + kb0) * 32 + r;
}
// The first super-row to pass w_unit / s_unit (or glu_w_unit / glu_s_unit) for a unit of tile super-row sr so that it
// reads super-row min(nb0 + sr, NB - 1): a super-row past N reads the last one instead (W4xSources).
GEMMA4_T4_GEMM_W4_HD inline int clamp_nb0(int nb0, int sr, int NB) { return (nb0 + sr < NB ? nb0 + sr : NB - 1) - sr; }
GEMMA4_T4_GEMM_W4_HD inline size_t s_unit(int idx, int G, int nb0, int kb0, int KG, int* sr, int* gi) {
  *sr = idx / (G * 4);
  const int r = idx % (G * 4);
  *gi = r / 4;
  return (size_t(nb0 + *sr) * KG + kb0) * 4 + r;
}
// A fragment address (ldmatrix.x4 row of `lane`) for m16 tile i and k16 half h of group gi: row and column
// of the X tile. Lanes 0-7 / 8-15 / 16-23 / 24-31 address matrices (rows 0-7, k 0-7) / (rows 8-15, k 0-7) /
// (rows 0-7, k 8-15) / (rows 8-15, k 8-15): registers a0..a3 of m16n8k16.
GEMMA4_T4_GEMM_W4_HD inline void a_addr(int lane, int row0, int i, int gi, int h, int* row, int* col) {
  *row = row0 + 16 * i + (lane & 15);
  *col = 32 * gi + 16 * h + (lane >> 4) * 8;
}
// The B word and scale pair of (super-row sr, group gi) for a lane: word index (u32) and scale index (fp16) in
// the stage's W / S parts.
GEMMA4_T4_GEMM_W4_HD inline int b_word(int sr, int gi, int G, int lane, int j) {
  return ((sr * G + gi) * 32 + lane) * 4 + j;
}
GEMMA4_T4_GEMM_W4_HD inline int b_scale(int sr, int gi, int G, int lane, int j) {
  return (sr * G + gi) * 32 + (lane >> 2) * 4 + j;
}

// The shipped configurations (launch_gemm_w4's dispatch by shape, gemm_w4_by_shape).
using CfgLarge = Cfg<4, 2, 4, 1, 1, 2>;  // 128 x 128 x 32, warps 2 x 4 x 1; 24.5 KiB smem, 2 blocks per SM
using CfgDeep = Cfg<4, 2, 4, 1, 2, 1>;   // 128 x 128 x 64, 2 x 4 x 1, 45.0 KiB (lab v3; 65..128 rows until (f))
using CfgSmall = Cfg<4, 1, 2, 4, 1, 1>;  // 64 x 64 x 128, warps 1 x 2 x 4; 43.0 KiB
using CfgTiny = Cfg<2, 1, 2, 4, 1, 2>;   // 32 x 64 x 128, warps 1 x 2 x 4; 26 KiB

// The reworked kernel's configuration (gemm_w4x_kernel; lab versions 12..15, dev/gemm_w4.cu): a warp computes MT
// m16 tiles x NT n8 tiles (NT 2: half a super-row, n8 tiles j0, j0 + 1; 4: a whole one); WM, WN, WK: warps along m,
// n, k (8 in all); GPW: scale groups per warp per k-tile; MINB: __launch_bounds__ min blocks per SM on sm_80+ (1 on
// sm_75); SLOTS: blocks per SM that the lab's split-K fills (the engine: gemm_w4_splits_for at one); LEAN: kLean.
template <int MT_, int NT_, int WM_, int WN_, int WK_, int GPW_, int MINB_, int SLOTS_ = 1, bool LEAN_ = true>
struct XCfg {
  static constexpr bool kX = true;  // gemm_w4x_kernel's configuration
  static constexpr int MT = MT_, NT = NT_, WM = WM_, WN = WN_, WK = WK_, GPW = GPW_, MINB = MINB_, SLOTS = SLOTS_;
  // The k-tiles inside K load without predicates (gemm_w4x_tile); false: every k-tile as the one that ends past K
  // (predicated loads, zeros past K), the form before 2026-12-06 (lab versions 20..22)
  static constexpr bool kLean = LEAN_;
  static_assert(NT == 2 || NT == 4, "half or all of a super-row per warp");
  static_assert(MT % 2 == 0, "the half-MT instantiation");
  static constexpr int kThreads = 256;
  static_assert(WM * WN * WK == 8, "8 warps");
  static_assert(WK == 1 || WK == 2 || WK == 4 || WK == 8, "k-warps: a power of two (tree reduction)");
  static constexpr int BM = WM * MT * 16;  // rows of X per block
  static constexpr int BN = WN * NT * 8;   // outputs per block
  static_assert(BN % 32 == 0, "whole super-rows per block");
  static constexpr int G = WK * GPW;  // scale groups per k-tile
  static constexpr int BK = 32 * G;   // k per tile
  static constexpr int XS = BK + 8;   // smem row stride of the X tile, halves
  static constexpr int kXBytes = BM * XS * 2, kWBytes = BN * BK / 2, kSBytes = BN * G * 2;
  static constexpr int kStage = kXBytes + kWBytes + kSBytes;
  static constexpr int kXLoads = BM * BK / 8, kWLoads = BN * BK / 32, kSLoads = BN * G / 8;  // 16-byte units
  static constexpr int kXL = (kXLoads + 255) / 256;
  // W and S in one register set of kWL 16-byte units per thread (as Cfg), unless the scales would take a unit set
  // of their own (v12: 256 W + 32 S units): then they travel as kSL 4-byte words (4 registers fewer).
  static constexpr bool kSSep = (kWLoads + kSLoads + 255) / 256 > (kWLoads + 255) / 256;
  static constexpr int kWL = kSSep ? (kWLoads + 255) / 256 : (kWLoads + kSLoads + 255) / 256;
  static constexpr int kSWords = BN * G / 2, kSL = kSSep ? (kSWords + 255) / 256 : 0;
  static constexpr int kAcc = MT * NT * 4;
  static constexpr int kRedBytes = (WK / 2) * WM * WN * kAcc * 32 * 4;
  static constexpr int kSmem = 2 * kStage > kRedBytes ? 2 * kStage : kRedBytes;  // the reduction reuses the stages
  static_assert(kSmem <= 48 * 1024, "static shared memory <= 48 KiB (sm_75 without opt-in)");
  static_assert(kXBytes % 16 == 0 && kWBytes % 16 == 0 && kSBytes % 16 == 0, "16-byte aligned smem parts");
  // warp column wn -> its super-row in the tile and its first n8 tile there
  GEMMA4_T4_GEMM_W4_HD static constexpr int sr_of(int wn) { return wn * NT / 4; }
  GEMMA4_T4_GEMM_W4_HD static constexpr int j0_of(int wn) { return wn * NT % 4; }
};

// The version configurations (header above; tiles M x N x K, warps m x n x k).
// The shipped one: 64 x 128 x 64, warps 1 x 4 x 2 (a warp 64 x 32), 32 KiB smem, 2 blocks per SM on sm_80+ (lab
// version 12).
using XSmall = XCfg<4, 4, 1, 4, 2, 1, 2>;
// The same tile with split-K filling both blocks of every SM (lab version 16): the N <= 2048 matrices with a long K.
using XSmallFill = XCfg<4, 4, 1, 4, 2, 1, 2, 2>;

// The MLP's gate and up in one launch with the GELU product as the epilogue (gemm_w4x_glu_kernel; lab version 17):
// the block's weight tile is a base XCfg's (XSmall: 4 super-rows x G groups), filled from two matrices: tile
// super-rows [0, SRM) are gate's super-rows nb0 .. nb0 + SRM - 1, [SRM, 2 SRM) up's same ones (SRM = BN / 64), so
// the smem stage, the loads per thread and the math per warp are the base's. A warp's NT = 4 n8 tiles are n8 tiles
// j0, j0 + 1 of output super-row osr in gate (accumulators j 0, 1) and in up (j 2, 3): g and u of one output sit in
// one lane (the epilogue needs no exchange). Its B operand: two 8-byte words and two 4-byte scale words instead of
// one 16-byte and one 8-byte shared load (the dequant, ldmatrix and mma counts are XSmall's).
template <class B>
struct GluCfg : B {
  using Base = B;
  static_assert(B::NT == 4, "a warp: n8 tiles j0, j0 + 1 of gate and of up");
  static constexpr int NTO = B::NT / 2;  // n8 tiles per matrix per warp
  static constexpr int BNO = B::BN / 2;  // outputs per block (columns of act; of gate and of up each)
  static constexpr int SRM = BNO / 32;   // super-rows per matrix in the tile
  static_assert(BNO % 32 == 0, "whole super-rows of both matrices");
  static_assert(B::kSSep, "W in 16-byte units, the scales as 4-byte words (as XSmall)");
  // warp column wn -> its output super-row in the block and its first n8 tile there
  GEMMA4_T4_GEMM_W4_HD static constexpr int osr_of(int wn) { return wn * NTO / 4; }
  GEMMA4_T4_GEMM_W4_HD static constexpr int oj0_of(int wn) { return wn * NTO % 4; }
};
using GluSmall = GluCfg<XSmall>;  // 64 rows x 64 outputs x 64 k (128 accumulator columns), 32 KiB smem (lab version 17)
// Half as many outputs per block, a k-tile twice as deep (lab version 19): 64 rows x 32 outputs x 128 k, warps 1 x 2
// x 4 (each warp XSmall's math), 43 KiB smem. For passes of at most 64 rows, where GluSmall's one row tile leaves
// SMs idle: E2B's gate/up of 6144 outputs make 96 GluSmall blocks on an H100's or H200's 132 SMs, 192 of these
// (launch_gemm_w4_glu: gemm_w4_glu_narrow).
// Its loads stay predicated (kLean false): the lean form spills 76 bytes on sm_90 at 128 registers (28 this way; four X
// units in flight per thread where XSmall has two); 2-4% faster in the lab, no gain in the engine (2026-12-06).
using XNarrow = XCfg<4, 4, 1, 2, 4, 1, 2, 1, false>;
using GluNarrow = GluCfg<XNarrow>;

// A k-tile further along K, a unit's source moves by G groups: 32 16-byte W units (512 bytes) and 16 S words per
// group (the kernel adds kb0 times these to the k-tile-0 source of glu_w_unit / glu_s_unit; the emulator too).
constexpr int kGluWUnitsPerGroup = 32, kGluSWordsPerGroup = 16;

// Unit idx of GluCfg's W tile (16-byte units, kept in smem as they are) -> its matrix (0 gate, 1 up), its global unit
// in that matrix's wp (w_unit), its super-row nb there and its group gi in the tile.
GEMMA4_T4_GEMM_W4_HD inline size_t glu_w_unit(int idx, int G, int srm, int nb0, int kb0, int KG, int* mat, int* nb,
                                              int* gi) {
  const int per = G * 32 * srm;  // units per matrix
  int sr;
  const size_t src = w_unit(idx % per, G, nb0, kb0, KG, &sr, gi);
  *mat = idx / per;
  *nb = nb0 + sr;
  return src;
}
// The same for the S tile's 16-byte units (s_unit; the 4-byte words of unit idx / 4 follow it).
GEMMA4_T4_GEMM_W4_HD inline size_t glu_s_unit(int idx, int G, int srm, int nb0, int kb0, int KG, int* mat, int* nb,
                                              int* gi) {
  const int per = G * 4 * srm;
  int sr;
  const size_t src = s_unit(idx % per, G, nb0, kb0, KG, &sr, gi);
  *mat = idx / per;
  *nb = nb0 + sr;
  return src;
}

}  // namespace gemm_w4

#if defined(__CUDACC__) || defined(GEMMA4_T4_EMU)  // GEMMA4_T4_EMU: dev/emu.hpp

// ---- the kernel ----

struct GemmW4Args {
  const half* x = nullptr;  // [M, ldx] fp16, 16-byte aligned, ldx % 8 == 0
  int ldx = 0;
  int m = 0, n = 0, k = 0;       // N % 32 == 0, K % 32 == 0
  const uint32_t* wp = nullptr;  // [N/32][K/32][32][4] u32: the GEMM layout
  const half* sp = nullptr;      // [N/32][K/32][8][4] fp16 scales
  float* y = nullptr;            // [M, ldy] fp32, ldy % 2 == 0
  int ldy = 0;
  // Split-K (gemm_w4_splits): `splits` blocks along K per output tile, each writing its partial tile to part
  // ([splits][M][N] fp32, 16-byte aligned), summed in split order by a second kernel (deterministic) into y, or --
  // keep_parts -- left there for the reader to add in split order (launch_residual_norm's parts: part p at
  // part + p M N, rows of N), y unused.
  int splits = 1;
  float* part = nullptr;
  bool keep_parts = false;
};

// ---- the kernels' common tail ----

// The WK k-warps' partial accumulators (kAcc per lane; `mine`: this warp's) summed into k-warp 0's: a tree over
// shared memory (red: [WK / 2][WM * WN][kAcc][32] fp32), in a fixed order (deterministic). Every thread of the
// block calls it (barriers).
template <class C>
__device__ __forceinline__ void gemm_w4_kwarp_sum(float* mine, float* red, int ks, int wmn, int lane) {
#pragma unroll
  for (int step = C::WK / 2; step >= 1; step /= 2) {
    if (ks >= step && ks < 2 * step) {
#pragma unroll
      for (int e = 0; e < C::kAcc; ++e) red[(((ks - step) * C::WM * C::WN + wmn) * C::kAcc + e) * 32 + lane] = mine[e];
    }
    __syncthreads();
    if (ks < step) {
#pragma unroll
      for (int e = 0; e < C::kAcc; ++e) mine[e] += red[((ks * C::WM * C::WN + wmn) * C::kAcc + e) * 32 + lane];
    }
    __syncthreads();
  }
}

// A warp's MT m16 x NT n8 accumulator tiles (first row row0, first column col0) to Y, or to split z's partial tile
// when the grid splits K (formed here, not kept live through the k loop: registers). A row's 4 lanes write 32
// contiguous bytes as float2; rows past M are not written.
template <int MT, int NT>
__device__ __forceinline__ void gemm_w4_store(const GemmW4Args& a, const float (&acc)[MT][NT][4], int row0, int col0,
                                              int lane) {
  const int g = lane >> 2, t = lane & 3;
  float* const y = gridDim.z > 1 ? a.part + size_t(blockIdx.z) * a.m * a.n : a.y;
  const int ldy = gridDim.z > 1 ? a.n : a.ldy;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    const int row = row0 + 16 * i + g;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int col = col0 + 8 * j + 2 * t;
      if (row < a.m) *reinterpret_cast<float2*>(y + size_t(row) * ldy + col) = make_float2(acc[i][j][0], acc[i][j][1]);
      if (row + 8 < a.m)
        *reinterpret_cast<float2*>(y + size_t(row + 8) * ldy + col) = make_float2(acc[i][j][2], acc[i][j][3]);
    }
  }
}

template <class C>
__global__ void __launch_bounds__(C::kThreads, C::MINB) gemm_w4_kernel(const GemmW4Args a) {
  GEMMA4_T4_KTRACE_SCOPE(kKtGemmW4, 0);
  __shared__ __align__(16) unsigned char smem[2 * C::kStage];  // 2 stages of [X tile | W tile | S tile]
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int wmn = warp % (C::WM * C::WN), ks = warp / (C::WM * C::WN), wm = wmn / C::WN, wn = wmn % C::WN;
  const int m0 = int(blockIdx.y) * C::BM, nb0 = int(blockIdx.x) * (C::BN / 32);
  const int NB = a.n / 32, KG = a.k / 32, KT_all = (KG + C::G - 1) / C::G;
  // this block's k-tiles [kt_begin, KT) (split z of gridDim.z)
  const int z = int(blockIdx.z), kt_begin = int(int64_t(KT_all) * z / gridDim.z);
  const int KT = int(int64_t(KT_all) * (z + 1) / gridDim.z);

  uint4 xa[C::kXL], wa[C::kWL];  // the next k-tile, in flight in registers
  uint4 xb[C::kXL], wb[C::kWL];  // PF == 2: the one after it
  const half* xrow[C::kXL];      // this thread's X units: row start + column in the tile (null: row past M)
#pragma unroll
  for (int c = 0; c < C::kXL; ++c) {
    const int idx = tid + c * C::kThreads;
    int row, col;
    gemm_w4::x_unit(idx, C::BK, &row, &col);
    xrow[c] = idx < C::kXLoads && m0 + row < a.m ? a.x + size_t(m0 + row) * a.ldx + col : nullptr;
  }
  auto load = [&](int kt, uint4(&xr)[C::kXL], uint4(&wr)[C::kWL]) {
    const int kb0 = kt * C::G;
#pragma unroll
    for (int c = 0; c < C::kXL; ++c) {
      const int col = (tid + c * C::kThreads) % (C::BK / 8) * 8;
      const bool ok = xrow[c] != nullptr && kb0 * 32 + col < a.k;
      xr[c] = ld_x(reinterpret_cast<const uint4*>(ok ? xrow[c] + kb0 * 32 : a.x), ok);
    }
#pragma unroll
    for (int c = 0; c < C::kWL; ++c) {
      const int idx = tid + c * C::kThreads;
      const bool is_w = idx < C::kWLoads;
      int s_r, gi;
      const size_t src = is_w ? gemm_w4::w_unit(idx, C::G, nb0, kb0, KG, &s_r, &gi)
                              : gemm_w4::s_unit(idx - C::kWLoads, C::G, nb0, kb0, KG, &s_r, &gi);
      const bool ok = idx < C::kWLoads + C::kSLoads && nb0 + s_r < NB && kb0 + gi < KG;
      const uint4* base = is_w ? reinterpret_cast<const uint4*>(a.wp) : reinterpret_cast<const uint4*>(a.sp);
      wr[c] = ld_weights(base + (ok ? src : 0), ok);
    }
  };
  auto store = [&](int stage, const uint4(&xr)[C::kXL], const uint4(&wr)[C::kWL]) {
    unsigned char* base = smem + stage * C::kStage;
#pragma unroll
    for (int c = 0; c < C::kXL; ++c) {
      const int idx = tid + c * C::kThreads;
      int row, col;
      gemm_w4::x_unit(idx, C::BK, &row, &col);
      if (idx < C::kXLoads) *reinterpret_cast<uint4*>(base + (row * C::XS + col) * 2) = xr[c];
    }
#pragma unroll
    for (int c = 0; c < C::kWL; ++c) {  // the S part follows the W part: unit idx of W | S
      const int idx = tid + c * C::kThreads;
      if (idx < C::kWLoads + C::kSLoads) reinterpret_cast<uint4*>(base + C::kXBytes)[idx] = wr[c];
    }
  };

  float acc[C::MT][4][4];
#pragma unroll
  for (int i = 0; i < C::MT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;

  // k-tile kt's math from its smem stage (kt & 1)
  auto math = [&](int kt) {
    const unsigned char* base = smem + (kt & 1) * C::kStage;
    const half* xs = reinterpret_cast<const half*>(base);
    const uint32_t* ws = reinterpret_cast<const uint32_t*>(base + C::kXBytes);
    const uint16_t* ss = reinterpret_cast<const uint16_t*>(base + C::kXBytes + C::kWBytes);
#pragma unroll
    for (int q = 0; q < C::GPW; ++q) {
      const int gi = ks + C::WK * q;
      if (kt * C::G + gi >= KG) break;  // warp-uniform: past K (zeros anyway)
      const uint4 w = *reinterpret_cast<const uint4*>(ws + gemm_w4::b_word(wn, gi, C::G, lane, 0));
      const uint2 sc = *reinterpret_cast<const uint2*>(ss + gemm_w4::b_scale(wn, gi, C::G, lane, 0));
      const uint32_t wd[4] = {w.x, w.y, w.z, w.w};
      const uint32_t s2[4] = {__byte_perm(sc.x, 0, 0x1010), __byte_perm(sc.x, 0, 0x3232), __byte_perm(sc.y, 0, 0x1010),
                              __byte_perm(sc.y, 0, 0x3232)};  // scale of n8 tile j in both halves
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // k 0..15, 16..31 of the group
        uint32_t b[4][2];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          b[j][0] = w4_pair(wd[j], 2 * h, s2[j]);
          b[j][1] = w4_pair(wd[j], 2 * h + 1, s2[j]);
        }
#pragma unroll
        for (int i = 0; i < C::MT; ++i) {
          int row, col;
          gemm_w4::a_addr(lane, wm * C::MT * 16, i, gi, h, &row, &col);
          uint32_t af[4];
          ldsm_x4(af, xs + row * C::XS + col);
#pragma unroll
          for (int j = 0; j < 4; ++j) mma_16x8x16(acc[i][j], af, b[j][0], b[j][1]);
        }
      }
    }
  };

  pdl_enter();  // X comes from the previous kernel
  load(kt_begin, xa, wa);
  store(kt_begin & 1, xa, wa);
  if constexpr (C::PF == 1) {
    __syncthreads();
    for (int kt = kt_begin; kt < KT; ++kt) {
      if (kt + 1 < KT) load(kt + 1, xa, wa);  // in flight during this tile's math
      math(kt);
      if (kt + 1 < KT) store((kt + 1) & 1, xa, wa);
      __syncthreads();
    }
  } else {  // two tiles in flight: xb holds tile kt + 1 at the top of each iteration, xa is loaded with kt + 2
    if (kt_begin + 1 < KT) load(kt_begin + 1, xb, wb);
    __syncthreads();
    for (int kt = kt_begin; kt < KT; kt += 2) {
      if (kt + 2 < KT) load(kt + 2, xa, wa);
      math(kt);
      if (kt + 1 < KT) store((kt + 1) & 1, xb, wb);
      __syncthreads();
      if (kt + 1 >= KT) break;
      if (kt + 3 < KT) load(kt + 3, xb, wb);
      math(kt + 1);
      if (kt + 2 < KT) store(kt & 1, xa, wa);  // tile kt + 2's stage: tile kt's, read before the barrier above
      __syncthreads();
    }
  }

  if constexpr (C::WK > 1) {  // the k-warps' partial tiles (the stages are free after the loop)
    gemm_w4_kwarp_sum<C>(&acc[0][0][0], reinterpret_cast<float*>(smem), ks, wmn, lane);
    if (ks != 0) return;
  }

  const int nb = nb0 + wn;
  if (nb >= NB) return;
  gemm_w4_store(a, acc, m0 + wm * C::MT * 16, nb * 32, lane);
}

// y = sum of the splits' partial tiles, in split order. One thread per 4 outputs (N % 4 == 0).
static __global__ void gemm_w4_reduce_kernel(const float* __restrict__ part, int splits, int m, int n,
                                             float* __restrict__ y, int ldy) {
  GEMMA4_T4_KTRACE_SCOPE(kKtGemmW4, 3);
  pdl_enter();
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x, q = size_t(n) / 4;
  if (i >= size_t(m) * q) return;
  const size_t row = i / q, col = i % q * 4, stride = size_t(m) * n;
  float4 s = __ldcg(reinterpret_cast<const float4*>(part + row * n + col));
  for (int z = 1; z < splits; ++z) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(part + z * stride + row * n + col));
    s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
  }
  float* out = y + row * ldy + col;  // ldy % 2 == 0 only: two float2 stores
  *reinterpret_cast<float2*>(out) = make_float2(s.x, s.y);
  *reinterpret_cast<float2*>(out + 2) = make_float2(s.z, s.w);
}

// ---- the reworked kernel (gemm_w4x; lab version 12 ships as XSmall; configuration notes: XCfg) ----

// A 4-byte weight-path load (ld_weights' path: not allocated in L1), zero when !ok: v12's scales.
__device__ __forceinline__ uint32_t ld_weights_u32(const uint32_t* p, bool ok) {
#ifdef GEMMA4_T4_EMU  // dev/emu.hpp
  return ok ? *p : 0u;
#else
  uint32_t v;
  asm("{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %2, 0;\n"
      "  mov.b32 %0, 0;\n"
      "  @p ld.global.nc.L1::no_allocate.u32 %0, [%1];\n"
      "}\n"
      : "=r"(v)
      : "l"(p), "r"(int(ok)));
  return v;
#endif
}

// ld_weights_u32 without a predicate (see ld16_all)
__device__ __forceinline__ uint32_t ld_weights_u32_all(const uint32_t* p) {
#ifdef GEMMA4_T4_EMU  // dev/emu.hpp
  return *p;
#else
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
#endif
}

// Min blocks per SM for __launch_bounds__: C::MINB on sm_80+; 1 on sm_75, whose 64 KiB of shared memory per SM
// holds one block of these tiles anyway (v14's 25 KiB would fit two, but spills at 128 registers there).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
template <class C>
constexpr int kXMinBlocks = C::MINB > 1 ? 1 : C::MINB;  // 1 (names MINB: no unused-member warning)
#else
template <class C>
constexpr int kXMinBlocks = C::MINB;
#endif

// ---- the reworked kernels' block program (gemm_w4x_kernel, gemm_w4x_glu_kernel) ----
// Both kernels run gemm_w4x_tile<C, Src>: one prologue, X tile load, smem stage [X tile | W tile | S tile], pipeline
// (tile kt + 1's global loads in registers during tile kt's math, one barrier per k-tile), A side of the math
// (ldmatrix.x4 + mma per m16 tile, with the half-MT instantiation) and k-warp sum. What differs between them is a
// compile-time tile source Src (W4xOneMatrix, W4xGateUp), all of it inlined: each kernel compiles to the PTX its
// own copy of the loop did (compared per function, sm_75 and sm_90). Src provides:
//   Args                          the kernel's arguments: x, ldx, m, n, k as GemmW4Args, the weights, the output
//   kSplitK                       the block's k-tiles are split blockIdx.z of gridDim.z, else all of them
//   kSuperRows                    output super-rows per block (the block's first: blockIdx.x kSuperRows)
//   sr_of(wn), j0_of(wn)          warp column wn -> its output super-row in the block, its first n8 tile there
//   Src(a, tid, nb0, NB, KG)      a thread's load state, set up once before the k loop
//   load(kb0, w)                  this thread's W and S units of the k-tile whose first group is kb0, into w (zeros
//                                 past N and K). One call for both loops: with a call per unit, nvcc if-converts
//                                 the bounds tests of W4xOneMatrix's maps differently (other code, same loads)
//   b_operand(...)                a warp's NT B words and scale pairs of group gi from a stage's W / S parts
//   store(a, acc, row0, nb, j0, lane)  the epilogue: a warp's accumulators to its rows from row0, output super-row
//                                 nb from n8 tile j0 (the caller has dropped super-rows past N)

// A warp's MT x NT accumulator tiles.
template <class C>
using W4xAcc = float[C::MT][C::NT][4];

// A thread's share of one k-tile's weight tile in flight: kWL 16-byte units of W (!kSSep: of W | S, one register set
// for both as Cfg's) and, when the scales travel apart (kSSep), kSL 4-byte words of S (4 registers fewer than a unit).
template <class C>
struct W4xWeights {
  uint4 w[C::kWL];
  uint32_t s[C::kSL > 0 ? C::kSL : 1];
};

// A thread's weight sources for gemm_w4x_tile (both tile sources): its units of the W tile (w[], with the S tile's
// 16-byte units after W's when !kSSep) and its 4-byte S words (s[]) at k-tile 0, formed once and moved by kb0 groups
// per k-tile. A unit of a super-row past N reads the last super-row instead (it feeds accumulators that are never
// stored), so only the k-tile that ends past K needs a predicate (Tail).
template <class C>
struct W4xSources {
  static constexpr int kW = C::kWLoads + (C::kSSep ? 0 : C::kSLoads);  // units of w[] over the block
  static constexpr int kWStep = 32, kSUnitStep = 4, kSWordStep = 16;   // per group: W units, S units, S words
  const uint4* wsrc[C::kWL];
  const uint32_t* ssrc[C::kSL > 0 ? C::kSL : 1];
  int wgi[C::kWL], sgi[C::kSL > 0 ? C::kSL : 1];  // the unit's group in the tile; -1: no unit for this thread
  int KG;

  template <bool Tail>
  __device__ __forceinline__ void load(int kb0, W4xWeights<C>& r, int tid) const {
#pragma unroll
    for (int c = 0; c < C::kWL; ++c) {
      const int step = C::kSSep || tid + c * C::kThreads < C::kWLoads ? kWStep : kSUnitStep;
      const uint4* p = wsrc[c] + size_t(kb0) * step;
      if constexpr (Tail) {
        const bool ok = wgi[c] >= 0 && kb0 + wgi[c] < KG;
        r.w[c] = ld_weights(ok ? p : wsrc[c], ok);
      } else if (kW % C::kThreads == 0 || wgi[c] >= 0) {  // else the unit is never stored
        r.w[c] = ld_weights_all(p);
      }
    }
#pragma unroll
    for (int c = 0; c < C::kSL; ++c) {
      const uint32_t* p = ssrc[c] + size_t(kb0) * kSWordStep;
      if constexpr (Tail) {
        const bool ok = sgi[c] >= 0 && kb0 + sgi[c] < KG;
        r.s[c] = ld_weights_u32(ok ? p : ssrc[c], ok);
      } else if (C::kSWords % C::kThreads == 0 || sgi[c] >= 0) {
        r.s[c] = ld_weights_u32_all(p);
      }
    }
  }
};

// gemm_w4x_kernel's tile source: the block's BN / 32 super-rows of one matrix (the maps w_unit / s_unit evaluated once,
// W4xSources), a warp's NT n8 tiles from j0 in one super-row, split-K (launch_gemm_w4_cfg sums the partial tiles),
// fp32 Y.
template <class C>
struct W4xOneMatrix {
  using Args = GemmW4Args;
  static constexpr bool kSplitK = true;
  static constexpr int kSuperRows = C::BN / 32;
  __device__ static constexpr int sr_of(int wn) { return C::sr_of(wn); }
  __device__ static constexpr int j0_of(int wn) { return C::j0_of(wn); }

  W4xSources<C> src;  // the maps (w_unit, s_unit) at k-tile 0, super-rows past N clamped
  const int tid;
  __device__ __forceinline__ W4xOneMatrix(const Args& a, int t, int nb0, int NB, int KG) : tid(t) {
    src.KG = KG;
#pragma unroll
    for (int c = 0; c < C::kWL; ++c) {
      const int idx = tid + c * C::kThreads;
      const bool is_w = idx < C::kWLoads;
      auto map = [&](int nb_first, int* s_r, int* gi) {
        return is_w ? gemm_w4::w_unit(idx, C::G, nb_first, 0, KG, s_r, gi)
                    : gemm_w4::s_unit(idx - C::kWLoads, C::G, nb_first, 0, KG, s_r, gi);
      };
      int s_r, gi;
      map(nb0, &s_r, &gi);
      const size_t at = map(gemm_w4::clamp_nb0(nb0, s_r, NB), &s_r, &gi);
      const bool ok = idx < W4xSources<C>::kW;
      src.wgi[c] = ok ? gi : -1;
      src.wsrc[c] =
          (is_w ? reinterpret_cast<const uint4*>(a.wp) : reinterpret_cast<const uint4*>(a.sp)) + (ok ? at : 0);
    }
#pragma unroll
    for (int c = 0; c < C::kSL; ++c) {  // word idx of the S tile = word idx % 4 of its 16-byte unit idx / 4
      const int idx = tid + c * C::kThreads;
      int s_r, gi;
      gemm_w4::s_unit(idx / 4, C::G, nb0, 0, KG, &s_r, &gi);
      const size_t at =
          gemm_w4::s_unit(idx / 4, C::G, gemm_w4::clamp_nb0(nb0, s_r, NB), 0, KG, &s_r, &gi) * 4 + idx % 4;
      const bool ok = idx < C::kSWords;
      src.sgi[c] = ok ? gi : -1;
      src.ssrc[c] = reinterpret_cast<const uint32_t*>(a.sp) + (ok ? at : 0);
    }
  }

  template <bool Tail>
  __device__ __forceinline__ void load(int kb0, W4xWeights<C>& r) const {
    src.template load<Tail>(kb0, r, tid);
  }

  // NT 4: the whole super-row sr, one 16-byte word load and one 8-byte scale load; NT 2: n8 tiles j0, j0 + 1 (j0
  // even: 8- and 4-byte aligned)
  __device__ static __forceinline__ void b_operand(const uint32_t* ws, const uint16_t* ss, int sr, int j0, int gi,
                                                   int lane, uint32_t (&wd)[C::NT], uint32_t (&s2)[C::NT]) {
    if constexpr (C::NT == 4) {
      const uint4 w = *reinterpret_cast<const uint4*>(ws + gemm_w4::b_word(sr, gi, C::G, lane, 0));
      const uint2 sc = *reinterpret_cast<const uint2*>(ss + gemm_w4::b_scale(sr, gi, C::G, lane, 0));
      wd[0] = w.x, wd[1] = w.y, wd[2] = w.z, wd[3] = w.w;
      s2[0] = __byte_perm(sc.x, 0, 0x1010), s2[1] = __byte_perm(sc.x, 0, 0x3232);
      s2[2] = __byte_perm(sc.y, 0, 0x1010), s2[3] = __byte_perm(sc.y, 0, 0x3232);
    } else {
      const uint2 w = *reinterpret_cast<const uint2*>(ws + gemm_w4::b_word(sr, gi, C::G, lane, j0));
      const uint32_t sc = *reinterpret_cast<const uint32_t*>(ss + gemm_w4::b_scale(sr, gi, C::G, lane, j0));
      wd[0] = w.x, wd[1] = w.y;
      s2[0] = __byte_perm(sc, 0, 0x1010), s2[1] = __byte_perm(sc, 0, 0x3232);
    }
  }

  __device__ static __forceinline__ void store(const Args& a, const W4xAcc<C>& acc, int row0, int nb, int j0,
                                               int lane) {
    gemm_w4_store(a, acc, row0, nb * 32 + 8 * j0, lane);
  }
};

// launch_gemm_w4_glu's arguments: the MLP's gate and up (the same shape and layout) and the fp16 act.
struct GemmW4GluArgs {
  const half* x = nullptr;  // [M, ldx] fp16, 16-byte aligned, ldx % 8 == 0
  int ldx = 0;
  int m = 0, n = 0, k = 0;     // n: outputs of each matrix (the MLP width); N % 32 == 0, K % 32 == 0
  const uint32_t* wp[2] = {};  // gate, up: [N/32][K/32][32][4] u32, the GEMM layout, 16-byte aligned
  const half* sp[2] = {};      // gate, up: [N/32][K/32][8][4] fp16 scales, 16-byte aligned
  half* out = nullptr;         // [M, ld16] fp16 act, 4-byte aligned, ld16 % 2 == 0
  int ld16 = 0;
};

// gemm_w4x_glu_kernel's tile source (GluCfg C): tile super-rows [0, SRM) from gate, [SRM, 2 SRM) from up
// (gemm_w4::glu_w_unit, glu_s_unit), a warp's B from its output super-row in both halves (accumulators j < NTO: gate,
// j >= NTO: up, the same outputs), no split-K (the GELU needs whole sums; E2B's N of 6144 / 12288 makes 96 or more
// tiles at M >= 33), and gelu_mul's expression as the epilogue: the unfused path's act16 bit for bit at the same sums
// (checked by lab version 17 against XSmall unsplit + gelu_mul).
template <class C>
struct W4xGateUp {
  using Args = GemmW4GluArgs;
  static constexpr bool kSplitK = false;
  static constexpr int kSuperRows = C::SRM;
  __device__ static constexpr int sr_of(int wn) { return C::osr_of(wn); }
  __device__ static constexpr int j0_of(int wn) { return C::oj0_of(wn); }

  // A thread's W units and S words at k-tile 0 (their matrix selected once, super-rows past N clamped), advanced by
  // kb0 groups per k-tile (W4xSources)
  static_assert(gemm_w4::kGluWUnitsPerGroup == W4xSources<C>::kWStep &&
                    gemm_w4::kGluSWordsPerGroup == W4xSources<C>::kSWordStep,
                "a group further along K: the same unit steps as one matrix");
  W4xSources<C> src;
  const int tid;
  __device__ __forceinline__ W4xGateUp(const Args& a, int t, int nb0, int NB, int KG) : tid(t) {
    src.KG = KG;
#pragma unroll
    for (int c = 0; c < C::kWL; ++c) {
      const int idx = tid + c * C::kThreads;
      int mat, nb, gi;
      gemm_w4::glu_w_unit(idx, C::G, C::SRM, nb0, 0, KG, &mat, &nb, &gi);
      const int nbc = gemm_w4::clamp_nb0(nb0, nb - nb0, NB);
      const size_t at = gemm_w4::glu_w_unit(idx, C::G, C::SRM, nbc, 0, KG, &mat, &nb, &gi);
      const bool ok = idx < C::kWLoads;
      src.wgi[c] = ok ? gi : -1;
      src.wsrc[c] = reinterpret_cast<const uint4*>(mat ? a.wp[1] : a.wp[0]) + (ok ? at : 0);
    }
#pragma unroll
    for (int c = 0; c < C::kSL; ++c) {  // word idx of the S tile = word idx % 4 of its 16-byte unit idx / 4
      const int idx = tid + c * C::kThreads;
      int mat, nb, gi;
      gemm_w4::glu_s_unit(idx / 4, C::G, C::SRM, nb0, 0, KG, &mat, &nb, &gi);
      const int nbc = gemm_w4::clamp_nb0(nb0, nb - nb0, NB);
      const size_t at = gemm_w4::glu_s_unit(idx / 4, C::G, C::SRM, nbc, 0, KG, &mat, &nb, &gi) * 4 + idx % 4;
      const bool ok = idx < C::kSWords;
      src.sgi[c] = ok ? gi : -1;
      src.ssrc[c] = reinterpret_cast<const uint32_t*>(mat ? a.sp[1] : a.sp[0]) + (ok ? at : 0);
    }
  }

  template <bool Tail>
  __device__ __forceinline__ void load(int kb0, W4xWeights<C>& r) const {
    src.template load<Tail>(kb0, r, tid);
  }

  // n8 tiles j0, j0 + 1 of tile super-row osr (gate) and SRM + osr (up): two 8-byte word and two 4-byte scale loads
  __device__ static __forceinline__ void b_operand(const uint32_t* ws, const uint16_t* ss, int osr, int j0, int gi,
                                                   int lane, uint32_t (&wd)[C::NT], uint32_t (&s2)[C::NT]) {
#pragma unroll
    for (int mat = 0; mat < 2; ++mat) {
      const int t = mat * C::SRM + osr;
      const uint2 w = *reinterpret_cast<const uint2*>(ws + gemm_w4::b_word(t, gi, C::G, lane, j0));
      const uint32_t sc = *reinterpret_cast<const uint32_t*>(ss + gemm_w4::b_scale(t, gi, C::G, lane, j0));
      wd[2 * mat] = w.x, wd[2 * mat + 1] = w.y;
      s2[2 * mat] = __byte_perm(sc, 0, 0x1010), s2[2 * mat + 1] = __byte_perm(sc, 0, 0x3232);
    }
  }

  // gelu_mul_kernel's expression on g and u of each output; a row's 4 lanes write 16 contiguous bytes per n8 tile
  // as half2
  __device__ static __forceinline__ void store(const Args& a, const W4xAcc<C>& acc, int row0, int nb, int j0,
                                               int lane) {
    const int g = lane >> 2, t = lane & 3, col0 = nb * 32 + 8 * j0;
#pragma unroll
    for (int i = 0; i < C::MT; ++i)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {  // rows g, g + 8 of the m16 tile: accumulators 2 hr, 2 hr + 1
        const int row = row0 + 16 * i + g + 8 * hr;
        if (row >= a.m) continue;
#pragma unroll
        for (int j = 0; j < C::NTO; ++j) {
          const float* gv = acc[i][j] + 2 * hr;
          const float* uv = acc[i][j + C::NTO] + 2 * hr;
          const half2 v = __halves2half2(to_half_sat(gelu_tanh(gv[0]) * uv[0]), to_half_sat(gelu_tanh(gv[1]) * uv[1]));
          *reinterpret_cast<half2*>(a.out + size_t(row) * a.ld16 + col0 + 8 * j + 2 * t) = v;
        }
      }
  }
};

// The block program of the reworked kernels (C: an XCfg or GluCfg, Src: its tile source; see above). smem: the
// kernel's C::kSmem bytes (declared in the kernel: the __shared__ symbol keeps the kernel's name).
template <class C, class Src>
__device__ __forceinline__ void gemm_w4x_tile(const typename Src::Args& a, unsigned char* smem) {
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int wmn = warp % (C::WM * C::WN), ks = warp / (C::WM * C::WN), wm = wmn / C::WN, wn = wmn % C::WN;
  const int sr = Src::sr_of(wn), j0 = Src::j0_of(wn);
  const int m0 = int(blockIdx.y) * C::BM, nb0 = int(blockIdx.x) * Src::kSuperRows;
  const int NB = a.n / 32, KG = a.k / 32, KT_all = (KG + C::G - 1) / C::G;
  int kt_begin = 0, KT = KT_all;  // this block's k-tiles [kt_begin, KT)
  if constexpr (Src::kSplitK) {   // split z of gridDim.z
    const int z = int(blockIdx.z);
    kt_begin = int(int64_t(KT_all) * z / gridDim.z);
    KT = int(int64_t(KT_all) * (z + 1) / gridDim.z);
  }
  // m16 tiles of this warp with a row below M: MT, or MT / 2 (the half instantiation of the math)
  const int rows_left = a.m - m0 - wm * C::MT * 16;
  const bool full = rows_left > C::MT / 2 * 16;

  uint4 xa[C::kXL];  // the next k-tile, in flight in registers
  W4xWeights<C> wa;  // its weights and scales
  // this thread's X units (x_unit): rows xrow0 + c kXRowStep, column xcol of the tile (one register pair, not kXL:
  // kXL offsets spill GluNarrow on sm_90). A row past M reads row M - 1 instead: it feeds accumulators that are never
  // stored, so the loads need no row predicate; only the k-tile that ends past K (K % BK != 0: kt_tail) needs one.
  static_assert(C::kThreads % (C::BK / 8) == 0, "X units of a thread: one column");
  constexpr int kXRowStep = C::kThreads / (C::BK / 8);
  const int xrow0 = m0 + tid / (C::BK / 8), xcol = tid % (C::BK / 8) * 8;
  auto xoff = [&](int c) { return min(xrow0 + c * kXRowStep, a.m - 1) * a.ldx + xcol; };  // M ldx < 2^31
  const int kt_tail = a.k % C::BK != 0 ? KT_all - 1 : -1;
  const Src src(a, tid, nb0, NB, KG);
  auto load = [&](int kt) {
    const int kb0 = kt * C::G;
    if (C::kLean && kt != kt_tail) {  // block-uniform
#pragma unroll
      for (int c = 0; c < C::kXL; ++c)
        if (C::kXLoads % C::kThreads == 0 || tid + c * C::kThreads < C::kXLoads)  // else never stored
          xa[c] = ld_x_all(reinterpret_cast<const uint4*>(a.x + xoff(c) + kb0 * 32));
      src.template load<false>(kb0, wa);
    } else {
#pragma unroll
      for (int c = 0; c < C::kXL; ++c) {
        const bool ok = tid + c * C::kThreads < C::kXLoads && kb0 * 32 + xcol < a.k;
        xa[c] = ld_x(reinterpret_cast<const uint4*>(a.x + xoff(c) + (ok ? kb0 * 32 : 0)), ok);
      }
      src.template load<true>(kb0, wa);
    }
  };
  auto store = [&](int stage) {
    unsigned char* base = smem + stage * C::kStage;
#pragma unroll
    for (int c = 0; c < C::kXL; ++c) {
      const int idx = tid + c * C::kThreads;
      int row, col;
      gemm_w4::x_unit(idx, C::BK, &row, &col);
      if (idx < C::kXLoads) *reinterpret_cast<uint4*>(base + (row * C::XS + col) * 2) = xa[c];
    }
#pragma unroll
    for (int c = 0; c < C::kWL; ++c) {  // !kSSep: the S part follows the W part, unit idx of W | S
      const int idx = tid + c * C::kThreads;
      if (idx < C::kWLoads + (C::kSSep ? 0 : C::kSLoads)) reinterpret_cast<uint4*>(base + C::kXBytes)[idx] = wa.w[c];
    }
#pragma unroll
    for (int c = 0; c < C::kSL; ++c) {
      const int idx = tid + c * C::kThreads;
      if (idx < C::kSWords) reinterpret_cast<uint32_t*>(base + C::kXBytes + C::kWBytes)[idx] = wa.s[c];
    }
  };

  W4xAcc<C> acc;
#pragma unroll
  for (int i = 0; i < C::MT; ++i)
#pragma unroll
    for (int j = 0; j < C::NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;

  // k-tile kt's math from its smem stage, for the first MTA m16 tiles (MT or MT / 2; the rest stay zero)
  auto math = [&](int kt, auto mta) {
    constexpr int MTA = decltype(mta)::value;
    const unsigned char* base = smem + (kt & 1) * C::kStage;
    const half* xs = reinterpret_cast<const half*>(base);
    const uint32_t* ws = reinterpret_cast<const uint32_t*>(base + C::kXBytes);
    const uint16_t* ss = reinterpret_cast<const uint16_t*>(base + C::kXBytes + C::kWBytes);
#pragma unroll
    for (int q = 0; q < C::GPW; ++q) {
      const int gi = ks + C::WK * q;
      if (kt * C::G + gi >= KG) break;  // warp-uniform: past K (zeros anyway)
      uint32_t wd[C::NT], s2[C::NT];
      Src::b_operand(ws, ss, sr, j0, gi, lane, wd, s2);
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // k 0..15, 16..31 of the group
        uint32_t b[C::NT][2];
#pragma unroll
        for (int j = 0; j < C::NT; ++j) w4x_pairs(h ? wd[j] >> 8 : wd[j], s2[j], &b[j][0], &b[j][1]);
#pragma unroll
        for (int i = 0; i < MTA; ++i) {
          int row, col;
          gemm_w4::a_addr(lane, wm * C::MT * 16, i, gi, h, &row, &col);
          uint32_t af[4];
          ldsm_x4(af, xs + row * C::XS + col);
#pragma unroll
          for (int j = 0; j < C::NT; ++j) mma_16x8x16(acc[i][j], af, b[j][0], b[j][1]);
        }
      }
    }
  };
  auto math_any = [&](int kt) {
    if (full)
      math(kt, std::integral_constant<int, C::MT>());
    else if (rows_left > 0)
      math(kt, std::integral_constant<int, C::MT / 2>());
  };

  pdl_enter();  // X comes from the previous kernel
  load(kt_begin);
  store(kt_begin & 1);
  __syncthreads();
  for (int kt = kt_begin; kt < KT; ++kt) {
    if (kt + 1 < KT) load(kt + 1);  // in flight during this tile's math
    math_any(kt);
    if (kt + 1 < KT) store((kt + 1) & 1);
    __syncthreads();
  }

  if constexpr (C::WK > 1) {  // the k-warps' partial tiles (the stages are free after the loop)
    gemm_w4_kwarp_sum<C>(&acc[0][0][0], reinterpret_cast<float*>(smem), ks, wmn, lane);
    if (ks != 0) return;
  }

  const int nb = nb0 + sr;
  if (nb >= NB) return;
  Src::store(a, acc, m0 + wm * C::MT * 16, nb, j0, lane);
}

// Y = X W^T (or split z's partial tile) for an XCfg C: W4xOneMatrix.
template <class C>
__global__ void __launch_bounds__(C::kThreads, kXMinBlocks<C>) gemm_w4x_kernel(const GemmW4Args a) {
  GEMMA4_T4_KTRACE_SCOPE(kKtGemmW4, 1);
  __shared__ __align__(16) unsigned char smem[C::kSmem];  // 2 stages of [X tile | W tile | S tile]; the reduction
  gemm_w4x_tile<C, W4xOneMatrix<C>>(a, smem);
}

// act = half(gelu_tanh(X gate^T) * (X up^T)) for a GluCfg C: W4xGateUp.
template <class C>
__global__ void __launch_bounds__(C::kThreads, kXMinBlocks<C>) gemm_w4x_glu_kernel(const GemmW4GluArgs a) {
  GEMMA4_T4_KTRACE_SCOPE(kKtGemmW4, 2);
  __shared__ __align__(16) unsigned char smem[C::kSmem];  // 2 stages of [X tile | W tile | S tile]; the reduction
  gemm_w4x_tile<C, W4xGateUp<C>>(a, smem);
}

// out = half(gelu_tanh(x gate^T) * (x up^T)) in one launch (GluCfg C, no split-K). cudaErrorInvalidValue for shapes or
// alignments the kernel does not take (launch_gemm_w4_cfg's for an XCfg, with ld16 % 2, ld16 < N and out 4-byte
// aligned for Y's).
template <class C>
inline cudaError_t launch_gemm_w4_glu_cfg(const GemmW4GluArgs& a, const Launch& l) {
  bool aligned = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.out) % 4 == 0;
  for (int mat = 0; mat < 2; ++mat)
    aligned =
        aligned && reinterpret_cast<uintptr_t>(a.wp[mat]) % 16 == 0 && reinterpret_cast<uintptr_t>(a.sp[mat]) % 16 == 0;
  if (a.m < 0 || a.n % 32 != 0 || a.k % 32 != 0 || a.ldx % 8 != 0 || a.ld16 % 2 != 0 || a.ldx < a.k || a.ld16 < a.n ||
      int64_t(a.m) * a.ldx >= (int64_t(1) << 31) || !aligned)
    return cudaErrorInvalidValue;
  if (a.m == 0 || a.n == 0) return cudaSuccess;
  if (a.k == 0) return cudaErrorInvalidValue;
  const dim3 grid(ceil_div(size_t(a.n), C::BNO), ceil_div(size_t(a.m), C::BM));
  if (grid.y > 65535) return cudaErrorInvalidValue;
  return launch_kernel(gemm_w4x_glu_kernel<C>, grid, C::kThreads, l, a);
}

// launch_gemm_w4_glu's configuration: GluNarrow where GluSmall's grid would leave SMs idle at most 64 rows (E2B's
// 6144-wide gate/up on an H100 or H200: 96 GluSmall blocks on 132 SMs, 192 GluNarrow), else GluSmall (its 12288-wide
// one: 192 blocks; the lab has GluNarrow 4-7% slower there, bench/RESULTS.md 2026-12-05 (h)).
inline bool gemm_w4_glu_narrow(int m, int n, int sms) {
  return m <= 64 && ceil_div(size_t(n), size_t(gemm_w4::GluSmall::BNO)) < size_t(sms);
}

// The same with the configuration by shape and this device's SM count (gemm_w4_glu_narrow).
inline cudaError_t launch_gemm_w4_glu(const GemmW4GluArgs& a, const Launch& l) {
  return gemm_w4_glu_narrow(a.m, a.n, device_sms()) ? launch_gemm_w4_glu_cfg<gemm_w4::GluNarrow>(a, l)
                                                    : launch_gemm_w4_glu_cfg<gemm_w4::GluSmall>(a, l);
}

// One configuration C, a Cfg (gemm_w4_kernel) or an XCfg (gemm_w4x_kernel); the lab instantiates others. Returns
// cudaErrorInvalidValue for shapes or alignments the kernel does not take (N % 32, K % 32, K == 0, ldx % 8, ldy % 2,
// ldx < K, ldy < N, x / wp / sp not 16-byte or y not 8-byte aligned; an XCfg: M ldx >= 2^31 (32-bit X offsets);
// splits < 1, more splits than k-tiles, or splits > 1 without a 16-byte aligned part).
template <class C>
inline cudaError_t launch_gemm_w4_cfg(const GemmW4Args& a, const Launch& l) {
  if (a.m < 0 || a.n % 32 != 0 || a.k % 32 != 0 || a.ldx % 8 != 0 || a.ldy % 2 != 0 || a.ldx < a.k || a.ldy < a.n ||
      reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || reinterpret_cast<uintptr_t>(a.y) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(a.wp) % 16 != 0 || reinterpret_cast<uintptr_t>(a.sp) % 16 != 0 ||
      (C::kX && int64_t(a.m) * a.ldx >= (int64_t(1) << 31)))
    return cudaErrorInvalidValue;
  if (a.m == 0 || a.n == 0) return cudaSuccess;
  if (a.k == 0) return cudaErrorInvalidValue;
  const int kt = (a.k / 32 + C::G - 1) / C::G;
  if (a.splits < 1 || a.splits > kt || a.splits > 65535 ||
      (a.splits > 1 && (!a.part || reinterpret_cast<uintptr_t>(a.part) % 16 != 0)))
    return cudaErrorInvalidValue;
  const dim3 grid(ceil_div(size_t(a.n), C::BN), ceil_div(size_t(a.m), C::BM), unsigned(a.splits));
  if (grid.y > 65535) return cudaErrorInvalidValue;
  cudaError_t e;
  if constexpr (C::kX)
    e = launch_kernel(gemm_w4x_kernel<C>, grid, C::kThreads, l, a);
  else
    e = launch_kernel(gemm_w4_kernel<C>, grid, C::kThreads, l, a);
  if (e != cudaSuccess || a.splits == 1 || a.keep_parts) return e;
  return launch_kernel(gemm_w4_reduce_kernel, ceil_div(size_t(a.m) * (a.n / 4), 256), 256, l, a.part, a.splits, a.m,
                       a.n, a.y, a.ldy);
}

// The tile configuration for an M x N x K product: f(C()) for the shipped configuration C that serves it.
// Measured with dev/gemm_w4.cu on the H200 (bench/RESULTS.md 2026-12-04 (e) and (f); each E2B shape at M 33..256,
// split-K as the engine does): up to 256 rows the reworked kernel's 64 x 128 x 64 tile (XSmall, lab version 12: two
// blocks per SM, a cheaper dequant) is fastest nearly everywhere, 11-30% ahead of the 64 x 64 x 128 tile on q_proj
// and gate/up. On the N <= 2048 matrices with a long K (o_proj at 65..256 rows, down_proj at any) its split-K filling
// both blocks of every SM (XSmallFill, lab version 16) beats both it and the 128 x 128 x 64 tile that served 65..128
// rows: down_proj at 128 rows 18.8 us against 24.9 / 19.3, the double-wide one 27.9 against 41.3 / 28.0, at 256 rows
// 37.1 / 63.4 against 41.3 / 73.8; o_proj at 33..64 rows keeps XSmall (10.2 against 11.1 us). Past 256 rows
// (prefill) the 128 x 128 x 32 tile at two blocks per SM, as before. M <= 32 (not an engine shape: the GEMVs take
// them): the 32 x 64 x 128 tile.
template <class F>
inline auto gemm_w4_by_shape(int m, int n, int k, F&& f) {
  if (m <= 32) return f(gemm_w4::CfgTiny());
  if (m <= 256) {
    if (n <= 2048 && (k >= 4096 || (m > 64 && k >= 2048))) return f(gemm_w4::XSmallFill());
    return f(gemm_w4::XSmall());
  }
  return f(gemm_w4::CfgLarge());
}

// Blocks per SM that a configuration's split-K fills: XCfg's SLOTS, 1 for a Cfg.
template <class C, class = void>
struct GemmW4Slots {
  static constexpr int value = 1;
};
template <class C>
struct GemmW4Slots<C, std::void_t<decltype(C::SLOTS)>> {
  static constexpr int value = C::SLOTS;
};

// The configuration launch_gemm_w4 takes for an M x N x K product: BM x BN output tiles, BK k per tile, split-K
// filling `slots` blocks per SM.
struct GemmW4Tile {
  int bm, bn, bk, slots = 1;
};
inline GemmW4Tile gemm_w4_tile(int m, int n, int k) {
  return gemm_w4_by_shape(m, n, k, [](auto c) {
    using C = decltype(c);
    return GemmW4Tile{C::BM, C::BN, C::BK, GemmW4Slots<C>::value};
  });
}

// Split-K, for tile t, for a grid that would leave SMs idle (the small-M tiles against N = 256..2048: 4..32 blocks on a
// 132-SM H200): enough splits to give each of `sms` SMs a block, at most one per k-tile, and at most
// part_floats / (M N) (the caller's partials buffer). 1: no split. A function of the shape, sms and part_floats
// only, so a row's result is deterministic for a given GPU.
inline int gemm_w4_splits_for(const GemmW4Tile& t, int m, int n, int k, int sms, size_t part_floats) {
  if (m <= 0 || n <= 0 || k <= 0) return 1;
  const size_t blocks = size_t(ceil_div(size_t(n), size_t(t.bn))) * ceil_div(size_t(m), size_t(t.bm));
  if (blocks >= size_t(sms)) return 1;
  size_t s = ceil_div(size_t(sms), blocks);
  const size_t ktiles = ceil_div(size_t(k), size_t(t.bk)), fit = part_floats / (size_t(m) * size_t(n));
  if (s > ktiles) s = ktiles;
  if (s > fit) s = fit;
  return s > 1 ? int(s) : 1;
}
// The same for the tile launch_gemm_w4 takes for that shape (gemm_w4_by_shape), filling its slots per SM.
inline int gemm_w4_splits(int m, int n, int k, int sms, size_t part_floats) {
  const GemmW4Tile t = gemm_w4_tile(m, n, k);
  return gemm_w4_splits_for(t, m, n, k, sms * t.slots, part_floats);
}

// One launch for any shape: the tile configuration by shape (gemm_w4_by_shape).
inline cudaError_t launch_gemm_w4(const GemmW4Args& a, const Launch& l) {
  return gemm_w4_by_shape(a.m, a.n, a.k, [&](auto c) { return launch_gemm_w4_cfg<decltype(c)>(a, l); });
}

// ---- the repack (once at load) ----

// wq [N, K/8] u32 + s [N, K/32] fp16 (the checkpoint layout, as DevLinear holds it) -> wp [N/32][K/32][32][4] u32 +
// sp [N/32][K/32][8][4] fp16 (the header's GEMM layout). Separate buffers (no in-place repack).
static __global__ void repack_w4_gemm_kernel(const uint32_t* wq, const half* s, int N, int K, uint32_t* wp, half* sp) {
  const size_t words = size_t(N) * K / 8, scales = size_t(N) * K / 32, step = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < words; i += step) {
    wp[i] = gemm_w4::repack_word(wq, N, K, i);
    if (i < scales) {
      const uint16_t v = gemm_w4::repack_scale(reinterpret_cast<const uint16_t*>(s), N, K, i);
      reinterpret_cast<uint16_t*>(sp)[i] = v;
    }
  }
}

inline cudaError_t launch_repack_w4_gemm(const uint32_t* wq, const half* s, int N, int K, uint32_t* wp, half* sp,
                                         const Launch& launch) {
  if (N < 0 || K < 0 || N % 32 != 0 || K % 32 != 0) return cudaErrorInvalidValue;
  const size_t words = size_t(N) * K / 8;
  if (words == 0) return cudaSuccess;
  return launch_kernel(repack_w4_gemm_kernel, ceil_div(words, 256) < 4096u ? ceil_div(words, 256) : 4096u, 256, launch,
                       wq, s, N, K, wp, sp);
}

#endif  // __CUDACC__ || GEMMA4_T4_EMU

}  // namespace kernels
}  // namespace gemma4_t4

#undef GEMMA4_T4_GEMM_W4_HD
