// LoadOptions::w4_matmul end to end: one E2B-shaped w4a16 checkpoint (tools/make_synthetic --model e2b --layers
// 7 --vocab 4096, as tests/gpu/test_persistent.cpp writes it) loaded twice, W4Matmul::Dequant (dequantise +
// cuBLAS) and W4Matmul::TensorCore (kernels/gemm_w4.cuh from the GEMM-layout copy), fed the same tokens: a
// 300-token prefill (one pass of 300 rows: every linear through the GEMM) and batched decode steps of 24 sessions
// (24 rows: past the 16-row GEMVs). Both multiply the same fp16 weights (w = fp16((u - 8) s)) with fp16 activations
// and fp32 sums; only the summation order differs (and, through it, the fp16 roundings of the activations
// between layers): logits within kTol of each other (max |a - b| / max |b| per row, ~1e-3 expected), the same
// greedy token wherever the reference's top-2 gap is clear. Tags [gpu][gemm_w4].
#include <catch2/catch.hpp>

#include "../reference.hpp"
#include "../temp_dir.hpp"

#ifdef GEMMA4_T4_MAKE_SYNTHETIC

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

using namespace gemma4_t4;
using namespace testref;

namespace {

constexpr double kTol = 5e-3;

Engine load(const std::string& dir, W4Matmul how) {
  LoadOptions opt;
  opt.backend = Backend::Cuda;
  opt.w4_matmul = how;
  opt.max_context = 1024;
  opt.max_pass_rows = 512;
  return load_engine(dir, opt);
}

// Row r of a and b: within kTol, and the same argmax where b's top-2 gap is well above the error.
double compare_row(const float* a, const float* b, int V) {
  const double e = row_error(a, b, V);
  CHECK(e <= kTol);
  if (top_gap(b, V) > 4 * kTol * max_abs(b, V)) CHECK(argmax(a, size_t(V)) == argmax(b, size_t(V)));
  return e;
}

}  // namespace

TEST_CASE("w4_matmul TensorCore: prefill and 24-session decode match the Dequant path", "[gpu][gemm_w4]") {
  testutil::TempDir tmp;
  make_e2b_model(tmp.path().string(), "w4a16");
  Engine tc = load(tmp.path().string(), W4Matmul::TensorCore);
  Engine dq = load(tmp.path().string(), W4Matmul::Dequant);
  const int V = tc.config().vocab_size;
  std::mt19937 rng(31);
  std::uniform_int_distribution<int> id(5, V - 1);

  SECTION("a 300-token prefill: every position's logits") {
    std::vector<int32_t> prompt(300);
    for (auto& t : prompt) t = id(rng);
    Session st, sd;
    REQUIRE(tc.create_session(&st));
    REQUIRE(dq.create_session(&sd));
    std::vector<float> lt, ld;
    REQUIRE(tc.forward(st, prompt.data(), prompt.size(), Logits::All, &lt));
    REQUIRE(dq.forward(sd, prompt.data(), prompt.size(), Logits::All, &ld));
    REQUIRE(lt.size() == ld.size());
    REQUIRE(lt.size() == prompt.size() * size_t(V));
    double worst = 0;
    for (size_t r = 0; r < prompt.size(); ++r) {
      INFO("position " << r);
      worst = std::max(worst, compare_row(&lt[r * V], &ld[r * V], V));
    }
    WARN("w4a16 prefill of 300 tokens: TensorCore vs Dequant, max rel err " << worst);
  }

  SECTION("batched decode of 24 sessions: 4 steps") {
    constexpr int kRows = 24;
    std::vector<Session> st(kRows), sd(kRows);
    std::vector<std::vector<int32_t>> prompts(kRows);
    std::vector<BatchItem> it(kRows), idq(kRows);
    for (int b = 0; b < kRows; ++b) {
      prompts[b].resize(size_t(3 + 7 * b));
      for (auto& t : prompts[b]) t = id(rng);
      REQUIRE(tc.create_session(&st[b]));
      REQUIRE(dq.create_session(&sd[b]));
      it[b] = BatchItem{&st[b], prompts[b].data(), prompts[b].size()};
      idq[b] = BatchItem{&sd[b], prompts[b].data(), prompts[b].size()};
    }
    std::vector<float> lt, ld;
    REQUIRE(tc.forward_batch(it.data(), kRows, Logits::Last, &lt));  // a multi-session prefill pass
    REQUIRE(dq.forward_batch(idq.data(), kRows, Logits::Last, &ld));
    std::vector<int32_t> tok(kRows);
    double worst = 0;
    for (int step = 0; step <= 4; ++step) {
      REQUIRE(lt.size() == ld.size());
      for (int b = 0; b < kRows; ++b) {
        INFO("step " << step << ", session " << b);
        worst = std::max(worst, compare_row(&lt[size_t(b) * V], &ld[size_t(b) * V], V));
        tok[b] = argmax(&ld[size_t(b) * V], size_t(V));  // both go on with the Dequant path's token
      }
      if (step == 4) break;
      for (int b = 0; b < kRows; ++b) {
        it[b] = BatchItem{&st[b], &tok[b], 1};
        idq[b] = BatchItem{&sd[b], &tok[b], 1};
      }
      REQUIRE(tc.forward_batch(it.data(), kRows, Logits::Last, &lt));  // 24 decode rows in one pass
      REQUIRE(dq.forward_batch(idq.data(), kRows, Logits::Last, &ld));
    }
    for (int b = 0; b < kRows; ++b) CHECK(st[b].position() == prompts[b].size() + 4);
    WARN("w4a16 decode of 24 sessions: TensorCore vs Dequant, max rel err " << worst);
  }
}

#endif  // GEMMA4_T4_MAKE_SYNTHETIC
