// gemma4_t4 kernels: decode attention over a session's KV cache (any rows, prompt chunks included), split over
// the keys (flash-decoding) with the splits merged in the same launch.
//
// For row r (a query token at position p = pos[r] of sequence seq[r]) and query head h:
//   keys j in [lo, p] with lo = max(0, p - window + 1) on sliding layers (window > 0), 0 on full layers;
//   K/V row j of KV head g = h / (heads / kv_heads) lives at slot j % capacity of the (seq, layer) cache
//   (caches: [capacity, kv_heads, D] fp16; the K/V of the rows themselves were written before this runs);
//   out[r, h] = softmax_j(q . k_j) v_j     (Gemma 4: scaling 1.0, no soft-cap; out saturated to fp16)
//
// Work split. Grid (rows, kv_heads x head_split, splits): a block takes group / head_split of one KV head's
// `group` query heads (GQA 8:1 on E2B; head_split 1: all of them, so each K/V row is loaded once for the group;
// more: a few rows' launch gets head_split times the blocks, each merging 1 / head_split of the partials, and
// the K/V tile is read once per slice, from L2 after the first), and one contiguous range of the row's keys
// (the row's keys split evenly in whole 32-key tiles: the grid does not depend on positions, so a captured CUDA
// graph stays valid as the sequences grow; splits past a short row's keys are empty).
// PDL prologue (AttnArgs::late_keys >= 0): the block reads the row's metadata, the cache tables and its first
// tile of past keys and values before pdl_enter -- they were written by the host or by kernels at least two
// launches back (common.cuh) -- and only q and the keys the previous launch wrote (each row's own key, after
// the layer's head_norm_rope) after it.
// The warps split the head dimension: warp w owns channels [64 w, 64 w + 64) (D = 32: one warp of 32), so
// per-thread state does not grow with D and a block's whole 32-key tile of K and V (64 KiB at D = 512) is
// requested at once -- one memory latency per tile. Per tile, with no barrier between the loads and their use:
//   1. scores: the warp's partial q . k over its channels on the tensor cores (m16n8k8 tensor-core mma: 16 keys x
//      8 heads x 8 channels, fp16 products exact, fp32 sums), K fragments straight from 16-byte global
//      loads (the channel order inside a step is free, so a lane's 8 contiguous channels are its k-slots;
//      q uses the same order) -> shared; the next tile's K loads issued                           | barrier
//   2. warp h' takes heads h', h' + warps, ...: lane j sums the warps' partials of key j, online softmax in
//      fp32 (running max m, sum l), p = e^(s - m) -> shared [head][key] as two fp16, hi = fp16(p) and lo =
//      fp16(p - hi) (hi + lo is p to ~2^-22: P.V keeps the fp32 weights), rescale factor -> shared  | barrier
//   3. P.V on the tensor cores: O^T (channels x heads) += V^T (channels x keys) (P_lo + P_hi)^T (keys x heads),
//      m16n8k8 with fp32 accumulators. The V rows are loaded as they lie in the cache (lane (g, t): key 8 o + g,
//      8 channels from 8 t: 16 bytes) and each register is transposed in place (movmatrix, sm_75) into the A
//      fragment of V^T; the channels then come in a fixed permutation, undone by one exchange between lane pairs
//      at the end. 32 mma + 32 movmatrix + 8 shared loads per warp and tile where fp32 FMAs took 512 per lane,
//      and a lane accumulates 16 fp32 instead of 64; the next tile's V loads issued
// Merge. One split: the block writes out itself. More: each split stores (o, m, l) in fp32 scratch; then
//   fused (counters given and splits x group x D small, attention_fused_splits): __threadfence, one atomic
//       ticket per (row, KV head); the last block to arrive resets the counter to 0 (a replayed graph finds
//       it zeroed) and merges: out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M) over the splits that
//       hold keys (a prefix), re-reading the partials through L2;
//   else attention_merge_kernel, a second launch spread over (rows, heads, 64-channel slices): at long
//       contexts one block re-reading every split's partials would take longer than a launch.
// Shared memory (static): warps x 8 x 36 fp32 partial scores + 2 x 8 x 40 fp16 p + G x 64 fp32 merge weights:
// 12.4 KiB at D = 512, G = 8. Block: D / 2 threads (32 at D = 32).
//
// Heads mode (launch_attention_heads; decode passes, one row per sequence): the launch also does the layer's
// head_norm_rope (rope_kv.cuh), one launch instead of two. Its input is the q/k/v GEMV's fp32 output: each block
// normalises and ropes its own query heads into shared memory (q never goes through global memory), and every
// block of the split holding the row's own key (the last used split: one block per head slice, never an empty
// one) normalises and ropes k and normalises v of its KV head into shared memory and takes the own key from there;
// the head-slice-0 block alone also writes them to the caches at the row's slot -- one writer per (row, KV head),
// and no block reads that slot from global memory, so no block waits for another. Same arithmetic as
// head_norm_rope_kernel (the head_pair_* functions, and block_sums adds the sums of squares in block_sum's order:
// the attention block has head_norm_rope_kernel's D / 2 threads), so the caches and out equal the two launches'
// bit for bit. Per block:
//   before pdl_enter: the row's metadata, the cache tables, the first tile's past keys and values (as above), the
//     norms' weights, inv_freq and the sincos of the row's position;
//   pdl_enter; the q heads' (+ own k, v) fp32 loads, per-warp sums of squares -> shared       | barrier
//   every warp completes the sums (block_sums), scales, rotates, rounds to fp16 -> shared, and the writer
//     stores the own K/V to the caches                                                          | barrier
//   q fragments and the own key's K fragments / V rows from shared memory, then the tile loop above.
// Shared memory on top: G x D fp16 q + 2 x D fp16 own K/V + warps x (G + 2) fp32: 10.3 KiB at D = 512, G = 8.
//
// sm_75 rules: fp16 m16n8k8 tensor-core mma with fp32 accumulators (sm_75; m16n8k16 is sm_80+); no cp.async
// (plain 16-byte loads issued a phase ahead of use), no bf16. Fragment layouts (PTX ISA, "Matrix Fragments
// for mma.m16n8k8"; g = lane / 4, t = lane % 4; the low half of an .f16x2 register holds the lower index):
//   A 16x8 row-major: a0 = (row g, cols 2t, 2t+1), a1 = (row g + 8, same cols)   <- K: rows keys, cols channels
//   B 8x8 ("col"):    b0 = (k 2t, 2t+1; n g)                                       <- q: k channels, n heads
//   C 16x8 fp32:      c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g + 8, same cols)
#pragma once

#include <atomic>

#include "common.cuh"
#include "mma.cuh"
#include "rope_kv.cuh"

namespace gemma4_t4 {
namespace kernels {

struct AttnArgs {
  const half* q = nullptr;       // [rows, heads, D] fp16
  half* const* kbase = nullptr;  // [seqs * layers] caches
  half* const* vbase = nullptr;
  const int* capacity = nullptr;  // [seqs * layers]
  const int* seq = nullptr;       // [rows]
  const int* pos = nullptr;       // [rows]
  int layer = 0, layers = 0;      // table index of the layer whose cache is read (the KV source)
  int rows = 0, heads = 0, kv_heads = 0;
  int window = 0;            // sliding window; 0 = full attention
  int splits = 1;            // key ranges per row (1..kAttnMaxSplits); each row splits its own keys evenly
  float* part_o = nullptr;   // [rows, heads, splits, D] fp32 scratch (splits > 1)
  float* part_ml = nullptr;  // [rows, heads, splits, 2] fp32 scratch (max, sum)
  half* out = nullptr;       // [rows, heads * D] fp16
  // [rows, kv_heads, head_split] arrival counters, zero before the launch and zero again after it (the last
  // block of each (row, KV head, head slice) resets its own); allocate once, zeroed. Null: the splits are merged
  // by a second launch.
  unsigned* counters = nullptr;
  int head_split = 1;  // query-head slices per KV head (a divisor of the group; group / head_split <= 8)
  // Keys at the end of each row's range that the previous launch wrote, read after pdl_enter; every earlier key
  // (and the metadata) is read before it. -1: everything after pdl_enter (passes with prompt chunks, whose rows'
  // keys were all just written; the persistent kernel). 1: a decode pass (one row per sequence, its own key
  // written by the layer's head_norm_rope). 0: a layer that reads an earlier layer's cache (KV-shared).
  int late_keys = -1;
};

// Heads mode (see the header): what head_norm_rope_kernel would take for the layer's q, k and v targets.
// Caches written: a.kbase / a.vbase at table index seq * layers + a.layer, slot pos % capacity (a layer
// that owns its cache reads it: a.layer is the layer itself).
struct AttnHeads {
  const float* q = nullptr;         // [rows, heads * D] fp32 q_proj output
  const float* q_w = nullptr;       // [D] q_norm weight, or nullptr
  const float* inv_freq = nullptr;  // [D / 2] RoPE table of q and k, or nullptr: no RoPE
  const float* k = nullptr;         // [rows, kv_heads * D] fp32 k_proj output; nullptr: KV-shared (q only)
  const float* v = nullptr;         // [rows, kv_heads * D] fp32 v_proj output (k_proj's on k_eq_v layers)
  const float* k_w = nullptr;       // [D] k_norm weight, or nullptr (v: none)
  float eps = 0.f;
};

// Passes of more rows than this (batched decode past the GEMVs' 32 rows) take attention_splits_for's one-wave rule.
constexpr int kAttnManyRows = 32;

constexpr int kAttnTile = 32;            // keys per block step, and the split granule
constexpr int kAttnMaxSplits = 1024;     // splits a launch takes (attention_merge_kernel's weights in shared memory)
constexpr int kAttnFusedSplits = 64;     // splits the fused merge takes (its weights in shared memory)
constexpr int kAttnFusedFloats = 65536;  // fused merge: at most splits x group x D fp32 partials (256 KiB) for the
                                         // last block to re-read from L2 (~2 us on one SM)

// Channels per warp: 64, or the whole head at D = 32.
template <int D>
__host__ __device__ constexpr int attn_slice() {
  return D >= 64 ? 64 : D;
}

template <int D>
__host__ __device__ constexpr int attn_block() {
  return D / attn_slice<D>() * 32;
}

// ---- device helpers ----

// A row's keys and how they split: first key lo, n keys, per keys per split (whole tiles). Splits
// [0, used) hold keys, the rest are empty.
struct AttnRange {
  int lo, n, per, used;
};

__device__ __forceinline__ AttnRange attn_range(const AttnArgs& a, int row) {
  const int p = a.pos[row];
  AttnRange r;
  r.lo = a.window > 0 ? max(0, p - a.window + 1) : 0;
  r.n = p - r.lo + 1;
  r.per = ((r.n + a.splits - 1) / a.splits + kAttnTile - 1) / kAttnTile * kAttnTile;
  r.used = (r.n + r.per - 1) / r.per;
  return r;
}

// Merge weights of one head over its `used` splits (one warp): wt[s] = e^(m_s - M) / sum_s l_s e^(m_s - M).
// ml: the head's [splits, 2] (max, sum) partials, written by other blocks (read through L2). Every used split
// holds keys, so m_s is finite and the sum positive.
__device__ __forceinline__ void attn_merge_weights(const float* ml, int used, float* wt, int lane) {
  float M = -INFINITY;
  for (int s = lane; s < used; s += 32) M = fmaxf(M, __ldcg(ml + 2 * s));
  M = warp_max(M);
  float L = 0.f;
  for (int s = lane; s < used; s += 32) {
    const float w = __expf(__ldcg(ml + 2 * s) - M);
    L = fmaf(__ldcg(ml + 2 * s + 1), w, L);
    wt[s] = w;
  }
  const float inv = 1.f / warp_sum(L);
  for (int s = lane; s < used; s += 32) wt[s] *= inv;
}

// K fragments of a 32-key tile for lane (g, t): keys 16 mt + 8 hi + g, channels c0 + 32 i + 8 t .. + 7
// (off = kv head * D + c0 + 8 t; ld = kv_heads * D). Keys past nt are zeros, never loaded.
// CG: the cache was written earlier in the same kernel (persistent decode): read through L2, not the
// read-only path.
template <int KCH, bool CG>
__device__ __forceinline__ void attn_load_k(uint4 (&kf)[2][2][KCH], const half* __restrict__ K, int ld, int off, int t0,
                                            int nt, int cap, int g) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int key = 16 * mt + 8 * hi + g;
      const uint4* src = reinterpret_cast<const uint4*>(K + size_t((t0 + key) % cap) * ld + off);
#pragma unroll
      for (int i = 0; i < KCH; ++i)
        kf[mt][hi][i] = key < nt ? (CG ? __ldcg(src + 4 * i) : __ldg(src + 4 * i)) : make_uint4(0u, 0u, 0u, 0u);
    }
}

// The same for keys [klo, khi) of the tile only; the other fragments are left as they are (the keys a PDL
// prologue could not load: see AttnArgs::late_keys).
template <int KCH>
__device__ __forceinline__ void attn_load_k_late(uint4 (&kf)[2][2][KCH], const half* __restrict__ K, int ld, int off,
                                                 int t0, int klo, int khi, int cap, int g) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int key = 16 * mt + 8 * hi + g;
      if (key < klo || key >= khi) continue;
      const uint4* src = reinterpret_cast<const uint4*>(K + size_t((t0 + key) % cap) * ld + off);
#pragma unroll
      for (int i = 0; i < KCH; ++i) kf[mt][hi][i] = __ldg(src + 4 * i);
    }
}

// V of a 32-key tile for lane (g, t), the P.V mma's A operands before their transpose: load i = CH o + c is key
// 8 o + g, channels 32 c + 8 t .. + 7 of the warp's slice (off = kv head * D + warp's first channel + 8 t). Keys
// past nt are zeros, never loaded.
template <int VI, int CH, bool CG>
__device__ __forceinline__ void attn_load_v(uint4 (&vf)[VI], const half* __restrict__ V, int ld, int off, int t0,
                                            int nt, int cap, int g) {
#pragma unroll
  for (int i = 0; i < VI; ++i) {
    const int key = 8 * (i / CH) + g;
    const uint4* src = reinterpret_cast<const uint4*>(V + size_t((t0 + key) % cap) * ld + off + 32 * (i % CH));
    vf[i] = key < nt ? (CG ? __ldcg(src) : __ldg(src)) : make_uint4(0u, 0u, 0u, 0u);
  }
}

template <int VI, int CH>
__device__ __forceinline__ void attn_load_v_late(uint4 (&vf)[VI], const half* __restrict__ V, int ld, int off, int t0,
                                                 int klo, int khi, int cap, int g) {
#pragma unroll
  for (int i = 0; i < VI; ++i) {
    const int key = 8 * (i / CH) + g;
    if (key >= klo && key < khi)
      vf[i] = __ldg(reinterpret_cast<const uint4*>(V + size_t((t0 + key) % cap) * ld + off + 32 * (i % CH)));
  }
}

// Heads mode: the row's own key (ks: [D] fp16 in shared memory, + this lane's first channel) as key `key` of the
// tile's K fragments, and its value (vs: + this lane's 8 channels) as key `key` of the V rows.
template <int KCH>
__device__ __forceinline__ void attn_own_k(uint4 (&kf)[2][2][KCH], const half* ks, int key, int g) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi)
      if (16 * mt + 8 * hi + g == key)
#pragma unroll
        for (int i = 0; i < KCH; ++i) kf[mt][hi][i] = *reinterpret_cast<const uint4*>(ks + 32 * i);
}

template <int VI, int CH>
__device__ __forceinline__ void attn_own_v(uint4 (&vf)[VI], const half* vs, int key, int g) {
#pragma unroll
  for (int i = 0; i < VI; ++i)
    if (8 * (i / CH) + g == key) vf[i] = *reinterpret_cast<const uint4*>(vs + 32 * (i % CH));
}

// ---- kernels ----

// Shared memory of one attention block (NW warps).
template <int D, int G, int NW>
struct AttnSmem {
  float s_part[NW][8][kAttnTile + 4];  // [warp][head][key] partial scores over the warp's channels
  // [hi / lo][head][key] e^(s - m) as two fp16, hi = fp16(p), lo = fp16(p - hi): P.V's B operands (8 n = heads;
  // rows past the group stay 0; the pad spreads a fragment over 32 banks)
  __align__(16) half p16[2][8][kAttnTile + 8];
  float alpha_s[8], m_s[G], l_s[G];  // per-tile rescale (heads past the group: 0); the split's max, sum
  float wt_s[G][kAttnFusedSplits];   // fused merge weights [head][split]
  int last_s;
};

// And in heads mode.
template <int D, int G, int NW>
struct AttnHeadsSmem {
  __align__(16) half q[G][D];  // the block's query heads, normalised + roped, fp16 (rows past its heads unused)
  __align__(16) half k[D];     // the row's own key and value as written to the caches (own-key blocks only)
  __align__(16) half v[D];
  float part[NW][G + 2];  // block_sums' partials: q heads 0 .. G - 1, k, v
};

// Heads mode: one normalised (+ roped) pair of a head, rounded to fp16, into shared memory sm and, when dst is
// set, into global memory (the cache slot).
__device__ __forceinline__ void attn_head_out(const HeadPair& hp, float r, float va, float vb, int i, int half_d,
                                              half* sm, half* dst) {
  head_pair_apply(hp, r, va, vb);
  const half ha = to_half_sat(va), hb = to_half_sat(vb);
  sm[i] = ha;
  sm[i + half_d] = hb;
  if (dst) {
    dst[i] = ha;
    dst[i + half_d] = hb;
  }
}

// Heads mode, after pdl_enter: query heads [qh, qh + group) of [rows * heads] and, when own, the row's k and v
// (offset kv into [rows, kv_heads * D]) normalised (+ roped) as head_norm_rope_kernel does, into hsm; k and v also
// into kdst, vdst (the cache slot) when kdst is set (the one writer). Thread i takes channels i and i + D / 2 of
// every head, as in head_norm_rope_kernel's block. Ends with a barrier: hsm is ready.
template <int D, int G, int NW>
__device__ __forceinline__ void attn_heads(const AttnHeads& hn, AttnHeadsSmem<D, G, NW>& hsm, const HeadPair& pq,
                                           const HeadPair& pk, size_t qh, int group, size_t kv, bool own, half* kdst,
                                           half* vdst) {
  constexpr int HD = D / 2, N = G + 2;  // values per thread: G q heads, then k, v
  static_assert(NW * 32 == (HD + 31) / 32 * 32, "head_norm_rope_kernel's block: head_norm_threads(D) threads");
  const int i = threadIdx.x;
  const bool active = D >= 64 || i < HD;  // D = 32: 16 pairs; the other lanes add zeros, as in that kernel
  const unsigned used = ((1u << group) - 1u) | (own ? 3u << G : 0u);
  float xa[N], xb[N], ss[N];
#pragma unroll
  for (int n = 0; n < N; ++n) xa[n] = xb[n] = 0.f;
  if (active) {
#pragma unroll
    for (int h = 0; h < G; ++h)
      if (h < group) {
        const float* x = hn.q + (qh + h) * D;
        xa[h] = x[i];
        xb[h] = x[i + HD];
      }
    if (own) {
      xa[G] = hn.k[kv + i];
      xb[G] = hn.k[kv + i + HD];
      xa[G + 1] = hn.v[kv + i];
      xb[G + 1] = hn.v[kv + i + HD];
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n) ss[n] = head_pair_ss(xa[n], xb[n]);
  block_sums<N, NW>(ss, hsm.part, used);
  if (active) {
#pragma unroll
    for (int h = 0; h < G; ++h)
      if (h < group) attn_head_out(pq, head_norm_scale(ss[h], D, hn.eps), xa[h], xb[h], i, HD, hsm.q[h], nullptr);
    if (own) {
      const HeadPair pv = HeadPair();  // v_norm: no weight, no RoPE
      attn_head_out(pk, head_norm_scale(ss[G], D, hn.eps), xa[G], xb[G], i, HD, hsm.k, kdst);
      attn_head_out(pv, head_norm_scale(ss[G + 1], D, hn.eps), xa[G + 1], xb[G + 1], i, HD, hsm.v, vdst);
    }
  }
  __syncthreads();
}

// Block (row, KV head kvh, head slice hs, key split sp) of a decode-attention launch, NW warps (threads 0 .. 32
// NW - 1). D: head dim (32..512); G: the block's heads (group / head_split) rounded up to 1, 2, 4 or 8 (the rest
// are padding: zero q, never written). fused: merge in the last block (a.counters, a.splits <=
// kAttnFusedSplits), else write partials for attention_merge_kernel; a.splits == 1 writes out directly either
// way. Persist (the persistent decode kernel): q from qs ([G][D] fp16 in shared memory, this block's heads)
// instead of a.q, and the caches read through L2 (this step wrote some of their slots); no PDL (a.late_keys,
// a.head_split unused).
// Otherwise the block calls pdl_enter itself: first thing, or after its prologue (a.late_keys >= 0).
// Heads (heads mode, see the header; a.late_keys 1, or 0 on a KV-shared layer): q from the head norms of hn into
// hsm (qs = hsm->q), and the row's own key from hsm->k / v.
template <int D, int G, int NW, bool Persist, bool Heads = false>
__device__ __forceinline__ void attention_block(const AttnArgs& a, int row, int kvh, int hs, int sp, bool fused,
                                                AttnSmem<D, G, NW>& sm, const half* qs, const AttnHeads* hn = nullptr,
                                                AttnHeadsSmem<D, G, NW>* hsm = nullptr) {
  constexpr int WS = D / NW, NT = 32 * NW;
  constexpr int KCH = WS / 32;                             // 32-channel K chunks per lane per key (16-byte loads)
  constexpr int CH = WS / 32;                              // P.V: 32-channel halves of the warp's slice
  constexpr int VI = kAttnTile / 8 * CH;                   // P.V: 16-byte V loads per lane per tile
  constexpr int HPW = (G + NW - 1) / NW;                   // softmax: heads per warp
  constexpr int SLD = kAttnTile + 4;                       // partial-score row: fragment stores hit 32 banks
  constexpr int C4 = D / 4, CPT = (G * C4 + NT - 1) / NT;  // fused merge: float4 columns per thread
  static_assert(kAttnTile == 32, "softmax: one lane per key");
  static_assert((WS == 32 || WS == 64) && D % WS == 0 && NW <= 8, "head dim 32, 64, 128, 256 or 512");
  static_assert(G == 1 || G == 2 || G == 4 || G == 8, "group rounded up to 1, 2, 4 or 8");
  static_assert(!(Heads && Persist), "heads mode is a launch of its own");

  auto& s_part = sm.s_part;
  auto& p16 = sm.p16;
  auto& alpha_s = sm.alpha_s;
  auto& m_s = sm.m_s;
  auto& l_s = sm.l_s;
  auto& wt_s = sm.wt_s;
  auto& last_s = sm.last_s;
  static_assert(SLD == sizeof(s_part[0][0]) / sizeof(float), "partial-score row");

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int hsplit = Persist ? 1 : a.head_split;
  const int group = a.heads / a.kv_heads / hsplit;                // this block's query heads
  const int hbase = row * a.heads + (kvh * hsplit + hs) * group;  // its first query head in [rows * heads]
  const bool early = !Persist && a.late_keys >= 0;                // a PDL prologue (see AttnArgs::late_keys)
  if (!Persist && !early) pdl_enter();
  const AttnRange r = attn_range(a, row);
  const int begin = r.lo + sp * r.per, end = min(r.lo + r.n, begin + r.per);

  // P.V: O^T = V^T P^T on the tensor cores, per 32-channel half c two m16 x n8 tiles (16 channels x 8 heads):
  // acc[c][m] = (row g: channel ch(2 m), row g + 8: ch(2 m + 1); cols: heads 2t, 2t + 1), where ch(r) = warp's
  // first channel + 32 c + 8 (g / 2) + 2 r + g % 2 (the channel order the register transpose leaves, see phase 3)
  float acc[CH][2][4];
#pragma unroll
  for (int c = 0; c < CH; ++c)
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[c][m][e] = 0.f;
  float m_run[HPW], l_run[HPW];  // softmax warps: running max (warp-uniform) and this lane's share of the sum
#pragma unroll
  for (int k = 0; k < HPW; ++k) {
    m_run[k] = -INFINITY;
    l_run[k] = 0.f;
  }

  if (begin < end) {  // block-uniform: an empty split only takes part in the merge
    const int idx = a.seq[row] * a.layers + a.layer;
    const half* __restrict__ K = a.kbase[idx];
    const half* __restrict__ V = a.vbase[idx];
    const int cap = a.capacity[idx], ld = a.kv_heads * D;
    // this lane's first channel of its K fragments and V rows in the head (lc) and in a cache row (off)
    const int lc = warp * WS + 8 * t, off = kvh * D + lc;

    uint4 kf[2][2][KCH], vf[VI];
    int t0 = begin, nt = min(kAttnTile, end - t0);
    // keys [0, pre) of the first tile now; with a prologue, the ones the previous launch wrote after the wait
    const int pre = early ? max(0, min(nt, r.lo + r.n - a.late_keys - t0)) : nt;
    attn_load_k<KCH, Persist>(kf, K, ld, off, t0, pre, cap, g);
    attn_load_v<VI, CH, Persist>(vf, V, ld, off, t0, pre, cap, g);
    // Heads mode: own -- this block's split holds the row's own key (the last key, r.lo + r.n - 1 = pos[row]),
    // whose K and V this launch makes; the head-slice-0 block writes them to the caches.
    const bool own = Heads && hn->k && sp == r.used - 1;
    if constexpr (Heads) {
      const int p = r.lo + r.n - 1;
      half* kdst = nullptr;
      half* vdst = nullptr;
      if (own && hs == 0) {
        const size_t at = (size_t(p % cap) * a.kv_heads + kvh) * D;
        kdst = a.kbase[idx] + at;
        vdst = a.vbase[idx] + at;
      }
      HeadPair pq, pk;  // the constants of this thread's channel pair, before the wait
      if (D >= 64 || tid < D / 2) {
        head_pair_rope(pq, hn->inv_freq, tid, p);
        pk = pq;  // q and k share the rotation
        head_pair_weights(pq, hn->q_w, tid, D / 2);
        head_pair_weights(pk, hn->k_w, tid, D / 2);
      }
      pdl_enter();
      attn_heads<D, G, NW>(*hn, *hsm, pq, pk, size_t(hbase), group, (size_t(row) * a.kv_heads + kvh) * D, own, kdst,
                           vdst);
      if (pre < nt) {  // a.late_keys 1 and the first tile ends at the row's end: key nt - 1 is the own key
        attn_own_k<KCH>(kf, hsm->k + lc, nt - 1, g);
        attn_own_v<VI, CH>(vf, hsm->v + lc, nt - 1, g);
      }
    } else if (early) {
      pdl_enter();
      if (pre < nt) {
        attn_load_k_late<KCH>(kf, K, ld, off, t0, pre, nt, cap, g);
        attn_load_v_late<VI, CH>(vf, V, ld, off, t0, pre, nt, cap, g);
      }
    }

    uint4 qf[KCH];  // B fragments: head g, channels warp * WS + 32 i + 8 t .. + 7 (zeros for padding heads)
#pragma unroll
    for (int i = 0; i < KCH; ++i) {
      const int c = warp * WS + 32 * i + 8 * t;
      if (g >= group)
        qf[i] = make_uint4(0u, 0u, 0u, 0u);
      else if constexpr (Persist || Heads)
        qf[i] = *reinterpret_cast<const uint4*>(qs + g * D + c);
      else
        qf[i] = __ldg(reinterpret_cast<const uint4*>(a.q + size_t(hbase + g) * D + c));
    }
    for (int i = tid; i < 2 * 8 * (kAttnTile + 8); i += NT) (&p16[0][0][0])[i] = __float2half_rn(0.f);  // padding
    if (tid < 8) alpha_s[tid] = 0.f;  // keep p = 0 and alpha = 0

    while (nt > 0) {
      // 1. partial scores: keys 16 mt + g (+ 8) x heads 2t, 2t + 1 over this warp's channels
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        float sc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int i = 0; i < KCH; ++i)
#pragma unroll
          for (int s = 0; s < 4; ++s)
            mma_16x8x8(sc, u4_word(kf[mt][0][i], s), u4_word(kf[mt][1][i], s), u4_word(qf[i], s));
#pragma unroll
        for (int hi = 0; hi < 2; ++hi)
#pragma unroll
          for (int j = 0; j < 2; ++j) s_part[warp][2 * t + j][16 * mt + 8 * hi + g] = sc[2 * hi + j];
      }
      const int t1 = t0 + kAttnTile, nt1 = min(kAttnTile, end - t1);
      if constexpr (Heads) {  // the own key, when in tile t1, from shared memory
        const bool own1 = own && nt1 > 0 && t1 + nt1 == r.lo + r.n;
        if (nt1 > 0) attn_load_k<KCH, false>(kf, K, ld, off, t1, own1 ? nt1 - 1 : nt1, cap, g);
        if (own1) attn_own_k<KCH>(kf, hsm->k + lc, nt1 - 1, g);
      } else {
        if (nt1 > 0) attn_load_k<KCH, Persist>(kf, K, ld, off, t1, nt1, cap, g);
      }
      __syncthreads();

      // 2. online softmax: lane = key
#pragma unroll
      for (int k = 0; k < HPW; ++k) {
        const int h = warp + NW * k;
        if (h < group) {  // warp-uniform
          float s = 0.f;
#pragma unroll
          for (int w = 0; w < NW; ++w) s += s_part[w][h][lane];
          s = lane < nt ? s : -INFINITY;
          const float mx = fmaxf(m_run[k], warp_max(s));  // finite: key 0 of the tile is valid
          const float alpha = __expf(m_run[k] - mx);      // 0 on the first tile (m = -inf)
          // p as hi + lo fp16 (P.V's operands): their sum is p to ~2^-22, so P.V keeps fp32's precision
          const float e = __expf(s - mx);  // 0 past the last key
          const half hi = __float2half_rn(e);
          l_run[k] = fmaf(l_run[k], alpha, e);
          m_run[k] = mx;
          p16[0][h][lane] = hi;
          p16[1][h][lane] = __float2half_rn(e - __half2float(hi));
          if (lane == 0) alpha_s[h] = alpha;
        }
      }
      __syncthreads();

      // 3. o = o * alpha + P.V on the tensor cores (keys past nt: p = 0 and v = 0). Register r of load (o, c) is, over
      // the warp, the 8 x 8 matrix X_r[key g][2 t + e] = V[8 o + g][32 c + 8 t + 2 r + e]; its transpose gives lane
      // (g, t) X_r[2 t, 2 t + 1][g]: rows of V^T for channel 32 c + 8 (g / 2) + 2 r + g % 2 over keys 2t, 2t + 1 of the
      // octet, the m16n8k8 A fragment rows g (r even) and g + 8 (r odd). B: p16[head g][keys 8 o + 2 t, + 1].
      const float al0 = alpha_s[2 * t], al1 = alpha_s[2 * t + 1];
#pragma unroll
      for (int c = 0; c < CH; ++c)
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          acc[c][m][0] *= al0;
          acc[c][m][1] *= al1;
          acc[c][m][2] *= al0;
          acc[c][m][3] *= al1;
        }
#pragma unroll
      for (int o = 0; o < kAttnTile / 8; ++o) {
        const uint32_t bh = *reinterpret_cast<const uint32_t*>(&p16[0][g][8 * o + 2 * t]);
        const uint32_t bl = *reinterpret_cast<const uint32_t*>(&p16[1][g][8 * o + 2 * t]);
#pragma unroll
        for (int c = 0; c < CH; ++c) {
          const uint4 v = vf[o * CH + c];
          const uint32_t a0 = movmatrix_trans(v.x), a1 = movmatrix_trans(v.y);
          const uint32_t a2 = movmatrix_trans(v.z), a3 = movmatrix_trans(v.w);
          mma_16x8x8(acc[c][0], a0, a1, bl);  // the small part first
          mma_16x8x8(acc[c][0], a0, a1, bh);
          mma_16x8x8(acc[c][1], a2, a3, bl);
          mma_16x8x8(acc[c][1], a2, a3, bh);
        }
      }
      if constexpr (Heads) {
        const bool own1 = own && nt1 > 0 && t1 + nt1 == r.lo + r.n;
        if (nt1 > 0) attn_load_v<VI, CH, false>(vf, V, ld, off, t1, own1 ? nt1 - 1 : nt1, cap, g);
        if (own1) attn_own_v<VI, CH>(vf, hsm->v + lc, nt1 - 1, g);
      } else {
        if (nt1 > 0) attn_load_v<VI, CH, Persist>(vf, V, ld, off, t1, nt1, cap, g);
      }
      t0 = t1;
      nt = nt1;
    }
  } else if (early) {
    pdl_enter();  // an empty split writes nothing of its own, but every block passes the wait before it stores
  }
#pragma unroll
  for (int k = 0; k < HPW; ++k) {
    const int h = warp + NW * k;
    if (h < group) {
      const float l = warp_sum(l_run[k]);
      if (lane == 0) {
        m_s[h] = m_run[k];
        l_s[h] = l;
      }
    }
  }
  __syncthreads();

  // Lanes g and g ^ 1 (lane ^ 4) hold the even and the odd channels of 8 (heads 2t, 2t + 1): they swap half, so that
  // lane (g, t) holds head oh = 2 t + g % 2, channels oc + 32 c .. + 7 in order.
  const int oh = 2 * t + (g & 1), oc = warp * WS + 8 * (g >> 1);
  float o8[CH][8];
#pragma unroll
  for (int c = 0; c < CH; ++c)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float even_h = acc[c][r >> 1][2 * (r & 1)], odd_h = acc[c][r >> 1][2 * (r & 1) + 1];  // channel ch(r)
      const float keep = (g & 1) ? odd_h : even_h;
      const float got = __shfl_xor_sync(0xffffffffu, (g & 1) ? even_h : odd_h, 4);
      o8[c][2 * r] = (g & 1) ? got : keep;
      o8[c][2 * r + 1] = (g & 1) ? keep : got;
    }
  if (a.splits == 1) {  // the only split holds every key: l > 0
    if (oh < group) {
      const float inv = 1.f / l_s[oh];
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        half2 o2[4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
          o2[e] = __halves2half2(to_half_sat(o8[c][2 * e] * inv), to_half_sat(o8[c][2 * e + 1] * inv));
        *reinterpret_cast<uint4*>(a.out + size_t(hbase + oh) * D + oc + 32 * c) = *reinterpret_cast<const uint4*>(o2);
      }
    }
    return;
  }
  if (begin < end) {
    if (oh < group) {
      float* dst = a.part_o + (size_t(hbase + oh) * a.splits + sp) * D + oc;
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        reinterpret_cast<float4*>(dst + 32 * c)[0] = make_float4(o8[c][0], o8[c][1], o8[c][2], o8[c][3]);
        reinterpret_cast<float4*>(dst + 32 * c)[1] = make_float4(o8[c][4], o8[c][5], o8[c][6], o8[c][7]);
      }
    }
    if (tid < group) {
      float* ml = a.part_ml + (size_t(hbase + tid) * a.splits + sp) * 2;
      ml[0] = m_s[tid];
      ml[1] = l_s[tid];
    }
  }
  if (!fused) return;

  // Fused merge: the last block of this (row, KV head) to arrive. Every thread fences its own partial
  // stores before the ticket; the last block fences again after it, then reads the partials via L2.
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    unsigned* cnt = a.counters + (size_t(row) * a.kv_heads + kvh) * hsplit + hs;
    const int last = atomicAdd(cnt, 1u) == unsigned(a.splits - 1);
    if (last) {
      atomicExch(cnt, 0u);  // every split has arrived: ready for the next launch (graph replay)
      __threadfence();
    }
    last_s = last;
  }
  __syncthreads();
  if (!last_s) return;

#pragma unroll
  for (int k = 0; k < HPW; ++k) {
    const int h = warp + NW * k;
    if (h < group) attn_merge_weights(a.part_ml + size_t(hbase + h) * a.splits * 2, r.used, wt_s[h], lane);
  }
  __syncthreads();
  float4 o[CPT];
#pragma unroll
  for (int j = 0; j < CPT; ++j) o[j] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
  for (int s = 0; s < r.used; ++s)
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      const int col = tid + j * NT, h = col / C4;
      if (h < group) {
        const float w = wt_s[h][s];
        const float4 v =
            __ldcg(reinterpret_cast<const float4*>(a.part_o + (size_t(hbase + h) * a.splits + s) * D) + col % C4);
        o[j].x = fmaf(w, v.x, o[j].x);
        o[j].y = fmaf(w, v.y, o[j].y);
        o[j].z = fmaf(w, v.z, o[j].z);
        o[j].w = fmaf(w, v.w, o[j].w);
      }
    }
#pragma unroll
  for (int j = 0; j < CPT; ++j) {
    const int col = tid + j * NT, h = col / C4;
    if (h < group) {
      const half2 o2[2] = {__halves2half2(to_half_sat(o[j].x), to_half_sat(o[j].y)),
                           __halves2half2(to_half_sat(o[j].z), to_half_sat(o[j].w))};
      *reinterpret_cast<uint2*>(a.out + size_t(hbase + h) * D + (col % C4) * 4) = *reinterpret_cast<const uint2*>(o2);
    }
  }
}

template <int D, int G>
static __global__ void __launch_bounds__(attn_block<D>()) attention_split_kernel(AttnArgs a, int fused) {
  GEMMA4_T4_KTRACE_SCOPE(kKtAttnSplit, D * 10 + G);
  constexpr int NW = attn_block<D>() / 32;
  __shared__ AttnSmem<D, G, NW> sm;
  const int y = int(blockIdx.y);
  attention_block<D, G, NW, false>(a, int(blockIdx.x), y / a.head_split, y % a.head_split, int(blockIdx.z), fused != 0,
                                   sm, nullptr);
}

// Heads mode (see the header): the same blocks, q, k and v from the q/k/v GEMV.
template <int D, int G>
static __global__ void __launch_bounds__(attn_block<D>()) attention_heads_kernel(AttnArgs a, AttnHeads hn, int fused) {
  GEMMA4_T4_KTRACE_SCOPE(kKtAttnHeads, D * 10 + G);
  constexpr int NW = attn_block<D>() / 32;
  __shared__ AttnSmem<D, G, NW> sm;
  __shared__ AttnHeadsSmem<D, G, NW> hsm;
  const int y = int(blockIdx.y);
  attention_block<D, G, NW, false, true>(a, int(blockIdx.x), y / a.head_split, y % a.head_split, int(blockIdx.z),
                                         fused != 0, sm, &hsm.q[0][0], &hn, &hsm);
}

// The unfused merge: out[r, h, c] = sum_s o_s[c] e^(m_s - M) / sum_s l_s e^(m_s - M) over the splits holding
// keys. Grid (rows, heads, ceil(D / 64)), 32 threads, 2 channels each.
template <int D>
static __global__ void __launch_bounds__(32) attention_merge_kernel(AttnArgs a) {
  GEMMA4_T4_KTRACE_SCOPE(kKtAttnMerge, D);
  pdl_enter();
  constexpr int CB = D < 64 ? D : 64;  // channels per block
  __shared__ float wt[kAttnMaxSplits];
  const int row = blockIdx.x, h = blockIdx.y, lane = threadIdx.x, c = blockIdx.z * CB + 2 * lane;
  const AttnRange r = attn_range(a, row);
  const size_t base = (size_t(row) * a.heads + h) * a.splits;  // [rows, heads, splits] index of split 0
  attn_merge_weights(a.part_ml + base * 2, r.used, wt, lane);
  __syncwarp();
  if (2 * lane >= CB) return;
  float2 o = make_float2(0.f, 0.f);
#pragma unroll 4
  for (int s = 0; s < r.used; ++s) {
    const float2 v = __ldcg(reinterpret_cast<const float2*>(a.part_o + (base + s) * D + c));
    o.x = fmaf(wt[s], v.x, o.x);
    o.y = fmaf(wt[s], v.y, o.y);
  }
  *reinterpret_cast<half2*>(a.out + (size_t(row) * a.heads + h) * D + c) =
      __halves2half2(to_half_sat(o.x), to_half_sat(o.y));
}

// ---- launch policy ----

// Most splits the fused merge takes for this group and head dim (>= 1).
inline int attention_fused_splits(int group, int head_dim) {
  const int f = kAttnFusedFloats / ((group > 0 ? group : 1) * (head_dim > 0 ? head_dim : 1));
  return f < 1 ? 1 : f > kAttnFusedSplits ? kAttnFusedSplits : f;
}

// Query-head slices per KV head for a launch of `rows` rows of up to `keys` keys: the largest power of two
// dividing the group while the grid at one 32-key tile per split (rows x kv_heads x slices x tiles blocks)
// stays within about two blocks per SM. A decode step of one or a few sessions then runs 8x (E2B) the blocks
// of one slice, and each block's merge re-reads 1 / slices of the partials; from about 16 sessions on, one.
inline int attention_head_split_for(int rows, int kv_heads, int group, int keys, int sms) {
  if (rows <= 0 || keys <= 0 || group <= 1) return 1;
  const long long tiles = (keys + kAttnTile - 1) / kAttnTile;
  const long long base = (long long)(rows) * (kv_heads > 0 ? kv_heads : 1) * tiles;
  int hs = 1;
  while (group % (2 * hs) == 0 && base * 2 * hs <= 2LL * (sms > 0 ? sms : 1)) hs *= 2;
  return hs;
}

// Splits for a launch of `rows` rows of up to `keys` keys each on a GPU with `sms` SMs, `head_split` head
// slices per KV head: one 32-key tile per split while the grid (rows x kv_heads x head_split x splits blocks)
// stays within about two blocks per SM -- a block's tiles run one after another, so fewer, longer splits are
// latency-bound -- and rows x splits <= budget (the partials' scratch). Where the fused merge cannot take that
// many splits but can take a count that at most doubles the tiles per block, that count: a second launch costs
// more than a tile.
//
// More than kAttnManyRows rows, with blocks_per_sm (the split kernel's occupancy at this head dim, > 0) known: the
// most splits whose grid fits one wave (rows x kv_heads x head_split x splits <= sms x blocks_per_sm), at least 1.
// A block's tiles run one after another, so a launch costs about waves x tiles per split; the ceiling above
// overshoots a wave (128 rows, 132 SMs: 3 splits = 384 blocks for the 264 slots of two blocks per SM -- 2 waves of 6
// tiles at 512 keys, against 1 wave of 8 with 2 splits), and a head dim whose blocks fit once per SM (E2B's 512)
// has half the slots. With the keys unknown (a graph's bound), one wave is never more tile rounds than more waves.
inline int attention_splits_for(int rows, int kv_heads, int group, int head_dim, int keys, int sms, int budget,
                                int head_split = 1, int blocks_per_sm = 0) {
  if (rows <= 0 || keys <= 0) return 1;
  if (head_split < 1) head_split = 1;
  const int tiles = (keys + kAttnTile - 1) / kAttnTile;
  const int blocks = rows * (kv_heads > 0 ? kv_heads : 1) * head_split;
  group = group / head_split > 0 ? group / head_split : 1;
  const int fill = rows > kAttnManyRows && blocks_per_sm > 0 ? (sms > 0 ? sms : 1) * blocks_per_sm / blocks
                                                             : (2 * (sms > 0 ? sms : 1) + blocks - 1) / blocks;
  int s = tiles < fill ? tiles : fill;
  if (s > budget / rows) s = budget / rows;
  if (s > kAttnMaxSplits) s = kAttnMaxSplits;
  if (s < 1) return 1;
  const int fs = attention_fused_splits(group, head_dim);
  if (s > fs && (tiles + fs - 1) / fs <= 2 * ((tiles + s - 1) / s)) s = fs;
  return s;
}

// hn: heads mode (attention_heads_kernel), else attention_split_kernel.
template <int D, int G>
inline cudaError_t launch_attention_dg(const AttnArgs& a, const AttnHeads* hn, const Launch& launch) {
  const int heads = a.heads / a.kv_heads / a.head_split;  // per block
  const bool fused = a.splits > 1 && a.counters && a.splits <= attention_fused_splits(heads, D);
  const dim3 grid(a.rows, a.kv_heads * a.head_split, a.splits);
  const cudaError_t e =
      hn ? launch_kernel(attention_heads_kernel<D, G>, grid, attn_block<D>(), launch, a, *hn, int(fused))
         : launch_kernel(attention_split_kernel<D, G>, grid, attn_block<D>(), launch, a, int(fused));
  if (e != cudaSuccess || a.splits == 1 || fused) return e;
  return launch_kernel(attention_merge_kernel<D>, dim3(a.rows, a.heads, (D + 63) / 64), 32, launch, a);
}

template <int D>
inline cudaError_t launch_attention_d(const AttnArgs& a, int group, const AttnHeads* hn, const Launch& launch) {
  switch (group > 8 ? -1 : gqa_group_pad(group)) {
    case 1: return launch_attention_dg<D, 1>(a, hn, launch);
    case 2: return launch_attention_dg<D, 2>(a, hn, launch);
    case 4: return launch_attention_dg<D, 4>(a, hn, launch);
    case 8: return launch_attention_dg<D, 8>(a, hn, launch);
    default: return cudaErrorInvalidValue;
  }
}

// Head dims 32..512 (powers of two), up to 8 query heads per KV head.
inline bool attention_supported(int d, int group) {
  return (d == 32 || d == 64 || d == 128 || d == 256 || d == 512) && group >= 1 && group <= 8;
}

// Blocks of attention_split_kernel<D, group> one SM holds at once on the current device (registers, shared memory:
// the runtime's occupancy calculator), for attention_splits_for; 0 for head dims and groups attention does not take,
// or on an error. Asked once per (device, head dim, group) and remembered (devices past the table: asked every time).
template <int D, int G>
inline cudaError_t attention_occupancy(int* blocks) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      blocks, reinterpret_cast<const void*>(&attention_split_kernel<D, G>), attn_block<D>(), 0);
}

template <int D>
inline int attention_blocks_per_sm_d(int group) {
  int n = 0;
  cudaError_t e = cudaErrorInvalidValue;
  switch (group > 8 ? -1 : gqa_group_pad(group)) {
    case 1: e = attention_occupancy<D, 1>(&n); break;
    case 2: e = attention_occupancy<D, 2>(&n); break;
    case 4: e = attention_occupancy<D, 4>(&n); break;
    case 8: e = attention_occupancy<D, 8>(&n); break;
    default: break;
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it
    return 0;
  }
  return n;
}

inline int attention_blocks_per_sm(int head_dim, int group) {
  if (!attention_supported(head_dim, group)) return 0;
  static std::atomic<int> known[5][9][kMemoDevices];  // [log2(D / 32)][group][device] (per_device_memo)
  const int di = head_dim == 32 ? 0 : head_dim == 64 ? 1 : head_dim == 128 ? 2 : head_dim == 256 ? 3 : 4;
  return per_device_memo(known[di][group], [&](int) {
    switch (head_dim) {
      case 32: return attention_blocks_per_sm_d<32>(group);
      case 64: return attention_blocks_per_sm_d<64>(group);
      case 128: return attention_blocks_per_sm_d<128>(group);
      case 256: return attention_blocks_per_sm_d<256>(group);
      default: return attention_blocks_per_sm_d<512>(group);
    }
  });
}

// launch_attention (hn null) and launch_attention_heads: the shape checks, then the kernels of head dim and group.
inline cudaError_t launch_attention_any(const AttnArgs& a, int head_dim, const AttnHeads* hn, const Launch& launch) {
  if (a.rows <= 0) return cudaSuccess;
  if (a.kv_heads <= 0 || a.heads % a.kv_heads != 0 || a.splits < 1 || a.splits > kAttnMaxSplits || a.head_split < 1 ||
      (a.heads / a.kv_heads) % a.head_split != 0 || a.kv_heads * a.head_split > 65535 || a.late_keys < -1)
    return cudaErrorInvalidValue;
  const int group = a.heads / a.kv_heads / a.head_split;
  switch (head_dim) {
    case 32: return launch_attention_d<32>(a, group, hn, launch);
    case 64: return launch_attention_d<64>(a, group, hn, launch);
    case 128: return launch_attention_d<128>(a, group, hn, launch);
    case 256: return launch_attention_d<256>(a, group, hn, launch);
    case 512: return launch_attention_d<512>(a, group, hn, launch);
    default: return cudaErrorInvalidValue;
  }
}

// One launch when splits == 1 or the merge fuses (a.counters set, splits <= attention_fused_splits of the
// block's heads), else two. a.head_split must divide the group; a.late_keys >= 0 only for launches whose rows'
// keys before the last late_keys were written at least two launches back (AttnArgs).
inline cudaError_t launch_attention(const AttnArgs& a, int head_dim, const Launch& launch) {
  return launch_attention_any(a, head_dim, nullptr, launch);
}

// Heads mode: head_norm_rope (q -> q_norm + RoPE; k -> k_norm + RoPE and v -> v_norm into the caches) and the
// attention over the caches in the launches launch_attention makes (see the header). The same results as
// launch_head_norm_rope_multi of those targets (q into an fp16 buffer, then a.q) followed by launch_attention,
// bit for bit; a.q unused. For decode passes: every row a sequence of its own (no two rows share a cache slot),
// a.late_keys 1 (hn.k and hn.v set: a layer that owns its cache, a.layer = that layer) or 0 (hn.k null: a KV-shared
// layer, q only); the previous launch wrote hn's inputs, and every key but each row's own at least two launches back.
// Head dims and groups: attention_supported.
inline cudaError_t launch_attention_heads(const AttnArgs& a, const AttnHeads& hn, int head_dim, const Launch& launch) {
  if (a.rows <= 0) return cudaSuccess;
  if (!hn.q || a.late_keys != (hn.k ? 1 : 0) || (hn.k && !hn.v)) return cudaErrorInvalidValue;
  return launch_attention_any(a, head_dim, &hn, launch);
}

}  // namespace kernels
}  // namespace gemma4_t4
