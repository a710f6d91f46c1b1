// Kernel lab: prefill attention on the tensor cores (kernels/flash_attention.cuh), the attention of every
// forward pass that holds a prompt chunk (issue 17: a fifth of a 4,096-token TTFT, bench/RESULTS.md
// 2026-12-03 (d)).
//
//   lab_flash_attention [VERSIONS] [--rows 512,2048] [--reps 20] [--samples 5] [--validate-only]
//
// VERSIONS: a comma list (default 1,2,3); every case is timed under each listed version that implements it.
//   1  the shipped kernel, through its launcher (launch_flash_attention, the table from flash_attention_tiles):
//      a block takes 32 MMA rows (4 positions x 8 heads on E2B, where 8 query heads share each KV head); its
//      D / 64 warps split the head dimension, so each warp's partial scores go through shared memory to be
//      summed by every thread before the softmax. Head dims 64..512.
//   2  64 MMA rows per block (8 positions x 8 heads) in 8 warps, which split ROWS and KEYS for the scores
//      (warp w: rows 16 (w / 2) .. + 15, keys 16 (w % 2) .. + 15 of the tile, q of its 16 rows x D in
//      registers) and CHANNELS for P.V (warp w: o of all 64 rows x channels D/8 w .. + D/8). The scores need
//      no cross-warp sum; the block shares one K tile in shared memory, each warp loads its own V slice.
//      Per position a block reads half the K/V bytes of version 1 from L2. Head dims 128 and 256 (E2B's
//      sliding layers); D = 512 would need q of 16 rows x 512 (128 registers) beside o (64): not here.
//   3  version 1's structure (64-channel warps, partial scores summed in shared memory) with 48 MMA rows per
//      block (6 positions x 8 heads) and 16-key tiles: registers hold q and o of 48 rows (48 + 96) and one
//      tile's K and V slices in flight (32). Two thirds of version 1's K/V bytes per position from L2, at a
//      third more barriers per (row, key). Head dims 256 and 512, so it also covers E2B's full layers.
//
// The question (written 2026-12-05 without a device, not yet run): is version 1 bound by the K/V bytes its
// blocks pull from L2? Every block re-reads the whole key range of its 4 positions: at 2048-row passes that is
// 512 blocks x ~3,000 keys x 2 KB for a D-512 layer, ~3 GB per layer and pass from L2 for 0.1 TFLOP of mma.
// The last measurement (2026-12-02: 235 us for 512 rows at positions 3584..4095, D 512) is ~4.2 TB/s of such
// traffic, near what an H100-class L2 delivers; an ncu profile of the shipped kernel has not been taken.
// Each timed line prints the modelled L2 -> SM bytes (the key tiles each block loads, K and V) as GB/s beside
// TFLOP/s, and a 4,096-token E2B prefill in 2048-row passes is summed from the cases (28 sliding layers, 7
// full). If versions 2 and 3 gain in proportion to the bytes they save (1/2, 1/3), the traffic is the limit; if
// they do not, the per-tile chain (barriers, the softmax between two mma phases) is -- and version 3, with a third
// more barriers per (row, key), then loses.
//
// Validation comes first: every listed version at odd sizes (head dims, groups 1/2/3/8, two KV heads, windows,
// several sequences in one pass, rings that wrap inside a key tile) and at E2B's shapes, against a host
// reference in double from the logical K/V (the caches are rings filled in position order, as the backend
// fills them). Outputs and a guard after them poisoned (NaN) before each launch; every output element finite,
// max |got - ref| / max |ref| <= 2e-3 (fp16 P, fp16 out: the GPU test's tolerance), the guard untouched.
// A failure exits with status 1 before any timing.
// Timing: cudaEvents around --reps back-to-back launches, median of --samples; q, K and V as a prefill pass
// leaves them (just written, mostly in L2).
#include <random>

#include "../kernels/flash_attention.cuh"
#include "lab.cuh"

namespace kn = gemma4_t4::kernels;
using kn::AttnArgs;

namespace {

constexpr int kVersions = 3;
const char* const kAbout[kVersions + 1] = {
    "",
    "shipped: 32 MMA rows per block, warps split the head dim (launch_flash_attention)",
    "64 MMA rows per block, warps split rows x keys (scores) and channels (P.V); D 128, 256",
    "version 1's warps (64-channel slices) with 48 MMA rows per block and 16-key tiles; D 256, 512",
};

// ---- version 2: 64 MMA rows per block, warps split rows and keys for the scores, channels for P.V ----

constexpr int kV2Rows = 64;      // MMA rows per block: (position, head) pairs, four m16 tiles
constexpr int kV2Keys = 32;      // keys per tile
constexpr int kV2Threads = 256;  // 8 warps

// Per block (D = 256): K tile [32][D + 8] fp16 (16.5 KiB, every warp's B operand of the scores), V tile
// [32][D + 8] fp16 (each warp writes and reads only its own D / 8 channels), scores 2 x [64][16] fp32 (one
// array per 16-key half, the shipped kernel's swizzle), P [64][40] fp16, alpha and l [64] fp32: 47,424 B.
template <int D>
struct V2Smem {
  static constexpr int KV_LD = D + 8, P_LD = kV2Keys + 8;
  static constexpr int KV_BYTES = kV2Keys * KV_LD * 2;
  static constexpr int PART_OFF = (kV2Rows * 16 * 4 + 64) / 4;  // floats between the two halves
  static constexpr int S_BYTES = 4 * PART_OFF + kV2Rows * 16 * 4;
  static constexpr int P_BYTES = kV2Rows * P_LD * 2;
  static constexpr int K_OFF = 0, V_OFF = KV_BYTES, S_OFF = 2 * KV_BYTES, P_OFF = S_OFF + S_BYTES;
  static constexpr int A_OFF = P_OFF + P_BYTES, L_OFF = A_OFF + kV2Rows * 4;
  static constexpr int BYTES = L_OFF + kV2Rows * 4;
};

// Grid (num_tiles, kv_heads), 256 threads. tiles: {first row, count <= 64 / G} of one sequence at consecutive
// positions, as launch_flash_attention's contract (with 64 / G positions per tile instead of 32 / G).
template <int D, int G>
__global__ void __launch_bounds__(kV2Threads) flash_rows_kernel(AttnArgs a, const int2* __restrict__ tiles) {
  using S = V2Smem<D>;
  constexpr int BM = kV2Rows, BN = kV2Keys, MT = BM / 16;
  constexpr int KS = D / 8;                   // k8 steps of a score (the whole head dim)
  constexpr int SL = D / 8;                   // P.V channels per warp
  constexpr int NT = SL / 8;                  // n8 tiles of o per m16 tile
  constexpr int KCR = D / 8;                  // 16-byte chunks per K row
  constexpr int KPT = BN * KCR / kV2Threads;  // K chunks per thread per tile
  constexpr int VCR = SL / 8;                 // 16-byte chunks per row of a warp's V slice
  constexpr int VPL = BN * VCR / 32;          // V chunks per lane per tile
  constexpr int TPR = kV2Threads / BM;        // softmax threads per row (4)
  constexpr int CPT = BN / 4 / TPR;           // 4-key chunks per softmax thread (2)
  static_assert(D == 128 || D == 256, "version 2: head dim 128 or 256");
  static_assert(G == 1 || G == 2 || G == 4 || G == 8, "group folded as 1, 2, 4 or 8 heads");
  static_assert(KPT >= 1 && BN * KCR % kV2Threads == 0 && VPL >= 1 && SL % 16 == 0 && CPT >= 1, "tiling");
  static_assert(S::BYTES <= 48 * 1024, "static shared memory");

  __shared__ __align__(16) unsigned char smem[S::BYTES];
  half(*const kt)[S::KV_LD] = reinterpret_cast<half(*)[S::KV_LD]>(smem + S::K_OFF);
  half(*const vt)[S::KV_LD] = reinterpret_cast<half(*)[S::KV_LD]>(smem + S::V_OFF);
  float* const sp = reinterpret_cast<float*>(smem + S::S_OFF);
  half(*const p_s)[S::P_LD] = reinterpret_cast<half(*)[S::P_LD]>(smem + S::P_OFF);
  float* const alpha_s = reinterpret_cast<float*>(smem + S::A_OFF);
  float* const l_s = reinterpret_cast<float*>(smem + S::L_OFF);

  const int2 tile = tiles[gridDim.x - 1 - blockIdx.x];  // heaviest tiles first, as version 1
  const int first = tile.x, count = min(tile.y, BM / G);
  if (count <= 0) return;
  const int kvh = blockIdx.y, group = a.heads / a.kv_heads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int mi = warp >> 1, kh = warp & 1;  // scores: m16 tile, 16-key half
  const int c0 = warp * SL;                 // P.V: this warp's channels

  const int idx = a.seq[first] * a.layers + a.layer;
  const int cap = a.capacity[idx];
  const size_t rs = size_t(a.kv_heads) * D;
  const half* __restrict__ Kb = a.kbase[idx] + size_t(kvh) * D;
  const half* __restrict__ Vb = a.vbase[idx] + size_t(kvh) * D + c0;
  const int kbeg = a.window > 0 ? max(0, a.pos[first] - a.window + 1) : 0;
  const int kend = a.pos[first + count - 1];

  // q A fragments of rows 16 mi + g (+ 8), all D channels
  uint32_t qa[KS][2];
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int m = mi * 16 + hi * 8 + g, i = m / G, h = m % G;
    const bool valid = i < count && h < group;
    const uint32_t* qr =
        valid ? reinterpret_cast<const uint32_t*>(a.q + (size_t(first + i) * a.heads + kvh * group + h) * D + 2 * t)
              : nullptr;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) qa[ks][hi] = valid ? qr[ks * 4] : 0u;
  }

  const int srow = tid / TPR, spart = tid % TPR;
  const int spos = (srow / G < count && srow % G < group) ? a.pos[first + srow / G] : -1;
  const int slo = a.window > 0 ? max(0, spos - a.window + 1) : 0;
  float m_run = -INFINITY, l_run = 0.f;

  // One 16-byte chunk (key row r of the tile at k0, ring slot s0 + r, 8 channels at `off`) or zeros past kend.
  auto chunk = [&](const half* __restrict__ base, int k0, int s0, int r, int off, bool fast) -> uint4 {
    if (fast) return __ldg(reinterpret_cast<const uint4*>(base + size_t(s0 + r) * rs + off));
    if (k0 + r > kend) return make_uint4(0u, 0u, 0u, 0u);
    int sl = s0 + r;
    if (sl >= cap) sl %= cap;
    return __ldg(reinterpret_cast<const uint4*>(base + size_t(sl) * rs + off));
  };
  auto load_k = [&](uint4(&r)[KPT], int k0, int s0) {
    const bool fast = k0 + BN - 1 <= kend && s0 + BN <= cap;
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      const int q = tid + kV2Threads * i;
      r[i] = chunk(Kb, k0, s0, q / KCR, (q % KCR) * 8, fast);
    }
  };
  auto store_k = [&](const uint4(&r)[KPT]) {
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      const int q = tid + kV2Threads * i;
      *reinterpret_cast<uint4*>(&kt[q / KCR][(q % KCR) * 8]) = r[i];
    }
  };
  auto load_v = [&](uint4(&r)[VPL], int k0, int s0) {
    const bool fast = k0 + BN - 1 <= kend && s0 + BN <= cap;
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int q = lane + 32 * i;
      r[i] = chunk(Vb, k0, s0, q / VCR, (q % VCR) * 8, fast);
    }
  };
  auto store_v = [&](const uint4(&r)[VPL]) {
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int q = lane + 32 * i;
      *reinterpret_cast<uint4*>(&vt[q / VCR][c0 + (q % VCR) * 8]) = r[i];
    }
  };

  float o[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[mt][nt][c] = 0.f;

  const int sstep = BN % cap;
  auto next_slot = [&](int s) {
    s += sstep;
    return s >= cap ? s - cap : s;
  };
  int k0 = kbeg, s0 = k0 % cap;
  uint4 kr[KPT], vr[VPL];
  if (k0 <= kend) {
    load_k(kr, k0, s0);
    load_v(vr, k0, s0);
    store_k(kr);
    if (k0 + BN <= kend) load_k(kr, k0 + BN, next_slot(s0));
  }
  __syncthreads();

  for (; k0 <= kend; k0 += BN) {
    const int s1 = next_slot(s0);
    const bool more = k0 + BN <= kend, more2 = k0 + 2 * BN <= kend;

    // ---- scores of rows 16 mi.. x keys 16 kh.. over all D channels; two accumulator pairs (even / odd k16) ----
    {
      float s[2][2][4];
#pragma unroll
      for (int p = 0; p < 2; ++p)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c) s[p][nt][c] = 0.f;
#pragma unroll
      for (int k2 = 0; k2 < KS / 2; ++k2) {
        uint32_t b[4];  // (keys 0-7, ch 0-7), (keys 0-7, ch 8-15), (keys 8-15, ch 0-7), (keys 8-15, ch 8-15)
        kn::ldsm_x4(b, &kt[kh * 16 + (lane >> 4) * 8 + (lane & 7)][k2 * 16 + ((lane >> 3) & 1) * 8]);
        const int p = k2 & 1;
        kn::mma_16x8x8(s[p][0], qa[2 * k2][0], qa[2 * k2][1], b[0]);
        kn::mma_16x8x8(s[p][1], qa[2 * k2][0], qa[2 * k2][1], b[2]);
        kn::mma_16x8x8(s[p][0], qa[2 * k2 + 1][0], qa[2 * k2 + 1][1], b[1]);
        kn::mma_16x8x8(s[p][1], qa[2 * k2 + 1][0], qa[2 * k2 + 1][1], b[3]);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        float* dst = sp + kh * S::PART_OFF + (((2 * nt + (t >> 1)) ^ kn::flash_swizzle(g)) << 2) + (t & 1) * 2;
        *reinterpret_cast<float2*>(dst + (mi * 16 + g) * 16) =
            make_float2(s[0][nt][0] + s[1][nt][0], s[0][nt][1] + s[1][nt][1]);
        *reinterpret_cast<float2*>(dst + (mi * 16 + g + 8) * 16) =
            make_float2(s[0][nt][2] + s[1][nt][2], s[0][nt][3] + s[1][nt][3]);
      }
    }
    __syncthreads();  // scores visible; every warp is done reading the K tile

    // ---- online softmax over complete scores (one array): TPR threads per row, CPT chunks of 4 keys ----
    kn::flash_softmax_tile<1, CPT, TPR, S::P_LD>(sp, 0, S::PART_OFF, srow, spart, k0, slo, spos, m_run, l_run, p_s,
                                                 alpha_s);
    if (more) store_k(kr);  // the next tile's K: the tile buffer is free since the barrier
    if (more2) load_k(kr, k0 + 2 * BN, next_slot(s1));
    __syncthreads();  // P, alpha and the next K tile visible

    __syncwarp();  // this warp's P.V reads of its V slice (previous tile) are done
    store_v(vr);
    __syncwarp();
    if (more) load_v(vr, k0 + BN, s1);

      // ---- o = o * alpha + P V over this warp's channels ----
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float a_lo = alpha_s[mt * 16 + g], a_hi = alpha_s[mt * 16 + g + 8];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        o[mt][nt][0] *= a_lo;
        o[mt][nt][1] *= a_lo;
        o[mt][nt][2] *= a_hi;
        o[mt][nt][3] *= a_hi;
      }
    }
#pragma unroll
    for (int k2 = 0; k2 < BN / 16; ++k2) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        kn::ldsm_x4(pa[mt], &p_s[mt * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)][k2 * 16 + (lane >> 4) * 8]);
#pragma unroll
      for (int n2 = 0; n2 < NT / 2; ++n2) {
        uint32_t b[4];
        kn::ldsm_x4_trans(b, &vt[k2 * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)][c0 + (2 * n2 + (lane >> 4)) * 8]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          kn::mma_16x8x8(o[mt][2 * n2], pa[mt][0], pa[mt][1], b[0]);
          kn::mma_16x8x8(o[mt][2 * n2 + 1], pa[mt][0], pa[mt][1], b[2]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          kn::mma_16x8x8(o[mt][2 * n2], pa[mt][2], pa[mt][3], b[1]);
          kn::mma_16x8x8(o[mt][2 * n2 + 1], pa[mt][2], pa[mt][3], b[3]);
        }
      }
    }
    s0 = s1;
  }

  if (spart == 0) l_s[srow] = l_run;
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int m = mt * 16 + hi * 8 + g, i = m / G, h = m % G;
      if (i >= count || h >= group) continue;
      const float l = l_s[m];
      const float sc = l > 0.f ? 1.f / l : 0.f;
      half* orow = a.out + (size_t(first + i) * a.heads + kvh * group + h) * D + c0 + 2 * t;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        *reinterpret_cast<half2*>(orow + nt * 8) =
            __halves2half2(kn::to_half_sat(o[mt][nt][2 * hi] * sc), kn::to_half_sat(o[mt][nt][2 * hi + 1] * sc));
    }
}

template <int D>
cudaError_t launch_flash_rows_d(const AttnArgs& a, const int2* tiles, int num_tiles, int group, cudaStream_t s) {
  const dim3 grid(unsigned(num_tiles), unsigned(a.kv_heads));
  switch (kn::gqa_group_pad(group)) {
    case 1: return kn::launch_kernel(flash_rows_kernel<D, 1>, grid, kV2Threads, kn::Launch(s), a, tiles);
    case 2: return kn::launch_kernel(flash_rows_kernel<D, 2>, grid, kV2Threads, kn::Launch(s), a, tiles);
    case 4: return kn::launch_kernel(flash_rows_kernel<D, 4>, grid, kV2Threads, kn::Launch(s), a, tiles);
    default: return kn::launch_kernel(flash_rows_kernel<D, 8>, grid, kV2Threads, kn::Launch(s), a, tiles);
  }
}

// ---- version 3: version 1's warps (each a 64-channel slice of the head dim), 48 MMA rows, 16-key tiles ----

constexpr int kV3Rows = 48;  // MMA rows per block: 6 positions x 8 heads on E2B (three m16 tiles)
constexpr int kV3Keys = 16;  // keys per tile

template <int D>
__host__ __device__ constexpr int v3_threads() {
  return D / 64 * 32;
}

// Shared memory: per warp a K/V buffer [16][64 + 8] fp16 (2,304 B) and its partial scores [48][16] fp32 (3 KiB,
// version 1's chunk swizzle), P [48][24] fp16, alpha and l [48] fp32. D 512: 45,696 B; D 256: 24,192 B.
template <int D>
struct V3Smem {
  static constexpr int W = D / 64, KV_LD = 64 + 8, P_LD = kV3Keys + 8;
  static constexpr int BUF_BYTES = kV3Keys * KV_LD * 2, PART_BYTES = kV3Rows * 16 * 4;
  static constexpr int BUF_OFF = 0, PART_OFF = W * BUF_BYTES, P_OFF = PART_OFF + W * PART_BYTES;
  static constexpr int A_OFF = P_OFF + kV3Rows * P_LD * 2, L_OFF = A_OFF + kV3Rows * 4;
  static constexpr int BYTES = L_OFF + kV3Rows * 4;
};

// Grid (num_tiles, kv_heads), v3_threads<D>() threads; tiles of <= 48 / G positions.
template <int D, int G>
__global__ void __launch_bounds__(v3_threads<D>()) flash_slim_kernel(AttnArgs a, const int2* __restrict__ tiles) {
  using S = V3Smem<D>;
  constexpr int W = S::W, GT = 32 * W, BM = kV3Rows, BN = kV3Keys, MT = BM / 16, NS = 8;
  constexpr int TPR = (GT / BM >= 4) ? 4 : 2;  // softmax threads per row (power of two; GT / BM is 2.67 or 5.33)
  constexpr int SMT = BM * TPR;                // softmax threads: 192 (D 512) or 96 (D 256)
  constexpr int CPT = BN / 4 / TPR;            // 4-key chunks per softmax thread: 1 or 2
  constexpr int RPL = BN / 4;                  // K/V rows per lane per tile (4 rows x 128 B per warp load)
  static_assert(D == 256 || D == 512, "version 3: head dim 256 or 512");
  static_assert(G == 1 || G == 2 || G == 4 || G == 8, "group folded as 1, 2, 4 or 8 heads");
  static_assert(SMT <= GT && CPT >= 1 && S::BYTES <= 48 * 1024, "tiling");

  __shared__ __align__(16) unsigned char smem[S::BYTES];
  const int2 tile = tiles[gridDim.x - 1 - blockIdx.x];
  const int first = tile.x, count = min(tile.y, BM / G);
  if (count <= 0) return;
  const int kvh = blockIdx.y, group = a.heads / a.kv_heads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int col0 = warp * 64;

  half(*const kv)[S::KV_LD] = reinterpret_cast<half(*)[S::KV_LD]>(smem + S::BUF_OFF + warp * S::BUF_BYTES);
  float* const part = reinterpret_cast<float*>(smem + S::PART_OFF + warp * S::PART_BYTES);
  half(*const p_s)[S::P_LD] = reinterpret_cast<half(*)[S::P_LD]>(smem + S::P_OFF);
  float* const alpha_s = reinterpret_cast<float*>(smem + S::A_OFF);
  float* const l_s = reinterpret_cast<float*>(smem + S::L_OFF);

  const int idx = a.seq[first] * a.layers + a.layer;
  const int cap = a.capacity[idx];
  const size_t rs = size_t(a.kv_heads) * D;
  const half* __restrict__ Kl = a.kbase[idx] + size_t(kvh) * D + col0 + (lane & 7) * 8;
  const half* __restrict__ Vl = a.vbase[idx] + size_t(kvh) * D + col0 + (lane & 7) * 8;
  const int kbeg = a.window > 0 ? max(0, a.pos[first] - a.window + 1) : 0;
  const int kend = a.pos[first + count - 1];

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
      for (int ks = 0; ks < NS; ++ks) qa[mt][ks][hi] = valid ? qr[ks * 4] : 0u;
    }

  const bool smax = tid < SMT;  // a softmax thread
  const int srow = smax ? tid / TPR : 0, spart = tid % TPR;
  const int spos = (smax && srow / G < count && srow % G < group) ? a.pos[first + srow / G] : -1;
  const int slo = a.window > 0 ? max(0, spos - a.window + 1) : 0;
  float m_run = -INFINITY, l_run = 0.f;

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
          if (sl >= cap) sl %= cap;
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

  const int sstep = BN % cap;
  int k0 = kbeg, s0 = k0 % cap;
  uint4 kr[RPL], vr[RPL];
  if (k0 <= kend) {
    load_tile(kr, Kl, k0, s0);
    load_tile(vr, Vl, k0, s0);
  }
  for (; k0 <= kend; k0 += BN) {
    const bool more = k0 + BN <= kend;
    int s1 = s0 + sstep;
    if (s1 >= cap) s1 -= cap;

    __syncwarp();
    store_tile(kr);
    __syncwarp();
    if (more) load_tile(kr, Kl, k0 + BN, s1);

    // ---- partial scores over this warp's 64 channels: 48 rows x 16 keys ----
    {
      float s[MT][2][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c) s[mt][nt][c] = 0.f;
#pragma unroll
      for (int k2 = 0; k2 < NS / 2; ++k2) {
        uint32_t b[4];
        kn::ldsm_x4(b, &kv[(lane >> 4) * 8 + (lane & 7)][k2 * 16 + ((lane >> 3) & 1) * 8]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          kn::mma_16x8x8(s[mt][0], qa[mt][2 * k2][0], qa[mt][2 * k2][1], b[0]);
          kn::mma_16x8x8(s[mt][1], qa[mt][2 * k2][0], qa[mt][2 * k2][1], b[2]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          kn::mma_16x8x8(s[mt][0], qa[mt][2 * k2 + 1][0], qa[mt][2 * k2 + 1][1], b[1]);
          kn::mma_16x8x8(s[mt][1], qa[mt][2 * k2 + 1][0], qa[mt][2 * k2 + 1][1], b[3]);
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          float* dst = part + (((2 * nt + (t >> 1)) ^ kn::flash_swizzle(g)) << 2) + (t & 1) * 2;
          *reinterpret_cast<float2*>(dst + (mt * 16 + g) * 16) = make_float2(s[mt][nt][0], s[mt][nt][1]);
          *reinterpret_cast<float2*>(dst + (mt * 16 + g + 8) * 16) = make_float2(s[mt][nt][2], s[mt][nt][3]);
        }
    }
    __syncthreads();

    // ---- online softmax: TPR threads per row of the first SMT threads (whole warps: 192 or 96 threads, so
    // the shuffles' full mask is exact), the W warps' partial scores summed ----
    if (smax)
      kn::flash_softmax_tile<W, CPT, TPR, S::P_LD>(reinterpret_cast<const float*>(smem + S::PART_OFF),
                                                   S::PART_BYTES / 4, 0, srow, spart, k0, slo, spos, m_run, l_run, p_s,
                                                   alpha_s);
    __syncthreads();

    store_tile(vr);
    __syncwarp();
    if (more) load_tile(vr, Vl, k0 + BN, s1);

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
    {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        kn::ldsm_x4(pa[mt], &p_s[mt * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)][(lane >> 4) * 8]);
#pragma unroll
      for (int n2 = 0; n2 < NS / 2; ++n2) {
        uint32_t b[4];
        kn::ldsm_x4_trans(b, &kv[((lane >> 3) & 1) * 8 + (lane & 7)][(2 * n2 + (lane >> 4)) * 8]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          kn::mma_16x8x8(o[mt][2 * n2], pa[mt][0], pa[mt][1], b[0]);
          kn::mma_16x8x8(o[mt][2 * n2 + 1], pa[mt][0], pa[mt][1], b[2]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          kn::mma_16x8x8(o[mt][2 * n2], pa[mt][2], pa[mt][3], b[1]);
          kn::mma_16x8x8(o[mt][2 * n2 + 1], pa[mt][2], pa[mt][3], b[3]);
        }
      }
    }
    s0 = s1;
  }

  if (smax && spart == 0) l_s[srow] = l_run;
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int m = mt * 16 + hi * 8 + g, i = m / G, h = m % G;
      if (i >= count || h >= group) continue;
      const float l = l_s[m];
      const float sc = l > 0.f ? 1.f / l : 0.f;
      half* orow = a.out + (size_t(first + i) * a.heads + kvh * group + h) * D + col0 + 2 * t;
#pragma unroll
      for (int nt = 0; nt < NS; ++nt)
        *reinterpret_cast<half2*>(orow + nt * 8) =
            __halves2half2(kn::to_half_sat(o[mt][nt][2 * hi] * sc), kn::to_half_sat(o[mt][nt][2 * hi + 1] * sc));
    }
}

template <int D>
cudaError_t launch_flash_slim_d(const AttnArgs& a, const int2* tiles, int num_tiles, int group, cudaStream_t s) {
  const dim3 grid(unsigned(num_tiles), unsigned(a.kv_heads));
  switch (kn::gqa_group_pad(group)) {
    case 1: return kn::launch_kernel(flash_slim_kernel<D, 1>, grid, v3_threads<D>(), kn::Launch(s), a, tiles);
    case 2: return kn::launch_kernel(flash_slim_kernel<D, 2>, grid, v3_threads<D>(), kn::Launch(s), a, tiles);
    case 4: return kn::launch_kernel(flash_slim_kernel<D, 4>, grid, v3_threads<D>(), kn::Launch(s), a, tiles);
    default: return kn::launch_kernel(flash_slim_kernel<D, 8>, grid, v3_threads<D>(), kn::Launch(s), a, tiles);
  }
}

// ---- the problems: one prefill pass (runs of rows of several sequences) over ring caches ----

struct Run {
  int seq, p0, n;  // n rows of sequence `seq` at positions p0 .. p0 + n - 1
};

struct Spec {
  std::string name;
  int D, kv_heads, group, window;
  std::vector<Run> runs;
  int ring_extra = 0;  // more ring slots than the least the contract allows (moves the wrap)
};

constexpr size_t kGuard = 64;  // fp16 elements after the output that no launch may touch

struct Problem {
  Spec spec;
  int rows = 0, heads = 0, seqs = 0;
  std::vector<int> seq, pos, cap;
  std::vector<half> q;                         // [rows, heads, D]
  std::vector<std::vector<float>> klog, vlog;  // [seqs] -> [last + 1, kv_heads, D] (fp16 values)
  lab::DevBuf<half> dq, dout;
  std::vector<lab::DevBuf<half>> dk, dv;  // [seqs] ring caches [cap, kv_heads, D]
  lab::DevBuf<half*> dkb, dvb;
  lab::DevBuf<int> dcap, dseq, dpos;
  lab::DevBuf<int2> dtiles[kVersions + 1];
  int ntiles[kVersions + 1] = {};
  double l2_bytes[kVersions + 1] = {};  // modelled K/V bytes the version's blocks load
  double flops = 0;                     // 4 D per (row, head, key)

  AttnArgs args() const {
    AttnArgs a;
    a.q = dq.get();
    a.kbase = dkb.get();
    a.vbase = dvb.get();
    a.capacity = dcap.get();
    a.seq = dseq.get();
    a.pos = dpos.get();
    a.layer = 0;
    a.layers = 1;
    a.rows = rows;
    a.heads = heads;
    a.kv_heads = spec.kv_heads;
    a.window = spec.window;
    a.out = dout.get();
    return a;
  }
};

int positions_per_tile(int version, int group) {
  return (version == 2 ? kV2Rows : version == 3 ? kV3Rows : kn::kFlashRows) / kn::gqa_group_pad(group);
}

int keys_per_tile(int version) { return version == 3 ? kV3Keys : version == 2 ? kV2Keys : kn::kFlashKeys; }

bool implements(int version, int D, int group) {
  if (version == 1) return kn::flash_attention_supported(D, group);
  if (version == 2) return (D == 128 || D == 256) && group >= 1 && group <= 8;
  return (D == 256 || D == 512) && group >= 1 && group <= 8;
}

std::unique_ptr<Problem> make_problem(const Spec& spec, uint64_t seed) {
  auto p = std::make_unique<Problem>();
  p->spec = spec;
  const int D = spec.D, kv = spec.kv_heads;
  p->heads = kv * spec.group;
  for (const Run& r : spec.runs) {
    p->seqs = std::max(p->seqs, r.seq + 1);
    for (int i = 0; i < r.n; ++i) {
      p->seq.push_back(r.seq);
      p->pos.push_back(r.p0 + i);
    }
  }
  p->rows = int(p->seq.size());
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const float q_amp = 4.f / std::sqrt(float(D));  // scores of a few units: softmax neither flat nor one-hot
  p->q.resize(size_t(p->rows) * p->heads * D);
  for (half& x : p->q) x = __float2half(q_amp * u(rng));
  p->klog.resize(size_t(p->seqs));
  p->vlog.resize(size_t(p->seqs));
  p->cap.assign(size_t(p->seqs), 1);
  const size_t row = size_t(kv) * D;
  std::vector<std::vector<half>> kc(size_t(p->seqs), std::vector<half>(row, __float2half(NAN)));
  std::vector<std::vector<half>> vc = kc;
  for (const Run& r : spec.runs) {
    const int last = r.p0 + r.n - 1;
    const int cap = (spec.window > 0 ? spec.window + r.n : last + 1) + spec.ring_extra;
    std::vector<float>&K = p->klog[size_t(r.seq)], &V = p->vlog[size_t(r.seq)];
    K.resize(size_t(last + 1) * row);
    V.resize(K.size());
    for (float& x : K) x = __half2float(__float2half(u(rng)));
    for (float& x : V) x = __half2float(__float2half(u(rng)));
    p->cap[size_t(r.seq)] = cap;
    kc[size_t(r.seq)].assign(size_t(cap) * row, __float2half(NAN));
    vc[size_t(r.seq)].assign(size_t(cap) * row, __float2half(NAN));
    for (int j = 0; j <= last; ++j)  // position order: a ring slot keeps its latest position
      for (size_t c = 0; c < row; ++c) {
        kc[size_t(r.seq)][size_t(j % cap) * row + c] = __float2half(K[size_t(j) * row + c]);
        vc[size_t(r.seq)][size_t(j % cap) * row + c] = __float2half(V[size_t(j) * row + c]);
      }
  }
  p->dq = lab::DevBuf<half>(p->q.size());
  p->dq.upload(p->q);
  p->dout = lab::DevBuf<half>(p->q.size() + kGuard);
  std::vector<half*> kb, vb;
  for (int s = 0; s < p->seqs; ++s) {
    p->dk.emplace_back(kc[size_t(s)].size());
    p->dv.emplace_back(vc[size_t(s)].size());
    p->dk.back().upload(kc[size_t(s)]);
    p->dv.back().upload(vc[size_t(s)]);
    kb.push_back(p->dk.back().get());
    vb.push_back(p->dv.back().get());
  }
  p->dkb = lab::DevBuf<half*>(kb.size());
  p->dkb.upload(kb);
  p->dvb = lab::DevBuf<half*>(vb.size());
  p->dvb.upload(vb);
  p->dcap = lab::DevBuf<int>(p->cap.size());
  p->dcap.upload(p->cap);
  p->dseq = lab::DevBuf<int>(p->seq.size());
  p->dseq.upload(p->seq);
  p->dpos = lab::DevBuf<int>(p->pos.size());
  p->dpos.upload(p->pos);
  for (int r = 0; r < p->rows; ++r) {
    const int ps = p->pos[size_t(r)], lo = spec.window > 0 ? std::max(0, ps - spec.window + 1) : 0;
    p->flops += 4.0 * D * p->heads * (ps - lo + 1);
  }
  for (int v = 1; v <= kVersions; ++v) {
    if (!implements(v, D, spec.group)) continue;
    // the shipped table builder, with this version's positions per tile
    const int P = positions_per_tile(v, spec.group);
    std::vector<int2> tiles;
    for (int r = 0; r < p->rows;) {
      int c = 1;
      while (r + c < p->rows && c < P && p->seq[size_t(r + c)] == p->seq[size_t(r)] &&
             p->pos[size_t(r + c)] == p->pos[size_t(r)] + c)
        ++c;
      tiles.push_back(make_int2(r, c));
      const int lo = spec.window > 0 ? std::max(0, p->pos[size_t(r)] - spec.window + 1) : 0;
      const int keys = p->pos[size_t(r + c - 1)] - lo + 1, bn = keys_per_tile(v);
      const int tile_keys = (keys + bn - 1) / bn * bn;
      p->l2_bytes[v] += double(tile_keys) * kv * D * 2 * 2;
      r += c;
    }
    if (v == 1) {  // the shipped builder must agree with the copy above
      std::vector<int2> ref(size_t(kn::flash_attention_max_tiles(p->rows, int(spec.runs.size()), spec.group)));
      const int n =
          kn::flash_attention_tiles(p->seq.data(), p->pos.data(), p->rows, spec.group, ref.data(), int(ref.size()));
      if (n != int(tiles.size())) {
        std::printf("lab's tile table differs from flash_attention_tiles (%d vs %zu tiles)\n", n, tiles.size());
        std::exit(1);
      }
    }
    p->ntiles[v] = int(tiles.size());
    p->dtiles[v] = lab::DevBuf<int2>(tiles.size());
    p->dtiles[v].upload(tiles);
  }
  return p;
}

// out[r, h] = softmax_j(q . k_j) v_j over j in [lo, p] from the logical K/V, in double.  [rows, heads, D]
std::vector<double> flash_ref(const Problem& p) {
  const int D = p.spec.D, kv = p.spec.kv_heads;
  std::vector<double> out(size_t(p.rows) * p.heads * D, 0.0);
  lab::parallel_for(p.rows, [&](int r) {
    const int s = p.seq[size_t(r)], ps = p.pos[size_t(r)];
    const int lo = p.spec.window > 0 ? std::max(0, ps - p.spec.window + 1) : 0;
    const std::vector<float>&K = p.klog[size_t(s)], &V = p.vlog[size_t(s)];
    std::vector<double> sc(size_t(ps - lo + 1));
    std::vector<double> qd(static_cast<size_t>(D));
    for (int h = 0; h < p.heads; ++h) {
      const int g = h / p.spec.group;
      for (int c = 0; c < D; ++c) qd[size_t(c)] = __half2float(p.q[(size_t(r) * p.heads + h) * D + c]);
      double mx = -INFINITY;
      for (int j = lo; j <= ps; ++j) {
        const float* kr = &K[(size_t(j) * kv + g) * D];
        double d = 0;
        for (int c = 0; c < D; ++c) d += qd[size_t(c)] * kr[c];
        sc[size_t(j - lo)] = d;
        mx = std::max(mx, d);
      }
      double sum = 0;
      for (double& x : sc) sum += x = std::exp(x - mx);
      double* o = &out[(size_t(r) * p.heads + h) * D];
      for (int j = lo; j <= ps; ++j) {
        const float* vr = &V[(size_t(j) * kv + g) * D];
        const double w = sc[size_t(j - lo)] / sum;
        for (int c = 0; c < D; ++c) o[c] += w * vr[c];
      }
    }
  });
  return out;
}

cudaError_t run(int version, const Problem& p, cudaStream_t stream) {
  const AttnArgs a = p.args();
  if (version == 1) return kn::launch_flash_attention(a, p.dtiles[1].get(), p.ntiles[1], p.spec.D, kn::Launch(stream));
  const int2* tiles = p.dtiles[version].get();
  const int n = p.ntiles[version], group = p.spec.group;
  if (version == 2)
    return p.spec.D == 128 ? launch_flash_rows_d<128>(a, tiles, n, group, stream)
                           : launch_flash_rows_d<256>(a, tiles, n, group, stream);
  return p.spec.D == 256 ? launch_flash_slim_d<256>(a, tiles, n, group, stream)
                         : launch_flash_slim_d<512>(a, tiles, n, group, stream);
}

struct VersionStats {
  lab::Tally out{"out fp16", 2e-3};
  int launches = 0;
};

void validate(Problem& p, const std::vector<int>& versions, std::vector<VersionStats>* stats, cudaStream_t stream) {
  const std::vector<double> ref = flash_ref(p);
  for (int v : versions) {
    if (!implements(v, p.spec.D, p.spec.group)) continue;
    VersionStats& st = (*stats)[size_t(v)];
    p.dout.poison();
    const cudaError_t e = run(v, p, stream);
    LAB_CHECK(e);
    LAB_CHECK(cudaStreamSynchronize(stream));
    ++st.launches;
    const std::vector<half> got16 = p.dout.download();
    std::vector<float> got(ref.size());
    for (size_t i = 0; i < got.size(); ++i) got[i] = __half2float(got16[i]);
    lab::Error err = lab::max_rel_error(got, ref);
    for (size_t i = ref.size(); i < got16.size(); ++i) {
      uint16_t bits;
      std::memcpy(&bits, &got16[i], 2);
      if (bits != 0xFFFFu) ++err.stray;
    }
    st.out.add(err, p.spec.name + " v" + std::to_string(v));
  }
}

int usage(const char* argv0) {
  std::printf("usage: %s [VERSIONS 1..%d] [--rows 512,2048] [--reps N] [--samples N] [--validate-only]\n", argv0,
              kVersions);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> rows = {512, 2048};
  lab::CommonArgs common;
  common.versions = {1, 2, 3};
  common.reps = 20;
  common.samples = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (common.take(argc, argv, &i, kVersions)) continue;
    if (arg == "--rows" && i + 1 < argc && lab::parse_ints(argv[++i], &rows)) continue;
    return usage(argv[0]);
  }
  if (std::any_of(rows.begin(), rows.end(), [](int n) { return n < 1 || n > 4096; })) return usage(argv[0]);
  const std::vector<int>& versions = common.versions;

  cudaDeviceProp prop;
  LAB_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  LAB_CHECK(cudaStreamCreate(&stream));
  std::printf("lab_flash_attention on %s (sm_%d%d, %d SMs, L2 %d MiB)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.l2CacheSize >> 20);
  for (int v : versions) std::printf("  version %d: %s\n", v, kAbout[v]);

  // ---- validate
  std::printf(
      "\nvalidating (random inputs, output and guard poisoned; max |got - ref| / max |ref| against the "
      "host, double)\n");
  std::vector<VersionStats> stats(kVersions + 1);
  std::vector<Spec> odd;
  for (int D : {64, 128, 256, 512})
    for (int group : {1, 2, 3, 8})
      for (int window : {0, 37}) {
        const int kv = group == 3 ? 2 : 1;
        const std::string name = "odd D" + std::to_string(D) + " G" + std::to_string(group) + " kv" +
                                 std::to_string(kv) + (window ? " w37" : " full");
        odd.push_back({name, D, kv, group, window, {{0, 0, 77}}, 0});
        odd.push_back({name + " 3 seqs", D, kv, group, window, {{1, 40, 19}, {0, 5, 3}, {2, 90, 45}}, 5});
      }
  odd.push_back({"E2B sliding D256 w512, 100 rows at 700", 256, 1, 8, 512, {{0, 700, 100}}, 0});
  odd.push_back({"E2B sliding D256 w512, 64 rows at 1000, ring + 13", 256, 1, 8, 512, {{0, 1000, 64}}, 13});
#ifdef GEMMA4_T4_EMU  // the CPU emulator (dev/emu.hpp): a full layer's 512 rows would take hours there
  odd.push_back({"E2B full D512, 24 rows at 40", 512, 1, 8, 0, {{0, 40, 24}}, 0});
#else
  odd.push_back({"E2B full D512, 512 rows at 3584", 512, 1, 8, 0, {{0, 3584, 512}}, 0});
  odd.push_back({"E2B sliding D256 w512, 512 rows at 3584", 256, 1, 8, 512, {{0, 3584, 512}}, 0});
#endif
  uint64_t seed = 11;
  for (const Spec& s : odd) validate(*make_problem(s, seed += 7), versions, &stats, stream);
  bool ok = true;
  for (int v : versions) {
    const VersionStats& s = stats[size_t(v)];
    std::printf("  version %d: %d launches; %s max rel err %.2e (tol %.0e), %d failed\n", v, s.launches,
                s.out.what.c_str(), s.out.max_rel, s.out.tol, s.out.failures);
    ok = ok && s.out.failures == 0;
  }
  if (!ok) {
    std::printf("VALIDATION FAILED\n");
    return 1;
  }
  if (common.validate_only) return 0;
#ifdef GEMMA4_T4_EMU
  std::printf("(CPU emulator: validation only)\n");
  return 0;
#endif

  // ---- time: E2B's two attention shapes (8 query heads on 1 KV head), the first and the last chunk of a
  // 4,096-token prompt in passes of `rows` rows
  std::printf(
      "\ntiming (median of %d x %d launches; TFLOP/s = 4 D x (row, head, key) triples / time; L2 GB/s = the "
      "key tiles' K and V bytes each block loads / time, a model)\n",
      common.samples, common.reps);
  std::printf("%-40s %5s %7s %10s %9s %9s\n", "case", "ver", "blocks", "us", "TFLOP/s", "L2 GB/s");
  struct Shape {
    const char* name;
    int D, window, layers;  // layers of E2B with this shape
  };
  const Shape shapes[] = {{"sliding D256 w512", 256, 512, 28}, {"full D512", 512, 0, 7}};
  for (int n : rows) {
    // The prompt's attention per version: the version where it implements the shape, version 1 elsewhere
    // (what the backend would run).
    std::vector<double> prompt_us(kVersions + 1, 0.0);
    const bool whole = 4096 % n == 0;
    for (const Shape& sh : shapes)
      for (int p0 = 0; p0 < 4096; p0 += n) {
        if (!whole && p0 > 0) break;
        const bool report = p0 == 0 || p0 + n == 4096;
        auto p = make_problem({std::string(sh.name), sh.D, 1, 8, sh.window, {{0, p0, n}}, 0}, seed += 7);
        std::vector<double> us(kVersions + 1, -1.0);
        auto time = [&](int v) {
          if (us[size_t(v)] < 0)
            us[size_t(v)] =
                lab::median_us([&](int) { LAB_CHECK(run(v, *p, stream)); }, common.reps, common.samples, stream);
          return us[size_t(v)];
        };
        for (int v : versions) {
          const int u = implements(v, sh.D, 8) ? v : 1;
          prompt_us[size_t(v)] += time(u) * sh.layers;
          if (report && u == v) {
            char name[96];
            std::snprintf(name, sizeof name, "%s, %d rows at %d", sh.name, n, p0);
            std::printf("%-40s %5d %7d %10.1f %9.1f %9.0f\n", name, v, p->ntiles[v], us[size_t(v)],
                        p->flops / us[size_t(v)] / 1e6, p->l2_bytes[v] / us[size_t(v)] / 1e3);
          }
        }
      }
    if (whole)
      for (int v : versions)
        std::printf(
            "  4,096-token E2B prefill in %d-row passes, attention (28 sliding + 7 full layers per pass), "
            "version %d%s: %.2f ms\n",
            n, v, implements(v, 512, 8) ? "" : " (version 1 for D 512)", prompt_us[size_t(v)] / 1e3);
  }
  LAB_CHECK(cudaStreamDestroy(stream));
  return 0;
}
