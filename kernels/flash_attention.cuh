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
// rows, never written. Keys go in tiles of BN = 16 from lo(first row) to p(last row): only the key range the
// tile's rows can see, so a window-512 layer reads ~515 keys per block and a full layer p + 1, whatever the
// prompt length (no O(prompt^2) memory, no clamp).
//
// Warps split the head dimension: warp w owns channels [64 w, 64 w + 64) -- D / 64 warps (1 / 2 / 4 / 8 at
// D = 64 / 128 / 256 / 512) -- of q, k, v and the output, so per-thread state does not grow with D:
//   q    A fragments of its 64 channels for the 32 rows, in registers for the whole kernel (32 regs)
//   o    its 32 x 64 fp32 output slice (64 regs)
// and each warp streams its own 64-channel slice of every K/V row (128 contiguous bytes) through a private
// shared buffer: no block barrier guards K/V. Per key tile:
//   1. K slice -> shared (from registers loaded one step earlier); V slice loads issued (held in registers)
//   2. partial scores S_w = Q[:, slice] K[:, slice]^T (32 x 16, m16n8k8, ldmatrix) -> shared     | barrier
//   3. every thread: W threads per row sum the W partials (= q . k), mask (causal + window, per position),
//      online softmax in fp32 (running max m, sum l per row), P = exp(s - m) rounded to fp16 -> shared, and
//      l accumulates the ROUNDED p (so the weights P.V uses sum exactly to l); rescale factor -> shared  | barrier
//   4. V slice -> shared (same buffer as K), next K slice loads issued; o = o * alpha + P V (ldmatrix.trans
//      gives V's B fragments straight from the [key][channel] layout)
// Finally o / l -> fp16 (saturating). A masked row keeps m = -inf; exp is then taken against 0, so such a
// row (padding, or a row whose window starts in a later key tile) gets p = 0 and alpha = 0, never NaN.
// Keys past the tile's last position are loaded as zeros (their p is 0 anyway; zeros keep 0 * v finite).
//
// Shared memory (static, no opt-in): per warp a K/V slice 16 x (64 + 8) fp16 (2304 B; the 16-byte row pad
// keeps ldmatrix conflict-free) and 32 x 16 fp32 partial scores (2048 B); P 32 x (16 + 8) fp16 (1536 B);
// 2 x 32 fp32 row factors. D = 64: ~6 KiB, D = 128: 10,496 B, D = 256: 19,200 B, D = 512: 36,608 B. Block: D / 2
// threads.
//
// sm_75 rules: fp16 mma.sync.aligned.m16n8k8 with fp32 accumulators and ldmatrix (both sm_75); no
// m16n8k16, cp.async, bf16 or anything newer. The global loads are plain 16-byte loads issued a phase ahead
// of their use (register double-buffering stands in for cp.async).
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
constexpr int kFlashKeys = 16;   // keys per tile
constexpr int kFlashSlice = 64;  // head-dimension channels per warp

template <int D>
__host__ __device__ constexpr int flash_threads() {
  return D / kFlashSlice * 32;
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

// ---- kernel ----

// D: head dim (64, 128, 256, 512); G: query heads folded per KV head (1, 2, 4, 8; the real group is
// a.heads / a.kv_heads <= G). Grid (num_tiles, kv_heads), flash_threads<D>() threads.
// tiles: [num_tiles] {first row, row count}: see launch_flash_attention.
template <int D, int G>
static __global__ void __launch_bounds__(flash_threads<D>())
    flash_attention_kernel(AttnArgs a, const int2* __restrict__ tiles) {
  constexpr int W = D / kFlashSlice, THREADS = 32 * W;
  constexpr int BM = kFlashRows, BN = kFlashKeys, MT = BM / 16;
  constexpr int NS = kFlashSlice / 8;                    // 8-wide k-steps (scores) / n-tiles (output) in a warp's slice
  constexpr int TPR = THREADS / BM;                      // softmax threads per row (= W)
  constexpr int KPT = BN / TPR;                          // keys per softmax thread
  constexpr int KV_LD = kFlashSlice + 8, P_LD = BN + 8;  // padded rows (fp16): 144 B / 48 B
  static_assert(D % kFlashSlice == 0 && W >= 1 && W <= 8, "head dim 64, 128, 256 or 512");
  static_assert(G == 1 || G == 2 || G == 4 || G == 8, "group folded as 1, 2, 4 or 8 heads");
  static_assert(BN % TPR == 0 && (KPT == 2 || KPT % 4 == 0), "softmax thread layout");

  __shared__ __align__(16) half kv_s[W][BN][KV_LD];  // per warp: K slice, then V slice, of the key tile
  __shared__ __align__(16) float s_s[W][BM][BN];     // per warp: partial scores over its channels
  __shared__ __align__(16) half p_s[BM][P_LD];       // softmax numerators, fp16 (A operand of P.V)
  __shared__ float alpha_s[BM], inv_l_s[BM];         // per-row rescale of o; 1 / l at the end

  // Heaviest tiles (latest positions, most keys) first: the tail of the grid is then short blocks.
  const int2 tile = tiles[gridDim.x - 1 - blockIdx.x];
  const int first = tile.x, count = min(tile.y, BM / G);
  if (count <= 0) return;  // uniform over the block
  const int kvh = blockIdx.y;
  const int group = a.heads / a.kv_heads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int col0 = warp * kFlashSlice;  // this warp's channels [col0, col0 + 64)

  const int idx = a.seq[first] * a.layers + a.layer;
  const half* __restrict__ K = a.kbase[idx];
  const half* __restrict__ V = a.vbase[idx];
  const int cap = a.capacity[idx];
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

  // softmax role: row srow, keys [spart * KPT, spart * KPT + KPT) of each tile
  const int srow = tid / TPR, spart = tid % TPR;
  const int spos = (srow / G < count && srow % G < group) ? a.pos[first + srow / G] : -1;  // -1: masked row
  const int slo = a.window > 0 ? max(0, spos - a.window + 1) : 0;
  float m_run = -INFINITY, l_run = 0.f;

  // K/V slice rows of a key tile: lane loads 16 bytes of rows lane / 8 + 4 i, i < 4 (a warp: 4 rows of
  // 128 contiguous bytes per instruction). Keys past kend read as zeros.
  uint4 kv_r[4];
  auto load_rows = [&](const half* __restrict__ base, int k0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = k0 + (lane >> 3) + 4 * i;
      kv_r[i] = make_uint4(0u, 0u, 0u, 0u);
      if (j <= kend)
        kv_r[i] =
            __ldg(reinterpret_cast<const uint4*>(base + (size_t(j % cap) * a.kv_heads + kvh) * D + col0) + (lane & 7));
    }
  };
  auto store_rows = [&]() {
    __syncwarp();  // the warp's previous ldmatrix reads of the buffer are done
#pragma unroll
    for (int i = 0; i < 4; ++i) *reinterpret_cast<uint4*>(&kv_s[warp][(lane >> 3) + 4 * i][(lane & 7) * 8]) = kv_r[i];
    __syncwarp();
  };

  float o[MT][NS][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NS; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[mt][nt][c] = 0.f;

  load_rows(K, kbeg);
  for (int k0 = kbeg; k0 <= kend; k0 += BN) {
    store_rows();  // K slice
    load_rows(V, k0);

    // ---- partial scores over this warp's channels: s[mt][nt] = 16 rows x 8 keys ----
    float s[MT][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) s[mt][nt][c] = 0.f;
#pragma unroll
    for (int k2 = 0; k2 < NS / 2; ++k2) {
      // matrices: 0 = (keys 0-7, channels 16 k2 + 0-7), 1 = (keys 0-7, +8-15), 2 / 3 = keys 8-15
      uint32_t b[4];
      flash_ldsm_x4(b, &kv_s[warp][(lane >> 4) * 8 + (lane & 7)][k2 * 16 + ((lane >> 3) & 1) * 8]);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        flash_mma(s[mt][0], qa[mt][2 * k2][0], qa[mt][2 * k2][1], b[0]);
        flash_mma(s[mt][0], qa[mt][2 * k2 + 1][0], qa[mt][2 * k2 + 1][1], b[1]);
        flash_mma(s[mt][1], qa[mt][2 * k2][0], qa[mt][2 * k2][1], b[2]);
        flash_mma(s[mt][1], qa[mt][2 * k2 + 1][0], qa[mt][2 * k2 + 1][1], b[3]);
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        *reinterpret_cast<float2*>(&s_s[warp][mt * 16 + g][nt * 8 + 2 * t]) = make_float2(s[mt][nt][0], s[mt][nt][1]);
        *reinterpret_cast<float2*>(&s_s[warp][mt * 16 + g + 8][nt * 8 + 2 * t]) =
            make_float2(s[mt][nt][2], s[mt][nt][3]);
      }
    __syncthreads();

    // ---- online softmax: TPR threads per row, KPT keys each ----
    {
      float sv[KPT];
#pragma unroll
      for (int k = 0; k < KPT; ++k) sv[k] = 0.f;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float* src = &s_s[w][srow][spart * KPT];
        if constexpr (KPT == 2) {
          const float2 v = *reinterpret_cast<const float2*>(src);
          sv[0] += v.x;
          sv[1] += v.y;
        } else {
#pragma unroll
          for (int k = 0; k < KPT; k += 4) {
            const float4 v = *reinterpret_cast<const float4*>(src + k);
            sv[k] += v.x;
            sv[k + 1] += v.y;
            sv[k + 2] += v.z;
            sv[k + 3] += v.w;
          }
        }
      }
      float mx = -INFINITY;
#pragma unroll
      for (int k = 0; k < KPT; ++k) {
        const int j = k0 + spart * KPT + k;
        if (j < slo || j > spos) sv[k] = -INFINITY;
        mx = fmaxf(mx, sv[k]);
      }
#pragma unroll
      for (int off = 1; off < TPR; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m_run, mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: exp(-inf) = 0, no NaN
      const float alpha = __expf(m_run - m_use);
      float sum = 0.f;
      half ph[KPT];
#pragma unroll
      for (int k = 0; k < KPT; ++k) {
        ph[k] = __float2half_rn(__expf(sv[k] - m_use));
        sum += __half2float(ph[k]);
      }
#pragma unroll
      for (int off = 1; off < TPR; off <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      l_run = l_run * alpha + sum;
      m_run = m_new;
#pragma unroll
      for (int k = 0; k < KPT; k += 2)
        *reinterpret_cast<half2*>(&p_s[srow][spart * KPT + k]) = __halves2half2(ph[k], ph[k + 1]);
      if (spart == 0) alpha_s[srow] = alpha;
    }
    __syncthreads();

    store_rows();  // V slice (this warp's K reads ended before the first barrier)
    if (k0 + BN <= kend) load_rows(K, k0 + BN);

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
    // P A-fragments: pa[mt] = {a0, a1} of keys 0-7, then {a0, a1} of keys 8-15
    uint32_t pa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      flash_ldsm_x4(pa[mt], &p_s[mt * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)][(lane >> 4) * 8]);
#pragma unroll
    for (int n2 = 0; n2 < NS / 2; ++n2) {
      // matrices: 0 = (keys 0-7, channels 16 n2 + 0-7), 1 = (keys 8-15, same), 2 / 3 = channels + 8-15
      uint32_t b[4];
      flash_ldsm_x4_trans(b, &kv_s[warp][((lane >> 3) & 1) * 8 + (lane & 7)][(2 * n2 + (lane >> 4)) * 8]);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        flash_mma(o[mt][2 * n2], pa[mt][0], pa[mt][1], b[0]);
        flash_mma(o[mt][2 * n2], pa[mt][2], pa[mt][3], b[1]);
        flash_mma(o[mt][2 * n2 + 1], pa[mt][0], pa[mt][1], b[2]);
        flash_mma(o[mt][2 * n2 + 1], pa[mt][2], pa[mt][3], b[3]);
      }
    }
    // The next tile's first barrier orders these p_s / alpha_s reads before their next writes.
  }

  if (spart == 0) inv_l_s[srow] = l_run > 0.f ? 1.f / l_run : 0.f;
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int m = mt * 16 + hi * 8 + g, i = m / G, h = m % G;
      if (i >= count || h >= group) continue;
      const float sc = inv_l_s[m];
      half* orow = a.out + (size_t(first + i) * a.heads + kvh * group + h) * D + col0 + 2 * t;
#pragma unroll
      for (int nt = 0; nt < NS; ++nt)
        *reinterpret_cast<half2*>(orow + nt * 8) =
            __halves2half2(to_half_sat(o[mt][nt][2 * hi] * sc), to_half_sat(o[mt][nt][2 * hi + 1] * sc));
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
    case 1: flash_attention_kernel<D, 1><<<grid, T, 0, stream>>>(a, tiles); break;
    case 2: flash_attention_kernel<D, 2><<<grid, T, 0, stream>>>(a, tiles); break;
    case 4: flash_attention_kernel<D, 4><<<grid, T, 0, stream>>>(a, tiles); break;
    default: flash_attention_kernel<D, 8><<<grid, T, 0, stream>>>(a, tiles); break;
  }
  return cudaGetLastError();
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
