// gemma4_t4 kernels: the persistent decode step -- one launch runs a whole decode step of 1..16 rows, from the
// embedding to the sampled (greedy) token, as a list of instructions.
//
// Why: at E2B's sizes each matrix of a decode step is 0.2-10 MB, a few microseconds of bandwidth, about what
// a kernel needs to fill and drain the GPU; a step as ~385 dependent kernels is latency, not bytes. Here every
// block of one co-resident grid walks the same instruction list (cuda/persistent.hpp builds it from the block
// description, block.hpp). Instruction i's work items are dealt round robin over the blocks, continuing where
// instruction i - 1 stopped. Dependencies are counters, not grid barriers: a block with items in instruction i
//   1. pulls the weights of its first items into L2 (prefetch.global.L2, bounded by prefetch_bytes per block),
//   2. waits until done[i - 1] counts every item of instruction i - 1 (thread 0 spins on an acquire load),
//   3. runs its items, pulling the weights of later items into L2 while it computes,
//   4. fences and adds its item count to done[i].
// A block with no items in instruction i goes straight on to i + 1: while the GPU finishes instruction i, the
// blocks that will run i + 1 are already streaming its weights. The chain is linear (each instruction waits for
// the one before), so every dependency further back holds transitively. The grid must be co-resident (a
// cooperative launch, sized by the occupancy API), and done[] / best[] are zeroed before every launch.
//
// Instructions (StepOp):
//   Gemv        kernels/gemv.cuh's gemv_block on the tensor cores. Its x rows are either a buffer an earlier
//               instruction wrote (read through L2: ld.cg, never the read-only path, whose L1 lines may be a
//               previous layer's), or built in shared memory by each block that has items (StepX): the
//               residual of the previous branch and the next norm, folded in --
//                 h = (embed row * scale) or h_in;  h = (h + norm(y) * w_post) * scalar  (when y);
//                 x = half(norm(h) * w) or half(h);  the block with item 0 stores h to h_out
//               -- so no instruction is spent on a norm. Epilogues: Store (fp32), GeluMul, GeluPle, Head (the LM
//               head: soft-capped logits and each row's argmax key, max-reduced per block, then atomically).
//   Attention   one (row, KV head, key split) per item: the group's q heads normalised and roped into shared
//               memory, the new K/V of a layer that owns its cache normalised (+ roped) and written by the split
//               that holds the row's position, then kernels/attention.cuh's attention_block over the caches
//               (read through L2), the splits merged by the last to arrive.
//   PleCombine  one (row, layer) per item: ple = (rmsnorm(proj * pscale) * w + tok * tscale) * mix, tok the
//               token's table row as stored (bf16 / fp16 / fp32), as elementwise.cuh's kernels compute it.
//   Tokens      one item: token[r] = the argmax index of row r.
//
// Shared memory (dynamic, kernel-wide union): the x rows [rows][ldx] fp16 + the GEMV reduction, or the
// attention block's state + q [G][D] fp16. E2B at 16 rows: 49,408 + 4,096 (NT = 1) / 8,192 B. sm_75: no cp.async,
// no PDL, no cluster; <= 64 KiB of shared memory per block; spin-waits on counters (co-residency by the
// cooperative launch).
#pragma once

#include "attention.cuh"
#include "elementwise.cuh"
#include "gemv.cuh"

namespace gemma4_t4 {
namespace kernels {

constexpr int kStepThreads = kGemvWarps * 32;  // 256
constexpr int kStepMaxRows = 16;  // rows of one persistent step (NT <= 2 instantiations; the GEMVs take 32)
constexpr int kStepChunks = 12;   // float4 chunks of a hidden row per lane: H <= 32 * 4 * 12 = 1536

enum class StepOp : int { Gemv, Attention, PleCombine, Tokens };

// The x rows of a Gemv instruction, built in shared memory (build != 0; see the header), or a.x.
struct StepX {
  int build = 0;
  const half* embed = nullptr;  // h = float(embed[ids[r]]) * embed_scale   [V, H] fp16, or
  float embed_scale = 1.f;
  const float* h_in = nullptr;    // h = h_in[r]                            [rows, H] fp32
  const float* y = nullptr;       // then, when set: h = (h + y * r_y * w_post) * scalar   [rows, H] fp32
  const float* w_post = nullptr;  // [H]
  float scalar = 1.f;
  float* h_out = nullptr;    // item 0's block stores h here                  [rows, H] fp32
  const float* w = nullptr;  // x = half(h * r_h * w), or half(h) when null  [H]
};

struct StepAttn {
  AttnArgs a;                       // the caches and tables, layer = the KV source, window, out, part_o/ml,
                                    // counters = this instruction's merge tickets ([rows, kv_heads], zeroed)
  const float* q = nullptr;         // [rows, heads * D] fp32 q_proj output
  const float* q_w = nullptr;       // [D] q_norm
  const float* inv_freq = nullptr;  // [D / 2]
  const float* k = nullptr;         // [rows, kv_heads * D] fp32 k_proj output; null on KV-shared layers
  const float* v = nullptr;         // [rows, kv_heads * D] fp32 v_proj output (k_proj's on k_eq_v layers)
  const float* k_w = nullptr;       // [D] k_norm
  int own_layer = 0;                // the cache table index k and v are written to
};

struct StepPle {
  const float* proj = nullptr;         // [rows, L * D] fp32 per_layer_model_projection output
  RawFloat tok_type = RawFloat::BF16;  // StepParams::ple_rows: the tokens' table rows [rows, L * D] as stored, or
  const half* table16 = nullptr;       // [V, L * D] fp16: the whole table on the GPU (PleLocation::Device)
  const float* w = nullptr;            // [D] per_layer_projection_norm
  float pscale = 1.f, tscale = 1.f, mix = 1.f;
  float* ple = nullptr;  // [rows, L * D] fp32
  int L = 0, D = 0;
};

struct StepInstr {
  StepOp op = StepOp::Gemv;
  int items = 0;  // work items; Attention / PleCombine: set by the kernel from the launch's rows and splits
  GemvEpilogue epilogue = GemvEpilogue::Store;
  int head_dim = 0;  // Attention
  GemvArgs gemv;     // Gemv (x = gemv.x when !x.build)
  StepX x;
  StepAttn attn;
  StepPle ple;
  int pad[2] = {0, 0};  // sizeof % 16 == 0: the kernel loads an instruction as 16-byte units
};

struct StepParams {
  const StepInstr* prog = nullptr;  // [count] in device memory
  int count = 0;
  int rows = 0;  // 1..16
  int splits_sliding = 1, splits_full = 1;
  const int* ids = nullptr;            // [rows] token ids
  const int* pos = nullptr;            // [rows] positions
  const int* seq = nullptr;            // [rows] cache table row of each row's session
  const int* slots = nullptr;          // [seqs * L] KV slots
  half* const* kbase = nullptr;        // [seqs * L] K caches
  half* const* vbase = nullptr;        // [seqs * L] V caches
  int layers = 0;                      // L (the cache table's row length)
  unsigned* done = nullptr;            // [count] items finished per instruction; zero before the launch
  unsigned* fault = nullptr;           // 0, or 1 + the instruction a wait timed out at; zero before the launch
  unsigned long long* best = nullptr;  // [16] packed row maxima of the LM head; zero before the launch
  int* tokens = nullptr;               // [rows] argmax ids
  float eps = 1e-6f;
  int prefetch_bytes = 0;          // weights a block keeps in flight to L2 ahead of its items
  const void* ple_rows = nullptr;  // [rows, L * D] PLE table rows as stored (StepPle::tok_type), or null
  // Optional timing trace, [count][gridDim.x][kStepTraceSlots] globaltimer ns per (instruction, block) with
  // items: its wait begins, its wait ends, its items are done (and counted), its x rows are built (Gemv with
  // StepX), its first item is done. Zeroed before the launch; null: no trace.
  unsigned long long* trace = nullptr;
};

// ---- synchronisation ----

// A counter polled through L2 (no ordering per poll: the waiter acquires once, after the wait).
__device__ __forceinline__ unsigned ld_relaxed(const unsigned* p) {
#ifdef GEMMA4_T4_EMU  // dev/emu.hpp (which never runs this kernel: its blocks wait for each other)
  return *reinterpret_cast<const volatile unsigned*>(p);
#else
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
#endif
}

// Acquire / release at GPU scope (PTX ISA 6.0, sm_70+: on the T4): a release add by thread 0 after bar.sync
// publishes what every thread of the block wrote before the barrier (release is cumulative over what
// happens-before it; bar.sync orders the block's threads); an acquire by thread 0 before bar.sync makes it
// visible to the whole block. fence.acq_rel is the lighter fence for exactly this pattern; __threadfence()
// (fence.sc, sequential consistency) orders more than a counter hand-off needs.
#ifdef GEMMA4_T4_EMU
__device__ __forceinline__ void fence_acq_rel_gpu() {}
__device__ __forceinline__ void red_release_add(unsigned* p, unsigned n) { *p += n; }
#else
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
__device__ __forceinline__ void red_release_add(unsigned* p, unsigned n) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(n) : "memory");
}
#endif

constexpr unsigned long long kStepWaitNs = 2000000000ull;  // a wait this long is a fault, not a slow step

// Thread 0 waits until *counter >= need; then every thread of the block sees what the counted blocks wrote.
// A wait of more than kStepWaitNs (blocks not co-resident, a fault in another block) records instruction + 1 in
// *fault and gives up, and so does every later wait once *fault is set: the launch ends, with the step's
// results void, instead of hanging the GPU.
__device__ __forceinline__ void step_wait(const unsigned* counter, unsigned need, unsigned* fault, int instr) {
  if (threadIdx.x == 0) {
    const unsigned long long t0 = global_ns();
    unsigned ns = 32;  // back-off: up to ~130 blocks poll one L2 line that the finishing blocks' atomics need too
    while (ld_relaxed(counter) < need) {
      if (ld_relaxed(fault) != 0) break;
      if (global_ns() - t0 > kStepWaitNs) {
        atomicCAS(fault, 0u, unsigned(instr) + 1u);
        break;
      }
      __nanosleep(ns);
      ns = ns < 256 ? 2 * ns : 256;
    }
    fence_acq_rel_gpu();  // acquire: what the counted blocks released is visible from here on
  }
  __syncthreads();
}

// The block's writes for its items, then `n` more items done (release: bar.sync orders every thread's writes
// before thread 0's release add).
__device__ __forceinline__ void step_signal(unsigned* counter, unsigned n) {
  __syncthreads();
  if (threadIdx.x == 0 && n) red_release_add(counter, n);
}

constexpr int kStepTraceSlots = 5;  // wait begins, wait ends, items counted, x rows built, first item done

__device__ __forceinline__ void step_trace(const StepParams& p, int instr, int slot) {
  if (p.trace && threadIdx.x == 0)
    p.trace[(size_t(instr) * gridDim.x + blockIdx.x) * kStepTraceSlots + slot] = global_ns();
}

// Bytes of item `bid`'s weights (its rows of each matrix, scales included): one contiguous range per array, slots
// 2m (the int4 words or fp16 rows of matrix m) and 2m + 1 (its scales); unused slots hold 0 bytes. (Constant slot
// indices only: a dynamic index would put the ranges in local memory.)
struct GemvItemRange {
  const char* p[4];
  unsigned bytes[4];
};

__device__ __forceinline__ GemvItemRange gemv_item_range(const GemvArgs& a, int bid, bool two) {
  GemvItemRange r;
  const int mi = (a.count > 1 && bid >= a.first_block[1]) ? ((a.count > 2 && bid >= a.first_block[2]) ? 2 : 1) : 0;
  const int first = mi == 0 ? a.first_block[0] : (mi == 1 ? a.first_block[1] : a.first_block[2]);
  const int per = 16 * (kGemvWarps / a.kw), row0 = (bid - first) * per;
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const GemvMat& g = two ? (m == 0 ? a.mat[0] : a.mat[1]) : (mi == 0 ? a.mat[0] : (mi == 1 ? a.mat[1] : a.mat[2]));
    const int rows = (m == 0 || two) ? min(per, g.out - row0) : 0;
    r.p[2 * m] = r.p[2 * m + 1] = nullptr;
    r.bytes[2 * m] = r.bytes[2 * m + 1] = 0;
    if (rows <= 0) continue;
    if (g.wq) {
      r.p[2 * m] = reinterpret_cast<const char*>(g.wq) + size_t(row0) * (a.in / 2);
      r.bytes[2 * m] = unsigned(rows) * (a.in / 2);
      r.p[2 * m + 1] = reinterpret_cast<const char*>(g.s) + size_t(row0) * (a.in / 16);
      r.bytes[2 * m + 1] = unsigned(rows) * (a.in / 16);
    } else if (g.w16) {
      r.p[2 * m] = reinterpret_cast<const char*>(g.w16) + size_t(row0) * a.in * 2;
      r.bytes[2 * m] = unsigned(rows) * a.in * 2;
    }
  }
  return r;
}

__device__ __forceinline__ void prefetch_range(const GemvItemRange& r) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
    for (unsigned off = threadIdx.x * 128u; off < r.bytes[i]; off += kStepThreads * 128u)
      prefetch_l2_line(r.p[i] + off);
}

// ---- x rows in shared memory (StepX) ----

// The norms' weights of a StepX (constants) into L1, by the whole block, before it waits: build_x then reads
// them without a round trip.
__device__ __forceinline__ void prefetch_norms(const StepX& x, int H) {
  for (int k = int(threadIdx.x); k < H / 32; k += kStepThreads) {
    if (x.w_post) prefetch_l1_line(x.w_post + 32 * k);
    if (x.w) prefetch_l1_line(x.w + 32 * k);
  }
}

// Warp w builds rows w, w + 8 of x into xs ([rows][ldx] fp16) from the residual stream; the block of item 0
// (store_h) writes h back. Row sums in fp32, one warp per row (no block barrier inside).
__device__ __forceinline__ void build_x(const StepX& x, const StepParams& p, int H, half* xs, int ldx, bool store_h) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n4 = H / 4;
  for (int r = warp; r < p.rows; r += kGemvWarps) {
    float4 hv[kStepChunks], yv[kStepChunks];
    const half* erow = x.embed ? x.embed + size_t(p.ids[r]) * H : nullptr;
#pragma unroll
    for (int j = 0; j < kStepChunks; ++j) {
      const int c = lane + 32 * j;
      hv[j] = yv[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (c >= n4) continue;
      if (erow) {
        const uint2 e = __ldg(reinterpret_cast<const uint2*>(erow) + c);
        const float2 e0 = __half22float2(u32_as_h2(e.x)), e1 = __half22float2(u32_as_h2(e.y));
        hv[j] = make_float4(e0.x * x.embed_scale, e0.y * x.embed_scale, e1.x * x.embed_scale, e1.y * x.embed_scale);
      } else {
        hv[j] = __ldcg(reinterpret_cast<const float4*>(x.h_in + size_t(r) * H) + c);
      }
      if (x.y) yv[j] = __ldcg(reinterpret_cast<const float4*>(x.y + size_t(r) * H) + c);
    }
    if (x.y) {
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < kStepChunks; ++j)
        ss += yv[j].x * yv[j].x + yv[j].y * yv[j].y + yv[j].z * yv[j].z + yv[j].w * yv[j].w;
      const float ry = rsqrtf(warp_sum(ss) / H + p.eps);
#pragma unroll
      for (int j = 0; j < kStepChunks; ++j) {
        const int c = lane + 32 * j;
        if (c >= n4) continue;
        const float4 w = __ldg(reinterpret_cast<const float4*>(x.w_post) + c);
        const float4 a = hv[j], b = yv[j];
        hv[j] = make_float4((a.x + b.x * ry * w.x) * x.scalar, (a.y + b.y * ry * w.y) * x.scalar,
                            (a.z + b.z * ry * w.z) * x.scalar, (a.w + b.w * ry * w.w) * x.scalar);
      }
    }
    float rh = 1.f;
    if (x.w) {
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < kStepChunks; ++j)
        ss += hv[j].x * hv[j].x + hv[j].y * hv[j].y + hv[j].z * hv[j].z + hv[j].w * hv[j].w;
      rh = rsqrtf(warp_sum(ss) / H + p.eps);
    }
#pragma unroll
    for (int j = 0; j < kStepChunks; ++j) {
      const int c = lane + 32 * j;
      if (c >= n4) continue;
      const float4 v = hv[j];
      if (store_h && x.h_out) reinterpret_cast<float4*>(x.h_out + size_t(r) * H)[c] = v;
      float4 o = v;
      if (x.w) {
        const float4 w = __ldg(reinterpret_cast<const float4*>(x.w) + c);
        o = make_float4(v.x * rh * w.x, v.y * rh * w.y, v.z * rh * w.z, v.w * rh * w.w);
      }
      const half2 lo = __halves2half2(to_half_sat(o.x), to_half_sat(o.y)),
                  hi = __halves2half2(to_half_sat(o.z), to_half_sat(o.w));
      *reinterpret_cast<uint2*>(xs + size_t(r) * ldx + 4 * c) = make_uint2(h2_as_u32(lo), h2_as_u32(hi));
    }
  }
}

// ---- attention: per-head norms and RoPE (as head_norm_rope_kernel, one warp per head) ----

// x: one head's D fp32 channels (L2); w: weight or null; inv_freq: RoPE table or null. Lane holds chunks
// lane + 32 j (4 channels each); chunk q pairs with q + D / 8 (channel i with i + D / 2).
// Not bit-identical to head_norm_rope_kernel: the sum of squares is added in a warp's order (a lane's 4 J
// channels, then the lanes), not block_sum's (pairs i, i + D / 2, then the block), and the compiler contracts the
// expressions as it sees fit here; the per-kernel path's heads mode (attention.cuh, AttnHeads) is the one that
// matches that kernel bit for bit. The persistent and per-kernel paths agree to rounding (test_persistent.cpp).
template <int D>
__device__ __forceinline__ void head_norm_rope(const float* x, const float* w, const float* inv_freq, int pos,
                                               float eps, half* out) {
  constexpr int J = D / 128;
  const int lane = threadIdx.x & 31;
  float4 v[J];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    v[j] = __ldcg(reinterpret_cast<const float4*>(x) + lane + 32 * j);
    ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  }
  const float r = rsqrtf(warp_sum(ss) / D + eps);
  float f[J][4];
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int c = 4 * (lane + 32 * j);
    const float4 ww = w ? __ldg(reinterpret_cast<const float4*>(w + c)) : make_float4(1.f, 1.f, 1.f, 1.f);
    f[j][0] = v[j].x * (r * ww.x);
    f[j][1] = v[j].y * (r * ww.y);
    f[j][2] = v[j].z * (r * ww.z);
    f[j][3] = v[j].w * (r * ww.w);
  }
  if (inv_freq) {
#pragma unroll
    for (int j = 0; j < J / 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 4 * (lane + 32 * j) + e;  // < D / 2; its partner c + D / 2 is f[j + J / 2][e]
        const float fr = __ldg(inv_freq + c);
        if (fr != 0.f) {
          float s, co;
          sincosf(float(pos) * fr, &s, &co);
          const float a = f[j][e], b = f[j + J / 2][e];
          f[j][e] = a * co - b * s;
          f[j + J / 2][e] = b * co + a * s;
        }
      }
  }
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const half2 lo = __halves2half2(to_half_sat(f[j][0]), to_half_sat(f[j][1])),
                hi = __halves2half2(to_half_sat(f[j][2]), to_half_sat(f[j][3]));
    *reinterpret_cast<uint2*>(out + 4 * (lane + 32 * j)) = make_uint2(h2_as_u32(lo), h2_as_u32(hi));
  }
}

template <int D, int G>
struct StepAttnSmem {
  AttnSmem<D, G, kGemvWarps> attn;
  __align__(16) half q[G][D];
};

template <int D, int G>
__device__ __forceinline__ void step_attention(const StepInstr& ins, const StepParams& p, int item,
                                               unsigned char* smem) {
  StepAttnSmem<D, G>& sm = *reinterpret_cast<StepAttnSmem<D, G>*>(smem);
  const StepAttn& s = ins.attn;
  const AttnArgs& a = s.a;
  const int splits = a.splits, kvh = (item / splits) % a.kv_heads, row = item / (splits * a.kv_heads),
            sp = item % splits;
  const int warp = threadIdx.x >> 5, group = a.heads / a.kv_heads, pos = p.pos[row];
  if (warp < group)
    head_norm_rope<D>(s.q + (size_t(row) * a.heads + kvh * group + warp) * D, s.q_w, s.inv_freq, pos, p.eps,
                      sm.q[warp]);
  const AttnRange rg = attn_range(a, row);
  if (s.k && sp == rg.used - 1 && warp < 2) {  // the split holding the row's own key writes its K and V
    const int idx = p.seq[row] * p.layers + s.own_layer;
    const size_t at = (size_t(pos % p.slots[idx]) * a.kv_heads + kvh) * D;
    const size_t in = (size_t(row) * a.kv_heads + kvh) * D;
    if (warp == 0)
      head_norm_rope<D>(s.k + in, s.k_w, s.inv_freq, pos, p.eps, p.kbase[idx] + at);
    else
      head_norm_rope<D>(s.v + in, nullptr, nullptr, pos, p.eps, p.vbase[idx] + at);
    __threadfence();  // the block reads these slots back through L2
  }
  __syncthreads();
  attention_block<D, G, kGemvWarps, true>(a, row, kvh, 0, sp, splits > 1, sm.attn, &sm.q[0][0]);
}

// ---- the kernel ----

template <int NT, int WL, GemvEpilogue E>
__device__ __forceinline__ void step_gemv_item(const StepInstr& ins, int item, float* red, const half* xs,
                                               unsigned long long* best) {
  if (ins.x.build)
    gemv_block<NT, WL, E, GemvX::Shared>(ins.gemv, item, red, xs, best);
  else
    gemv_block<NT, WL, E, GemvX::Coherent>(ins.gemv, item, red, xs, best);
}

// NT: 8-row tiles (1: rows <= 8, 2: <= 16); WL: the body's weight layout (kGemvF16 / kGemvW4; the LM head is
// fp16); G: the GQA group, padded; MB: blocks per SM the registers are budgeted for (1: as many as the code
// wants; 2: at most 128 per thread, two co-resident blocks where shared memory allows).
template <int NT, int WL, int G, int MB = 1>
static __global__ void __launch_bounds__(kStepThreads, MB) decode_step_kernel(const StepParams p) {
  GEMMA4_T4_DYNAMIC_SMEM(smem);
  // Two instruction slots: instruction i + 1 is loaded into registers while i runs, stored into the other slot.
  constexpr int n16 = int(sizeof(StepInstr) / 16);
  static_assert(sizeof(StepInstr) % 16 == 0 && n16 <= kStepThreads, "an instruction is one 16-byte load per thread");
  __shared__ __align__(16) uint4 ins_raw[2][n16];
  __shared__ unsigned long long best_s[kStepMaxRows];
  const int tid = threadIdx.x, nb = int(gridDim.x), b = int(blockIdx.x);
  if (tid < kStepMaxRows) best_s[tid] = 0;
  uint4 next_chunk = tid < n16 ? __ldg(reinterpret_cast<const uint4*>(p.prog) + tid) : make_uint4(0u, 0u, 0u, 0u);
  int base = 0;  // the block of the current instruction's item 0
  unsigned prev_items = 0;
  for (int i = 0; i < p.count; ++i) {
    // Slot i & 1 was last read in instruction i - 2: every barrier of instruction i - 1 lies in between.
    if (tid < n16) ins_raw[i & 1][tid] = next_chunk;
    __syncthreads();
    if (tid < n16 && i + 1 < p.count) next_chunk = __ldg(reinterpret_cast<const uint4*>(p.prog + i + 1) + tid);
    StepInstr& ins = *reinterpret_cast<StepInstr*>(&ins_raw[i & 1][0]);
    if (tid == 0) {  // the launch's shape
      if (ins.op == StepOp::Attention) {
        ins.attn.a.rows = p.rows;
        ins.attn.a.splits = ins.attn.a.window > 0 ? p.splits_sliding : p.splits_full;
        ins.items = p.rows * ins.attn.a.kv_heads * ins.attn.a.splits;
      } else if (ins.op == StepOp::PleCombine) {
        ins.items = p.rows * ins.ple.L;
      }
      ins.gemv.n = p.rows;
    }
    __syncthreads();
    const int items = ins.items;
    int first = (b - base) % nb;
    if (first < 0) first += nb;
    base = (base + items) % nb;
    const unsigned wait_for = prev_items;
    prev_items = unsigned(items);
    if (first >= items) continue;  // nothing here: on to the next instruction's weights
    const unsigned mine = unsigned((items - first + nb - 1) / nb);

    if (ins.op == StepOp::Gemv) {
      const bool two = ins.epilogue == GemvEpilogue::GeluMul;
      const GemvItemRange r0 = gemv_item_range(ins.gemv, first, two);
      unsigned per = 0;
      for (int k = 0; k < 4; ++k) per += r0.bytes[k];
      const int ahead = max(1, p.prefetch_bytes / int(max(per, 1u)));
      int fetched = 0;  // my items whose weights are requested
      for (; fetched < ahead && first + fetched * nb < items; ++fetched)
        prefetch_range(gemv_item_range(ins.gemv, first + fetched * nb, two));
      if (ins.x.build) prefetch_norms(ins.x, ins.gemv.in);  // constants: into L1 while the block waits
      step_trace(p, i, 0);
      if (i > 0) step_wait(p.done + i - 1, wait_for, p.fault, i);
      step_trace(p, i, 1);
      float* red = reinterpret_cast<float*>(smem);
      half* xs = reinterpret_cast<half*>(smem + sizeof(float) * gemv_red_floats<NT>());
      if (ins.x.build) {
        build_x(ins.x, p, ins.gemv.in, xs, ins.gemv.ldx, first == 0);
        __syncthreads();
        step_trace(p, i, 3);
      }
      for (int k = 0, t = first; t < items; ++k, t += nb) {
        if (first + fetched * nb < items) prefetch_range(gemv_item_range(ins.gemv, first + (fetched++) * nb, two));
        if (k > 0) __syncthreads();  // the reduction scratch is free again
        switch (ins.epilogue) {
          case GemvEpilogue::Store: step_gemv_item<NT, WL, GemvEpilogue::Store>(ins, t, red, xs, best_s); break;
          case GemvEpilogue::GeluMul: step_gemv_item<NT, WL, GemvEpilogue::GeluMul>(ins, t, red, xs, best_s); break;
          case GemvEpilogue::GeluPle: step_gemv_item<NT, WL, GemvEpilogue::GeluPle>(ins, t, red, xs, best_s); break;
          case GemvEpilogue::Head:
            gemv_block<NT, kGemvF16, GemvEpilogue::Head, GemvX::Shared>(ins.gemv, t, red, xs, best_s);
            break;
        }
        if (k == 0) step_trace(p, i, 4);
      }
      if (ins.epilogue == GemvEpilogue::Head) {
        __syncthreads();
        if (tid < p.rows && best_s[tid]) atomicMax(p.best + tid, best_s[tid]);
      }
    } else if (ins.op == StepOp::Attention) {
      step_trace(p, i, 0);
      if (i > 0) step_wait(p.done + i - 1, wait_for, p.fault, i);
      step_trace(p, i, 1);
      for (int k = 0, t = first; t < items; ++k, t += nb) {
        if (k > 0) __syncthreads();
        if (ins.head_dim == 256)
          step_attention<256, G>(ins, p, t, smem);
        else
          step_attention<512, G>(ins, p, t, smem);
      }
    } else if (ins.op == StepOp::PleCombine) {
      step_trace(p, i, 0);
      if (i > 0) step_wait(p.done + i - 1, wait_for, p.fault, i);
      step_trace(p, i, 1);
      const StepPle& s = ins.ple;
      for (int k = 0, t = first; t < items; ++k, t += nb) {
        const size_t off = size_t(t) * s.D;  // (row, layer) slice of [rows, L, D]
        float ss = 0.f;
        for (int c = tid; c < s.D; c += kStepThreads) {
          const float v = __ldcg(s.proj + off + c) * s.pscale;
          ss += v * v;
        }
        const float r = rsqrtf(block_sum(ss) / s.D + p.eps);
        const int row = t / s.L, l = t % s.L;
        for (int c = tid; c < s.D; c += kStepThreads) {
          float tk;
          if (s.table16) {
            tk = __half2float(s.table16[(size_t(p.ids[row]) * s.L + l) * s.D + c]);
          } else if (s.tok_type == RawFloat::F32) {
            tk = static_cast<const float*>(p.ple_rows)[off + c];
          } else {
            const unsigned short bits = static_cast<const unsigned short*>(p.ple_rows)[off + c];
            tk = s.tok_type == RawFloat::BF16 ? __uint_as_float(unsigned(bits) << 16)
                                              : __half2float(__ushort_as_half(bits));
          }
          s.ple[off + c] = (__ldcg(s.proj + off + c) * s.pscale * r * __ldg(s.w + c) + tk * s.tscale) * s.mix;
        }
      }
    } else {  // Tokens
      step_trace(p, i, 0);
      if (i > 0) step_wait(p.done + i - 1, wait_for, p.fault, i);
      step_trace(p, i, 1);
      if (tid < p.rows) p.tokens[tid] = argmax_index(__ldcg(p.best + tid));
    }
    step_signal(p.done + i, mine);
    step_trace(p, i, 2);
  }
}

// Dynamic shared memory of decode_step_kernel for x rows of width H (padded by 8 halves) and the attention
// state of the head dims 256 and 512.
template <int NT, int G>
constexpr size_t decode_step_smem(int H) {
  const size_t gemv = sizeof(float) * gemv_red_floats<NT>() + size_t(NT * 8) * (H + 8) * sizeof(half);
  const size_t attn = sizeof(StepAttnSmem<512, G>) > sizeof(StepAttnSmem<256, G>) ? sizeof(StepAttnSmem<512, G>)
                                                                                  : sizeof(StepAttnSmem<256, G>);
  return gemv > attn ? gemv : attn;
}

}  // namespace kernels
}  // namespace gemma4_t4
