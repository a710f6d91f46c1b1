// gemma4_t4 kernels: the tensor-core and load primitives, once. Every inline-PTX helper the kernels share
// lives here with the hardware reason it exists; the kernels include this file instead of writing their own.
//
// sm_75 (Tesla T4) is the floor: mma.sync.m16n8k8 with fp16 inputs and fp32 accumulators (m16n8k16 is
// sm_80+), ldmatrix (sm_75), predicated 16-byte global loads, prefetch.global.L2 (any arch). Nothing here
// needs cp.async, bf16 arithmetic or cluster features.
//
// Fragment layouts of mma.m16n8k8 (PTX ISA, "Matrix Fragments for mma.m16n8k8", .f16 A/B, .f32 C/D;
// lane = 4 g + t; the low half of an .f16x2 register holds the lower column / k index):
//   A 16x8 row-major: a0 = (row g, cols 2t, 2t+1), a1 = (row g + 8, same cols)
//   B 8x8 ("col"):    b0 = (k 2t, 2t+1; n g)
//   C 16x8 fp32:      c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g + 8, same cols)
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace gemma4_t4 {
namespace kernels {

// c += A (16x8 fp16) B (8x8 fp16) with fp32 accumulators on the tensor cores: the one mma shape sm_75 has.
// Plain asm (no volatile): it has no side effects, so the compiler may schedule it freely.
__device__ __forceinline__ void mma_16x8x8(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
#ifdef GEMMA4_T4_EMU  // dev/emu.hpp: the CPU emulator of the kernel lab
  emu::mma_16x8x8(c, a0, a1, b);
#else
  asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(b));
#endif
}

#ifndef GEMMA4_T4_EMU
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

// Four 8x8 fp16 matrices from shared memory into fragment layout with one instruction (sm_75): the
// alternative, 32-bit shared loads per fragment register, costs 4x the instructions and bank conflicts.
// Lanes 8i..8i+7 give the row addresses of matrix i; register i of every lane receives (row g, cols 2t, 2t+1)
// of matrix i -- an A or B fragment of a [row][k] block.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row_addr) {
#ifdef GEMMA4_T4_EMU
  emu::ldmatrix_x4(r, row_addr, false);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_addr))
               : "memory");
#endif
}

// The same, transposed in flight: (rows 2t, 2t+1; col g), the B fragments of a row-major [k][n] block.
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* row_addr) {
#ifdef GEMMA4_T4_EMU
  emu::ldmatrix_x4(r, row_addr, true);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_addr))
               : "memory");
#endif
}

// An 8x8 fp16 matrix held in fragment layout (lane 4 g + t: row g, cols 2t, 2t+1) transposed in registers with one
// instruction (movmatrix, sm_75): lane 4 g + t receives (rows 2t, 2t+1; col g). Decode attention's P.V takes V^T as
// the mma's A operand from V rows loaded as they lie in the cache, without a trip through shared memory.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
#ifdef GEMMA4_T4_EMU
  return emu::movmatrix_trans(x);
#else
  uint32_t r;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
  return r;
#endif
}

// ---- global loads ----
// Predicated in PTX (zeros when !ok), so no lane branches around a load before a warp-wide mma.sync.

// Which path a 16-byte global load takes; each wrapper below says why it exists.
enum class Ld16 { kWeights, kX, kCoherent };

// The predicated 16-byte load's PTX, written once: %0-%3 are zeroed, then loaded through `insn` when %5 != 0.
// clang-format off
#define GEMMA4_T4_PRED_LD16(insn)             \
  "{\n"                                       \
  "  .reg .pred p;\n"                         \
  "  setp.ne.b32 p, %5, 0;\n"                 \
  "  mov.b32 %0, 0;\n"                        \
  "  mov.b32 %1, 0;\n"                        \
  "  mov.b32 %2, 0;\n"                        \
  "  mov.b32 %3, 0;\n"                        \
  "  @p " insn " {%0, %1, %2, %3}, [%4];\n"   \
  "}\n"
// clang-format on

template <Ld16 kPath>
__device__ __forceinline__ uint4 ld16(const uint4* p, bool ok) {
#ifdef GEMMA4_T4_EMU
  return ok ? *p : make_uint4(0u, 0u, 0u, 0u);
#else
  uint4 v;
  if constexpr (kPath == Ld16::kWeights)
    asm(GEMMA4_T4_PRED_LD16("ld.global.nc.L1::no_allocate.v4.u32")
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "r"(int(ok)));
  else if constexpr (kPath == Ld16::kX)
    asm(GEMMA4_T4_PRED_LD16("ld.global.nc.v4.u32") : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "r"(int(ok)));
  else  // volatile: other blocks write this data during the kernel, so the load must not be merged or hoisted
    asm volatile(GEMMA4_T4_PRED_LD16("ld.global.cg.v4.u32")
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "r"(int(ok)));
  return v;
#endif
}
#undef GEMMA4_T4_PRED_LD16

// Weights: 16 bytes through the non-coherent path, not allocated in L1 -- read once per step; L1 is better
// left to the activations, which every row tile re-reads.
__device__ __forceinline__ uint4 ld_weights(const uint4* p, bool ok) { return ld16<Ld16::kWeights>(p, ok); }

// Activations written by an earlier kernel: 16 bytes through the read-only path (kept in L1).
__device__ __forceinline__ uint4 ld_x(const uint4* p, bool ok) { return ld16<Ld16::kX>(p, ok); }

// ld_weights and ld_x without a predicate, for addresses known to be in bounds (the int4 GEMM's k-tiles inside K): no
// zeroing moves (4 per load) and no predicate setup.
template <Ld16 kPath>
__device__ __forceinline__ uint4 ld16_all(const uint4* p) {
  static_assert(kPath != Ld16::kCoherent, "the weight and activation paths");
#ifdef GEMMA4_T4_EMU
  return *p;
#else
  uint4 v;
  if constexpr (kPath == Ld16::kWeights)
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
  else
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
#endif
}
__device__ __forceinline__ uint4 ld_weights_all(const uint4* p) { return ld16_all<Ld16::kWeights>(p); }
__device__ __forceinline__ uint4 ld_x_all(const uint4* p) { return ld16_all<Ld16::kX>(p); }

// Activations written earlier IN THE SAME KERNEL by another block (a persistent kernel's previous phase):
// 16 bytes through L2 (ld.global.cg), never the non-coherent path, whose L1 lines may be stale.
__device__ __forceinline__ uint4 ld_cg(const uint4* p, bool ok) { return ld16<Ld16::kCoherent>(p, ok); }

// A 2-byte scale, zero-extended (zero when !ok).
__device__ __forceinline__ uint32_t ld_u16(const unsigned short* p, bool ok) {
#ifdef GEMMA4_T4_EMU
  return ok ? *p : 0u;
#else
  uint32_t v;
  asm("{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %2, 0;\n"
      "  mov.b32 %0, 0;\n"
      "  @p ld.global.nc.u16 %0, [%1];\n"
      "}\n"
      : "=r"(v)
      : "l"(p), "r"(int(ok)));
  return v;
#endif
}

// Pulls a constant's 128-byte line into L2 ahead of its use: fire and forget, no register holds it. Any arch.
#ifdef GEMMA4_T4_EMU
__device__ __forceinline__ void prefetch_l2_line(const void*) {}
__device__ __forceinline__ void prefetch_l1_line(const void*) {}
#else
__device__ __forceinline__ void prefetch_l2_line(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }
// The same into L1 (and L2): for small constants a block reads soon (a norm's weights).
__device__ __forceinline__ void prefetch_l1_line(const void* p) { asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p)); }
#endif

// ---- register views ----

// 32-bit word i (two fp16 values) of a 16-byte load; i is a compile-time constant after unrolling, so this
// selects a register instead of indexing an array in local memory.
__device__ __forceinline__ uint32_t u4_word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

__device__ __forceinline__ half2 u32_as_h2(uint32_t u) {
  half2 h;
  memcpy(&h, &u, 4);
  return h;
}

__device__ __forceinline__ uint32_t h2_as_u32(half2 h) {
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}

// ---- int4 / int8 weights -> fp16 pairs in registers ----

// d = (a & b) | c in one instruction (sm_50+, so sm_75-safe): nvcc does not always fuse the and/or pair of the
// dequant, and the point of w4x_pairs is its instruction count. 0xEA = (0xF0 & 0xCC) | 0xAA.
__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
#ifdef GEMMA4_T4_EMU  // dev/emu.hpp
  return (a & b) | c;
#else
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#endif
}

// Nibbles s and s + 4 of a packed w4a16 word -> half2 ((n_s - 8) * scale, (n_{s+4} - 8) * scale). 0x6400 | n
// is the fp16 1024 + n (exact, n < 16); minus 1032 gives n - 8 exactly; the scale multiply rounds once -- the
// same fp16 weight dequant_w4 builds for the prefill path. No integer-to-float conversion instructions.
__device__ __forceinline__ uint32_t w4_pair(uint32_t word, int s, uint32_t scale2) {
  const uint32_t v = ((word >> (4 * s)) & 0x000F000Fu) | 0x64006400u;
  const half2 q = __hsub2(u32_as_h2(v), u32_as_h2(0x64086408u));  // 0x6408 = 1032.0
  return h2_as_u32(__hmul2(q, u32_as_h2(scale2)));
}

// Pairs 2h and 2h + 1 of a packed w4a16 word (w4_pair(word, 2h), w4_pair(word, 2h + 1), bit for bit) in fewer
// instructions: w is the word (h = 0) or word >> 8 (h = 1). Even pair: 1024 + u (mask 0x000F000F) - 1032; odd pair:
// 1024 + 16 u (mask 0x00F000F0, no shift) / 16 - 72 in one hfma2; both exact, then times the scale (one rounding).
// The int4 GEMM's dequant (gemm_w4.cuh) and, through w4_pairs4, the decode GEMV's.
__device__ __forceinline__ void w4x_pairs(uint32_t w, uint32_t scale2, uint32_t* b0, uint32_t* b1) {
  const half2 s = u32_as_h2(scale2);
  const half2 lo = u32_as_h2(lop3_and_or(w, 0x000F000Fu, 0x64006400u));
  const half2 hi = u32_as_h2(lop3_and_or(w, 0x00F000F0u, 0x64006400u));
  const half2 q0 = __hsub2(lo, u32_as_h2(0x64086408u));                          // 1032.0
  const half2 q1 = __hfma2(hi, u32_as_h2(0x2C002C00u), u32_as_h2(0xD480D480u));  // 1/16, -72.0
  *b0 = h2_as_u32(__hmul2(q0, s));
  *b1 = h2_as_u32(__hmul2(q1, s));
}

// w4_pair(word, s, scale2) for s = 0..3 into p[s], bit for bit: w4x_pairs on the word and on word >> 8, so a word
// takes one shift instead of three (the w4a16 decode GEMV's dequant).
__device__ __forceinline__ void w4_pairs4(uint32_t word, uint32_t scale2, uint32_t (&p)[4]) {
  w4x_pairs(word, scale2, &p[0], &p[1]);
  w4x_pairs(word >> 8, scale2, &p[2], &p[3]);
}

// The w4a16 GEMV word order (kernels/gemv.cuh: the device copy of the checkpoint's packed words, reordered once at
// load): a checkpoint word holds columns c0..c7 of its 8 in nibbles 0..7; the GEMV word holds c0, c2, c4, c6 in
// nibbles 0..3 and c1, c3, c5, c7 in nibbles 4..7, so that w4_pair(word, s) is the half2 of columns (2s, 2s + 1):
// exactly word s of the 16-byte x load of those 8 columns, with no byte_perm per x pair. Two delta swaps: nibbles
// 1 and 2 of each 16-bit half, then bytes 1 and 2.
__host__ __device__ __forceinline__ uint32_t w4_gemv_word(uint32_t ckpt) {
  uint32_t t = (ckpt ^ (ckpt >> 4)) & 0x00F000F0u;
  uint32_t w = ckpt ^ t ^ (t << 4);
  t = (w ^ (w >> 8)) & 0x0000FF00u;
  return w ^ t ^ (t << 8);
}

// Bytes 2p and 2p + 1 of a word of int8 weights -> half2 (exact): (b + 128) into the mantissa of 1024.0,
// minus 1152.0.
__device__ __forceinline__ uint32_t w8_pair(uint32_t word, int p) {
  const uint32_t v = __byte_perm(word ^ 0x80808080u, 0x64646464u, p ? 0x4342u : 0x4140u);
  return h2_as_u32(__hsub2(u32_as_h2(v), u32_as_h2(0x64806480u)));  // 0x6480 = 1152.0
}

// ---- grouped-query attention ----

// Query heads per KV head as the attention kernels fold them: 1, 2, 4 or 8 (padding heads are masked), and
// that size's index 0..3 (a tile table, a template instantiation).
__host__ __device__ constexpr int gqa_group_pad(int group) {
  return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8;
}
__host__ __device__ constexpr int gqa_group_index(int group) {
  return group <= 1 ? 0 : group <= 2 ? 1 : group <= 4 ? 2 : 3;
}

// ---- additions for the w4a16 GEMM (issue 17, dev/gemm_w4.cu); keep this block separate ----

// c += A (16x16 fp16) B (16x8 fp16), fp32 accumulators. a[0..3] = ldsm_x4 of a [16 rows][16 k] block (a0, a1 =
// k 0..7 of rows g, g + 8; a2, a3 = k 8..15); b0 = (k 2t, 2t+1; n g), b1 = (k 2t+8, 2t+9; n g). sm_80+ has
// m16n8k16, one instruction for twice the work of m16n8k8; sm_75 has only m16n8k8, so there it is two m16n8k8
// with the same registers (k 0..7, then k 8..15). Sums may round differently between the two paths.
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  mma_16x8x8(c, a[0], a[1], b0);
  mma_16x8x8(c, a[2], a[3], b1);
#endif
}

// ---- end of the w4a16 GEMM additions ----

}  // namespace kernels
}  // namespace gemma4_t4
