// Kernel lab: a decode step's matmul chain at one row -- the per-kernel path against one persistent kernel that
// streams every block's weights into shared memory ahead of the dependencies (issue 16).
//
//   lab_decode_chain [VERSIONS] [--layers 35] [--wide-from 15] [--ring-kb 128,64,32] [--reps 20] [--samples 7]
//                    [--validate-only]
//
// The chain: per layer of Gemma 4 E2B's shapes (hidden H = 1536; w4a16 weights in the GEMV word order, fp16 scales
// per 32 columns), with the residual stream h in fp32:
//   x1 = half(norm(h) w_in)                      (layer 0; later layers fold it into the previous residual)
//   y  = x1 Wqkv^T                               q/k/v: 2048 + 256 + 256 outputs
//   a  = half(y[0, 2048))                        stands in for attention (a dependent stage without weights)
//   yo = a Wo^T                                  2048 -> 1536
//   h  = h + norm(yo) w_post1;  x2 = half(norm(h) w_pre2)
//   act = half(gelu_tanh(x2 Wg^T) * (x2 Wu^T))   1536 -> I x 2 (I = 6144, or 12288 from layer --wide-from on)
//   yd = act Wd^T                                I -> 1536
//   h  = h + norm(yd) w_post2                    (then the next layer's x1 from it)
// The output is h after the last layer. What it leaves out of a real decode step: attention over the caches, the
// q/k norms and RoPE, the PLE branch, the LM head and the sampling. So its time is a floor on what the matmul part
// of a step costs under each version, not a step.
//
// VERSIONS (default 1,19,25,26,27,28,29,30: the best measured and the ones not yet timed):
//   1  the shipped kernels, as the CUDA backend launches them at one row: gemv (the q/k/v launch of three
//      matrices), to_half, gemv o_proj (k-split by gemv_store_splits), residual_norm (+ the next norm), gemv
//      gate/up + GELU, gemv down_proj (k-split), residual_norm: 7 launches a layer, captured in one CUDA graph, with
//      programmatic dependent launch where the GPU has it (sm_90+ and a native build).
//   2  one cooperative persistent kernel, one block of 512 threads per SM. Warps 8..15 (producers) copy the block's
//      share of every weight matrix of the whole chain, in chain order, into a ring of --ring-kb KiB of shared
//      memory, limited only by the ring's free space -- so while the block waits for a dependency its next weights
//      are already arriving (sm_75-safe: plain 16-byte loads through registers, no cp.async). Warps 0..7
//      (consumers) run the stages: wait on a global counter per stage (the previous stage's blocks all arrived),
//      build x in shared memory (each block folds the residual norms itself: h lives in every block's registers,
//      so no stage is spent on a norm), run the block's units of the matrix from the ring on the tensor cores
//      (kernels/mma.cuh's m16n8k16 and w4_pairs4, the decode GEMV's dequant), store, and arrive. A unit is a
//      16-row tile of one k-range (choose_parts picks the k-split per matrix so that the units spread evenly over
//      the SMs); the ring holds units in the order both sides walk them. 5 stages a layer (q/k/v, the attention
//      stand-in, o_proj, gate/up, down_proj). Timed at the largest --ring-kb; versions 3-5 at each, version 3 also
//      in lockstep (a stage's weights loaded only once its dependency is met: what the run-ahead buys); versions 3-5
//      and the lockstep run traced per stage (v2_trace).
//   3  version 2's stages with faster producers (each warp copies its own rows of each unit, with compile-time
//      offsets per unit shape, and publishes its own progress: no barrier among the producers) and the consumers'
//      (matrix, k-tile) pairs dealt evenly over their warps.
//   4  version 3 with each consumer warp's ring loads issued before its math, an accumulator per item.
//   5  version 3 with fewer live registers in the producers (only a unit's index, stage and place kept across their
//      loop) and each unit's 16 sums reduced by warp 7, so that warp 0 waits for the next unit meanwhile.
//   6  one cooperative persistent kernel without producers or a ring (direct_kernel): every warp multiplies, from
//      registers. A block's items of a stage (one matrix's 16-row tile x one 128-column k-tile of its units, as in
//      2-5) are dealt over its warps; each warp holds B of them in registers, loads item k + B as item k is done,
//      and loads its first items of the next weighted stage before the block arrives, so they are in flight over
//      the hand-off. The 16 row sums of each item go to shared memory and the epilogue adds a unit's k-tiles in
//      order. The residual stream h lives in shared memory; the folds are two block reductions. 32 warps, B = 2.
//   7  version 6 with 16 warps, B = 4.
//   8  version 6 with the norm weights and the next stage's descriptor read before the stage's wait.
//   9  version 8 with every warp's next-stage loads issued after the block's arrival.
//  10  version 8 with 24 warps, B = 3 (no register spills).
//  11  version 8 with one next-stage item a warp loaded before the arrival, the second once x is built.
//  12  version 11, and after the arrival each warp pulls the rest of its next-stage items into L2.
//  13  version 8 with no next-stage item loaded before the arrival; all of them pulled into L2 after it.
//  14  version 8, and the rest of the next stage pulled into L2 after the arrival.
//  15  version 9 with B = 1.  16  version 9 with 24 warps, B = 2.  17  version 10 with the next-stage loads after the
//      arrival (as version 9). Versions 10 and 15-17 have no register spills on sm_90.
//  18  version 9 with warp 0 taking no items: the thread that polls and arrives has no weight loads in flight, so
//      whether the hand-off waits behind the SM's loads or only behind its own warp's shows.  19  version 17 with it.
//  20  version 19 with down_proj waiting per k-tile, not per stage: gate/up's blocks count their row tiles into a
//      counter per 128-column k-tile of act, and each warp polls the counter of its item's k-tile and reads those
//      128 columns from L2: no stage counter, no block barrier and no x in shared memory before down_proj.
//  21  version 20 with o_proj the same way on a's k-tiles: warp 0 (which takes no items) does the block's share of
//      the attention stand-in as soon as q/k/v's k-tile counters cover it, and counts it into a's.
//  22  version 19 with each residual fold in one block reduction, not two: the sums of y^2, h^2, h y w_post and
//      (y w_post)^2 together give both norms (|h + r y w_post|^2 expanded).  23  version 21 with it.
//  24  version 23 with B = 2 (fewer live registers over the folds).
//  25  version 19 with the folds and the stand-in loading a k-split's parts of y together (4 at a time), not one
//      after another (each load waited for the add before it: one L2 round trip a part).  26  version 25 with
//      version 22's folds.
//  27  version 19 with every hand-off in the data: each value a stage hands on (q's, o_proj's and down_proj's parts,
//      a and act) is stored with its (launch, layer) flag in one 8-byte word, and its readers load until the flag is
//      theirs (NCCL's LL protocol). No stage counter, arrival or stage wait: the hand-off is the one L2 round trip
//      that brings the data. A thread loads the words of 4 parts (8 words of a copied x) at once.  28  version 27
//      with B = 2.  29  version 27 loading 2 parts' words (4 of a copied x) at once.  30  version 29 with B = 2.
//  On the CPU emulator (dev/emu.hpp) versions 1 and 6-30 run the validation with one block (the emulator runs blocks
//  one after another, so a persistent kernel of more would wait forever), with an H100's k-splits.
//
// Validation first: a 3-layer chain (layer 0 narrow, layers 1-2 double-wide) against the host reference (double
// sums of the same fp16 weights, fp16 roundings of x where the kernels round), every selected version, output
// poisoned before the run; then the full chain of each persistent version against version 1 (printed). Timing: the
// median of --samples timings of --reps chained steps (cudaEvents), us per step and weight GB/s against the stream
// read bandwidth this program measures.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "../kernels/decode_step.cuh"  // the counter hand-offs: ld_relaxed, fence_acq_rel_gpu, red_release_add
#include "../kernels/elementwise.cuh"
#include "../kernels/gemv.cuh"
#include "../kernels/rmsnorm.cuh"
#include "lab.cuh"

namespace kn = gemma4_t4::kernels;

namespace {

constexpr int kH = 1536, kQ = 2048, kKV = 256, kQKV = kQ + 2 * kKV;
constexpr float kEps = 1e-6f;
constexpr int kTileCounters = 96;               // versions 20-21: 128-column k-tiles of the widest x (act, 12288 wide)
constexpr int kMaxAct = 12288, kMaxParts = 16;  // versions 27-30's LL buffers: act's width, k-split parts

// ---- the model (device) ----

struct Mat4 {  // one w4a16 matrix [out, in]: GEMV word order, fp16 scales per 32 columns
  lab::DevBuf<uint32_t> q;
  lab::DevBuf<half> s;
  int out = 0, in = 0;
};

struct Layer {
  Mat4 qkv, o, g, u, d;
  lab::DevBuf<float> w_in, w_post1, w_pre2, w_post2;
  int I = 0;
};

void make_mat(Mat4& m, int out, int in, uint64_t seed) {
  m.out = out, m.in = in;
  m.q = lab::DevBuf<uint32_t>(size_t(out) * in / 8);
  m.s = lab::DevBuf<half>(size_t(out) * in / 32);
  lab::fill_bits(m.q.get(), m.q.size(), seed);
  // |w| ~ 4.6 s: y = x W^T of a normalised x has std ~ 4.6 s sqrt(in) ~ 1
  const float c = 1.f / (4.6f * std::sqrt(float(in)));
  lab::fill_uniform(m.s.get(), m.s.size(), 0.5f * c, 1.5f * c, seed + 1);
}

std::vector<Layer> make_model(int layers, int wide_from, uint64_t seed) {
  std::vector<Layer> m(static_cast<size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    Layer& y = m[size_t(l)];
    y.I = l >= wide_from ? 12288 : 6144;
    const uint64_t s = seed + 100 * uint64_t(l);
    make_mat(y.qkv, kQKV, kH, s + 1);
    make_mat(y.o, kH, kQ, s + 3);
    make_mat(y.g, y.I, kH, s + 5);
    make_mat(y.u, y.I, kH, s + 7);
    make_mat(y.d, kH, y.I, s + 9);
    lab::DevBuf<float>* w[4] = {&y.w_in, &y.w_post1, &y.w_pre2, &y.w_post2};
    for (int i = 0; i < 4; ++i) {
      *w[i] = lab::DevBuf<float>(kH);
      lab::fill_uniform(w[i]->get(), kH, 0.5f, 1.5f, s + 20 + uint64_t(i));
    }
  }
  LAB_CHECK(cudaDeviceSynchronize());
  return m;
}

double weight_bytes(const std::vector<Layer>& m) {
  double b = 0;
  for (const Layer& y : m)
    for (const Mat4* x : {&y.qkv, &y.o, &y.g, &y.u, &y.d}) b += x->q.size() * 4.0 + x->s.size() * 2.0;
  return b;
}

// ---- host reference ----

float round_half(double v) { return __half2float(__float2half_rn(float(v))); }

// y = W x with W = half((nibble - 8) * scale) in the GEMV word order (nibbles s, s + 4 = columns 2s, 2s + 1 of the
// word's 8).
std::vector<double> ref_gemv(const Mat4& m, const std::vector<float>& x) {
  const std::vector<uint32_t> q = m.q.download();
  const std::vector<half> s = m.s.download();
  std::vector<double> y(size_t(m.out));
  lab::parallel_for(size_t(m.out), [&](size_t o) {
    double acc = 0;
    for (int j = 0; j < m.in / 8; ++j) {
      const uint32_t w = q[o * size_t(m.in / 8) + size_t(j)];
      const float sc = __half2float(s[o * size_t(m.in / 32) + size_t(j / 4)]);
      for (int k = 0; k < 8; ++k) {
        const int nib = k % 2 == 0 ? k / 2 : 4 + k / 2;  // column 8j + k
        const int v = int((w >> (4 * nib)) & 15u) - 8;
        acc += double(__half2float(__float2half_rn(float(v) * sc))) * double(x[size_t(8 * j + k)]);
      }
    }
    y[o] = acc;
  });
  return y;
}

double ref_rms(const std::vector<double>& v) {
  double ss = 0;
  for (double x : v) ss += x * x;
  return 1.0 / std::sqrt(ss / double(v.size()) + double(kEps));
}

std::vector<double> ref_chain(const std::vector<Layer>& m, const std::vector<float>& h_in) {
  std::vector<double> h(h_in.begin(), h_in.end());
  for (const Layer& y : m) {
    const std::vector<float> w_in = y.w_in.download(), w_post1 = y.w_post1.download(), w_pre2 = y.w_pre2.download(),
                             w_post2 = y.w_post2.download();
    std::vector<float> x(kH);
    double r = ref_rms(h);
    for (int i = 0; i < kH; ++i) x[size_t(i)] = round_half(h[size_t(i)] * r * w_in[size_t(i)]);
    const std::vector<double> qkv = ref_gemv(y.qkv, x);
    std::vector<float> a(kQ);
    for (int i = 0; i < kQ; ++i) a[size_t(i)] = round_half(qkv[size_t(i)]);
    const std::vector<double> yo = ref_gemv(y.o, a);
    r = ref_rms(yo);
    for (int i = 0; i < kH; ++i) h[size_t(i)] += yo[size_t(i)] * r * w_post1[size_t(i)];
    r = ref_rms(h);
    for (int i = 0; i < kH; ++i) x[size_t(i)] = round_half(h[size_t(i)] * r * w_pre2[size_t(i)]);
    const std::vector<double> g = ref_gemv(y.g, x), u = ref_gemv(y.u, x);
    std::vector<float> act(size_t(y.I));
    for (int i = 0; i < y.I; ++i) {
      act[size_t(i)] = round_half(lab::gelu_tanh_ref(g[size_t(i)]) * u[size_t(i)]);
    }
    const std::vector<double> yd = ref_gemv(y.d, act);
    r = ref_rms(yd);
    for (int i = 0; i < kH; ++i) h[size_t(i)] += yd[size_t(i)] * r * w_post2[size_t(i)];
  }
  return h;
}

// ---- version 1: the shipped kernels, launch by launch ----

struct Scratch {  // activations of both versions
  lab::DevBuf<float> h{kH}, h_in{kH}, y_q{kQ}, y_k{kKV}, y_v{kKV}, yqkv, yo, yd;
  lab::DevBuf<half> x1{kH}, x2{kH}, a{kQ}, act{12288};
  lab::DevBuf<unsigned> done, fault{1};  // done: the stage counters, then the k-tile counters (versions 20-21)
  lab::DevBuf<unsigned long long> ll;    // versions 27-30: ChainArgs' LL buffers, zeroed (no flag matches)
  static constexpr size_t kLLWords =
      2 * (size_t(kMaxParts) * kQ + kQ / 2 + size_t(kMaxParts) * kH + kMaxAct / 2 + size_t(kMaxParts) * kH);
  Scratch(int layers, int parts)
      : yqkv(size_t(parts) * kQKV),
        yo(size_t(parts) * kH),
        yd(size_t(parts) * kH),
        done(size_t(5 * layers) + size_t(layers) * 3 * kTileCounters),
        ll(kLLWords) {
    LAB_CHECK(cudaMemset(done.get(), 0, done.size() * sizeof(unsigned)));
    LAB_CHECK(cudaMemset(fault.get(), 0, sizeof(unsigned)));
    LAB_CHECK(cudaMemset(ll.get(), 0, ll.size() * sizeof(unsigned long long)));
  }
};

void v1_step(const std::vector<Layer>& m, Scratch& s, const kn::Launch& L) {
  const int sms = kn::device_sms();
  LAB_CHECK(kn::launch_rmsnorm(s.h.get(), kH, nullptr, m[0].w_in.get(), 1, kH, kEps, s.x1.get(), L));
  for (size_t l = 0; l < m.size(); ++l) {
    const Layer& y = m[l];
    const size_t qw = size_t(kH) / 8, sw = size_t(kH) / 32;
    const kn::GemvMat mats[3] = {
        kn::GemvMat{nullptr, y.qkv.q.get(), y.qkv.s.get(), kQ, s.y_q.get(), kQ},
        kn::GemvMat{nullptr, y.qkv.q.get() + kQ * qw, y.qkv.s.get() + kQ * sw, kKV, s.y_k.get(), kKV},
        kn::GemvMat{nullptr, y.qkv.q.get() + (kQ + kKV) * qw, y.qkv.s.get() + (kQ + kKV) * sw, kKV, s.y_v.get(), kKV}};
    LAB_CHECK(kn::launch_gemv_multi(mats, 3, s.x1.get(), 1, kH, L));
    LAB_CHECK(kn::launch_to_half(s.y_q.get(), kQ, s.a.get(), L));
    const int so = kn::gemv_store_splits(kH, kQ, kn::kGemvW4, sms);
    LAB_CHECK(kn::launch_gemv(nullptr, y.o.q.get(), y.o.s.get(), s.a.get(), 1, kH, kQ, s.yo.get(), kH, L, so, kH));
    LAB_CHECK(kn::launch_residual_norm(s.h.get(), s.yo.get(), y.w_post1.get(), 1, kH, kEps, 1.f, kn::NextNorm::Norm,
                                       y.w_pre2.get(), s.x2.get(), L, so, kH));
    const kn::GemvMat g{nullptr, y.g.q.get(), y.g.s.get(), y.I, nullptr, 0};
    const kn::GemvMat u{nullptr, y.u.q.get(), y.u.s.get(), y.I, nullptr, 0};
    LAB_CHECK(kn::launch_gemv_gelu_mul(g, u, s.x2.get(), 1, kH, s.act.get(), y.I, L));
    const int sd = kn::gemv_store_splits(kH, y.I, kn::kGemvW4, sms);
    LAB_CHECK(kn::launch_gemv(nullptr, y.d.q.get(), y.d.s.get(), s.act.get(), 1, kH, y.I, s.yd.get(), kH, L, sd, kH));
    const bool last = l + 1 == m.size();
    LAB_CHECK(kn::launch_residual_norm(s.h.get(), s.yd.get(), y.w_post2.get(), 1, kH, kEps, 1.f,
                                       last ? kn::NextNorm::None : kn::NextNorm::Norm,
                                       last ? nullptr : m[l + 1].w_in.get(), s.x1.get(), L, sd, kH));
  }
}

// ---- version 2: the persistent chain ----

constexpr int kThreads = 512;  // warps 0..7 consume, 8..15 produce
constexpr int kCons = 256;
constexpr int kUnitMax = 32768;                          // bytes of one unit (the producers' registers hold one)
constexpr int kChunksPerThread = kUnitMax / 16 / kCons;  // 8
constexpr int kHPer = kH / kCons;                        // residual elements per consumer thread: 6
constexpr int kMaxIn = 12288;

struct ChainLayer {
  const uint32_t* q[5];  // q/k/v, o, gate, up, down
  const half* s[5];
  int I = 0;
  int pd = 1;  // down_proj's k-split parts
  const float *w_in, *w_post1, *w_pre2, *w_post2;
};

struct ChainArgs {
  const ChainLayer* layers = nullptr;
  int L = 0;
  const float* h_in = nullptr;
  float* h_out = nullptr;
  float* yqkv = nullptr;     // [pq][kQKV]
  half* a = nullptr;         // [kQ]
  float* yo = nullptr;       // [po][kH]
  half* act = nullptr;       // [I]
  float* yd = nullptr;       // [pd][kH]
  unsigned* done = nullptr;  // [5 L] monotonic: launch e waits for e * gridDim.x
  // versions 20-21: [L][3][kTileCounters] per 128-column k-tile of the next matrix's x, monotonic like done: q/k/v's
  // units of q (8 tiles x pq parts a k-tile), the stand-in's elements of a (128), gate/up's tiles of act (8)
  unsigned* tiles = nullptr;
  unsigned* fault = nullptr;
  // versions 27-30: the hand-offs' LL words (ll_store), each buffer twice (by the layer's parity): q's k-split parts
  // [2][pq][kQ], a's pairs [2][kQ / 2], o_proj's parts [2][po][kH], act's pairs [2][kMaxAct / 2], down_proj's parts
  // [2][kMaxParts][kH]
  unsigned long long *llq = nullptr, *lla = nullptr, *llo = nullptr, *llact = nullptr, *lld = nullptr;
  unsigned epoch = 1;
  int pq = 1, po = 1;
  unsigned ring = 0;  // bytes, a power of two
  int lockstep = 0;   // 1: a stage's weights are loaded only once its dependency is met (what the run-ahead buys)
  // Optional timeline, [5 L][gridDim.x][kSlots] per (stage, block), by the consumers' thread 0: globaltimer ns when
  // the dependency is met, when x is built, when the units are done (before the arrival), and the ns spent waiting
  // for the ring (units not yet stored). Null: off.
  unsigned long long* trace = nullptr;
};
constexpr int kSlots = 4;

// A stage's matrix: M matrices (gate/up: 2) of [out, in], k-split into P parts; units = out / 16 tiles x P.
struct StageMat {
  const uint32_t* q0;
  const uint32_t* q1;
  const half* s0;
  const half* s1;
  int M, out, in, P;
};

enum Kind { kQkv = 0, kAtt = 1, kO = 2, kGu = 3, kDn = 4 };

__device__ __forceinline__ StageMat stage_mat(const ChainArgs& a, const ChainLayer& y, int kind) {
  StageMat m{};
  m.M = 1;
  if (kind == kQkv) m.q0 = y.q[0], m.s0 = y.s[0], m.out = kQKV, m.in = kH, m.P = a.pq;
  if (kind == kO) m.q0 = y.q[1], m.s0 = y.s[1], m.out = kH, m.in = kQ, m.P = a.po;
  if (kind == kGu) m.q0 = y.q[2], m.s0 = y.s[2], m.q1 = y.q[3], m.s1 = y.s[3], m.M = 2, m.out = y.I, m.in = kH, m.P = 1;
  if (kind == kDn) m.q0 = y.q[4], m.s0 = y.s[4], m.out = kH, m.in = y.I, m.P = y.pd;
  return m;
}

// This block's [i0, i1) of n, split evenly over the grid.
__device__ __forceinline__ void block_share(long long n, int* i0, int* i1) {
  *i0 = int(n * blockIdx.x / gridDim.x);
  *i1 = int(n * (blockIdx.x + 1) / gridDim.x);
}

// The block's units of a stage: [u0, u1) of out / 16 * P, split evenly over the grid.
__device__ __forceinline__ void block_units(const StageMat& m, int* u0, int* u1) {
  block_share((long long)(m.out / 16) * m.P, u0, u1);
}

// A unit in the ring: per matrix, the scales [16 rows][ktn * 4] fp16 (8 ktn bytes a row), then the words [16 rows]
// [ktn * 4 chunks of 16 bytes], chunk c of an odd row at c ^ 4 (LDS.128 of rows gid and gid + 1 then hit both bank
// halves). ktn = k-tiles (128 columns) of the unit's part, even.
__device__ __forceinline__ unsigned unit_bytes(int M, int ktn) { return 1152u * unsigned(M) * unsigned(ktn); }

#ifdef GEMMA4_T4_EMU  // the CPU emulator has no named barriers: versions 2-5 do not run there (main refuses them)
__device__ __forceinline__ void bar_cons() { std::abort(); }
__device__ __forceinline__ void bar_prod() { std::abort(); }
#else
__device__ __forceinline__ void bar_cons() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
__device__ __forceinline__ void bar_prod() { asm volatile("bar.sync 2, 256;\n" ::: "memory"); }
#endif

constexpr unsigned long long kSpinNs = 500000000ull;               // a wait this long is a fault
constexpr unsigned kProducerSleepNs = 128, kConsumerSleepNs = 32;  // back-off of the in-block waits

// A counter polled with acquire semantics (each poll), sm_70+.
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
#ifdef GEMMA4_T4_EMU
  return *reinterpret_cast<const volatile unsigned*>(p);
#else
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
#endif
}

// Polls *p until it reaches need (the calling thread only), each poll an acquire load (kAcquire: versions 6+, no
// fence after it, which would wait for the block's weight loads in flight) or relaxed (the caller fences), backing off
// kSleepNs a miss (0: none; on the CPU emulator the back-off is what lets a producing fiber run). The timer and the
// fault flag are read every 256th poll; past kSpinNs the wait sets the fault to `code` and gives up.
template <bool kAcquire, unsigned kSleepNs = 0>
__device__ __forceinline__ void poll_counter(const ChainArgs& a, const unsigned* p, unsigned need, unsigned code) {
  const auto count = [&] { return kAcquire ? ld_acquire(p) : kn::ld_relaxed(p); };
  if (count() >= need) return;
  const unsigned long long t0 = kn::global_ns();
  for (unsigned i = 1; count() < need; ++i) {
    if (kSleepNs) __nanosleep(kSleepNs);
    if ((i & 255u) != 0) continue;
    if (kn::ld_relaxed(a.fault) != 0) break;  // an earlier wait gave up: the launch's results are void
    if (kn::global_ns() - t0 > kSpinNs) {
      atomicCAS(a.fault, 0u, code);
      break;
    }
  }
}

// Polls done[s] until it counts every block of this launch.
template <bool kAcquire>
__device__ __forceinline__ void poll_done(const ChainArgs& a, int s) {
  poll_counter<kAcquire>(a, a.done + s, a.epoch * gridDim.x, unsigned(s) + 1u);
}

// Thread 0 of the consumers: wait until done[s] counts every block of this launch.
__device__ __forceinline__ void wait_stage(const ChainArgs& a, int s) {
  if (threadIdx.x == 0 && s >= 0) {
    poll_done<false>(a, s);
    kn::fence_acq_rel_gpu();
  }
  bar_cons();
}

__device__ __forceinline__ void stamp(const ChainArgs& a, int s, int slot) {
  if (a.trace && threadIdx.x == 0) a.trace[(size_t(s) * gridDim.x + blockIdx.x) * kSlots + slot] = kn::global_ns();
}

__device__ __forceinline__ void arrive_stage(const ChainArgs& a, int s) {
  bar_cons();
  stamp(a, s, 2);
  if (threadIdx.x == 0) kn::red_release_add(a.done + s, 1u);
}

// In-block hand-offs through shared memory (volatile; a fence on each side).
struct RingState {
  unsigned filled;    // stream bytes the producers have stored
  unsigned consumed;  // stream bytes the consumers are done with
  unsigned stage;     // the stage whose dependency the consumers have met (lockstep)
  unsigned fault;
  unsigned wfilled[8];  // version 3: stream bytes each producer warp has stored (its rows of every unit)
};

// Waits until *p >= need (a wrapping compare). The first poll reads no timer; later polls back off by sleep_ns
// (__nanosleep, sm_70+) and read the global timer only every 1024th time: a poll of %globaltimer is not free, and every
// poll of shared memory takes a slot in the pipe that the consumers' loads need.
__device__ __forceinline__ void spin_until_ge(volatile unsigned* p, unsigned need, RingState* rs, unsigned sleep_ns) {
  if (int(*p - need) >= 0) return;
  const unsigned long long t0 = kn::global_ns();
  for (unsigned i = 1;; ++i) {
    if (sleep_ns) __nanosleep(sleep_ns);
    if (int(*p - need) >= 0) return;
    if ((i & 1023u) == 0) {
      if (*reinterpret_cast<volatile unsigned*>(&rs->fault) != 0) return;
      if (kn::global_ns() - t0 > kSpinNs) {
        rs->fault = 1;
        return;
      }
    }
  }
}

// Stage s's dependency is met (lockstep producers wait for this; stored as s + 1, 0 meaning none yet).
__device__ __forceinline__ void begin_stage(const ChainArgs& a, RingState* rs, int s) {
  wait_stage(a, s - 1);
  stamp(a, s, 0);
  if (threadIdx.x == 0) *reinterpret_cast<volatile unsigned*>(&rs->stage) = unsigned(s) + 1u;
}

// Sum over the first NW warps' threads (every one gets it), joined by bar(). part: [NW] shared scratch, free on entry.
template <int NW, typename Bar>
__device__ __forceinline__ float warps_sum(float v, float* part, Bar bar) {
  v = kn::warp_sum(v);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  bar();
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < NW; ++w) s += part[w];
  return s;
}

// Sum over the 256 consumer threads (every one gets it). part: [8] shared scratch, free on entry.
__device__ __forceinline__ float cons_sum(float v, float* part) {
  return warps_sum<8>(v, part, [] { bar_cons(); });
}

// The producers' walk over the block's units, in chain order (stage by stage, unit by unit).
struct UnitIt {
  int l = 0, kind = -1, u = 0, u1 = 0;  // kind -1: before the first stage
  unsigned pos = 0;
};

struct UnitRef {
  StageMat m;
  int u, stage;
  unsigned pos, bytes;
};

__device__ __forceinline__ bool next_unit(const ChainArgs& a, UnitIt& it, UnitRef* r) {
  while (it.u >= it.u1) {
    if (++it.kind == 5) it.kind = 0, ++it.l;
    if (it.l >= a.L) return false;
    if (it.kind == kAtt) continue;
    const StageMat m = stage_mat(a, a.layers[it.l], it.kind);
    block_units(m, &it.u, &it.u1);
  }
  r->m = stage_mat(a, a.layers[it.l], it.kind);
  r->u = it.u++;
  r->stage = 5 * it.l + it.kind;
  r->pos = it.pos;
  r->bytes = unit_bytes(r->m.M, r->m.in / 128 / r->m.P);
  it.pos += r->bytes;
  return true;
}

// Chunk j (16 bytes) of a unit: its source and its offset in the unit.
__device__ __forceinline__ const uint4* chunk_src(const UnitRef& r, int j, unsigned* dst) {
  const StageMat& m = r.m;
  const int ktn = m.in / 128 / m.P, per = 72 * ktn;  // chunks per matrix: 16 rows x (ktn / 2 + 4 ktn)
  const int mi = j / per, jj = j - mi * per;
  const int tile = r.u / m.P, part = r.u - tile * m.P, row0 = tile * 16, kt0 = part * ktn;
  const uint32_t* q = mi ? m.q1 : m.q0;
  const half* s = mi ? m.s1 : m.s0;
  const unsigned base = unsigned(mi) * 1152u * unsigned(ktn);
  if (jj < 8 * ktn) {  // scales: row rr, chunk cc (8 scales)
    const int rr = jj / (ktn / 2), cc = jj - rr * (ktn / 2);
    *dst = base + unsigned(rr * 8 * ktn + cc * 16);
    return reinterpret_cast<const uint4*>(s + size_t(row0 + rr) * (m.in / 32) + kt0 * 4 + cc * 8);
  }
  const int jq = jj - 8 * ktn, rr = jq / (4 * ktn), c = jq - rr * 4 * ktn;
  *dst = base + 128u * unsigned(ktn) + unsigned(rr * 4 * ktn + (c ^ ((rr & 1) << 2))) * 16u;
  return reinterpret_cast<const uint4*>(q + size_t(row0 + rr) * (m.in / 8) + kt0 * 16 + c * 4);
}

__device__ __forceinline__ void load_unit(const UnitRef& r, uint4 (&v)[kChunksPerThread], int pt) {
  const int n = int(r.bytes / 16);
#pragma unroll
  for (int k = 0; k < kChunksPerThread; ++k) {
    const int j = pt + k * kCons;
    unsigned dst;
    if (j < n) v[k] = kn::ld_weights(chunk_src(r, j, &dst), true);
  }
}

__device__ __forceinline__ void store_unit(const ChainArgs& a, const UnitRef& r, const uint4 (&v)[kChunksPerThread],
                                           int pt, unsigned char* ring, RingState* rs) {
  if (pt == 0) spin_until_ge(&rs->consumed, r.pos + r.bytes - a.ring, rs, kProducerSleepNs);
  bar_prod();
  const int n = int(r.bytes / 16);
#pragma unroll
  for (int k = 0; k < kChunksPerThread; ++k) {
    const int j = pt + k * kCons;
    unsigned dst;
    if (j < n) {
      chunk_src(r, j, &dst);
      *reinterpret_cast<uint4*>(ring + ((r.pos + dst) & (a.ring - 1))) = v[k];
    }
  }
  bar_prod();
  if (pt == 0) {
    __threadfence_block();
    *reinterpret_cast<volatile unsigned*>(&rs->filled) = r.pos + r.bytes;
  }
}

// Version 3's producers: each warp copies its own rows (pw and pw + 8 of every matrix) of each unit and publishes its
// own progress, so no barrier joins the producer warps. A unit's shape (matrices M, k-tiles KTN) is a template
// parameter, so a chunk's source and place are compile-time offsets from the unit's row origin: per row, chunks
// 0 .. 4 KTN - 1 are the words and 4 KTN .. 4.5 KTN - 1 the scales; lane l takes chunks l, l + 32, ... of each row.
// (The first form of version 3 found each chunk's place with a multiply-high and the unit's origin with an integer
// division per chunk: ncu counted 538 M instructions a step, most of them the producers' index math.)
template <int M, int KTN>
struct UnitShape {
  static constexpr int kR = KTN * 9 / 2;      // chunks per row
  static constexpr int kIt = (kR + 31) / 32;  // per lane per row
  static_assert(2 * M * kIt <= kChunksPerThread, "a unit's share of one warp must fit its registers");
};

struct UnitOrigin {  // the warp's first row (pw) of each matrix of the unit: words and scales
  const char* q[2];
  const char* s[2];
  unsigned qstride, sstride;  // bytes per row
};

__device__ __forceinline__ UnitOrigin unit_origin(const UnitRef& r, int pw) {
  const StageMat& m = r.m;
  const int ktn = m.in / 128 / m.P, tile = r.u / m.P, part = r.u - tile * m.P;
  const size_t row = size_t(tile) * 16 + size_t(pw);
  UnitOrigin o;
  o.qstride = unsigned(m.in / 2);
  o.sstride = unsigned(m.in / 16);
  o.q[0] = reinterpret_cast<const char*>(m.q0) + row * o.qstride + size_t(part) * ktn * 64;
  o.s[0] = reinterpret_cast<const char*>(m.s0) + row * o.sstride + size_t(part) * ktn * 8;
  o.q[1] = m.M > 1 ? reinterpret_cast<const char*>(m.q1) + row * o.qstride + size_t(part) * ktn * 64 : nullptr;
  o.s[1] = m.M > 1 ? reinterpret_cast<const char*>(m.s1) + row * o.sstride + size_t(part) * ktn * 8 : nullptr;
  return o;
}

// Calls f(m, h, j, slot) for each of this lane's chunks of a unit of shape (M, KTN): matrix m, row pw + 8 h, chunk j
// of the row, register slot (all compile-time after unrolling but j).
template <int M, int KTN, typename F>
__device__ __forceinline__ void unit_chunks(int lane, F f) {
  using S = UnitShape<M, KTN>;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int it = 0; it < S::kIt; ++it) {
        const int j = lane + 32 * it;
        if (j < S::kR) f(m, h, j, (m * 2 + h) * S::kIt + it);
      }
}

template <int M, int KTN>
__device__ __forceinline__ void load_t(const UnitRef& r, uint4 (&v)[kChunksPerThread], int pw, int lane) {
  const UnitOrigin o = unit_origin(r, pw);
  unit_chunks<M, KTN>(lane, [&](int m, int h, int j, int slot) {
    const char* src = j < 4 * KTN ? o.q[m] + size_t(8 * h) * o.qstride + size_t(j) * 16
                                  : o.s[m] + size_t(8 * h) * o.sstride + size_t(j - 4 * KTN) * 16;
    v[slot] = kn::ld_weights(reinterpret_cast<const uint4*>(src), true);
  });
}

template <int M, int KTN>
__device__ __forceinline__ void store_t(const UnitRef& r, const uint4 (&v)[kChunksPerThread], int pw, int lane,
                                        unsigned char* ring, unsigned mask) {
  const unsigned swz = (unsigned(pw) & 1u) << 2;  // rows pw and pw + 8 share the parity
  unit_chunks<M, KTN>(lane, [&](int m, int h, int j, int slot) {
    const unsigned rr = unsigned(pw + 8 * h), base = unsigned(m) * 1152u * KTN;
    const unsigned dst = j < 4 * KTN ? base + 128u * KTN + (rr * 4u * KTN + (unsigned(j) ^ swz)) * 16u
                                     : base + rr * 8u * KTN + unsigned(j - 4 * KTN) * 16u;
    *reinterpret_cast<uint4*>(ring + ((r.pos + dst) & mask)) = v[slot];
  });
}

// E2B's unit shapes: (M, KTN) = (1, 4) q/k/v and o_proj, (2, 12) gate/up, (1, 12) and (1, 24) down_proj; -1: none.
__device__ __forceinline__ int unit_shape(const UnitRef& r) {
  const int ktn = r.m.in / 128 / r.m.P;
  if (r.m.M == 2) return ktn == 12 ? 1 : -1;
  return ktn == 4 ? 0 : ktn == 12 ? 2 : ktn == 24 ? 3 : -1;
}

__device__ __forceinline__ void load3(const UnitRef& r, uint4 (&v)[kChunksPerThread], int pw, int lane, RingState* rs) {
  switch (unit_shape(r)) {
    case 0: load_t<1, 4>(r, v, pw, lane); break;
    case 1: load_t<2, 12>(r, v, pw, lane); break;
    case 2: load_t<1, 12>(r, v, pw, lane); break;
    case 3: load_t<1, 24>(r, v, pw, lane); break;
    default: rs->fault = 2;
  }
}

__device__ __forceinline__ void store3(const ChainArgs& a, const UnitRef& r, const uint4 (&v)[kChunksPerThread], int pw,
                                       int lane, unsigned char* ring, RingState* rs) {
  if (lane == 0) spin_until_ge(&rs->consumed, r.pos + r.bytes - a.ring, rs, kProducerSleepNs);
  __syncwarp();
  const unsigned mask = a.ring - 1;
  switch (unit_shape(r)) {
    case 0: store_t<1, 4>(r, v, pw, lane, ring, mask); break;
    case 1: store_t<2, 12>(r, v, pw, lane, ring, mask); break;
    case 2: store_t<1, 12>(r, v, pw, lane, ring, mask); break;
    case 3: store_t<1, 24>(r, v, pw, lane, ring, mask); break;
    default: rs->fault = 2;
  }
  __syncwarp();
  if (lane == 0) {
    __threadfence_block();
    *reinterpret_cast<volatile unsigned*>(&rs->wfilled[pw]) = r.pos + r.bytes;
  }
}

__device__ void producer3(const ChainArgs& a, unsigned char* ring, RingState* rs) {
  const int pw = (int(threadIdx.x) - kCons) >> 5, lane = threadIdx.x & 31;
  uint4 v0[kChunksPerThread], v1[kChunksPerThread];
  UnitIt it;
  UnitRef r0, r1;
  if (a.lockstep) {
    while (next_unit(a, it, &r0)) {
      if (lane == 0) spin_until_ge(&rs->stage, unsigned(r0.stage) + 1u, rs, kProducerSleepNs);
      __syncwarp();
      load3(r0, v0, pw, lane, rs);
      store3(a, r0, v0, pw, lane, ring, rs);
    }
    return;
  }
  bool have0 = next_unit(a, it, &r0);
  if (have0) load3(r0, v0, pw, lane, rs);
  while (have0) {
    const bool have1 = next_unit(a, it, &r1);
    if (have1) load3(r1, v1, pw, lane, rs);
    store3(a, r0, v0, pw, lane, ring, rs);
    if (!have1) break;
    have0 = next_unit(a, it, &r0);
    if (have0) load3(r0, v0, pw, lane, rs);
    store3(a, r1, v1, pw, lane, ring, rs);
  }
}

// Version 5's producers: version 3's, with only (unit, stage, position, bytes) kept across the loop; the stage's
// matrix pointers are read again per unit (a.layers, an L1 hit) instead of living in registers (version 3's two
// UnitRefs and their StageMats cost ~26 registers: ptxas spilled 72 bytes on sm_90).
struct UnitSlim {
  int u, stage;
  unsigned pos, bytes;
};

__device__ __forceinline__ UnitRef widen(const ChainArgs& a, const UnitSlim& x) {
  UnitRef r;
  r.m = stage_mat(a, a.layers[x.stage / 5], x.stage % 5);
  r.u = x.u, r.stage = x.stage, r.pos = x.pos, r.bytes = x.bytes;
  return r;
}

__device__ __forceinline__ bool next_slim(const ChainArgs& a, UnitIt& it, UnitSlim* x) {
  UnitRef r;
  if (!next_unit(a, it, &r)) return false;
  *x = UnitSlim{r.u, r.stage, r.pos, r.bytes};
  return true;
}

__device__ void producer5(const ChainArgs& a, unsigned char* ring, RingState* rs) {
  const int pw = (int(threadIdx.x) - kCons) >> 5, lane = threadIdx.x & 31;
  uint4 v0[kChunksPerThread], v1[kChunksPerThread];
  UnitIt it;
  UnitSlim x0, x1;
  bool have0 = next_slim(a, it, &x0);
  if (have0) load3(widen(a, x0), v0, pw, lane, rs);
  while (have0) {
    const bool have1 = next_slim(a, it, &x1);
    if (have1) load3(widen(a, x1), v1, pw, lane, rs);
    store3(a, widen(a, x0), v0, pw, lane, ring, rs);
    if (!have1) break;
    have0 = next_slim(a, it, &x0);
    if (have0) load3(widen(a, x0), v0, pw, lane, rs);
    store3(a, widen(a, x1), v1, pw, lane, ring, rs);
  }
}

template <int V>
__device__ void producer(const ChainArgs& a, unsigned char* ring, RingState* rs) {
  if constexpr (V == 5) {
    producer5(a, ring, rs);
    return;
  }
  if constexpr (V >= 3) {
    producer3(a, ring, rs);
    return;
  }
  const int pt = int(threadIdx.x) - kCons;
  uint4 v0[kChunksPerThread], v1[kChunksPerThread];
  UnitIt it;
  UnitRef r0, r1;
  if (a.lockstep) {  // one unit at a time, each only once the consumers have met its stage's dependency
    while (next_unit(a, it, &r0)) {
      if (pt == 0) spin_until_ge(&rs->stage, unsigned(r0.stage) + 1u, rs, kProducerSleepNs);
      bar_prod();
      load_unit(r0, v0, pt);
      store_unit(a, r0, v0, pt, ring, rs);
    }
    return;
  }
  bool have0 = next_unit(a, it, &r0);
  if (have0) load_unit(r0, v0, pt);
  while (have0) {
    const bool have1 = next_unit(a, it, &r1);
    if (have1) load_unit(r1, v1, pt);
    store_unit(a, r0, v0, pt, ring, rs);
    if (!have1) break;
    have0 = next_unit(a, it, &r0);
    if (have0) load_unit(r0, v0, pt);
    store_unit(a, r1, v1, pt, ring, rs);
  }
}

// One (matrix mi, k-tile) item of the unit at stream position `base` (matrix mi's start) for this lane: its rows gid
// and gid + 8, 16-byte unit c = 4 k-tile + tig, and their scales in both halves.
struct RingItem {
  uint4 qa, qb;
  uint32_t sa, sb;
};
__device__ __forceinline__ RingItem ring_item(const unsigned char* ring, unsigned mask, unsigned base, int ktn, int c,
                                              int gid) {
  const unsigned ra = unsigned(gid), rb = unsigned(gid + 8), k = unsigned(ktn);
  const uint32_t s0 = *reinterpret_cast<const unsigned short*>(ring + ((base + ra * 8u * k + c * 2u) & mask));
  const uint32_t s1 = *reinterpret_cast<const unsigned short*>(ring + ((base + rb * 8u * k + c * 2u) & mask));
  const unsigned cq = unsigned(c) ^ ((unsigned(gid) & 1u) << 2);  // rows gid and gid + 8 share the parity
  RingItem r;
  r.sa = s0 | (s0 << 16);
  r.sb = s1 | (s1 << 16);
  r.qa = *reinterpret_cast<const uint4*>(ring + ((base + 128u * k + (ra * 4u * k + cq) * 16u) & mask));
  r.qb = *reinterpret_cast<const uint4*>(ring + ((base + 128u * k + (rb * 4u * k + cq) * 16u) & mask));
  return r;
}

// acc += the item's 16 rows x its 32 columns of x (word w of the unit: xw(w), column 0 of B only), on the tensor cores
// with the decode GEMV's dequant (kernels/gemv.cuh gemv_block's w4a16 step).
template <typename XW>
__device__ __forceinline__ void item_mma_xw(float (&acc)[4], const RingItem& it, XW xw) {
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint4 xv = xw(w);
    uint32_t pa[4], pb[4];
    kn::w4_pairs4(kn::u4_word(it.qa, w), it.sa, pa);
    kn::w4_pairs4(kn::u4_word(it.qb, w), it.sb, pb);
    const uint32_t a0[4] = {pa[0], pb[0], pa[1], pb[1]}, a1[4] = {pa[2], pb[2], pa[3], pb[3]};
    kn::mma_16x8x16(acc, a0, xv.x, xv.y);
    kn::mma_16x8x16(acc, a1, xv.z, xv.w);
  }
}
__device__ __forceinline__ void item_mma(float (&acc)[4], const RingItem& it, const uint4 (&xv)[4]) {
  item_mma_xw(acc, it, [&](int w) { return xv[w]; });
}

// This lane's x for unit column group g = kt0 * 4 + c: 4 x 16 bytes (lanes gid 0; zeros elsewhere, B's other columns).
__device__ __forceinline__ void item_x(const half* xs, int g, int gid, uint4 (&xv)[4]) {
  const uint4* xp = reinterpret_cast<const uint4*>(xs) + size_t(g) * 4;
#pragma unroll
  for (int w = 0; w < 4; ++w) xv[w] = gid == 0 ? xp[w] : make_uint4(0u, 0u, 0u, 0u);
}

// The consumers' units of one matrix stage: wait for each in the ring, multiply, reduce over the warps, store.
// out(row, value0, value1) gets the unit's 16 sums per matrix (value1: the second matrix, gate/up).
template <int V, typename Out>
__device__ __forceinline__ void run_units(const ChainArgs& a, int stage, const StageMat& m, unsigned& pos,
                                          const half* xs, const unsigned char* ring, RingState* rs, float (*red)[2][16],
                                          Out out) {
  int u0, u1;
  block_units(m, &u0, &u1);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
  const int ktn = m.in / 128 / m.P;
  const unsigned bytes = unit_bytes(m.M, ktn), mask = a.ring - 1;
  for (int u = u0; u < u1; ++u, pos += bytes) {
    if (threadIdx.x == 0) {
      const unsigned long long t0 = a.trace ? kn::global_ns() : 0ull;
      if constexpr (V >= 3) {
        for (int w = 0; w < 8; ++w) spin_until_ge(&rs->wfilled[w], pos + bytes, rs, kConsumerSleepNs);
      } else {
        spin_until_ge(&rs->filled, pos + bytes, rs, kConsumerSleepNs);
      }
      __threadfence_block();
      if (a.trace) a.trace[(size_t(stage) * gridDim.x + blockIdx.x) * kSlots + 3] += kn::global_ns() - t0;
    }
    bar_cons();
    const int tile = u / m.P, part = u - tile * m.P, kt0 = part * ktn;
    float acc[2][4] = {};
    // version 2: warp w takes k-tiles w, w + 8, ... of every matrix; version 3: the (matrix, k-tile) pairs are dealt
    // over the warps (gate/up: 24 pairs, 3 a warp, where version 2 gave 4 warps 2 k-tiles x 2 matrices and 4 warps 1)
    const int items = V >= 3 ? m.M * ktn : ktn;
    if constexpr (V == 4) {
      // version 4: the warp's (at most 3) items' words and scales loaded before any math; each item's products into
      // an accumulator of its own, added to its matrix's after (one dependent mma chain per item, not per matrix)
      constexpr int kItems = 3;
      RingItem q[kItems];
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int item = warp + 8 * i;
        if (item >= items) continue;
        const int mi = item >= ktn ? 1 : 0, kl = item - mi * ktn;
        q[i] = ring_item(ring, mask, pos + unsigned(mi) * 1152u * unsigned(ktn), ktn, 4 * kl + tig, gid);
      }
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int item = warp + 8 * i;
        if (item >= items) continue;
        const int mi = item >= ktn ? 1 : 0, kl = item - mi * ktn;
        uint4 xv[4];
        item_x(xs, kt0 * 4 + 4 * kl + tig, gid, xv);
        float t[4] = {0.f, 0.f, 0.f, 0.f};
        item_mma(t, q[i], xv);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          acc[0][k] += mi ? 0.f : t[k];
          acc[1][k] += mi ? t[k] : 0.f;
        }
      }
    }
    for (int item = warp; V != 4 && item < items; item += 8) {
      const int m3 = V >= 3 && item >= ktn ? 1 : 0;
      const int kl = item - m3 * ktn;
      const int c = 4 * kl + tig;
      uint4 xv[4];  // x columns 32 (kt0 * 4 + c) + 8 w .. + 7
      item_x(xs, kt0 * 4 + c, gid, xv);
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        if (mi >= m.M || (V >= 3 && mi != m3)) continue;
        item_mma(acc[mi], ring_item(ring, mask, pos + unsigned(mi) * 1152u * unsigned(ktn), ktn, c, gid), xv);
      }
    }
    if (tig == 0) {  // C[row gid + 8 h][column 0] = acc[2 h]
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        red[warp][mi][gid] = acc[mi][0];
        red[warp][mi][gid + 8] = acc[mi][2];
      }
    }
    bar_cons();  // every warp is done with the unit's bytes and has written its partial sums
    if (threadIdx.x == 0) *reinterpret_cast<volatile unsigned*>(&rs->consumed) = pos + bytes;
    // the unit's 16 sums: warp 0 (versions 2-4), or warp 7 (version 5: warp 0's thread 0 waits for the next unit
    // meanwhile)
    const int er = V == 5 ? int(threadIdx.x) - 224 : int(threadIdx.x);
    if (er >= 0 && er < 16) {
      float v0 = 0.f, v1 = 0.f;
#pragma unroll
      for (int w = 0; w < 8; ++w) v0 += red[w][0][er], v1 += red[w][1][er];
      out(tile * 16 + er, part, v0, v1);
    }
  }
}

// Element i of y summed over its k-split parts, in part order. kAhead (versions 25-26): the parts' loads are issued
// 4 at a time, so a thread waits one L2 round trip per 4 parts; otherwise one a part (each load follows the add of
// the one before: the loop's count is not known at compile time).
template <bool kAhead>
__device__ __forceinline__ float sum_parts6(const float* y, size_t ld, int parts, int i) {
  float v = __ldcg(y + i);
  if constexpr (!kAhead) {
    for (int p = 1; p < parts; ++p) v += __ldcg(y + size_t(p) * ld + i);
  } else {
    for (int p0 = 1; p0 < parts; p0 += 4) {
      float t[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) t[q] = p0 + q < parts ? __ldcg(y + size_t(p0 + q) * ld + i) : 0.f;
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (p0 + q < parts) v += t[q];
    }
  }
  return v;
}

// The attention stand-in: a = half(q), q the sum of its k-split parts; this block's share, by `threads` threads.
template <bool kAhead = false>
__device__ __forceinline__ void attention_stand_in(const ChainArgs& a, int threads) {
  int i0, i1;
  block_share(kQ, &i0, &i1);
  for (int i = i0 + int(threadIdx.x); i < i1; i += threads)
    a.a[i] = kn::to_half_sat(sum_parts6<kAhead>(a.yqkv, kQKV, a.pq, i));
}

// The consumer thread's kHPer elements of a norm weight (a constant: loaded before the stage's wait).
struct NormW {
  float v[kHPer];
};
__device__ __forceinline__ NormW norm_w(const float* w) {
  NormW r;
#pragma unroll
  for (int i = 0; i < kHPer; ++i) r.v[i] = w[threadIdx.x + kCons * i];
  return r;
}

// h += norm(y) w_post, y the sum of its parts (a k-split's, in part order); the consumer threads' kHPer elements each.
// part: cons_sum's scratch.
__device__ __forceinline__ void add_residual(float (&h)[kHPer], const float* y, int parts, const NormW& w_post,
                                             float* part) {
  const int t = threadIdx.x;
  float v[kHPer];
#pragma unroll
  for (int i = 0; i < kHPer; ++i) v[i] = __ldcg(y + t + kCons * i);
  for (int p = 1; p < parts; ++p)
#pragma unroll
    for (int i = 0; i < kHPer; ++i) v[i] += __ldcg(y + size_t(p) * kH + t + kCons * i);
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kHPer; ++i) ss += v[i] * v[i];
  const float r = rsqrtf(cons_sum(ss, part) / kH + kEps);
#pragma unroll
  for (int i = 0; i < kHPer; ++i) h[i] += v[i] * r * w_post.v[i];
}

// xs = half(norm(h) w). part: cons_sum's scratch (not the one a cons_sum just before used: no barrier between).
__device__ __forceinline__ void norm_to_x(const float (&h)[kHPer], const NormW& w, half* xs, float* part) {
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kHPer; ++i) ss += h[i] * h[i];
  const float r = rsqrtf(cons_sum(ss, part) / kH + kEps);
#pragma unroll
  for (int i = 0; i < kHPer; ++i) xs[threadIdx.x + kCons * i] = kn::to_half_sat(h[i] * r * w.v[i]);
}

// The residual fold of a stage's x: h += norm(y) w_post, then xs = half(norm(h) w).
__device__ __forceinline__ void fold(float (&h)[kHPer], const float* y, int parts, const NormW& w_post, const NormW& w,
                                     half* xs, float* part) {
  add_residual(h, y, parts, w_post, part);
  norm_to_x(h, w, xs, part + 8);
}

// xs = n halves written earlier in this launch by other blocks (through L2).
__device__ __forceinline__ void copy_x(half* xs, const half* src, int n) {
  for (int i = int(threadIdx.x); i < n / 8; i += kCons)
    reinterpret_cast<uint4*>(xs)[i] = kn::ld_cg(reinterpret_cast<const uint4*>(src) + i, true);
}

template <int V>
__device__ void consumer(const ChainArgs& a, unsigned char* ring, RingState* rs, half* xs, float (*red)[2][16],
                         float* part) {
  const int t = threadIdx.x;
  float h[kHPer];
#pragma unroll
  for (int i = 0; i < kHPer; ++i) h[i] = a.h_in[t + kCons * i];
  unsigned pos = 0;
  for (int l = 0; l < a.L; ++l) {
    const ChainLayer& y = a.layers[l];
    const int s = 5 * l;
    // q/k/v: x = half(norm(h) w_in), h first updated with the previous layer's down_proj
    const NormW w_in = norm_w(y.w_in), w_post2 = norm_w(l > 0 ? a.layers[l - 1].w_post2 : y.w_in);
    begin_stage(a, rs, s);
    if (l == 0) {
      norm_to_x(h, w_in, xs, part);
    } else {
      fold(h, a.yd, a.layers[l - 1].pd, w_post2, w_in, xs, part);
    }
    bar_cons();
    stamp(a, s, 1);
    run_units<V>(a, s, stage_mat(a, y, kQkv), pos, xs, ring, rs, red,
                 [&](int row, int pt, float v, float) { a.yqkv[size_t(pt) * kQKV + row] = v; });
    arrive_stage(a, s);
    // the attention stand-in: a = half(q), this block's share
    wait_stage(a, s);
    stamp(a, s + 1, 0);
    stamp(a, s + 1, 1);
    attention_stand_in(a, kCons);
    arrive_stage(a, s + 1);
    // o_proj
    begin_stage(a, rs, s + 2);
    const StageMat mo = stage_mat(a, y, kO);
    copy_x(xs, a.a, kQ);
    bar_cons();
    stamp(a, s + 2, 1);
    run_units<V>(a, s + 2, mo, pos, xs, ring, rs, red,
                 [&](int row, int pt, float v, float) { a.yo[size_t(pt) * kH + row] = v; });
    arrive_stage(a, s + 2);
    // gate/up + GELU: h += norm(yo) w_post1, x = half(norm(h) w_pre2)
    const NormW w_post1 = norm_w(y.w_post1), w_pre2 = norm_w(y.w_pre2);
    begin_stage(a, rs, s + 3);
    fold(h, a.yo, a.po, w_post1, w_pre2, xs, part);
    bar_cons();
    stamp(a, s + 3, 1);
    run_units<V>(a, s + 3, stage_mat(a, y, kGu), pos, xs, ring, rs, red,
                 [&](int row, int, float g, float u) { a.act[row] = kn::to_half_sat(kn::gelu_tanh(g) * u); });
    arrive_stage(a, s + 3);
    // down_proj
    begin_stage(a, rs, s + 4);
    copy_x(xs, a.act, y.I);
    bar_cons();
    stamp(a, s + 4, 1);
    run_units<V>(a, s + 4, stage_mat(a, y, kDn), pos, xs, ring, rs, red,
                 [&](int row, int pt, float v, float) { a.yd[size_t(pt) * kH + row] = v; });
    arrive_stage(a, s + 4);
  }
  // h after the last layer: block 0 stores it
  if (blockIdx.x == 0) {
    const ChainLayer& p = a.layers[a.L - 1];
    const NormW w_post2 = norm_w(p.w_post2);
    wait_stage(a, 5 * a.L - 1);
    add_residual(h, a.yd, p.pd, w_post2, part);
#pragma unroll
    for (int i = 0; i < kHPer; ++i) a.h_out[t + kCons * i] = h[i];
  }
}

template <int V>
__global__ void __launch_bounds__(kThreads, 1) chain_kernel(const ChainArgs a) {
  GEMMA4_T4_DYNAMIC_SMEM(smem);
  __shared__ RingState rs;
  __shared__ float red[8][2][16];
  __shared__ float part[16];
  half* xs = reinterpret_cast<half*>(smem);
  unsigned char* ring = smem + kMaxIn * sizeof(half);
  if (threadIdx.x < 8) rs.wfilled[threadIdx.x] = 0;
  if (threadIdx.x == 0) rs.filled = rs.consumed = rs.stage = rs.fault = 0;
  __syncthreads();
  if (threadIdx.x >= kCons)
    producer<V>(a, ring, &rs);
  else
    consumer<V>(a, ring, &rs, xs, red, part);
  if (threadIdx.x == 0 && rs.fault) atomicCAS(a.fault, 0u, 0x10000u);
}

// ---- versions 6 and 7: the persistent chain with each warp's weights in its registers ----
//
// No producers and no ring: every warp of the block multiplies, and holds the next B items of its own stream of
// weights in registers. An item is one matrix's 16-row tile x one k-tile (128 columns) of a unit, 1 KiB of words and
// 64 bytes of scales; a block's items of a stage are dealt over its W warps (item i to warp i % W). A warp loads its
// item k + B into the slot that item k leaves, and in a stage's last group it loads its first B items of the next
// weighted stage, so those are in flight while the block finishes the stage (epilogue, arrival), waits for the next
// stage's dependency and builds its x. Each warp's item count is padded to a multiple of B, so a stage starts with
// its item b in slot b (static register indexing). The items' 16 row sums go to shared memory, and the epilogue
// adds a unit's k-tiles in order (the same sums whichever warp took an item). Warp 0 loads its next-stage items
// only after the block has arrived: the release of the arrival would otherwise wait for them.
// A block's items of one stage, at most (their partial sums in shared memory). The CPU emulator runs one block.
#ifdef GEMMA4_T4_EMU
constexpr int kItems6 = 1 << 15;
#else
constexpr int kItems6 = 256;
#endif

struct Stage6 {  // one weighted stage as a block sees it
  StageMat m;
  int u0, n, ktn;  // the block's first unit, its items, k-tiles a unit (no initialisers: it lives in shared memory)
};

__device__ __forceinline__ Stage6 stage6(const ChainArgs& a, int l, int kind) {
  Stage6 s{};
  s.m = stage_mat(a, a.layers[l], kind);
  int u1;
  block_units(s.m, &s.u0, &u1);
  s.ktn = s.m.in / 128 / s.m.P;
  s.n = (u1 - s.u0) * s.m.M * s.ktn;
  return s;
}

// Where item i of the block's stage lies: unit u0 + i / (M ktn), matrix (i / ktn) % M, k-tile i % ktn; its
// matrix's words and scales, its first row and its k-tile's first 16-byte chunk of a row.
struct ItemAt6 {
  const uint32_t* q;
  const half* sc;
  int row0, c0;
};
__device__ __forceinline__ ItemAt6 item_at6(const Stage6& s, int i) {
  const int per = s.m.M * s.ktn, uu = i / per, r = i - uu * per, mi = r >= s.ktn ? 1 : 0, kt = r - mi * s.ktn;
  const int u = s.u0 + uu, tile = u / s.m.P, part = u - tile * s.m.P;
  return {mi ? s.m.q1 : s.m.q0, mi ? s.m.s1 : s.m.s0, tile * 16, (part * s.ktn + kt) * 4};
}

// Item i's rows gid and gid + 8, this lane's 16-byte chunk (tig) of them. Its x column group (32 columns: the
// chunk) in *g. The scales as loaded (one half in the low bits).
__device__ __forceinline__ RingItem load_item6(const Stage6& s, int i, int gid, int tig, int* g) {
  const ItemAt6 at = item_at6(s, i);
  const int c = at.c0 + tig;
  const size_t ra = size_t(at.row0) + size_t(gid), rb = ra + 8;
  RingItem it;
  it.qa = kn::ld_weights_all(reinterpret_cast<const uint4*>(at.q + ra * size_t(s.m.in / 8)) + c);
  it.qb = kn::ld_weights_all(reinterpret_cast<const uint4*>(at.q + rb * size_t(s.m.in / 8)) + c);
  it.sa = kn::ld_u16(reinterpret_cast<const unsigned short*>(at.sc + ra * size_t(s.m.in / 32) + c), true);
  it.sb = kn::ld_u16(reinterpret_cast<const unsigned short*>(at.sc + rb * size_t(s.m.in / 32) + c), true);
  *g = c;
  return it;
}

// Item i's rows into L2, lane by lane: lanes 0-15 the words of row lane (64 bytes: two 32-byte halves, so one line
// or two sectors either way), lanes 16-31 the scales of row lane - 16 (8 bytes).
__device__ __forceinline__ void prefetch_l2_any(const void* p) {
#ifndef GEMMA4_T4_EMU
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
#else
  (void)p;
#endif
}
__device__ __forceinline__ void prefetch_item6(const Stage6& s, int i, int lane) {
  const ItemAt6 at = item_at6(s, i);
  const size_t row = size_t(at.row0) + size_t(lane & 15);
  if (lane < 16) {
    const uint4* q = reinterpret_cast<const uint4*>(at.q + row * size_t(s.m.in / 8)) + at.c0;
    prefetch_l2_any(q);
    prefetch_l2_any(q + 2);
  } else {
    prefetch_l2_any(at.sc + row * size_t(s.m.in / 32) + at.c0);
  }
}

// Versions 20-21, one thread, after the block's epilogue: counts the block's units [u0, u1) below `limit` into the
// counters c of their k-tiles of the next matrix's x (per_kt units to a k-tile: 8 row tiles x the k-split parts).
__device__ __forceinline__ void arrive_units(unsigned* c, int u0, int u1, int per_kt, int limit) {
  for (int u = u0; u < min(u1, limit);) {
    const int kt = u / per_kt, e = min(min(u1, limit), (kt + 1) * per_kt);
    kn::red_release_add(c + kt, unsigned(e - u));
    u = e;
  }
}

// Version 21's attention stand-in, by one warp a block, without a block barrier: the block's share of a = half(q)
// once q/k/v's counters say its k-tiles of q are stored, then a's k-tile counters (128 elements a k-tile).
__device__ __forceinline__ void stand_in_tiles(const ChainArgs& a, int l) {
  const int lane = threadIdx.x & 31;
  int i0, i1;
  block_share(kQ, &i0, &i1);
  if (i1 <= i0) return;
  const unsigned* qc = a.tiles + size_t(3 * l) * kTileCounters;
  unsigned* ac = a.tiles + size_t(3 * l + 1) * kTileCounters;
  for (int kt = i0 / 128; kt <= (i1 - 1) / 128; ++kt)
    poll_counter<true, kConsumerSleepNs>(a, qc + kt, a.epoch * 8u * unsigned(a.pq), 5u * l + 2u);
  for (int i = i0 + lane; i < i1; i += 32) a.a[i] = kn::to_half_sat(sum_parts6<false>(a.yqkv, kQKV, a.pq, i));
  __syncwarp();
  if (lane == 0) arrive_units(ac, i0, i1, 128, kQ);
}

__device__ __forceinline__ int warp_items6(int n, int warp, int W) { return warp < n ? (n - warp + W - 1) / W : 0; }

// Thread 0 waits until done[s] counts every block (an acquire load per poll: no fence that would wait for the
// block's weight loads in flight), then the block's barrier.
__device__ __forceinline__ void wait6(const ChainArgs& a, int s) {
  if (threadIdx.x == 0 && s >= 0) poll_done<true>(a, s);
  __syncthreads();
}

// Sum over the block (every thread gets it); red: [W] shared scratch, not read since the barrier before.
template <int W>
__device__ __forceinline__ float block_sum6(float v, float* red) {
  return warps_sum<W>(v, red, [] { __syncthreads(); });
}

// A thread's elements t, t + T, ... of a norm weight (kH of them in all).
template <int E>
struct Norm6 {
  float v[E];
};
template <int W>
__device__ __forceinline__ Norm6<(kH + W * 32 - 1) / (W * 32)> norm6(const float* w) {
  constexpr int T = W * 32, E = (kH + T - 1) / T;
  Norm6<E> r;
#pragma unroll
  for (int e = 0; e < E; ++e) r.v[e] = w && threadIdx.x + e * T < kH ? w[threadIdx.x + e * T] : 0.f;
  return r;
}

// Four sums over the block at once (every thread gets them); red: [4][W] shared scratch (16-byte aligned), not read
// since the barrier before, used as W float4s (one LDS.128 a warp's partial sums).
template <int W>
__device__ __forceinline__ void block_sum4(float (&v)[4], float (*red)[W]) {
  float4* r4 = reinterpret_cast<float4*>(&red[0][0]);
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = kn::warp_sum(v[k]);
  if ((threadIdx.x & 31) == 0) r4[threadIdx.x >> 5] = make_float4(v[0], v[1], v[2], v[3]);
  __syncthreads();
  float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
  for (int w = 0; w < W; ++w) {
    const float4 p = r4[w];
    s.x += p.x, s.y += p.y, s.z += p.z, s.w += p.w;
  }
  v[0] = s.x, v[1] = s.y, v[2] = s.z, v[3] = s.w;
}

// ---- versions 27-30: hand-offs in the data (LL words) ----
//
// Version 19's hand-off between stages is two dependent L2 round trips on the critical path: thread 0 polls the
// previous stage's counter until every block has arrived, then (after a block barrier) the block reads x or y. Both
// queue behind the weight loads the SM has in flight (2026-12-07 (f)). Here every value a stage hands to the next
// travels with its flag in one 8-byte word (the LL protocol of NCCL's low-latency all-reduce): the low 32 bits are the
// value (a float, or a pair of halves), the high 32 the flag of the (launch, layer) that wrote it. A reader loads its
// words and re-loads those whose flag is not yet the one it expects; the load that sees the flag also brings the
// value, so the hand-off is one round trip, and no counter, no arrival, no release and no stage barrier are left.
// An aligned 8-byte store and load are single-copy atomic (st / ld .relaxed.gpu .u64), so a word is never half
// written. Buffers are reused every other layer (their parity): any word of layer l + 2 is written after its writer
// has read (through the chain of stages) every block's share of a for layer l + 1, and a block writes that share
// after all of its reads of layer l (each block has a share: v2_setup checks). The flag tells a word of layer l from
// one of l + 2. The flag is epoch * 64 + layer + 1 (layers < 64: v2_setup checks): zeroed buffers match no flag,
// and no launch's words match another's.
__device__ __forceinline__ unsigned ll_flag(const ChainArgs& a, int l) { return a.epoch * 64u + unsigned(l) + 1u; }

__device__ __forceinline__ void ll_store(unsigned long long* p, unsigned v, unsigned flag) {
  const unsigned long long w = (static_cast<unsigned long long>(flag) << 32) | v;
#ifdef GEMMA4_T4_EMU
  *reinterpret_cast<volatile unsigned long long*>(p) = w;
#else
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\n" ::"l"(p), "l"(w) : "memory");
#endif
}

__device__ __forceinline__ unsigned long long ll_load(const unsigned long long* p) {
#ifdef GEMMA4_T4_EMU
  return *reinterpret_cast<const volatile unsigned long long*>(p);
#else
  unsigned long long w;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];\n" : "=l"(w) : "l"(p) : "memory");
  return w;
#endif
}

// The values of N words (addr(k): word k, or null for none), each loaded until its flag is `flag`; all N loads are
// issued together, and only the stale ones again, 32 ns after the round before. Past kSpinNs (or once an earlier wait
// gave up) the fault is set and the values are void.
template <int N, typename Addr>
__device__ __forceinline__ void ll_read(const ChainArgs& a, unsigned flag, Addr addr, unsigned (&v)[N]) {
  static_assert(N <= 32, "a stale bit a word");
  unsigned stale = 0;  // bit k: word k not yet of this flag
  const auto take = [&](int k) {
    const unsigned long long w = ll_load(addr(k));
    v[k] = unsigned(w);
    if (unsigned(w >> 32) != flag)
      stale |= 1u << k;
    else
      stale &= ~(1u << k);
  };
#pragma unroll
  for (int k = 0; k < N; ++k) {
    v[k] = 0u;
    if (addr(k)) take(k);
  }
  const unsigned code = 0x20000u + (flag & 63u);  // the fault: LL, and the layer + 1 of the flag
  unsigned long long t0 = 0;
  for (unsigned i = 0;; ++i) {
    if (!stale) break;
#ifdef GEMMA4_T4_EMU  // one block runs every stage in order, so a word not written yet never will be: a wrong word
    atomicCAS(a.fault, 0u, code);
    break;
#endif
    if ((i & 255u) == 0) {
      if (i == 0) {
        t0 = kn::global_ns();
      } else if (kn::ld_relaxed(a.fault) != 0 || kn::global_ns() - t0 > kSpinNs) {
        atomicCAS(a.fault, 0u, code);
        break;
      }
    }
    __nanosleep(kConsumerSleepNs);  // ~100k threads poll at once: leave L2 to the weights between rounds
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (stale >> k & 1u) take(k);
  }
}

// This thread's E elements i0 + e * step (those below n; 0 past) of an LL-handed y of `parts` k-split parts ld words
// apart, summed in part order; the words of G parts of all E elements are loaded together.
template <int E, int G>
__device__ __forceinline__ void ll_sum_parts(const ChainArgs& a, const unsigned long long* y, size_t ld, int parts,
                                             int i0, int step, int n, unsigned flag, float (&v)[E]) {
#pragma unroll
  for (int e = 0; e < E; ++e) v[e] = 0.f;
  for (int p0 = 0; p0 < parts; p0 += G) {
    unsigned w[G * E];
    ll_read<G * E>(
        a, flag,
        [&](int k) -> const unsigned long long* {
          const int e = k / G, p = p0 + k % G, i = i0 + e * step;
          return p < parts && i < n ? y + size_t(p) * ld + i : nullptr;
        },
        w);
#pragma unroll
    for (int k = 0; k < G * E; ++k)
      if (p0 + k % G < parts) v[k / G] += __uint_as_float(w[k]);
  }
}

// xs = n halves handed as LL pairs (n / 2 words at src), by T threads: R words a thread loaded together, a round.
template <int T, int R>
__device__ __forceinline__ void ll_copy_x(const ChainArgs& a, half* xs, const unsigned long long* src, int n,
                                          unsigned flag) {
  const int words = n / 2;
  for (int i0 = int(threadIdx.x); i0 < words; i0 += R * T) {
    unsigned w[R];
    ll_read<R>(
        a, flag, [&](int k) { return i0 + k * T < words ? src + i0 + k * T : nullptr; }, w);
#pragma unroll
    for (int k = 0; k < R; ++k)
      if (i0 + k * T < words) reinterpret_cast<unsigned*>(xs)[i0 + k * T] = w[k];
  }
}

// The attention stand-in of an LL hand-off: a = half(q), q from LL words, a's pairs (this block's share) as LL words.
template <int T, int G>
__device__ __forceinline__ void ll_stand_in(const ChainArgs& a, int l) {
  int j0, j1;
  block_share(kQ / 2, &j0, &j1);
  const unsigned flag = ll_flag(a, l);
  const unsigned long long* q = a.llq + size_t(l & 1) * a.pq * kQ;
  for (int j = j0 + int(threadIdx.x); j < j1; j += T) {
    float v[2];
    ll_sum_parts<2, G>(a, q, kQ, a.pq, 2 * j, 1, kQ, flag, v);
    const half2 h = __halves2half2(kn::to_half_sat(v[0]), kn::to_half_sat(v[1]));
    ll_store(a.lla + size_t(l & 1) * (kQ / 2) + j, kn::h2_as_u32(h), flag);
  }
}

// h (shared) += norm(y) w_post when y (the sum of its parts), then xs = half(norm(h) w) when w. Each thread owns the
// elements t, t + T of h. red: [4][W]. kPre: the norm weights come in registers (wp, wn: loaded before the stage's
// wait), not read here after each reduction. kOne (versions 22-24, 26), with y and w: one block reduction, not two.
// With d = norm(y) w_post = r y w_post, |h + d|^2 = |h|^2 + 2 r (h . y w_post) + r^2 |y w_post|^2, so the sums of y^2,
// h^2, h y w_post and (y w_post)^2 in one reduction give both norms.
// kLLG (versions 27-30): y comes as the LL words at ll, kLLG parts' words loaded together (ll_sum_parts: flag, the
// launch's args ca), not from y.
template <int W, bool kPre, bool kOne = false, bool kAhead = false, int kLLG = 0>
__device__ __forceinline__ void fold6(float* hs, const float* y, int parts, const float* w_post, const float* w,
                                      half* xs, float (*red)[W], const Norm6<(kH + W * 32 - 1) / (W * 32)>& wp,
                                      const Norm6<(kH + W * 32 - 1) / (W * 32)>& wn, unsigned long long* mark = nullptr,
                                      const unsigned long long* ll = nullptr, unsigned flag = 0,
                                      const ChainArgs* ca = nullptr) {
  constexpr int T = W * 32, E = (kH + T - 1) / T;
  const int t = threadIdx.x;
  const auto read_y = [&](float(&v)[E]) {  // this thread's elements of y, summed over the parts (0 past kH)
    if constexpr (kLLG > 0) {
      ll_sum_parts<E, kLLG>(*ca, ll, kH, parts, t, T, kH, flag, v);
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) v[e] = t + e * T < kH ? sum_parts6<kAhead>(y, kH, parts, t + e * T) : 0.f;
    }
  };
  const bool has_y = kLLG > 0 ? ll != nullptr : y != nullptr;
  if (kOne && has_y && w) {
    float v[E], sums[4] = {0.f, 0.f, 0.f, 0.f};
    read_y(v);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int i = t + e * T;
      if (i >= kH) continue;
      const float h = hs[i], vw = v[e] * (kPre ? wp.v[e] : w_post[i]);
      sums[0] += v[e] * v[e], sums[1] += h * h, sums[2] += h * vw, sums[3] += vw * vw;
    }
    block_sum4<W>(sums, red);
    if (mark && t == 0) *mark = kn::global_ns();  // the trace: y read and its norm's sum
    const float r = rsqrtf(sums[0] / kH + kEps);
    const float r2 = rsqrtf(fmaxf(sums[1] + 2.f * r * sums[2] + r * r * sums[3], 0.f) / kH + kEps);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int i = t + e * T;
      if (i >= kH) continue;
      const float hn = hs[i] + v[e] * r * (kPre ? wp.v[e] : w_post[i]);
      hs[i] = hn;
      xs[i] = kn::to_half_sat(hn * r2 * (kPre ? wn.v[e] : w[i]));
    }
    return;
  }
  if (has_y) {
    float v[E], ss = 0.f;
    read_y(v);
#pragma unroll
    for (int e = 0; e < E; ++e) ss += v[e] * v[e];
    const float r = rsqrtf(block_sum6<W>(ss, red[0]) / kH + kEps);
    if (mark && t == 0) *mark = kn::global_ns();  // the trace: y read and its norm's sum
#pragma unroll
    for (int e = 0; e < E; ++e)
      if (t + e * T < kH) hs[t + e * T] += v[e] * r * (kPre ? wp.v[e] : w_post[t + e * T]);
  }
  if (!w) return;
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (t + e * T < kH) ss += hs[t + e * T] * hs[t + e * T];
  const float r = rsqrtf(block_sum6<W>(ss, red[1]) / kH + kEps);
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (t + e * T < kH) xs[t + e * T] = kn::to_half_sat(hs[t + e * T] * r * (kPre ? wn.v[e] : w[t + e * T]));
}

// W warps, B items a warp in registers. kPre (versions 8-10): the stage's norm weights and the next weighted stage's
// descriptor are read before the stage's wait, not after it. kDeferAll (version 9): every warp loads its next-stage
// items only after the block has arrived (versions 6-8, 10: only warp 0, whose thread 0 arrives).
// kCtl (versions 18-19): warp 0 takes no items, so the thread that polls and arrives has no weight loads in flight.
// NP: items of the next stage a warp loads into registers before the block arrives (the rest, B - NP, are loaded
// once the next stage's x is built). kL2 (versions 12-14): after the block arrives, each warp pulls the rest of its
// next-stage items into L2 (prefetch.global.L2: no register, nothing waits for it).
// kTiles (versions 20-21): stages whose x is another stage's output (not a fold) wait per k-tile, not per stage: a
// warp polls the counter of its item's k-tile and reads that k-tile of x from memory (L2), with no block barrier
// before the stage. 1: down_proj on gate/up's tiles of act. 2: also o_proj on a's k-tiles, which warp 0 (kCtl: it
// takes no items) writes as the attention stand-in once q/k/v's counters cover its share of q.
// kFold1 (versions 22-24, 26): each fold in one block reduction (fold6's kOne). kAhead (versions 25-26): the folds and
// the stand-in load a k-split's parts together (sum_parts6). kLLG (versions 27-30): every hand-off is LL words (above),
// the words of kLLG parts (2 kLLG words of a copied x) loaded together: no stage waits on a counter, no block arrives
// on one.
template <int W, int B, bool kPre, bool kDeferAll, int NP = B, bool kL2 = false, bool kCtl = false, int kTiles = 0,
          bool kFold1 = false, bool kAhead = false, int kLLG = 0>
__global__ void __launch_bounds__(W * 32, 1) direct_kernel(const ChainArgs a) {
  static_assert(NP >= 0 && NP <= B, "next-stage items in registers");
  static_assert(kTiles == 0 || (kPre && kCtl),
                "k-tile waits: descriptors before the wait, warp 0 free for the stand-in");
  constexpr bool kLL = kLLG > 0;
  constexpr int kCopyWords = 2 * (kLL ? kLLG : 1);  // LL words of a copied x a thread loads together (ll_copy_x)
  static_assert(!kLL || (kTiles == 0 && !kL2), "LL hand-offs: no k-tile counters, no L2 pulls");
  constexpr int T = W * 32;
  using N6 = Norm6<(kH + T - 1) / T>;
  __shared__ __align__(16) half xs[kMaxIn];
  __shared__ float hs[kH];
  __shared__ float psum[kItems6][16];
  __shared__ __align__(16) float red[4][W];
  __shared__ Stage6 sd[2];  // the current weighted stage and the next (by the parity of its index)
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, gid = lane >> 2, tig = lane & 3;
  // kCtl: warp 0 takes no items (it polls and arrives with no weight loads of its own in flight); items are dealt
  // over the other IW warps, iw being this warp's place among them (-1: none)
  constexpr int IW = kCtl ? W - 1 : W;
  const int iw = kCtl ? warp - 1 : warp;
  for (int i = t; i < kH; i += T) hs[i] = a.h_in[i];
  if (t == 0) sd[0] = stage6(a, 0, kQkv);
  __syncthreads();
  RingItem buf[B];
  int gbuf[B];
  // slot b <- this warp's item b of stage st, if it has one
  const auto take = [&](const Stage6& st, int b) {
    if (iw >= 0 && iw + b * IW < st.n) buf[b] = load_item6(st, iw + b * IW, gid, tig, &gbuf[b]);
  };
  // thread 0: the next weighted stage's descriptor (none past the last layer)
  const auto describe_next = [&](int cur, int nl, int nk) {
    if (nl < a.L)
      sd[(cur + 1) & 1] = stage6(a, nl, nk);
    else
      sd[(cur + 1) & 1].n = 0;
  };
#pragma unroll
  for (int b = 0; b < NP; ++b) take(sd[0], b);
  int ws = 0;  // weighted stages begun
  for (int l = 0; l < a.L; ++l) {
    const ChainLayer& y = a.layers[l];
    for (int kind = 0; kind < 5; ++kind) {
      const int s = 5 * l + kind;
      // the next weighted stage (its items are loaded in this stage's last group)
      const int nl = kind == kDn ? l + 1 : l, nk = kind == kQkv ? kO : kind == kO ? kGu : kind == kGu ? kDn : kQkv;
      N6 wp{}, wn{};
      if (kPre && kind != kAtt) {
        if (t == 0) describe_next(ws, nl, nk);
        if (kind == kQkv) wp = norm6<W>(l > 0 ? a.layers[l - 1].w_post2 : nullptr), wn = norm6<W>(y.w_in);
        if (kind == kGu) wp = norm6<W>(y.w_post1), wn = norm6<W>(y.w_pre2);
      }
      // an x of k-tiles waited for by each warp (no stage wait, no barrier; the descriptors were read before it)
      const bool tiled = (kTiles >= 1 && kind == kDn) || (kTiles >= 2 && kind == kO);
      if (kTiles >= 2 && kind == kAtt) {  // warp 0 only, on q/k/v's k-tile counters; no arrival on done
        stamp(a, s, 0);
        stamp(a, s, 1);
        if (warp == 0) stand_in_tiles(a, l);
        stamp(a, s, 2);
        continue;
      }
      if (!tiled && !kLL) wait6(a, s - 1);
      stamp(a, s, 0);
      if (kind == kAtt) {  // the attention stand-in: a = half(q), this block's share
        stamp(a, s, 1);
        if constexpr (kLL)
          ll_stand_in<T, kLLG>(a, l);
        else
          attention_stand_in<kAhead>(a, T);
        __syncthreads();
        stamp(a, s, 2);
        if (t == 0 && !kLL) kn::red_release_add(a.done + s, 1u);
        continue;
      }
      // x of this stage
      unsigned long long* mark = a.trace ? a.trace + (size_t(s) * gridDim.x + blockIdx.x) * kSlots + 3 : nullptr;
      // kLL: the LL words of layer ll_l (by its parity)
      const auto ll_at = [&](unsigned long long* base, size_t per, int ll_l) { return base + size_t(ll_l & 1) * per; };
      if (kind == kQkv) {
        if (l == 0)
          fold6<W, kPre>(hs, nullptr, 0, nullptr, y.w_in, xs, red, wp, wn);
        else
          fold6<W, kPre, kFold1, kAhead, kLLG>(hs, a.yd, a.layers[l - 1].pd, a.layers[l - 1].w_post2, y.w_in, xs, red,
                                               wp, wn, mark, ll_at(a.lld, size_t(kMaxParts) * kH, l - 1),
                                               ll_flag(a, l - 1), &a);
      } else if (kind == kGu) {
        fold6<W, kPre, kFold1, kAhead, kLLG>(hs, a.yo, a.po, y.w_post1, y.w_pre2, xs, red, wp, wn, mark,
                                             ll_at(a.llo, size_t(a.po) * kH, l), ll_flag(a, l), &a);
      } else if (kLL) {
        if (kind == kO)
          ll_copy_x<T, kCopyWords>(a, xs, ll_at(a.lla, kQ / 2, l), kQ, ll_flag(a, l));
        else
          ll_copy_x<T, kCopyWords>(a, xs, ll_at(a.llact, kMaxAct / 2, l), y.I, ll_flag(a, l));
      } else if (!tiled) {
        const half* src = kind == kO ? a.a : a.act;
        const int n = kind == kO ? kQ : y.I;
        for (int i = t; i < n / 8; i += T)
          reinterpret_cast<uint4*>(xs)[i] = kn::ld_cg(reinterpret_cast<const uint4*>(src) + i, true);
      }
      if (!kPre && t == 0) describe_next(ws, nl, nk);
      if (!tiled) __syncthreads();
      stamp(a, s, 1);
      const Stage6& cs = sd[ws & 1];
      const Stage6& ns = sd[(ws + 1) & 1];
      const int n = (iw >= 0 ? warp_items6(cs.n, iw, IW) : 0), p = (n + B - 1) / B * B;
      const bool defer = kDeferAll || warp == 0;
      // tiled: x's source, its k-tile counters and their count when complete; the k-tile this lane last waited for
      const uint4* xg = reinterpret_cast<const uint4*>(kind == kO ? a.a : a.act);
      const unsigned* tc = a.tiles + size_t(3 * l + (kind == kO ? 1 : 2)) * kTileCounters;
      const unsigned tneed = a.epoch * (kind == kO ? 128u : 8u);
      int ready = -1;
#pragma unroll
      for (int b = NP; b < B; ++b) take(cs, b);  // the items not loaded before the arrival
      for (int j = 0; j < p; j += B) {
#pragma unroll
        for (int b = 0; b < B; ++b) {
          const int k = j + b, item = iw + k * IW;
          if (k < n) {
            const uint4* xp = reinterpret_cast<const uint4*>(xs) + size_t(gbuf[b]) * 4;
            RingItem it = buf[b];  // the scales to both halves here, not at the load (that would wait for it)
            it.sa |= it.sa << 16;
            it.sb |= it.sb << 16;
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            if (tiled) {  // lanes gid 0 (B's column 0): wait for the item's k-tile, then its 32 columns from L2
              uint4 xv[4] = {};
              if (gid == 0) {
                const int kt = gbuf[b] >> 2;
                if (kt != ready) poll_counter<true, kConsumerSleepNs>(a, tc + kt, tneed, unsigned(s) + 1u), ready = kt;
#pragma unroll
                for (int w = 0; w < 4; ++w) xv[w] = kn::ld_cg(xg + size_t(gbuf[b]) * 4 + w, true);
              }
              __syncwarp();
              item_mma_xw(acc, it, [&](int w) { return xv[w]; });
            } else {
              item_mma_xw(acc, it, [&](int w) { return gid == 0 ? xp[w] : make_uint4(0u, 0u, 0u, 0u); });
            }
            if (tig == 0) psum[item][gid] = acc[0], psum[item][gid + 8] = acc[2];
          }
          if (k + B < n) {
            buf[b] = load_item6(cs, item + B * IW, gid, tig, &gbuf[b]);
          } else if (j + B >= p && b < NP && !defer) {
            take(ns, b);
          }
        }
      }
      if (p == 0 && !defer) {
#pragma unroll
        for (int b = 0; b < NP; ++b) take(ns, b);
      }
      __syncthreads();
      // epilogue: a unit's 16 rows, k-tiles added in order
      {
        const int per = cs.m.M * cs.ktn, units = cs.n / per;
        if (kLL && kind == kGu) {  // act's pairs of rows (2 r2, 2 r2 + 1) of each unit (one part: no k-split)
          for (int e = t; e < units * 8; e += T) {
            const int uu = e >> 3, r2 = e & 7, o = (cs.u0 + uu) * 16 + 2 * r2;
            float g[2] = {0.f, 0.f}, u[2] = {0.f, 0.f};
#pragma unroll
            for (int j = 0; j < 2; ++j)
              for (int kt = 0; kt < cs.ktn; ++kt) {
                g[j] += psum[uu * per + kt][2 * r2 + j];
                u[j] += psum[uu * per + cs.ktn + kt][2 * r2 + j];
              }
            const half2 h = __halves2half2(kn::to_half_sat(kn::gelu_tanh(g[0]) * u[0]),
                                           kn::to_half_sat(kn::gelu_tanh(g[1]) * u[1]));
            ll_store(a.llact + size_t(l & 1) * (kMaxAct / 2) + o / 2, kn::h2_as_u32(h), ll_flag(a, l));
          }
        }
        for (int e = t; e < (kLL && kind == kGu ? 0 : units * 16); e += T) {
          const int uu = e >> 4, row = e & 15, u = cs.u0 + uu, tile = u / cs.m.P, part = u - tile * cs.m.P;
          float v0 = 0.f, v1 = 0.f;
          for (int kt = 0; kt < cs.ktn; ++kt) v0 += psum[uu * per + kt][row];
          if (cs.m.M == 2)
            for (int kt = 0; kt < cs.ktn; ++kt) v1 += psum[uu * per + cs.ktn + kt][row];
          const int o = tile * 16 + row;
          if constexpr (kLL) {
            const unsigned flag = ll_flag(a, l);
            if (kind == kQkv && o < kQ)
              ll_store(a.llq + (size_t(l & 1) * a.pq + part) * kQ + o, __float_as_uint(v0), flag);
            if (kind == kO) ll_store(a.llo + (size_t(l & 1) * a.po + part) * kH + o, __float_as_uint(v0), flag);
            if (kind == kDn) ll_store(a.lld + (size_t(l & 1) * kMaxParts + part) * kH + o, __float_as_uint(v0), flag);
            continue;  // gate/up: the loop below
          }
          if (kind == kQkv) a.yqkv[size_t(part) * kQKV + o] = v0;
          if (kind == kO) a.yo[size_t(part) * kH + o] = v0;
          if (kind == kGu) a.act[o] = kn::to_half_sat(kn::gelu_tanh(v0) * v1);
          if (kind == kDn) a.yd[size_t(part) * kH + o] = v0;
        }
      }
      __syncthreads();
      stamp(a, s, 2);
      if (kTiles >= 1 && t == 0) {  // the k-tile counters of the stages that wait per k-tile on this one
        const int units = cs.n / (cs.m.M * cs.ktn);
        if (kTiles >= 2 && kind == kQkv)
          arrive_units(a.tiles + size_t(3 * l) * kTileCounters, cs.u0, cs.u0 + units, 8 * cs.m.P, kQ / 16 * cs.m.P);
        if (kind == kGu) arrive_units(a.tiles + size_t(3 * l + 2) * kTileCounters, cs.u0, cs.u0 + units, 8, y.I / 16);
      }
      if (t == 0 && !kLL) kn::red_release_add(a.done + s, 1u);
      if (defer) {
#pragma unroll
        for (int b = 0; b < NP; ++b) take(ns, b);
      }
      if (kL2)
        for (int i = iw + NP * IW; iw >= 0 && i < ns.n; i += IW) prefetch_item6(ns, i, lane);
      ++ws;
    }
  }
  // h after the last layer: block 0 stores it
  if (blockIdx.x == 0) {
    const ChainLayer& last = a.layers[a.L - 1];
    if (!kLL) wait6(a, 5 * a.L - 1);
    const N6 none{};
    fold6<W, false, false, false, kLLG>(hs, a.yd, last.pd, last.w_post2, nullptr, xs, red, none, none, nullptr,
                                        a.lld + size_t((a.L - 1) & 1) * kMaxParts * kH, ll_flag(a, a.L - 1), &a);
    __syncthreads();
    for (int i = t; i < kH; i += T) a.h_out[i] = hs[i];
  }
}

// k-split parts for versions 6-7: the fewest (a divisor of the k-tiles, at most 16) whose largest per-block share of
// bytes is within 5% of an even split, with a block's items within kItems6.
int choose_parts6(int out, int in, int sms) {
  const int kt = in / 128, tiles = out / 16;
  const double even = double(tiles) * kt / sms;
  int best = -1;
  double best_share = 1e30;
  for (int p = 1; p <= 16; ++p) {
    if (kt % p != 0) continue;
    const long long per_block = ((long long)tiles * p + sms - 1) / sms;
    if (per_block * (kt / p) > kItems6) continue;
    const double share = double(per_block) * (kt / p);
    if (share < best_share * 0.999) best = p, best_share = share;
    if (share <= even * 1.05) break;
  }
  return best;
}

// k-split parts of a Store matrix: the fewest (1..4, an even number of k-tiles each, a unit <= kUnitMax) whose
// largest per-block share is within 10% of an even split.
int choose_parts(int out, int in, int sms) {
  const int kt = in / 128, tiles = out / 16;
  int best = -1;
  double best_bytes = 1e30;
  for (int p = 1; p <= 4; ++p) {
    if (kt % p != 0 || (kt / p) % 2 != 0 || 1152 * (kt / p) > kUnitMax) continue;
    const long long units = (long long)tiles * p;
    const double per_block = double((units + sms - 1) / sms) * 1152.0 * (kt / p);
    if (per_block < best_bytes * 0.9) best = p, best_bytes = per_block;
  }
  return best;
}

struct V2 {  // a configured persistent kernel (versions 2-5)
  void (*kernel)(ChainArgs) = nullptr;
  std::vector<ChainLayer> host;
  lab::DevBuf<ChainLayer> dev;
  ChainArgs args;
  int grid = 0, threads = kThreads;
  bool direct = false;  // versions 6+: the trace's slot 3 is when a fold's y is read and summed (0: no fold)
  size_t smem = 0;
};

// Versions 6-30: each one's kernel, block size (W warps), what it tries, and whether its hand-offs are LL words.
struct DirectVersion {
  void (*kernel)(ChainArgs);
  int threads;
  const char* what;
  bool ll;
};
template <int W, int B, bool kPre, bool kDeferAll, int NP = B, bool kL2 = false, bool kCtl = false, int kTiles = 0,
          bool kFold1 = false, bool kAhead = false, int kLLG = 0>
DirectVersion direct_version(const char* what) {
  return {direct_kernel<W, B, kPre, kDeferAll, NP, kL2, kCtl, kTiles, kFold1, kAhead, kLLG>, W * 32, what, kLLG > 0};
}
const DirectVersion& direct_version_of(int version) {
  static const DirectVersion t[] = {
      direct_version<32, 2, false, false>("32 warps, 2 items a warp in registers"),
      direct_version<16, 4, false, false>("16 warps, 4 items a warp in registers"),
      direct_version<32, 2, true, false>("version 6, norm weights before the wait"),
      direct_version<32, 2, true, true>("version 8, next-stage loads after the arrival"),
      direct_version<24, 3, true, false>("24 warps, 3 items a warp, norm weights before the wait"),
      direct_version<32, 2, true, false, 1, false>("version 8, one next-stage item a warp before the arrival"),
      direct_version<32, 2, true, false, 1, true>("version 11, the rest of the next stage into L2 after the arrival"),
      direct_version<32, 2, true, false, 0, true>(
          "version 8, no next-stage item before the arrival, all into L2 after it"),
      direct_version<32, 2, true, false, 2, true>("version 8, the rest of the next stage into L2 after the arrival"),
      direct_version<32, 1, true, true, 1, false>("version 9 with one item a warp"),
      direct_version<24, 2, true, true, 2, false>("version 9 with 24 warps"),
      direct_version<24, 3, true, true, 3, false>("version 10 with the next-stage loads after the arrival"),
      direct_version<32, 2, true, true, 2, false, true>("version 9 with warp 0 taking no items"),
      direct_version<24, 3, true, true, 3, false, true>("version 17 with warp 0 taking no items"),
      direct_version<24, 3, true, true, 3, false, true, 1>("version 19, down_proj waiting per k-tile of act"),
      direct_version<24, 3, true, true, 3, false, true, 2>(
          "version 20, o_proj waiting per k-tile of a (the stand-in by warp 0, per k-tile of q)"),
      direct_version<24, 3, true, true, 3, false, true, 0, true>("version 19 with each fold in one block reduction"),
      direct_version<24, 3, true, true, 3, false, true, 2, true>("version 21 with each fold in one block reduction"),
      direct_version<24, 2, true, true, 2, false, true, 2, true>("version 23 with 2 items a warp"),
      direct_version<24, 3, true, true, 3, false, true, 0, false, true>(
          "version 19 with a k-split's parts loaded together in the folds and the stand-in"),
      direct_version<24, 3, true, true, 3, false, true, 0, true, true>("version 25 with version 22's folds"),
      direct_version<24, 3, true, true, 3, false, true, 0, false, false, 4>(
          "version 19 with every hand-off in the data (LL words: no counters), 4 parts' words at once"),
      direct_version<24, 2, true, true, 2, false, true, 0, false, false, 4>("version 27 with 2 items a warp"),
      direct_version<24, 3, true, true, 3, false, true, 0, false, false, 2>("version 27 with 2 parts' words at once"),
      direct_version<24, 2, true, true, 2, false, true, 0, false, false, 2>("version 29 with 2 items a warp"),
  };
  if (version < 6 || version - 6 >= int(sizeof t / sizeof t[0]))
    std::exit((std::fprintf(stderr, "no direct version %d\n", version), 2));
  return t[version - 6];
}
constexpr int kLastVersion = 30;  // 6 + the table's entries - 1

struct Config {
  int version, ring_kb, lockstep;
};

V2 v2_setup(const std::vector<Layer>& m, Scratch& s, const Config& cfg) {
  V2 v;
  const bool direct = cfg.version >= 6;
  v.kernel = direct             ? direct_version_of(cfg.version).kernel
             : cfg.version == 5 ? chain_kernel<5>
             : cfg.version == 4 ? chain_kernel<4>
             : cfg.version == 3 ? chain_kernel<3>
                                : chain_kernel<2>;
  v.direct = direct;
  v.threads = direct ? direct_version_of(cfg.version).threads : kThreads;
  const int ring_kb = cfg.ring_kb, lockstep = cfg.lockstep;
  v.args.lockstep = lockstep;
#ifdef GEMMA4_T4_EMU
  // the emulator runs blocks one after another, so one block runs every unit; the k-splits are an H100's
  const int grid = 1, split_sms = 132;
#else
  const int grid = kn::device_sms(), split_sms = grid;
#endif
  const auto parts = [&](int out, int in) {
    return direct ? choose_parts6(out, in, split_sms) : choose_parts(out, in, split_sms);
  };
  for (const Layer& y : m) {
    ChainLayer c{};
    const Mat4* mats[5] = {&y.qkv, &y.o, &y.g, &y.u, &y.d};
    for (int i = 0; i < 5; ++i) c.q[i] = mats[i]->q.get(), c.s[i] = mats[i]->s.get();
    c.I = y.I;
    c.pd = parts(kH, y.I);
    c.w_in = y.w_in.get(), c.w_post1 = y.w_post1.get(), c.w_pre2 = y.w_pre2.get(), c.w_post2 = y.w_post2.get();
    if (c.pd < 1) std::exit((std::fprintf(stderr, "no k-split for down_proj of %d\n", y.I), 2));
    v.host.push_back(c);
  }
  v.dev = lab::DevBuf<ChainLayer>(v.host.size());
  LAB_CHECK(cudaMemcpy(v.dev.get(), v.host.data(), v.host.size() * sizeof(ChainLayer), cudaMemcpyHostToDevice));
  ChainArgs& a = v.args;
  a.layers = v.dev.get();
  a.L = int(m.size());
  a.h_in = s.h_in.get();
  a.h_out = s.h.get();
  a.yqkv = s.yqkv.get(), a.a = s.a.get(), a.yo = s.yo.get(), a.act = s.act.get(), a.yd = s.yd.get();
  a.done = s.done.get(), a.fault = s.fault.get();
  a.tiles = s.done.get() + 5 * a.L;
  a.pq = parts(kQKV, kH);
  a.po = parts(kH, kQ);
  if (a.pq < 1 || a.po < 1) std::exit((std::fprintf(stderr, "no k-split for q/k/v or o_proj\n"), 2));
  if (direct && direct_version_of(cfg.version).ll) {  // the LL buffers (versions 27-30), in Scratch's one allocation
    unsigned long long* p = s.ll.get();
    const auto take = [&](size_t words) { return std::exchange(p, p + 2 * words); };
    a.llq = take(size_t(kMaxParts) * kQ), a.lla = take(kQ / 2), a.llo = take(size_t(kMaxParts) * kH);
    a.llact = take(kMaxAct / 2), a.lld = take(size_t(kMaxParts) * kH);
    if (a.pq > kMaxParts || a.po > kMaxParts) std::exit((std::fprintf(stderr, "LL: more than 16 parts\n"), 2));
    // the buffers' reuse every other layer is safe when every block writes a share of a (above ll_flag)
    if (kQ / 2 < grid) std::exit((std::fprintf(stderr, "LL: a block without a share of a\n"), 2));
    if (a.L >= 64) std::exit((std::fprintf(stderr, "LL: the flags take at most 63 layers\n"), 2));
  }
  a.ring = unsigned(ring_kb) * 1024u;
  v.smem = direct ? 0 : size_t(kMaxIn) * sizeof(half) + a.ring;
  LAB_CHECK(cudaMemset(s.done.get(), 0, s.done.size() * sizeof(unsigned)));  // a fresh epoch count
  LAB_CHECK(cudaMemset(s.fault.get(), 0, sizeof(unsigned)));
  if (!direct) LAB_CHECK(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(v.smem)));
  int per_sm = 0;
  LAB_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, reinterpret_cast<const void*>(v.kernel), v.threads,
                                                          v.smem));
  if (per_sm < 1) std::exit((std::fprintf(stderr, "chain_kernel does not fit an SM at %zu B\n", v.smem), 2));
  v.grid = grid;
  if (direct) {  // every stage's items of a block fit the partial sums
    const auto items = [&](int out, int in, int M, int P) {
      return (out / 16 * P + grid - 1) / grid * M * (in / 128 / P);
    };
    for (const ChainLayer& c : v.host)
      if (std::max({items(kQKV, kH, 1, a.pq), items(kH, kQ, 1, a.po), items(c.I, kH, 2, 1), items(kH, c.I, 1, c.pd)}) >
          kItems6)
        std::exit((std::fprintf(stderr, "a block's items of a stage exceed %d\n", kItems6), 2));
  }
  return v;
}

void v2_step(V2& v, cudaStream_t st) {
#ifdef GEMMA4_T4_EMU  // one block (v2_setup), so no co-residency to ask for
  lab::launch(v.kernel, dim3(unsigned(v.grid)), dim3(unsigned(v.threads)), st, v.args);
  ++v.args.epoch;
  return;
#endif
  void* params[] = {&v.args};
  LAB_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(v.kernel), dim3(unsigned(v.grid)),
                                        dim3(unsigned(v.threads)), params, v.smem, st));
  ++v.args.epoch;
}

void check_fault(Scratch& s, const char* what);

// One traced step of version 2: per stage kind, the mean over layers of the stage's period (its last arrival minus the
// previous stage's), split into the hand-off (previous last arrival -> median block's dependency met), building x
// (median), and the units (median x built -> last block done); and the consumers' waits for the ring (versions 2-5),
// or (versions 6+) the time from the dependency met to a fold's y read and its first sum (median and largest block).
void v2_trace(V2& v, Scratch& s, cudaStream_t st) {
  const int L = v.args.L, G = v.grid;
  lab::DevBuf<unsigned long long> tr(size_t(5 * L) * G * kSlots);
  LAB_CHECK(cudaMemset(tr.get(), 0, tr.size() * sizeof(unsigned long long)));
  v.args.trace = tr.get();
  v2_step(v, st);
  LAB_CHECK(cudaStreamSynchronize(st));
  v.args.trace = nullptr;
  check_fault(s, "persistent (trace)");
  const std::vector<unsigned long long> t = tr.download();
  const auto at = [&](int stage, int b, int slot) {
    return double(t[(size_t(stage) * G + size_t(b)) * kSlots + size_t(slot)]);
  };
  const auto median = [](std::vector<double> x) {
    std::nth_element(x.begin(), x.begin() + x.size() / 2, x.end());
    return x[x.size() / 2];
  };
  const char* names[5] = {"q/k/v", "attention stand-in", "o_proj", "gate/up + GELU", "down_proj"};
  double sum[5][6] = {}, n[5] = {};
  for (int st2 = 1; st2 < 5 * L; ++st2) {
    double prev_end = 0, end = 0, ring_max = 0, ring_sum = 0;
    std::vector<double> dep, xb, built, fold;
    for (int b = 0; b < G; ++b) {
      prev_end = std::max(prev_end, at(st2 - 1, b, 2));
      end = std::max(end, at(st2, b, 2));
      dep.push_back(at(st2, b, 0));
      xb.push_back(at(st2, b, 1) - at(st2, b, 0));
      built.push_back(at(st2, b, 1));
      const double s3 = v.direct ? (at(st2, b, 3) > 0 ? at(st2, b, 3) - at(st2, b, 0) : 0.0) : at(st2, b, 3);
      fold.push_back(s3);
      ring_sum += s3;
      ring_max = std::max(ring_max, s3);
    }
    const int k = st2 % 5;
    const double d = median(dep), bm = median(built);
    const double row[6] = {end - prev_end, d - prev_end, median(xb), end - bm, v.direct ? median(fold) : ring_sum / G,
                           ring_max};
    for (int i = 0; i < 6; ++i) sum[k][i] += row[i] * 1e-3;
    n[k] += 1;
  }
  double first = 1e300, last = 0;
  for (int b = 0; b < G; ++b) first = std::min(first, at(0, b, 0)), last = std::max(last, at(5 * L - 1, b, 2));
  std::printf(
      "  traced step: %.1f us from the first stage's start to the last arrival; per stage, us (mean over layers):\n",
      (last - first) * 1e-3);
  std::printf("  %-20s %8s %8s %8s %8s %12s %12s\n", "stage", "period", "hand-off", "build x", "units",
              v.direct ? "fold's y" : "ring wait", v.direct ? "fold's y max" : "ring wait max");
  for (int k = 0; k < 5; ++k)
    if (n[k] > 0)
      std::printf("  %-20s %8.2f %8.2f %8.2f %8.2f %12.2f %12.2f\n", names[k], sum[k][0] / n[k], sum[k][1] / n[k],
                  sum[k][2] / n[k], sum[k][3] / n[k], sum[k][4] / n[k], sum[k][5] / n[k]);
}

void check_fault(Scratch& s, const char* what) {
  const std::vector<unsigned> f = s.fault.download();
  if (f[0]) std::exit((std::printf("FAIL %s: a wait timed out (fault 0x%x)\n", what, f[0]), 1));
}

}  // namespace

int main(int argc, char** argv) {
  lab::CommonArgs common;
  common.versions = {1, 19, 25, 26, 27, 28, 29, 30};
  common.reps = 20;
  int layers = 35, wide_from = 15;
  std::vector<int> rings = {128, 64, 32};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    std::vector<int> v;
    if (common.take(argc, argv, &i, kLastVersion)) continue;
    if ((arg == "--layers" || arg == "--wide-from") && i + 1 < argc && lab::parse_ints(argv[i + 1], &v) &&
        v.size() == 1) {
      (arg == "--layers" ? layers : wide_from) = v[0];
      ++i;
    } else if (arg == "--ring-kb" && i + 1 < argc && lab::parse_ints(argv[i + 1], &rings)) {
      ++i;
    } else {
      std::fprintf(stderr,
                   "usage: lab_decode_chain [VERSIONS] [--layers N] [--wide-from L] [--ring-kb 128,64,32] [--reps N] "
                   "[--samples N] [--validate-only]\n");
      return 2;
    }
  }
  for (int r : rings)
    if (r < 32 || (r & (r - 1)) != 0) return (std::fprintf(stderr, "--ring-kb: powers of two >= 32\n"), 2);
#ifdef GEMMA4_T4_EMU
  for (int v : common.versions)
    if (v >= 2 && v <= 5) return (std::fprintf(stderr, "versions 2-5 do not run on the CPU emulator\n"), 2);
#endif
  cudaDeviceProp prop{};
  LAB_CHECK(cudaGetDeviceProperties(&prop, 0));
  const bool pdl = kn::pdl_supported(0);
  std::printf("device: %s, %d SMs, %zu KiB shared memory per block (opt-in), PDL %s\n", prop.name,
              prop.multiProcessorCount, prop.sharedMemPerBlockOptin / 1024, pdl ? "on" : "off (not in this build)");
  cudaStream_t st;
  LAB_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const kn::Launch launch(st, pdl);
  const auto has = [&](int v) {
    return std::find(common.versions.begin(), common.versions.end(), v) != common.versions.end();
  };
  std::vector<int> ring_ok;
  for (int r : rings)
    if (size_t(r) * 1024 + size_t(kMaxIn) * 2 + 2048 <= prop.sharedMemPerBlockOptin) ring_ok.push_back(r);
  if ((has(2) || has(3) || has(4) || has(5)) && ring_ok.empty())
    return (std::printf("no --ring-kb fits this GPU's shared memory\n"), 1);
  // the persistent versions' configurations: version 2 at the largest ring; version 3 at each ring, then the largest
  // in lockstep
  std::vector<Config> configs;
  if (has(2) && !ring_ok.empty()) configs.push_back({2, ring_ok[0], 0});
  if (has(3)) {
    for (int r : ring_ok) configs.push_back({3, r, 0});
    if (!ring_ok.empty()) configs.push_back({3, ring_ok[0], 1});
  }
  for (int ver = 4; ver <= 5; ++ver)
    if (has(ver))
      for (int r : ring_ok) configs.push_back({ver, r, 0});
  for (int ver = 6; ver <= kLastVersion; ++ver)
    if (has(ver)) configs.push_back({ver, 0, 0});
  const auto config_name = [](const Config& c) {
    if (c.version >= 6) return "version " + std::to_string(c.version) + " (" + direct_version_of(c.version).what + ")";
    return "version " + std::to_string(c.version) + ", ring " + std::to_string(c.ring_kb) + " KiB" +
           (c.lockstep ? ", lockstep" : "");
  };

  // ---- validation: 3 layers (narrow, wide, wide) against the host reference ----
  int failures = 0;
  {
    const std::vector<Layer> m = make_model(3, 1, 11);
    Scratch s(3, 16);
    lab::fill_uniform(s.h_in.get(), kH, -1.f, 1.f, 5);
    const std::vector<float> h_in = s.h_in.download();
    const std::vector<double> ref = ref_chain(m, h_in);
    lab::Tally tally{"h (3 layers)", 5e-3};
    if (has(1)) {
      LAB_CHECK(cudaMemcpy(s.h.get(), s.h_in.get(), kH * 4, cudaMemcpyDeviceToDevice));
      v1_step(m, s, launch);
      LAB_CHECK(cudaStreamSynchronize(st));
      const lab::Error e = lab::max_rel_error(s.h.download(), ref);
      failures += !tally.add(e, "version 1");
      std::printf("validate version 1: max rel err %.3g\n", e.max_rel);
    }
    for (const Config& c : configs) {
      s.h.poison();
      V2 v = v2_setup(m, s, c);
      v2_step(v, st);
      LAB_CHECK(cudaStreamSynchronize(st));
      check_fault(s, "persistent (validation)");
      const lab::Error e = lab::max_rel_error(s.h.download(), ref);
      failures += !tally.add(e, config_name(c));
      std::printf("validate %s (parts q/k/v %d, o %d, down %d/%d): max rel err %.3g\n", config_name(c).c_str(),
                  v.args.pq, v.args.po, v.host[0].pd, v.host[1].pd, e.max_rel);
    }
  }
  if (failures) return (std::printf("FAILED validation\n"), 1);
  if (common.validate_only) return 0;

  // ---- the full chain ----
  const std::vector<Layer> m = make_model(layers, wide_from, 77);
  const double bytes = weight_bytes(m);
  const double bound = lab::stream_read_gbs(st);
  std::printf(
      "chain: %d layers (double-wide from %d), %.1f MB of weights + scales a step; stream read %.0f GB/s -> "
      "bound %.1f us\n",
      layers, wide_from, bytes / 1e6, bound, bytes / bound / 1e3);
  Scratch s(layers, 16);
  lab::fill_uniform(s.h_in.get(), kH, -1.f, 1.f, 5);
  std::vector<float> h1;
  if (has(1)) {
    LAB_CHECK(cudaMemcpy(s.h.get(), s.h_in.get(), kH * 4, cudaMemcpyDeviceToDevice));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    LAB_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    v1_step(m, s, launch);
    LAB_CHECK(cudaStreamEndCapture(st, &graph));
    LAB_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    LAB_CHECK(cudaGraphLaunch(exec, st));
    LAB_CHECK(cudaStreamSynchronize(st));
    h1 = s.h.download();
    const double us =
        lab::median_us([&](int) { LAB_CHECK(cudaGraphLaunch(exec, st)); }, common.reps, common.samples, st);
    std::printf("version 1 (%zu launches a step, one graph%s): %8.1f us a step, %6.0f GB/s (%4.1f%% of stream read)\n",
                7 * m.size() + 1, pdl ? ", PDL" : "", us, bytes / us / 1e3, 100.0 * bytes / us / 1e3 / bound);
    LAB_CHECK(cudaGraphExecDestroy(exec));
    LAB_CHECK(cudaGraphDestroy(graph));
  }
  for (const Config& c : configs) {
    V2 v = v2_setup(m, s, c);
    s.h.poison();
    v2_step(v, st);
    LAB_CHECK(cudaStreamSynchronize(st));
    check_fault(s, "persistent");
    if (!h1.empty()) {
      std::vector<double> ref(h1.begin(), h1.end());
      const lab::Error e = lab::max_rel_error(s.h.download(), ref);
      std::printf("%s against version 1, %d layers: max rel diff %.3g, %zu non-finite\n", config_name(c).c_str(),
                  layers, e.max_rel, e.nonfinite);
    }
    const double us = lab::median_us([&](int) { v2_step(v, st); }, common.reps, common.samples, st);
    check_fault(s, "persistent (timing)");
    const bool traced = (c.version >= 3 && (c.version >= 6 || c.ring_kb == ring_ok[0])) || c.lockstep;
    std::printf(
        "%s (%d blocks x %d threads, %zu B shared): %8.1f us a step, %6.0f GB/s "
        "(%4.1f%% of stream read)\n",
        config_name(c).c_str(), v.grid, v.threads, v.smem, us, bytes / us / 1e3, 100.0 * bytes / us / 1e3 / bound);
    if (traced) v2_trace(v, s, st);
  }
  LAB_CHECK(cudaStreamDestroy(st));
  return 0;
}
