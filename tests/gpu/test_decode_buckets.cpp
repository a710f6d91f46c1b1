// Decode graphs past the GEMVs' 32 rows (include/gemma4_t4/cuda/planner.hpp kDecodeBuckets): Engine::step of
// 33..128 sessions replays the graph of a bucket of 48, 64, 96 or 128 rows, the pass padded with rows of a
// session of their own (one-slot caches in the workspace). On the E2B-shaped w4a16 checkpoint of
// tests/gpu/test_persistent.cpp (tools/make_synthetic --model e2b --layers 7 --vocab 4096), default options
// (W4Matmul::Auto: 48, 64 and 128 rows through the int4 GEMM, kW4AutoGemmRows). The padding and the
// head are the same code for fp16 checkpoints, whose linears are cuBLAS at every row count past 32.
//   - padding is invisible: 40 sessions (bucket 48, 8 padding rows) step for step bit-identical to the same 40
//     sessions beside 8 more real ones (48 rows, no padding, the same graph): a padding row that wrote into a
//     real session's cache, or leaked into a real row, would show;
//   - the graphs against the path without them (cuda_graphs = false: unpadded direct launches; the same
//     kernels except for the LM head's and the GEMMs' row counts): within kTol, the same greedy token where
//     the top-2 gap is clear, at 33, 64 and 100 sessions (buckets 48, 64 and 128) -- and the positions advance.
// Also Engine::warm_up (a scratch session per prompt size, every decode graph): no session's result changes.
// Tags [gpu][buckets] ([warmup]).
#include <catch2/catch.hpp>

#include "../reference.hpp"
#include "../temp_dir.hpp"

#ifdef GEMMA4_T4_MAKE_SYNTHETIC

#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace gemma4_t4;
using namespace testref;

namespace {

constexpr double kTol = 3e-3;  // as tests/gpu/test_persistent.cpp's two GPU paths

Engine load(const std::string& dir, bool graphs) {
  LoadOptions opt;
  opt.backend = Backend::Cuda;
  opt.cuda_graphs = graphs;
  opt.max_context = 1024;
  opt.max_pass_rows = 512;
  return load_engine(dir, opt);
}

// n sessions on e, each prefilled with its prompt alone (so a session's cache does not depend on n); the
// greedy first tokens.
std::vector<int32_t> start(const Engine& e, const std::vector<std::vector<int32_t>>& prompts, size_t n,
                           std::vector<Session>* ss) {
  ss->resize(n);
  const int V = e.config().vocab_size;
  std::vector<int32_t> tok(n);
  for (size_t b = 0; b < n; ++b) {
    REQUIRE(e.create_session(&(*ss)[b]));
    std::vector<float> l;
    REQUIRE(e.forward((*ss)[b], prompts[b].data(), prompts[b].size(), Logits::Last, &l));
    tok[b] = argmax(l.data(), size_t(V));
  }
  return tok;
}

// One greedy Engine::step of every session, fed tok; the logits of every row.
std::vector<float> step(const Engine& e, std::vector<Session>* ss, std::vector<int32_t>* tok) {
  const size_t n = ss->size();
  std::vector<BatchItem> items(n);
  for (size_t b = 0; b < n; ++b) items[b] = BatchItem{&(*ss)[b], &(*tok)[b], 1};
  std::vector<int32_t> next(n);
  std::vector<float> l;
  const Status st = e.step(items.data(), n, nullptr, next.data(), &l);
  INFO(st.message);
  REQUIRE(st);
  REQUIRE(l.size() == n * size_t(e.config().vocab_size));
  *tok = next;
  return l;
}

}  // namespace

TEST_CASE("decode buckets: padded graphs past 32 sessions equal the unpadded passes", "[gpu][buckets]") {
  const std::string format = "w4a16";
  testutil::TempDir tmp;
  make_e2b_model(tmp.path().string(), format);
  const std::string dir = tmp.path().string();
  Engine g = load(dir, true);
  const int V = g.config().vocab_size;
  std::mt19937 rng(123);
  std::uniform_int_distribution<int> id(5, V - 1);
  std::vector<std::vector<int32_t>> prompts(100);
  for (size_t b = 0; b < prompts.size(); ++b) {
    prompts[b].resize(2 + (b * 37) % 61);
    for (auto& t : prompts[b]) t = id(rng);
  }

  SECTION("40 sessions (8 padding rows) bit-identical to the same 40 beside 8 more (no padding)") {
    Engine g48 = load(dir, true);
    std::vector<Session> s40, s48;
    std::vector<int32_t> t40 = start(g, prompts, 40, &s40), t48 = start(g48, prompts, 48, &s48);
    REQUIRE(std::memcmp(t40.data(), t48.data(), 40 * sizeof(int32_t)) == 0);  // the prefills: the same passes
    for (int k = 0; k < 5; ++k) {
      INFO("step " << k);
      const std::vector<float> a = step(g, &s40, &t40), b = step(g48, &s48, &t48);
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(t40.data(), t48.data(), 40 * sizeof(int32_t)) == 0);
    }
    for (size_t b = 0; b < 40; ++b) CHECK(s40[b].position() == prompts[b].size() + 5);
  }

  SECTION("33, 64 and 100 sessions: the graphs against direct launches") {
    Engine d = load(dir, false);
    for (const size_t n : {size_t(33), size_t(64), size_t(100)}) {
      INFO(n << " sessions");
      std::vector<Session> sg, sd;
      std::vector<int32_t> tg = start(g, prompts, n, &sg), td = start(d, prompts, n, &sd);
      double worst = 0;
      for (int k = 0; k < 3; ++k) {
        const std::vector<float> a = step(g, &sg, &tg), b = step(d, &sd, &td);
        for (size_t r = 0; r < n; ++r) {
          INFO("step " << k << ", session " << r);
          const float* x = &a[r * size_t(V)];
          const float* y = &b[r * size_t(V)];
          const double e = row_error(x, y, V);
          worst = std::max(worst, e);
          CHECK(e <= kTol);
          if (top_gap(y, V) > 4 * kTol * max_abs(y, V)) CHECK(tg[r] == td[r]);
          tg[r] = td[r];  // both go on with the direct path's token
        }
      }
      for (size_t r = 0; r < n; ++r) CHECK(sg[r].position() == prompts[r].size() + 3);
      WARN(format << ", " << n << " sessions: bucket graph vs direct launches, max rel err " << worst);
    }
  }
}

// Engine::warm_up (what a server runs before its first request): its prompts and decode steps of every graph's
// row count run in scratch sessions, so sessions afterwards are those of an engine that never warmed up -- bit for
// bit, prefill and decode (the graphs it captured are the ones first use would capture).
TEST_CASE("warm_up: every pass size and decode graph, and no session's result changes", "[gpu][buckets][warmup]") {
  testutil::TempDir tmp;
  make_e2b_model(tmp.path().string(), "w4a16");
  const std::string dir = tmp.path().string();
  Engine warm = load(dir, true), cold = load(dir, true);
  const Status st = warm.warm_up(40);
  INFO(st.message);
  REQUIRE(st);
  const int V = warm.config().vocab_size;
  std::mt19937 rng(321);
  std::uniform_int_distribution<int> id(5, V - 1);
  std::vector<std::vector<int32_t>> prompts(40);
  for (size_t b = 0; b < prompts.size(); ++b) {
    prompts[b].resize(2 + (b * 53) % 300);  // prompts past the GEMVs' rows and the int4 GEMM's
    for (auto& t : prompts[b]) t = id(rng);
  }
  for (const size_t n : {size_t(1), size_t(7), size_t(40)}) {
    INFO(n << " sessions");
    std::vector<Session> sw, sc;
    std::vector<int32_t> tw = start(warm, prompts, n, &sw), tc = start(cold, prompts, n, &sc);
    CHECK(std::memcmp(tw.data(), tc.data(), n * sizeof(int32_t)) == 0);
    for (int k = 0; k < 3; ++k) {
      INFO("step " << k);
      const std::vector<float> a = step(warm, &sw, &tw), b = step(cold, &sc, &tc);
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(tw.data(), tc.data(), n * sizeof(int32_t)) == 0);
    }
  }
  Engine unloaded;
  CHECK(unloaded.warm_up().code == Code::InvalidArgument);
}

#endif  // GEMMA4_T4_MAKE_SYNTHETIC
