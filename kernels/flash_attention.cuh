// gemma4_t4 kernels: prefill attention on Turing tensor cores (flash attention with mma.sync m16n8k8).
//
// Same result as attention_split_kernel (attention.cuh), for prompt chunks. For row r (a query at position
// p = pos[r] of sequence seq[r]) and query head h:
//   keys j in [lo, p] with lo = max(0, p - window + 1) on sliding layers (window > 0), 0 on full layers;
//   K/V row j of KV head g = h / (heads / kv_heads) at slot j % capacity of the (seq, layer) cache
//   (caches: [capacity, kv_heads, D] fp16; the K/V of the rows themselves were written before this runs);
//   out[r, h] = softmax_j(q . k_j) v_j     (Gemma 4: scaling 1.0, no soft-cap; out saturated to fp16)
//
// Work split. A block takes one tile of the caller's tile table -- up to P consecutive rows (positions) of
// ONE sequence -- and one KV head g. The group's G query heads are folded into the MMA M dimension: MMA row
// m = (position i = m / G, head h = m % G), so BM = 32 MMA rows = P positions x G heads (P = 32 / G: 4 on
// E2B, where G = 8) and each K/V tile in shared memory serves every head of the group. G is the group
// rounded up to 1, 2, 4 or 8; padding heads (h >= group) and padding positions (i >= tile rows) are masked
// rows, never written. Keys go in tiles of BN = 32 from lo(first row) to p(last row): only the key range the
// tile's rows can see, so a window-512 layer reads ~515 keys per block and a full layer p + 1, whatever the
// prompt length (no O(prompt^2) memory, no clamp). BM stays 32: a 512-row E2B chunk is then 128 blocks,
// about one per SM of a big GPU, and the o / q state of 32 rows at D = 512 already fills half a T4 SM's
// registers.
//
// Key groups. The block's warps form KG key groups (KG = 2 for D <= 256, 1 at D = 512): group k takes key
// tiles k, k + KG, k + 2 KG, ... with its own running max / sum and output, synchronising on its own named
// barrier (bar.sync 1 + k), so one group's softmax overlaps the other's tensor-core work; the groups' (o, m,
// l) are merged once at the end. Inside a group, warps split the head dimension: warp w owns channels
// [64 w, 64 w + 64) -- W = D / 64 warps -- of q, k, v and the output, so per-thread state does not grow with D:
//   q    A fragments of its 64 channels for the 32 rows, in registers for the whole kernel (32 regs)
//   o    its 32 x 64 fp32 output slice (64 regs)
// and each warp streams its own 64-channel slice of every K/V row (128 contiguous bytes) through a private
// shared buffer. Per key tile (group-local barriers):
//   1. K slice (loaded one tile earlier) registers -> buffer; the NEXT tile's K loads issued (registers)
//   2. partial scores S_w = Q[:, slice] K[:, slice]^T (32 x 32, m16n8k8, ldmatrix) -> the same buffer (the
//      K slice is dead by then: the buffer holds K, then the partial scores, then V)                 | barrier
//   3. every thread: W threads per row sum the W partials (= q . k), mask (causal + window, per position),
//      online softmax in fp32 (running max m, sum l per row), P = exp(s - m) rounded to fp16 -> shared, and
//      l accumulates the ROUNDED p (so the weights P.V uses sum exactly to l); rescale factor -> shared  | barrier
//   4. V slice (loaded one tile earlier) -> buffer; the NEXT tile's V loads issued; o = o * alpha + P V
//      (ldmatrix.trans gives V's B fragments straight from the [key][channel] layout)
// So every global load has a whole tile of work to arrive (register double-buffering stands in for
// cp.async): two register sets of 8 x 16 bytes per lane. Finally the groups merge: o_k scaled by
// exp(m_k - M) / sum_k exp(m_k - M) l_k, summed in shared memory, saturated to fp16. A masked row keeps
// m = -inf; exp is then taken against 0, so such a row (padding, or a row whose window starts in a later key
// tile) gets p = 0 and alpha = 0, never NaN; a group that saw no key of a row contributes 0. Keys past the
// tile's last position are loaded as zeros (their p is 0 anyway; zeros keep 0 * v finite).
//
// Shared memory (static, no opt-in), per group: per warp one 32 x (64 + 8) fp16 K/V buffer (4608 B; the
// 16-byte row pad keeps ldmatrix conflict-free) that doubles as the 32 x (32 + 4) fp32 partial scores (the
// 4-float pad makes the softmax's float4 reads conflict-free); P 32 x (32 + 8) fp16 (2560 B); 32 fp32 row
// factors. D = 64: 14,592 B, 128: 23,808 B, 256: 42,240 B, 512: 39,552 B. Block: KG x D / 2 threads.
// Registers: q 32 + o 64 + two staging sets 64 + 16 score accumulators; ptxas needs ~235 and uses up to 255
// (launch bounds), no spills on sm_75 .. sm_120, so a T4 SM runs one 256-thread block (8 warps).
//
// sm_75 rules: fp16 mma.sync.aligned.m16n8k8 with fp32 accumulators, ldmatrix and bar.sync with a thread
// count (all sm_75); no m16n8k16, cp.async, bf16 or anything newer.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k8", .f16 A/B, .f32 C/D; g = lane / 4,
// t = lane % 4; the lower half of an .f16x2 register holds the lower column / k index):
//   A 16x8 row-major: a0 = (row g, cols 2t, 2t+1), a1 = (row g + 8, same cols)
//   B 8x8 ("col"):    b0 = (k 2t, 2t+1; n g)
//   C 16x8:           c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g + 8, same cols)
//   ldmatrix x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i; register i of every lane receives
//   (row g, cols 2t, 2t+1) of matrix i -- an A or B fragment of a [row][k] block; .trans delivers
//   (rows 2t, 2t+1; col g) instead: the B fragment of a [k][n] block.
#pragma once

#include "attention.cuh"

namespace gemma4_t4 {
namespace kernels {

constexpr int kFlashRows = 32;   // MMA rows per block: (position, head) pairs, two m16 tiles
constexpr int kFlashKeys = 32;   // keys per tile
constexpr int kFlashSlice = 64;  // head-dimension channels per warp

// Key groups per block (see the header). Two groups for D <= 256 were measured on the H200 (512-row chunk,
// window 512: 22.8 us), but compute-sanitizer racecheck reported shared-memory hazards in those variants
// (not in the one-group ones) that are not explained yet, so every head dim runs one group until they are;
// kFlashTwoKeyGroups turns the two-group variants back on. At D = 512 one group regardless: 16 warps of
// ~240 registers would not fit an SM's 64K registers.
constexpr bool kFlashTwoKeyGroups = false;
template <int D>
__host__ __device__ constexpr int flash_key_groups() {
  return D >= 512 || !kFlashTwoKeyGroups ? 1 : 2;
}

template <int D>
__host__ __device__ constexpr int flash_threads() {
  return flash_key_groups<D>() * D / kFlashSlice * 32;
}

// The group as the kernel folds it: 1, 2, 4 or 8 query heads per KV head (padding heads are masked).
__host__ __device__ constexpr int flash_group_pad(int group) {
  return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8;
}

// Positions (rows of one sequence) per tile: 32, 16, 8 or 4 for groups 1, 2, 3-4, 5-8.
inline int flash_tile_positions(int group) { return kFlashRows / flash_group_pad(group); }

// ---- inline PTX (sm_75) ----

__device__ __forceinline__ uint32_t flash_smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 fp16 matrices from shared memory into fragment layout with one instruction (sm_75): the
// alternative, 32-bit shared loads per fragment register, costs 4x the instructions and bank conflicts.
__device__ __forceinline__ void flash_ldsm_x4(uint32_t (&r)[4], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(flash_smem_addr(row_addr))
               : "memory");
}

// The same, transposed in flight: B fragments of a row-major [k][n] block (V is stored [key][channel]).
__device__ __forceinline__ void flash_ldsm_x4_trans(uint32_t (&r)[4], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(flash_smem_addr(row_addr))
               : "memory");
}

// c += A (16x8 fp16) B (8x8 fp16), fp32 accumulate: the Turing tensor-core shape (m16n8k16 is sm_80+).
__device__ __forceinline__ void flash_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(b));
}

// Barrier of one key group only (THREADS threads, whole warps): __syncthreads would tie the groups
// together and undo their overlap. Id 1 + group (0 is __syncthreads'); immediate ids, so ptxas reserves
// only the barriers used.
template <int KG, int THREADS>
__device__ __forceinline__ void flash_group_sync(int kgrp) {
  static_assert(KG == 1 || KG == 2, "one or two key groups");
  if (KG == 1 || kgrp == 0)
    asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
  else
    asm volatile("bar.sync 2, %0;\n" ::"n"(THREADS) : "memory");
}

// 16-byte chunk swizzle of the partial-score rows (4 chunks of 64 bytes, two rows per 128-byte bank line):
// bit 1 of the row flips chunk bit 1, bit 2 flips chunk bit 0. Rows 0-3 of a C fragment store, and the 1,
// 2, 4 or 8 rows a quarter-warp of softmax threads reads, then fall on distinct banks.
__device__ __forceinline__ int flash_swizzle(int row) { return ((row >> 1) & 1) << 1 | ((row >> 2) & 1); }

__device__ __forceinline__ uint32_t flash_pack_half2(half lo, half hi) {
  const half2 h = __halves2half2(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// ---- kernel ----

// D: head dim (64, 128, 256, 512); G: query heads folded per KV head (1, 2, 4, 8; the real group is
// a.heads / a.kv_heads <= G). Grid (num_tiles, kv_heads), flash_threads<D>() threads.
// tiles: [num_tiles] {first row, row count}: see launch_flash_attention.
template <int D, int G>
static __global__ void __launch_bounds__(flash_threads<D>())
    flash_attention_kernel(AttnArgs a, const int2* __restrict__ tiles) {
  pdl_enter();
  constexpr int W = D / kFlashSlice, KG = flash_key_groups<D>(), GT = 32 * W;  // warps / threads per group
  constexpr int BM = kFlashRows, BN = kFlashKeys, MT = BM / 16;
  constexpr int NS = kFlashSlice / 8;  // 8-wide k-steps (scores) / n-tiles (output) in a warp's slice
  constexpr int TPR = GT / BM;         // softmax threads per row (= W)
  constexpr int CPT = BN / 4 / TPR;    // 4-key chunks per softmax thread
  constexpr int RPL = BN / 4;          // K/V rows per lane per tile: a warp loads 4 rows x 128 B at a time
  constexpr int KV_LD = kFlashSlice + 8, P_LD = BN + 8;  // padded rows (fp16): 144 B, 80 B
  constexpr int BUF_BYTES = BN * KV_LD * 2, P_BYTES = BM * P_LD * 2;
  constexpr int GROUP_BYTES = W * BUF_BYTES + P_BYTES + BM * 4;
  // Partial scores of keys 16 h + [0, 16), h = 0, 1: [BM][16] fp32 at float offset h * PART_OFF of the
  // buffer, inside the bytes of K rows 16 h .. 16 h + 15 (dead once those keys' scores are done). The 64-byte
  // shift of h = 1 and the chunk swizzle make the float2 stores and the softmax's float4 reads conflict-free.
  constexpr int HALF_BYTES = 16 * KV_LD * 2, PART_OFF = (HALF_BYTES + 64) / 4;
  static_assert(D % kFlashSlice == 0 && W >= 1 && W <= 8, "head dim 64, 128, 256 or 512");
  static_assert(G == 1 || G == 2 || G == 4 || G == 8, "group folded as 1, 2, 4 or 8 heads");
  static_assert(BN == 32 && CPT >= 1 && BM * 16 * 4 <= HALF_BYTES && 4 * PART_OFF + BM * 16 * 4 <= BUF_BYTES,
                "the partial scores of each 16-key half fit the K rows they replace");
  static_assert(KG == 1 || 2 * KG * BM * 4 + W * MT * NS * 32 * 16 <= KG * GROUP_BYTES, "merge fits");

  // Per group: W K/V buffers (K slice [BN][KV_LD] fp16 -> partial scores 2 x [BM][16] fp32 -> V slice),
  // P [BM][P_LD] fp16 (A operand of P.V), alpha [BM] fp32 (per-row rescale of o). After the loop the whole
  // array holds the merge: m, l [KG][BM] fp32 and the groups' o, [W][MT][NS][32 lanes] float4.
  __shared__ __align__(16) unsigned char smem[KG * GROUP_BYTES];

  // Heaviest tiles (latest positions, most keys) first: the tail of the grid is then short blocks.
  const int2 tile = tiles[gridDim.x - 1 - blockIdx.x];
  const int first = tile.x, count = min(tile.y, BM / G);
  if (count <= 0) return;  // uniform over the block
  const int kvh = blockIdx.y;
  const int group = a.heads / a.kv_heads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int kgrp = warp / W, wg = warp % W, gtid = tid % GT;  // key group, warp and thread within it
  const int col0 = wg * kFlashSlice;                          // this warp's channels [col0, col0 + 64)

  unsigned char* const gbase = smem + kgrp * GROUP_BYTES;
  half(*const kv)[KV_LD] = reinterpret_cast<half(*)[KV_LD]>(gbase + wg * BUF_BYTES);  // this warp's buffer
  float* const sp = reinterpret_cast<float*>(gbase + wg * BUF_BYTES);                 // same bytes
  half(*const p_s)[P_LD] = reinterpret_cast<half(*)[P_LD]>(gbase + W * BUF_BYTES);
  float* const alpha_s = reinterpret_cast<float*>(gbase + W * BUF_BYTES + P_BYTES);

  const int idx = a.seq[first] * a.layers + a.layer;
  const int cap = a.capacity[idx];
  const size_t rs = size_t(a.kv_heads) * D;  // cache row stride (elements)
  // this lane's 16 bytes of every K/V row it loads: channels col0 + 8 (lane % 8) + [0, 8)
  const half* __restrict__ Kl = a.kbase[idx] + size_t(kvh) * D + col0 + (lane & 7) * 8;
  const half* __restrict__ Vl = a.vbase[idx] + size_t(kvh) * D + col0 + (lane & 7) * 8;
  const int kbeg = a.window > 0 ? max(0, a.pos[first] - a.window + 1) : 0;  // lo of the first position
  const int kend = a.pos[first + count - 1];                                // the last position

  // q fragments of this warp's 64 channels: qa[mt][ks][0] rows mt*16 + g, [1] rows mt*16 + g + 8
  uint32_t qa[MT][NS][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int m = mt * 16 + hi * 8 + g, i = m / G, h = m % G;
      const bool valid = i < count && h < group;
      const uint32_t* qr = valid ? reinterpret_cast<const uint32_t*>(
                                       a.q + (size_t(first + i) * a.heads + kvh * group + h) * D + col0 + 2 * t)
                                 : nullptr;
#pragma unroll
      for (int ks = 0; ks < NS; ++ks) qa[mt][ks][hi] = valid ? qr[ks * 4] : 0u;  // 8 fp16 = 4 words per k-step
    }

  // softmax role: row srow, 4-key chunks c = spart + TPR i (keys 4 c .. 4 c + 3), i < CPT, of each tile
  const int srow = gtid / TPR, spart = gtid % TPR;
  const int spos = (srow / G < count && srow % G < group) ? a.pos[first + srow / G] : -1;  // -1: masked row
  const int slo = a.window > 0 ? max(0, spos - a.window + 1) : 0;
  float m_run = -INFINITY, l_run = 0.f;

  // K/V slice rows of the tile at key k0 (ring slot s0 = k0 % cap): lane loads 16 bytes of rows
  // lane / 8 + 4 i, i < RPL. Keys past kend read as zeros. Most tiles neither pass kend nor wrap the ring:
  // consecutive slots, one address computation.
  auto load_tile = [&](uint4(&r)[RPL], const half* __restrict__ base, int k0, int s0) {
    if (k0 + BN - 1 <= kend && s0 + BN <= cap) {
      const half* p = base + size_t(s0 + (lane >> 3)) * rs;
#pragma unroll
      for (int i = 0; i < RPL; ++i, p += 4 * rs) r[i] = __ldg(reinterpret_cast<const uint4*>(p));
    } else {
#pragma unroll
      for (int i = 0; i < RPL; ++i) {
        const int rr = (lane >> 3) + 4 * i;
        r[i] = make_uint4(0u, 0u, 0u, 0u);
        if (k0 + rr <= kend) {
          int sl = s0 + rr;
          if (sl >= cap) sl %= cap;  // a ring smaller than a tile can wrap more than once
          r[i] = __ldg(reinterpret_cast<const uint4*>(base + size_t(sl) * rs));
        }
      }
    }
  };
  auto store_tile = [&](const uint4(&r)[RPL]) {
#pragma unroll
    for (int i = 0; i < RPL; ++i) *reinterpret_cast<uint4*>(&kv[(lane >> 3) + 4 * i][(lane & 7) * 8]) = r[i];
  };

  float o[MT][NS][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NS; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[mt][nt][c] = 0.f;

  // This group's tiles: k0 = kbeg + (kgrp + KG n) BN; ring slot of k0 tracked incrementally.
  constexpr int KSTEP = KG * BN;
  const int sstep = KSTEP % cap;
  int k0 = kbeg + kgrp * BN;
  int s0 = k0 % cap;
  uint4 kr[RPL], vr[RPL];  // K and V of the next tile, in flight
  if (k0 <= kend) {
    load_tile(kr, Kl, k0, s0);
    load_tile(vr, Vl, k0, s0);
  }
  for (; k0 <= kend; k0 += KSTEP) {
    const bool more = k0 + KSTEP <= kend;
    int s1 = s0 + sstep;
    if (s1 >= cap) s1 -= cap;

    __syncwarp();  // the warp's P.V reads of the buffer are done
    store_tile(kr);
    __syncwarp();
    if (more) load_tile(kr, Kl, k0 + KSTEP, s1);

      // ---- partial scores over this warp's channels, 16 keys at a time: s[mt][nt] = 16 rows x 8 keys ----
      // Each half's partial scores go into the bytes of its own K rows, dead once the half is done: 16 live
      // accumulator registers, not 32 (the kernel is near the 255-register limit).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float s[MT][2][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c) s[mt][nt][c] = 0.f;
#pragma unroll
      for (int k2 = 0; k2 < NS / 2; ++k2) {
        // matrices: 0 = (keys 16 h + 0-7, channels 16 k2 + 0-7), 1 = (same keys, +8-15), 2 / 3 = keys + 8-15
        uint32_t b[4];
        flash_ldsm_x4(b, &kv[h * 16 + (lane >> 4) * 8 + (lane & 7)][k2 * 16 + ((lane >> 3) & 1) * 8]);
        // the four accumulators' chains interleaved: no MMA waits on the one just issued
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          flash_mma(s[mt][0], qa[mt][2 * k2][0], qa[mt][2 * k2][1], b[0]);
          flash_mma(s[mt][1], qa[mt][2 * k2][0], qa[mt][2 * k2][1], b[2]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          flash_mma(s[mt][0], qa[mt][2 * k2 + 1][0], qa[mt][2 * k2 + 1][1], b[1]);
          flash_mma(s[mt][1], qa[mt][2 * k2 + 1][0], qa[mt][2 * k2 + 1][1], b[3]);
        }
      }
      __syncwarp();  // every lane's reads of these K rows are done before their partial scores overwrite them
      // row mt * 16 + g (+ 8), keys 8 nt + 2t, + 1: chunk 2 nt + t / 2, swizzled by the row (bits 1, 2 of g)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          float* dst = sp + h * PART_OFF + (((2 * nt + (t >> 1)) ^ flash_swizzle(g)) << 2) + (t & 1) * 2;
          *reinterpret_cast<float2*>(dst + (mt * 16 + g) * 16) = make_float2(s[mt][nt][0], s[mt][nt][1]);
          *reinterpret_cast<float2*>(dst + (mt * 16 + g + 8) * 16) = make_float2(s[mt][nt][2], s[mt][nt][3]);
        }
    }
    flash_group_sync<KG, GT>(kgrp);

    // ---- online softmax: TPR threads per row, CPT chunks of 4 keys each ----
    {
      float sv[CPT][4];
#pragma unroll
      for (int i = 0; i < CPT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) sv[i][e] = 0.f;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float* src = reinterpret_cast<const float*>(gbase + w * BUF_BYTES) + srow * 16;
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
          const int c = spart + TPR * i;  // chunk c: half c / 4, chunk c % 4 of it
          const float4 v =
              *reinterpret_cast<const float4*>(src + (c >> 2) * PART_OFF + (((c & 3) ^ flash_swizzle(srow)) << 2));
          sv[i][0] += v.x;
          sv[i][1] += v.y;
          sv[i][2] += v.z;
          sv[i][3] += v.w;
        }
      }
      float mx = -INFINITY;
#pragma unroll
      for (int i = 0; i < CPT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = k0 + 4 * (spart + TPR * i) + e;
          if (j < slo || j > spos) sv[i][e] = -INFINITY;
          mx = fmaxf(mx, sv[i][e]);
        }
#pragma unroll
      for (int off = 1; off < TPR; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m_run, mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: exp(-inf) = 0, no NaN
      const float alpha = __expf(m_run - m_use);
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < CPT; ++i) {
        half ph[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          ph[e] = __float2half_rn(__expf(sv[i][e] - m_use));
          sum += __half2float(ph[e]);
        }
        *reinterpret_cast<uint2*>(&p_s[srow][4 * (spart + TPR * i)]) =
            make_uint2(flash_pack_half2(ph[0], ph[1]), flash_pack_half2(ph[2], ph[3]));
      }
#pragma unroll
      for (int off = 1; off < TPR; off <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      l_run = l_run * alpha + sum;
      m_run = m_new;
      if (spart == 0) alpha_s[srow] = alpha;
    }
    flash_group_sync<KG, GT>(kgrp);

    store_tile(vr);  // V slice (every thread of the group has read the partial scores)
    __syncwarp();
    if (more) load_tile(vr, Vl, k0 + KSTEP, s1);

      // ---- o = o * alpha + P V over this warp's channels ----
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float a_lo = alpha_s[mt * 16 + g], a_hi = alpha_s[mt * 16 + g + 8];
#pragma unroll
      for (int nt = 0; nt < NS; ++nt) {
        o[mt][nt][0] *= a_lo;
        o[mt][nt][1] *= a_lo;
        o[mt][nt][2] *= a_hi;
        o[mt][nt][3] *= a_hi;
      }
    }
#pragma unroll
    for (int k2 = 0; k2 < BN / 16; ++k2) {
      // P A-fragments of keys 16 k2 + 0-15: pa[mt] = {a0, a1} of keys + 0-7, then {a0, a1} of keys + 8-15
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        flash_ldsm_x4(pa[mt], &p_s[mt * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)][k2 * 16 + (lane >> 4) * 8]);
#pragma unroll
      for (int n2 = 0; n2 < NS / 2; ++n2) {
        // matrices: 0 = (keys 16 k2 + 0-7, channels 16 n2 + 0-7), 1 = (keys + 8-15, same), 2 / 3 = channels + 8-15
        uint32_t b[4];
        flash_ldsm_x4_trans(b, &kv[k2 * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)][(2 * n2 + (lane >> 4)) * 8]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          flash_mma(o[mt][2 * n2], pa[mt][0], pa[mt][1], b[0]);
          flash_mma(o[mt][2 * n2 + 1], pa[mt][0], pa[mt][1], b[2]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          flash_mma(o[mt][2 * n2], pa[mt][2], pa[mt][3], b[1]);
          flash_mma(o[mt][2 * n2 + 1], pa[mt][2], pa[mt][3], b[3]);
        }
      }
    }
    s0 = s1;
    // The next tile's first group barrier orders these p_s / alpha_s reads before their next writes.
  }

  // ---- merge the key groups: o = sum_k exp(m_k - M) o_k / sum_k exp(m_k - M) l_k ----
  __syncthreads();                                    // every group is done with its buffers
  float* const m_s = reinterpret_cast<float*>(smem);  // [KG][BM]
  float* const l_s = m_s + KG * BM;                   // [KG][BM]
  if (spart == 0) {
    m_s[kgrp * BM + srow] = m_run;
    l_s[kgrp * BM + srow] = l_run;
  }
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int m = mt * 16 + hi * 8 + g;
      float mx = -INFINITY;
#pragma unroll
      for (int k = 0; k < KG; ++k) mx = fmaxf(mx, m_s[k * BM + m]);
      float l = 0.f, f = 0.f;
#pragma unroll
      for (int k = 0; k < KG; ++k) {
        const float mk = m_s[k * BM + m];
        const float e = mk == -INFINITY ? 0.f : __expf(mk - mx);  // a group that saw no key of the row: 0
        l += e * l_s[k * BM + m];
        if (k == kgrp) f = e;
      }
      const float sc = l > 0.f ? f / l : 0.f;
#pragma unroll
      for (int nt = 0; nt < NS; ++nt) {
        o[mt][nt][2 * hi] *= sc;
        o[mt][nt][2 * hi + 1] *= sc;
      }
    }
  if constexpr (KG > 1) {
    float4* const o_s = reinterpret_cast<float4*>(smem + 2 * KG * BM * 4);  // [W][MT][NS][32 lanes]
#pragma unroll 1
    for (int k = 1; k < KG; ++k) {
      if (kgrp == k)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NS; ++nt)
            o_s[((wg * MT + mt) * NS + nt) * 32 + lane] =
                make_float4(o[mt][nt][0], o[mt][nt][1], o[mt][nt][2], o[mt][nt][3]);
      __syncthreads();
      if (kgrp == 0)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NS; ++nt) {
            const float4 v = o_s[((wg * MT + mt) * NS + nt) * 32 + lane];
            o[mt][nt][0] += v.x;
            o[mt][nt][1] += v.y;
            o[mt][nt][2] += v.z;
            o[mt][nt][3] += v.w;
          }
      if (k + 1 < KG) __syncthreads();
    }
    if (kgrp != 0) return;
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int m = mt * 16 + hi * 8 + g, i = m / G, h = m % G;
      if (i >= count || h >= group) continue;
      half* orow = a.out + (size_t(first + i) * a.heads + kvh * group + h) * D + col0 + 2 * t;
#pragma unroll
      for (int nt = 0; nt < NS; ++nt)
        *reinterpret_cast<half2*>(orow + nt * 8) =
            __halves2half2(to_half_sat(o[mt][nt][2 * hi]), to_half_sat(o[mt][nt][2 * hi + 1]));
    }
}

// ---- host side ----

// Head dims 64, 128, 256, 512; 1..8 query heads per KV head.
inline bool flash_attention_supported(int d, int group) {
  return (d == 64 || d == 128 || d == 256 || d == 512) && group >= 1 && group <= 8;
}

// Upper bound on the tiles flash_attention_tiles makes for `rows` rows forming `runs` runs (a run: rows of
// one sequence at consecutive positions; a prefill pass of n sequences has n runs): floor(rows / P) + runs,
// and never more than rows. E.g. the backend's 512-row, 64-sequence pass at G = 8 (P = 4): 192.
inline int flash_attention_max_tiles(int rows, int runs, int group) {
  const int bound = rows / flash_tile_positions(group) + runs;
  return bound < rows ? bound : rows;
}

// Builds the tile table from host copies of the rows' seq / pos: each run is cut greedily into tiles of
// flash_tile_positions(group) rows (the last one shorter). Returns the number of tiles written, or -1 when
// max_tiles is too small. tiles: [max_tiles] host memory.
inline int flash_attention_tiles(const int* seq, const int* pos, int rows, int group, int2* tiles, int max_tiles) {
  const int P = flash_tile_positions(group);
  int n = 0;
  for (int r = 0; r < rows;) {
    int c = 1;
    while (r + c < rows && c < P && seq[r + c] == seq[r] && pos[r + c] == pos[r] + c) ++c;
    if (n == max_tiles) return -1;
    tiles[n++] = make_int2(r, c);
    r += c;
  }
  return n;
}

template <int D>
inline cudaError_t launch_flash_attention_d(const AttnArgs& a, const int2* tiles, int num_tiles, int group,
                                            cudaStream_t stream) {
  const dim3 grid(unsigned(num_tiles), unsigned(a.kv_heads));
  constexpr int T = flash_threads<D>();
  switch (flash_group_pad(group)) {
    case 1: return launch_kernel(flash_attention_kernel<D, 1>, grid, T, stream, a, tiles);
    case 2: return launch_kernel(flash_attention_kernel<D, 2>, grid, T, stream, a, tiles);
    case 4: return launch_kernel(flash_attention_kernel<D, 4>, grid, T, stream, a, tiles);
    default: return launch_kernel(flash_attention_kernel<D, 8>, grid, T, stream, a, tiles);
  }
}

// Prefill attention over the caches described by `a` (q, kbase, vbase, capacity, seq, pos, layer, layers,
// rows, heads, kv_heads, window, out; splits / part_o / part_ml are not used: no scratch).
// tiles: [num_tiles] int2 in device memory, {first row, row count}; every tile holds 1 <= count <=
//   flash_tile_positions(heads / kv_heads) rows first .. first + count - 1 of ONE sequence at consecutive
//   positions (pos[first + i] = pos[first] + i). Rows no tile covers are not written; a row in two tiles is
//   written twice (same value). flash_attention_tiles builds the table; flash_attention_max_tiles bounds it.
// Cache contract (as launch_attention): K/V of every key position in [lo(pos[first]), pos[last]] present at
//   slot j % capacity -- a sliding layer's ring needs capacity >= window + (rows of the sequence in the pass).
// Unsupported shapes (flash_attention_supported, heads % kv_heads, kv_heads > 65535, no table) return
// cudaErrorInvalidValue before any launch; no rows or no tiles is a no-op.
inline cudaError_t launch_flash_attention(const AttnArgs& a, const int2* tiles, int num_tiles, int head_dim,
                                          cudaStream_t stream) {
  if (a.rows <= 0 || num_tiles == 0) return cudaSuccess;
  if (num_tiles < 0 || tiles == nullptr || a.kv_heads <= 0 || a.kv_heads > 65535 || a.heads % a.kv_heads != 0)
    return cudaErrorInvalidValue;
  const int group = a.heads / a.kv_heads;
  if (!flash_attention_supported(head_dim, group)) return cudaErrorInvalidValue;
  switch (head_dim) {
    case 64: return launch_flash_attention_d<64>(a, tiles, num_tiles, group, stream);
    case 128: return launch_flash_attention_d<128>(a, tiles, num_tiles, group, stream);
    case 256: return launch_flash_attention_d<256>(a, tiles, num_tiles, group, stream);
    default: return launch_flash_attention_d<512>(a, tiles, num_tiles, group, stream);
  }
}

}  // namespace kernels
}  // namespace gemma4_t4
