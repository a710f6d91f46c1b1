// GPU tests of kernels/flash_attention.cuh: the tensor-core prefill attention against a host fp32/fp64
// reference computed from the same fp16 inputs, and against launch_attention (attention.cuh) on the same
// inputs.
//
// Caches are built the way the backend fills them: every sequence has a logical K/V per position (random
// fp16), written in position order into slot j % capacity -- a ring of window + (rows of the sequence's
// chunk) slots on sliding layers, so positions beyond the ring wrap and overwrite older ones -- and the
// reference reads the LOGICAL arrays, so a wrong slot, layer or KV head shows. Slots never written and the
// other layer's caches hold fp16 NaN, as does the output before the launch: a read the kernel must not make
// or an element it forgot to write fails the check. Tolerance: max |got - ref| / max |ref| <= 2e-3 (P is
// rounded to fp16 for the P.V product, out to fp16).
// Every case is tagged [gpu]; tests/gpu/main.cpp skips the suite visibly where no GPU is present.
#include <catch2/catch.hpp>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../../kernels/attention.cuh"
#include "../../kernels/flash_attention.cuh"

#include "gemma4_t4.hpp"
#include "gemma4_t4/common.hpp"
#include "harness.hpp"

namespace {

namespace kn = gemma4_t4::kernels;
using gemma4_t4::detail::f16_to_f32;
using gemma4_t4::detail::f32_to_f16;
using namespace gputest;

// ---- harness (REQUIRE_CUDA, cat, Dev, Stream: harness.hpp) ----

constexpr uint16_t kNaN16 = 0xFFFFu;  // an fp16 NaN
constexpr double kTolFlash = 2e-3;    // max |err| / max |ref|: fp16 P and fp16 outputs

// ---- a prefill pass: sequences' prompt chunks over their caches ----

constexpr int kLayers = 2, kLayer = 1;  // caches of layer 1 are read; layer 0's are NaN

struct Run {
  int seq, p0, n;  // n rows of sequence `seq` at positions p0 .. p0 + n - 1 (its chunk in this pass)
};

struct Pass {
  int D = 0, kv_heads = 0, group = 0, window = 0;
  int rows = 0, heads = 0, seqs = 0;
  std::vector<Run> runs;                       // in row order
  std::vector<int> seq, pos;                   // [rows]
  std::vector<uint16_t> q;                     // [rows, heads, D] fp16
  std::vector<std::vector<float>> klog, vlog;  // [seqs] -> [last position + 1, kv_heads, D] (fp16 values)
  std::vector<int> capacity;                   // [seqs * layers]
  std::vector<std::vector<uint16_t>> kc, vc;   // [seqs * layers] -> [capacity, kv_heads, D] fp16
};

// Sliding layers: a ring of window + n slots (the least the contract allows); full layers: every position
// plus 5 spare slots; ring_extra more slots in both (moves where the ring wraps relative to the key tiles).
Pass make_pass(std::mt19937& rng, int D, int kv_heads, int group, int window, const std::vector<Run>& runs, float q_amp,
               int ring_extra = 0) {
  Pass p;
  p.D = D;
  p.kv_heads = kv_heads;
  p.group = group;
  p.window = window;
  p.heads = kv_heads * group;
  p.runs = runs;
  for (const Run& r : runs) {
    p.seqs = std::max(p.seqs, r.seq + 1);
    for (int i = 0; i < r.n; ++i) {
      p.seq.push_back(r.seq);
      p.pos.push_back(r.p0 + i);
    }
  }
  p.rows = int(p.seq.size());
  p.q = rand_f16(rng, size_t(p.rows) * p.heads * D, -q_amp, q_amp);
  p.klog.resize(size_t(p.seqs));
  p.vlog.resize(size_t(p.seqs));
  p.capacity.assign(size_t(p.seqs) * kLayers, 1);
  p.kc.assign(size_t(p.seqs) * kLayers, std::vector<uint16_t>(size_t(kv_heads) * D, kNaN16));
  p.vc = p.kc;
  const size_t row = size_t(kv_heads) * D;  // one position of one cache
  for (const Run& r : runs) {
    const int last = r.p0 + r.n - 1, cap = (window > 0 ? window + r.n : last + 1 + 5) + ring_extra;
    const std::vector<uint16_t> k16 = rand_f16(rng, size_t(last + 1) * row, -1.f, 1.f);
    const std::vector<uint16_t> v16 = rand_f16(rng, size_t(last + 1) * row, -1.f, 1.f);
    p.klog[size_t(r.seq)] = widen(k16);
    p.vlog[size_t(r.seq)] = widen(v16);
    for (int l = 0; l < kLayers; ++l) {
      const size_t idx = size_t(r.seq) * kLayers + size_t(l);
      p.capacity[idx] = l == kLayer ? cap : 7;
      p.kc[idx].assign(size_t(p.capacity[idx]) * row, kNaN16);
      p.vc[idx].assign(size_t(p.capacity[idx]) * row, kNaN16);
    }
    const size_t idx = size_t(r.seq) * kLayers + kLayer;
    for (int j = 0; j <= last; ++j) {  // in position order: a ring keeps the latest position of each slot
      std::copy_n(k16.begin() + std::ptrdiff_t(size_t(j) * row), row,
                  p.kc[idx].begin() + std::ptrdiff_t(size_t(j % cap) * row));
      std::copy_n(v16.begin() + std::ptrdiff_t(size_t(j) * row), row,
                  p.vc[idx].begin() + std::ptrdiff_t(size_t(j % cap) * row));
    }
  }
  return p;
}

// out[r, h] = softmax_j(q . k_j) v_j over j in [lo, p] from the logical K/V.     [rows, heads * D]
std::vector<double> flash_attention_ref(const Pass& p) {
  const int D = p.D;
  const std::vector<float> q = widen(p.q);
  std::vector<double> out(size_t(p.rows) * p.heads * D, 0.0);
  std::vector<double> sc, o(size_t(D), 0.0);
  for (int r = 0; r < p.rows; ++r) {
    const int s = p.seq[size_t(r)], ps = p.pos[size_t(r)];
    const int lo = p.window > 0 ? std::max(0, ps - p.window + 1) : 0;
    const std::vector<float>&K = p.klog[size_t(s)], &V = p.vlog[size_t(s)];
    for (int h = 0; h < p.heads; ++h) {
      const int g = h / p.group;
      const float* qh = &q[(size_t(r) * p.heads + h) * D];
      sc.assign(size_t(ps - lo + 1), 0.0);
      double mx = -INFINITY;
      for (int j = lo; j <= ps; ++j) {
        const float* kr = &K[(size_t(j) * p.kv_heads + g) * D];
        double d = 0;
        for (int c = 0; c < D; ++c) d += double(qh[c]) * kr[c];
        sc[size_t(j - lo)] = d;
        mx = std::max(mx, d);
      }
      double sum = 0;
      std::fill(o.begin(), o.end(), 0.0);
      for (int j = lo; j <= ps; ++j) {
        const double e = std::exp(sc[size_t(j - lo)] - mx);
        sum += e;
        const float* vr = &V[(size_t(j) * p.kv_heads + g) * D];
        for (int c = 0; c < D; ++c) o[size_t(c)] += e * vr[c];
      }
      for (int c = 0; c < D; ++c) out[(size_t(r) * p.heads + h) * D + c] = o[size_t(c)] / sum;
    }
  }
  return out;
}

// The pass on the device: caches, tables, q, the tile table and an output buffer per kernel.
struct DevPass {
  DevKvCaches kv;
  std::unique_ptr<Dev<int>> cap, seq, pos;
  std::unique_ptr<Dev<half>> q, out, out_split;  // out, out_split: [rows, heads * D] fp16
  std::unique_ptr<Dev<int2>> tiles;              // [num_tiles] {first row, row count}
  int num_tiles = 0, head_dim = 0;
  kn::AttnArgs args;

  // shuffle_rng: shuffle the tile table first (null: keep flash_attention_tiles' order).
  DevPass(const Pass& p, std::mt19937* shuffle_rng) : kv(p.kc, p.vc), head_dim(p.D) {
    cap = std::make_unique<Dev<int>>(p.capacity.size());
    seq = std::make_unique<Dev<int>>(p.seq.size());
    pos = std::make_unique<Dev<int>>(p.pos.size());
    q = std::make_unique<Dev<half>>(p.q.size());
    out = std::make_unique<Dev<half>>(p.q.size());
    out_split = std::make_unique<Dev<half>>(p.q.size());
    cap->upload(p.capacity);
    seq->upload(p.seq);
    pos->upload(p.pos);
    q->upload(p.q);

    const int max_tiles = kn::flash_attention_max_tiles(p.rows, int(p.runs.size()), p.group);
    std::vector<int2> t(size_t(std::max(max_tiles, 1)));
    num_tiles = kn::flash_attention_tiles(p.seq.data(), p.pos.data(), p.rows, p.group, t.data(), max_tiles);
    REQUIRE(num_tiles > 0);
    REQUIRE(num_tiles <= max_tiles);
    t.resize(size_t(num_tiles));
    if (shuffle_rng) std::shuffle(t.begin(), t.end(), *shuffle_rng);  // the table's order is free
    tiles = std::make_unique<Dev<int2>>(t.size());
    tiles->upload(t);

    args.q = q->get();
    args.kbase = kv.kb->get();
    args.vbase = kv.vb->get();
    args.capacity = cap->get();
    args.seq = seq->get();
    args.pos = pos->get();
    args.layer = kLayer;
    args.layers = kLayers;
    args.rows = p.rows;
    args.heads = p.heads;
    args.kv_heads = p.kv_heads;
    args.window = p.window;
    args.out = out->get();
  }

  cudaError_t flash(cudaStream_t s) const {
    return kn::launch_flash_attention(args, tiles->get(), num_tiles, head_dim, s);
  }

  // launch_attention (split over keys + merge) into out_split.
  void split(const Pass& p, int splits, const Stream& st) {
    kn::AttnArgs a = args;
    a.splits = splits;
    Dev<float> part_o(size_t(p.rows) * p.heads * size_t(splits) * p.D);  // [rows, heads, splits, D] fp32
    Dev<float> part_ml(size_t(p.rows) * p.heads * size_t(splits) * 2);   // [rows, heads, splits, 2] fp32
    a.part_o = part_o.get();
    a.part_ml = part_ml.get();
    a.out = out_split->get();
    out_split->poison();
    REQUIRE(kn::attention_supported(p.D, p.group));
    REQUIRE_CUDA(kn::launch_attention(a, p.D, st.s));
    st.sync();
  }
};

// Runs flash attention on the pass, checks it against the host reference and against launch_attention.
void check_pass(const Pass& p, const Stream& st, std::mt19937* shuffle_rng, const std::string& what) {
  INFO(what);
  const std::vector<double> ref = flash_attention_ref(p);
  DevPass d(p, shuffle_rng);
  REQUIRE(kn::flash_attention_supported(p.D, p.group));
  d.out->poison();
  REQUIRE_CUDA(d.flash(st.s));
  st.sync();
  const std::vector<float> got = widen(d.out->download<uint16_t>());
  check_max_rel(got, ref, kTolFlash, cat("flash vs reference: ", what));

  // The same inputs through the CUDA-core split kernel: both must agree closely.
  d.split(p, 3, st);
  const std::vector<float> split = widen(d.out_split->download<uint16_t>());
  std::vector<double> split_d(split.begin(), split.end());
  check_max_rel(got, split_d, kTolFlash, cat("flash vs launch_attention: ", what));
}

// ---- correctness ----

TEST_CASE("flash attention: prompt chunks of several sequences, full and ring caches, D 64/128/256/512, groups 1-8",
          "[gpu]") {
  std::mt19937 rng(4242);
  Stream st;
  // Row order: a one-row chunk (decode-like), a first chunk from position 0, a 129-row chunk at 200..328 (the
  // cache already holds 0..199), a 7-row chunk at 100..106. Odd row counts: 1, 33, 129, 7.
  const std::vector<Run> runs = {{2, 57, 1}, {0, 0, 33}, {3, 200, 129}, {1, 100, 7}};
  int n = 0;
  for (int D : {64, 128, 256, 512})
    for (int group : {1, 2, 3, 8})
      // window 8: most keys of a tile masked, and at 32 positions per tile (group 1) rows whose first key
      // lies in a later key tile (a fully masked row inside a tile); window 100: the 129-row chunk's ring
      // (229 slots) wraps; 0: full attention.
      for (int window : {0, 8, 100}) {
        const int kv_heads = group == 8 ? 1 : 2;  // group 8 / 1 KV head: the E2B shape
        // sharp scores (|q . k| up to ~0.5 sqrt(D): the online max moves across tiles) or soft ones
        const float q_amp = group == 2 ? 3.f / std::sqrt(float(D)) : 1.f;
        const Pass p = make_pass(rng, D, kv_heads, group, window, runs, q_amp);
        check_pass(p, st, (n++ % 2) ? &rng : nullptr,
                   cat("D ", D, " kv_heads ", kv_heads, " group ", group, " window ", window));
      }
}

TEST_CASE("flash attention: 1500-key prompt chunk next to a fresh sequence, window 512/1024 rings, E2B shapes",
          "[gpu]") {
  std::mt19937 rng(977);
  Stream st;
  // 129 rows at positions 1371..1499 (1500 keys) and a fresh 33-row prompt, 8 query heads per KV head.
  const std::vector<Run> runs = {{1, 1371, 129}, {0, 0, 33}};
  for (int D : {256, 512})
    for (int window : {0, 512, 1024}) {
      const Pass p = make_pass(rng, D, 1, 8, window, runs, 1.f);
      check_pass(p, st, nullptr, cat("D ", D, " group 8 window ", window, " (1500 keys)"));
    }
}

TEST_CASE("flash attention: the ring wraps at every offset of a key tile, short and long key ranges", "[gpu]") {
  std::mt19937 rng(5150);
  Stream st;
  // 45 rows at 300..344 over a 40-key window (ring of 85 + extra slots: wraps inside most key tiles), a
  // 2-row chunk at 3..4 (one key tile, the second key group idle), a 70-row fresh prompt.
  const std::vector<Run> runs = {{0, 300, 45}, {1, 3, 2}, {2, 0, 70}};
  for (int D : {64, 256, 512})
    for (int group : {1, 8})
      for (int extra : {0, 1, 13, 31}) {
        const Pass p = make_pass(rng, D, group == 8 ? 1 : 2, group, 40, runs, 1.f, extra);
        check_pass(p, st, nullptr, cat("D ", D, " group ", group, " window 40, ring of window + rows + ", extra));
      }
}

// ---- speed: a 512-row chunk at the start and at the end of a 4096-token prompt ----

TEST_CASE("flash attention: first and last 512 rows of a 4096-token prompt match launch_attention; timing", "[gpu]") {
  std::mt19937 rng(31);
  Stream st;
  struct Shape {
    int D, window, p0;
  };
  // E2B full and sliding layers, first chunk (positions 0..511) and last chunk (3584..4095)
  for (const Shape sh :
       {Shape{512, 0, 0}, Shape{512, 0, 4096 - 512}, Shape{256, 512, 0}, Shape{256, 512, 4096 - 512}}) {
    const Pass p = make_pass(rng, sh.D, 1, 8, sh.window, {{0, sh.p0, 512}}, 1.f);
    INFO("D " << sh.D << " window " << sh.window << " positions " << sh.p0 << "..");
    DevPass d(p, nullptr);
    d.out->poison();
    REQUIRE_CUDA(d.flash(st.s));
    st.sync();
    const std::vector<float> got = widen(d.out->download<uint16_t>());
    d.split(p, 1, st);
    const std::vector<float> split = widen(d.out_split->download<uint16_t>());
    check_max_rel(got, std::vector<double>(split.begin(), split.end()), kTolFlash, "flash vs launch_attention");

    cudaEvent_t e0, e1;
    REQUIRE_CUDA(cudaEventCreate(&e0));
    REQUIRE_CUDA(cudaEventCreate(&e1));
    constexpr int kReps = 5;
    REQUIRE_CUDA(cudaEventRecord(e0, st.s));
    for (int i = 0; i < kReps; ++i) REQUIRE_CUDA(d.flash(st.s));
    REQUIRE_CUDA(cudaEventRecord(e1, st.s));
    REQUIRE_CUDA(cudaEventSynchronize(e1));
    float ms_flash = 0;
    REQUIRE_CUDA(cudaEventElapsedTime(&ms_flash, e0, e1));
    ms_flash /= kReps;
    kn::AttnArgs a = d.args;
    Dev<float> part_o(size_t(p.rows) * p.heads * p.D), part_ml(size_t(p.rows) * p.heads * 2);
    a.part_o = part_o.get();
    a.part_ml = part_ml.get();
    a.out = d.out_split->get();
    REQUIRE_CUDA(cudaEventRecord(e0, st.s));
    REQUIRE_CUDA(kn::launch_attention(a, p.D, st.s));
    REQUIRE_CUDA(cudaEventRecord(e1, st.s));
    REQUIRE_CUDA(cudaEventSynchronize(e1));
    float ms_split = 0;
    REQUIRE_CUDA(cudaEventElapsedTime(&ms_split, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);

    double keys = 0;  // sum over rows of the keys each row sees
    for (int ps : p.pos) keys += sh.window > 0 ? std::min(ps + 1, sh.window) : ps + 1;
    const double flop = 4.0 * keys * p.heads * p.D;  // q.k and p.v, 2 flop per multiply-add
    std::printf(
        "\nflash attention D %d window %d, %d rows x %d heads (positions %d..%d): flash %.3f ms (%.2f "
        "TFLOP/s), launch_attention (1 split) %.3f ms\n",
        p.D, sh.window, p.rows, p.heads, p.pos.front(), p.pos.back(), ms_flash, flop / ms_flash * 1e-9, ms_split);
    std::fflush(stdout);
  }
}

// ---- host side: tile table, refused shapes ----

TEST_CASE("flash attention: tile table cuts runs, launcher refuses unsupported shapes before launching", "[gpu]") {
  // positions per tile: 32 / (group rounded up to 1, 2, 4, 8)
  REQUIRE(kn::flash_tile_positions(1) == 32);
  REQUIRE(kn::flash_tile_positions(2) == 16);
  REQUIRE(kn::flash_tile_positions(3) == 8);
  REQUIRE(kn::flash_tile_positions(4) == 8);
  REQUIRE(kn::flash_tile_positions(5) == 4);
  REQUIRE(kn::flash_tile_positions(8) == 4);
  {
    // group 8 (4 positions per tile): seq 0 at 0..9, seq 1 at 5, seq 0 again at 10..11 (a new run), seq 2 at
    // 3, 4, then a gap to 9
    const std::vector<int> seq = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 2, 2, 2};
    const std::vector<int> pos = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 5, 10, 11, 3, 4, 9};
    const int rows = int(seq.size());
    const int max_tiles = kn::flash_attention_max_tiles(rows, 5, 8);
    REQUIRE(max_tiles == rows / 4 + 5);
    std::vector<int2> t(static_cast<size_t>(max_tiles));
    const int n = kn::flash_attention_tiles(seq.data(), pos.data(), rows, 8, t.data(), max_tiles);
    const std::vector<std::pair<int, int>> want = {{0, 4}, {4, 4}, {8, 2}, {10, 1}, {11, 2}, {13, 2}, {15, 1}};
    REQUIRE(n == int(want.size()));
    for (int i = 0; i < n; ++i) {
      INFO("tile " << i);
      CHECK(t[size_t(i)].x == want[size_t(i)].first);
      CHECK(t[size_t(i)].y == want[size_t(i)].second);
    }
    REQUIRE(kn::flash_attention_tiles(seq.data(), pos.data(), rows, 8, t.data(), n - 1) == -1);  // too small
    REQUIRE(kn::flash_attention_max_tiles(3, 5, 1) == 3);                                        // <= rows
  }

  Stream st;
  REQUIRE_CUDA(cudaGetLastError());  // nothing sticky from earlier cases
  const int2 host_tile = make_int2(0, 1);
  Dev<int2> tiles(1);
  tiles.upload(std::vector<int2>{host_tile});
  kn::AttnArgs a;
  a.rows = 0;
  a.heads = 8;
  a.kv_heads = 1;
  REQUIRE_CUDA(kn::launch_flash_attention(a, tiles.get(), 1, 256, st.s));  // no rows
  a.rows = 1;
  REQUIRE_CUDA(kn::launch_flash_attention(a, tiles.get(), 0, 256, st.s));  // no tiles
  REQUIRE(kn::launch_flash_attention(a, tiles.get(), -1, 256, st.s) == cudaErrorInvalidValue);
  REQUIRE(kn::launch_flash_attention(a, nullptr, 1, 256, st.s) == cudaErrorInvalidValue);
  REQUIRE(kn::launch_flash_attention(a, tiles.get(), 1, 32, st.s) == cudaErrorInvalidValue);  // head dim
  REQUIRE(kn::launch_flash_attention(a, tiles.get(), 1, 96, st.s) == cudaErrorInvalidValue);
  a.heads = 9;
  REQUIRE(kn::launch_flash_attention(a, tiles.get(), 1, 256, st.s) == cudaErrorInvalidValue);  // group 9
  a.heads = 8;
  a.kv_heads = 3;
  REQUIRE(kn::launch_flash_attention(a, tiles.get(), 1, 256, st.s) == cudaErrorInvalidValue);  // 8 % 3
  a.kv_heads = 0;
  REQUIRE(kn::launch_flash_attention(a, tiles.get(), 1, 256, st.s) == cudaErrorInvalidValue);
  REQUIRE_FALSE(kn::flash_attention_supported(32, 1));
  REQUIRE(kn::flash_attention_supported(64, 4));
  REQUIRE_FALSE(kn::flash_attention_supported(256, 9));
  REQUIRE_FALSE(kn::flash_attention_supported(256, 0));
  REQUIRE(kn::flash_attention_supported(128, 1));
  REQUIRE(kn::flash_attention_supported(256, 8));
  REQUIRE(kn::flash_attention_supported(512, 8));
  st.sync();
  REQUIRE_CUDA(cudaGetLastError());  // nothing was launched
}

// ---- resources ----

template <int D>
void add_flash(std::vector<KernelUse>& ks) {
  ks.push_back({cat("flash_attention_kernel<", D, ",1>"),
                reinterpret_cast<const void*>(&kn::flash_attention_kernel<D, 1>), kn::flash_threads<D>()});
  ks.push_back({cat("flash_attention_kernel<", D, ",2>"),
                reinterpret_cast<const void*>(&kn::flash_attention_kernel<D, 2>), kn::flash_threads<D>()});
  ks.push_back({cat("flash_attention_kernel<", D, ",4>"),
                reinterpret_cast<const void*>(&kn::flash_attention_kernel<D, 4>), kn::flash_threads<D>()});
  ks.push_back({cat("flash_attention_kernel<", D, ",8>"),
                reinterpret_cast<const void*>(&kn::flash_attention_kernel<D, 8>), kn::flash_threads<D>()});
}

TEST_CASE("flash attention fits Turing limits (64 KiB shared memory, block size, registers, no spills)", "[gpu]") {
  std::vector<KernelUse> ks;
  add_flash<64>(ks);
  add_flash<128>(ks);
  add_flash<256>(ks);
  add_flash<512>(ks);
  check_turing_limits("flash attention kernel", ks, LocalMemory::kForbidden);
}

}  // namespace
