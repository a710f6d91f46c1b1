// gemma4_t4 kernels: prefill attention on Turing tensor cores (flash attention with m16n8k8 tensor-core mma).
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
// Warps split the head dimension: warp w owns channels [64 w, 64 w + 64) -- W = D / 64 warps -- of q, k, v
// and the output, so per-thread state does not grow with D:
//   q    A fragments of its 64 channels for the 32 rows, in registers for the whole kernel (32 regs)
//   o    its 32 x 64 fp32 output slice (64 regs)
// and each warp streams its own 64-channel slice of every K/V row (128 contiguous bytes) through a private
// shared buffer. Per key tile:
//   1. K slice (loaded one tile earlier) registers -> buffer; the NEXT tile's K loads issued (registers)
//   2. partial scores S_w = Q[:, slice] K[:, slice]^T (32 x 32, m16n8k8, ldmatrix) -> the same buffer (the
//      K slice is dead by then: the buffer holds K, then the partial scores, then V)                 | barrier
//   3. every thread: W threads per row sum the W partials (= q . k), mask (causal + window, per position),
//      online softmax in fp32 (running max m, sum l per row), P = exp(s - m) rounded to fp16 -> shared, and
//      l accumulates the ROUNDED p (so the weights P.V uses sum exactly to l); rescale factor -> shared  | barrier
//   4. V slice (loaded one tile earlier) -> buffer; the NEXT tile's V loads issued; o = o * alpha + P V
//      (ldmatrix.trans gives V's B fragments straight from the [key][channel] layout)
// So every global load has a whole tile of work to arrive (register double-buffering stands in for
// cp.async): two register sets of 8 x 16 bytes per lane. Finally o is scaled by 1 / l (the row's sum, handed
// from its softmax threads through shared memory) and saturated to fp16. A masked row keeps m = -inf; exp
// is then taken against 0, so such a row (padding, or a row whose window starts in a later key tile) gets
// p = 0 and alpha = 0, never NaN, and is not written. Keys past the tile's last position are loaded as
// zeros (their p is 0 anyway; zeros keep 0 * v finite).
//
// (Two key groups per block -- warps taking alternate key tiles, merged at the end -- were measured 9% faster
// at D 256 on the H200 but racecheck reported shared-memory hazards in them that were never explained; they
// were removed. See git history before issue 15 and bench/RESULTS.md 2026-12-02.)
//
// Shared memory (static, no opt-in): per warp one 32 x (64 + 8) fp16 K/V buffer (4608 B; the
// 16-byte row pad keeps ldmatrix conflict-free) that doubles as the 32 x (32 + 4) fp32 partial scores (the
// 4-float pad makes the softmax's float4 reads conflict-free); P 32 x (32 + 8) fp16 (2560 B); 32 fp32 row
// factors. D = 64: 7,296 B, 128: 11,904 B, 256: 21,120 B, 512: 39,552 B. Block: D / 2 threads.
// Registers: q 32 + o 64 + two staging sets 64 + 16 score accumulators; ptxas needs ~235 and uses up to 255
// (launch bounds), no spills on sm_75 .. sm_120, so a T4 SM runs one 256-thread block (8 warps).
//
// sm_75 rules: fp16 m16n8k8 tensor-core mma with fp32 accumulators and ldmatrix (kernels/mma.cuh, both sm_75);
// no m16n8k16, cp.async, bf16 or anything newer.
//
// Fragment layouts: kernels/mma.cuh.
#pragma once

#include "attention.cuh"

namespace gemma4_t4 {
namespace kernels {

constexpr int kFlashRows = 32;   // MMA rows per block: (position, head) pairs, two m16 tiles
constexpr int kFlashKeys = 32;   // keys per tile
constexpr int kFlashSlice = 64;  // head-dimension channels per warp

template <int D>
__host__ __device__ constexpr int flash_threads() {
  return D / kFlashSlice * 32;
}

// Positions (rows of one sequence) per tile: 32, 16, 8 or 4 for groups 1, 2, 3-4, 5-8.
inline int flash_tile_positions(int group) { return kFlashRows / gqa_group_pad(group); }

// 16-byte chunk swizzle of the partial-score rows (4 chunks of 64 bytes, two rows per 128-byte bank line):
// bit 1 of the row flips chunk bit 1, bit 2 flips chunk bit 0. Rows 0-3 of a C fragment store, and the 1,
// 2, 4 or 8 rows a quarter-warp of softmax threads reads, then fall on distinct banks.
__device__ __forceinline__ int flash_swizzle(int row) { return ((row >> 1) & 1) << 1 | ((row >> 2) & 1); }

__device__ __forceinline__ uint32_t flash_pack_half2(half lo, half hi) {
  const half2 h = __halves2half2(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The online softmax of one key tile for row srow: TPR threads per row (consecutive lanes), CPT chunks of 4 keys each
// (chunk c = spart + TPR i: keys 4 c .. 4 c + 3 of the tile at k0). The row's scores are the sum over W arrays
// `wstride` floats apart of [rows][16] partial scores per 16-key half (`half_off` floats between the halves, chunks
// swizzled by flash_swizzle). Writes P (fp16) to p_s[srow] and the rescale factor to alpha_s[srow] (spart 0), and
// updates the row's running max and sum: l accumulates the ROUNDED p, so the weights P.V uses sum exactly to l.
// Keys outside [slo, spos] get p = 0; a row with no key yet (m = -inf) takes exp against 0, never NaN.
template <int W, int CPT, int TPR, int P_LD>
__device__ __forceinline__ void flash_softmax_tile(const float* part, int wstride, int half_off, int srow, int spart,
                                                   int k0, int slo, int spos, float& m_run, float& l_run,
                                                   half (*p_s)[P_LD], float* alpha_s) {
  float sv[CPT][4];
#pragma unroll
  for (int i = 0; i < CPT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) sv[i][e] = 0.f;
#pragma unroll
  for (int w = 0; w < W; ++w) {
    const float* src = part + w * wstride + srow * 16;
#pragma unroll
    for (int i = 0; i < CPT; ++i) {
      const int c = spart + TPR * i;  // chunk c: half c / 4, chunk c % 4 of it
      const float4 v =
          *reinterpret_cast<const float4*>(src + (c >> 2) * half_off + (((c & 3) ^ flash_swizzle(srow)) << 2));
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

// ---- kernel ----

// D: head dim (64, 128, 256, 512); G: query heads folded per KV head (1, 2, 4, 8; the real group is
// a.heads / a.kv_heads <= G). Grid (num_tiles, kv_heads), flash_threads<D>() threads.
// tiles: [num_tiles] {first row, row count}: see launch_flash_attention.
template <int D, int G>
static __global__ void __launch_bounds__(flash_threads<D>())
    flash_attention_kernel(AttnArgs a, const int2* __restrict__ tiles) {
  pdl_enter();
  constexpr int W = D / kFlashSlice, GT = 32 * W;  // warps / threads
  constexpr int BM = kFlashRows, BN = kFlashKeys, MT = BM / 16;
  constexpr int NS = kFlashSlice / 8;  // 8-wide k-steps (scores) / n-tiles (output) in a warp's slice
  constexpr int TPR = GT / BM;         // softmax threads per row (= W)
  constexpr int CPT = BN / 4 / TPR;    // 4-key chunks per softmax thread
  constexpr int RPL = BN / 4;          // K/V rows per lane per tile: a warp loads 4 rows x 128 B at a time
  constexpr int KV_LD = kFlashSlice + 8, P_LD = BN + 8;  // padded rows (fp16): 144 B, 80 B
  constexpr int BUF_BYTES = BN * KV_LD * 2, P_BYTES = BM * P_LD * 2;
  constexpr int SMEM_BYTES = W * BUF_BYTES + P_BYTES + BM * 4;
  // Partial scores of keys 16 h + [0, 16), h = 0, 1: [BM][16] fp32 at float offset h * PART_OFF of the
  // buffer, inside the bytes of K rows 16 h .. 16 h + 15 (dead once those keys' scores are done). The 64-byte
  // shift of h = 1 and the chunk swizzle make the float2 stores and the softmax's float4 reads conflict-free.
  constexpr int HALF_BYTES = 16 * KV_LD * 2, PART_OFF = (HALF_BYTES + 64) / 4;
  static_assert(D % kFlashSlice == 0 && W >= 1 && W <= 8, "head dim 64, 128, 256 or 512");
  static_assert(G == 1 || G == 2 || G == 4 || G == 8, "group folded as 1, 2, 4 or 8 heads");
  static_assert(BN == 32 && CPT >= 1 && BM * 16 * 4 <= HALF_BYTES && 4 * PART_OFF + BM * 16 * 4 <= BUF_BYTES,
                "the partial scores of each 16-key half fit the K rows they replace");

  // W K/V buffers (K slice [BN][KV_LD] fp16 -> partial scores 2 x [BM][16] fp32 -> V slice), P [BM][P_LD]
  // fp16 (A operand of P.V), alpha [BM] fp32 (per-row rescale of o). After the loop: l [BM] fp32.
  __shared__ __align__(16) unsigned char smem[SMEM_BYTES];

  // Heaviest tiles (latest positions, most keys) first: the tail of the grid is then short blocks.
  const int2 tile = tiles[gridDim.x - 1 - blockIdx.x];
  const int first = tile.x, count = min(tile.y, BM / G);
  if (count <= 0) return;  // uniform over the block
  const int kvh = blockIdx.y;
  const int group = a.heads / a.kv_heads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int col0 = warp * kFlashSlice;  // this warp's channels [col0, col0 + 64)

  half(*const kv)[KV_LD] = reinterpret_cast<half(*)[KV_LD]>(smem + warp * BUF_BYTES);  // this warp's buffer
  float* const sp = reinterpret_cast<float*>(smem + warp * BUF_BYTES);                 // same bytes
  half(*const p_s)[P_LD] = reinterpret_cast<half(*)[P_LD]>(smem + W * BUF_BYTES);
  float* const alpha_s = reinterpret_cast<float*>(smem + W * BUF_BYTES + P_BYTES);

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
  const int srow = tid / TPR, spart = tid % TPR;
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

  // Tiles k0 = kbeg + n BN; ring slot of k0 tracked incrementally.
  constexpr int KSTEP = BN;
  const int sstep = KSTEP % cap;
  int k0 = kbeg;
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
        ldsm_x4(b, &kv[h * 16 + (lane >> 4) * 8 + (lane & 7)][k2 * 16 + ((lane >> 3) & 1) * 8]);
        // the four accumulators' chains interleaved: no MMA waits on the one just issued
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16x8x8(s[mt][0], qa[mt][2 * k2][0], qa[mt][2 * k2][1], b[0]);
          mma_16x8x8(s[mt][1], qa[mt][2 * k2][0], qa[mt][2 * k2][1], b[2]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16x8x8(s[mt][0], qa[mt][2 * k2 + 1][0], qa[mt][2 * k2 + 1][1], b[1]);
          mma_16x8x8(s[mt][1], qa[mt][2 * k2 + 1][0], qa[mt][2 * k2 + 1][1], b[3]);
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
    __syncthreads();

    // ---- online softmax: TPR threads per row, CPT chunks of 4 keys each, the W warps' partials summed ----
    flash_softmax_tile<W, CPT, TPR, P_LD>(reinterpret_cast<const float*>(smem), BUF_BYTES / 4, PART_OFF, srow, spart,
                                          k0, slo, spos, m_run, l_run, p_s, alpha_s);
    __syncthreads();

    store_tile(vr);  // V slice (every thread has read the partial scores)
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
        ldsm_x4(pa[mt], &p_s[mt * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)][k2 * 16 + (lane >> 4) * 8]);
#pragma unroll
      for (int n2 = 0; n2 < NS / 2; ++n2) {
        // matrices: 0 = (keys 16 k2 + 0-7, channels 16 n2 + 0-7), 1 = (keys + 8-15, same), 2 / 3 = channels + 8-15
        uint32_t b[4];
        ldsm_x4_trans(b, &kv[k2 * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)][(2 * n2 + (lane >> 4)) * 8]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16x8x8(o[mt][2 * n2], pa[mt][0], pa[mt][1], b[0]);
          mma_16x8x8(o[mt][2 * n2 + 1], pa[mt][0], pa[mt][1], b[2]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16x8x8(o[mt][2 * n2], pa[mt][2], pa[mt][3], b[1]);
          mma_16x8x8(o[mt][2 * n2 + 1], pa[mt][2], pa[mt][3], b[3]);
        }
      }
    }
    s0 = s1;
    // The next tile's first barrier orders these p_s / alpha_s reads before their next writes.
  }

  // ---- o / l: each row's sum from its softmax threads ----
  __syncthreads();                                    // every warp is done with its buffer
  float* const l_s = reinterpret_cast<float*>(smem);  // [BM]
  if (spart == 0) l_s[srow] = l_run;
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const float l = l_s[mt * 16 + hi * 8 + g];
      const float sc = l > 0.f ? 1.f / l : 0.f;  // a row that saw no key (padding) is not written
#pragma unroll
      for (int nt = 0; nt < NS; ++nt) {
        o[mt][nt][2 * hi] *= sc;
        o[mt][nt][2 * hi + 1] *= sc;
      }
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
                                            const Launch& launch) {
  const dim3 grid(unsigned(num_tiles), unsigned(a.kv_heads));
  constexpr int T = flash_threads<D>();
  switch (gqa_group_pad(group)) {
    case 1: return launch_kernel(flash_attention_kernel<D, 1>, grid, T, launch, a, tiles);
    case 2: return launch_kernel(flash_attention_kernel<D, 2>, grid, T, launch, a, tiles);
    case 4: return launch_kernel(flash_attention_kernel<D, 4>, grid, T, launch, a, tiles);
    default: return launch_kernel(flash_attention_kernel<D, 8>, grid, T, launch, a, tiles);
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
                                          const Launch& launch) {
  if (a.rows <= 0 || num_tiles == 0) return cudaSuccess;
  if (num_tiles < 0 || tiles == nullptr || a.kv_heads <= 0 || a.kv_heads > 65535 || a.heads % a.kv_heads != 0)
    return cudaErrorInvalidValue;
  const int group = a.heads / a.kv_heads;
  if (!flash_attention_supported(head_dim, group)) return cudaErrorInvalidValue;
  switch (head_dim) {
    case 64: return launch_flash_attention_d<64>(a, tiles, num_tiles, group, launch);
    case 128: return launch_flash_attention_d<128>(a, tiles, num_tiles, group, launch);
    case 256: return launch_flash_attention_d<256>(a, tiles, num_tiles, group, launch);
    default: return launch_flash_attention_d<512>(a, tiles, num_tiles, group, launch);
  }
}

}  // namespace kernels
}  // namespace gemma4_t4
