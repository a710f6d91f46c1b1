// The persistent decode kernel (kernels/decode_step.cuh via include/gemma4_t4/cuda/persistent.hpp) against the
// per-kernel path (LoadOptions::decode_path = Kernels, the path the fixtures' parity tests hold to the
// reference) and against the CPU backend. The tiny fixtures' shapes are not ones the kernel takes, so this
// file writes an E2B-shaped checkpoint with tools/make_synthetic (--model e2b --layers 7 --vocab 4096: hidden
// 1536, head dims 256 / 512, 8 query heads per KV head, PLE, KV-shared layers of both types, double-wide MLPs)
// in both formats. max_pass_rows 64 makes the sliding layers' ring 576 slots, so a 600-token prompt wraps it.
#include <catch2/catch.hpp>

#include "../reference.hpp"
#include "../temp_dir.hpp"

#ifdef GEMMA4_T4_MAKE_SYNTHETIC

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

using namespace gemma4_t4;
using namespace testref;

namespace {

// Both paths put fp16 into the tensor cores and sum in fp32; they differ in the order of the norms' sums
// (one warp per row here, a block there) and in the attention splits.
constexpr double kTolPaths = 3e-3;
constexpr double kTolCpu = 1e-2;  // CUDA vs the fp32 CPU backend, as tests/gpu/test_cuda_parity.cpp

Engine load(const std::string& dir, Backend backend, DecodePath path,
            const LoadOptions::PersistentTuning& tune = LoadOptions::PersistentTuning()) {
  LoadOptions opt;
  opt.backend = backend;
  opt.decode_path = path;
  opt.persistent = tune;
  opt.max_context = 1024;
  opt.max_pass_rows = 64;
  return load_engine(dir, opt);
}

}  // namespace

TEST_CASE("persistent decode: each step equals the per-kernel path (1, 3, 9 and 16 rows; w4a16)", "[gpu][persistent]") {
  // blocks_per_sm 2 (128 registers, rows <= 8; 9 and 16 rows take the per-kernel path) with the step trace on
  for (const int blocks_per_sm : {1, 2}) {
    const std::string format = "w4a16";  // fp16 models fall back to the per-kernel path (unsupported())
    INFO("format " << format << ", " << blocks_per_sm << " blocks per SM");
    testutil::TempDir tmp;
    make_e2b_model(tmp.path().string(), format);
    LoadOptions::PersistentTuning tune;
    tune.blocks_per_sm = blocks_per_sm;
    if (blocks_per_sm == 2) tune.trace = (tmp.path() / "trace.txt").string();
    Engine fast = load(tmp.path().string(), Backend::Cuda, DecodePath::Persistent, tune);
    Engine ref = load(tmp.path().string(), Backend::Cuda, DecodePath::Kernels);
    INFO("persistent engine: " << fast.decode_path());
    REQUIRE(fast.decode_path().rfind("persistent kernel", 0) == 0);
    REQUIRE(ref.decode_path().rfind("per-kernel", 0) == 0);
    const int V = fast.config().vocab_size;
    std::mt19937 rng(77);
    std::uniform_int_distribution<int> id(5, V - 1);
    const size_t lengths[] = {600, 37, 300, 5, 129, 64, 1, 513};
    for (int rows : {1, 3, 9, 16}) {
      INFO(rows << " rows");
      std::vector<Session> sf(static_cast<size_t>(rows)), sr(static_cast<size_t>(rows));
      std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(rows));
      std::vector<BatchItem> itf(static_cast<size_t>(rows)), itr(static_cast<size_t>(rows));
      for (int b = 0; b < rows; ++b) {
        prompts[b].resize(lengths[b % 8] + size_t(b / 8));
        for (auto& t : prompts[b]) t = id(rng);
        REQUIRE(fast.create_session(&sf[b]));
        REQUIRE(ref.create_session(&sr[b]));
        itf[b] = BatchItem{&sf[b], prompts[b].data(), prompts[b].size()};
        itr[b] = BatchItem{&sr[b], prompts[b].data(), prompts[b].size()};
      }
      std::vector<float> lf, lr;
      REQUIRE(fast.forward_batch(itf.data(), size_t(rows), Logits::Last, &lf));  // prefill: the same path
      REQUIRE(ref.forward_batch(itr.data(), size_t(rows), Logits::Last, &lr));
      std::vector<int32_t> tok(static_cast<size_t>(rows)), got(static_cast<size_t>(rows));
      for (int b = 0; b < rows; ++b) tok[b] = argmax(&lr[size_t(b) * V], size_t(V));
      double worst = 0;
      for (int step = 0; step < 6; ++step) {
        for (int b = 0; b < rows; ++b) {
          itf[b] = BatchItem{&sf[b], &tok[b], 1};
          itr[b] = BatchItem{&sr[b], &tok[b], 1};
        }
        // Engine::step: the persistent kernel's own greedy tokens, and its logits
        const Status st = fast.step(itf.data(), size_t(rows), nullptr, got.data(), &lf);
        INFO(st.message);
        REQUIRE(st);
        REQUIRE(ref.forward_batch(itr.data(), size_t(rows), Logits::Last, &lr));
        REQUIRE(lf.size() == lr.size());
        for (int b = 0; b < rows; ++b) {
          INFO("step " << step << ", row " << b << " at position " << sf[b].position() - 1);
          const float* f = &lf[size_t(b) * V];
          const float* r = &lr[size_t(b) * V];
          const double e = row_error(f, r, V);
          worst = std::max(worst, e);
          CHECK(e <= kTolPaths);
          CHECK(got[b] == argmax(f, size_t(V)));  // the fused argmax is the argmax of the logits it wrote
          if (top_gap(r, V) > 4 * kTolPaths * max_abs(r, V)) CHECK(got[b] == argmax(r, size_t(V)));
          tok[b] = argmax(r, size_t(V));  // both engines go on with the reference's token
        }
      }
      for (int b = 0; b < rows; ++b) CHECK(sf[b].position() == prompts[b].size() + 6);
      WARN(format << ", " << blocks_per_sm << " blocks/SM, " << rows << " rows: persistent vs per-kernel decode, "
                  << "max rel err " << worst);
    }
    if (!tune.trace.empty()) {  // written when the engine closes: every traced step's instructions, by kind
      fast = Engine();
      std::FILE* f = std::fopen(tune.trace.c_str(), "r");
      REQUIRE(f != nullptr);
      std::string text(1 << 16, '\0');
      text.resize(std::fread(&text[0], 1, text.size(), f));
      std::fclose(f);
      INFO(text);
      CHECK(text.find("persistent decode step trace: 12 steps") != std::string::npos);  // rows 1 and 3, 6 each
      CHECK(text.find("attention, sliding") != std::string::npos);
      CHECK(text.find("gate/up_proj") != std::string::npos);
    }
  }
}

TEST_CASE("persistent decode: bad tuning fails the load, naming the option", "[gpu][persistent]") {
  testutil::TempDir tmp;
  make_e2b_model(tmp.path().string(), "w4a16", 1);
  LoadOptions opt;
  opt.decode_path = DecodePath::Persistent;
  opt.persistent.blocks_per_sm = 3;
  Engine e;
  Status st = Engine::load(tmp.path().string(), opt, &e);
  CHECK(st.code == Code::InvalidArgument);
  CHECK(st.message.find("blocks_per_sm") != std::string::npos);
  opt.persistent.blocks_per_sm = 1;
  opt.persistent.trace = (tmp.path() / "no-such-dir" / "trace.txt").string();
  st = Engine::load(tmp.path().string(), opt, &e);
  CHECK(st.code == Code::IoError);
  CHECK(st.message.find("no-such-dir") != std::string::npos);
}

TEST_CASE("persistent decode: 1- and 2-layer models equal the per-kernel path and the CPU backend",
          "[gpu][persistent]") {
  for (int layers : {1, 2})
    for (const std::string format : {"w4a16"}) {
      INFO(format << ", " << layers << " layers");
      testutil::TempDir tmp;
      make_e2b_model(tmp.path().string(), format, layers);
      Engine fast = load(tmp.path().string(), Backend::Cuda, DecodePath::Persistent);
      Engine ref = load(tmp.path().string(), Backend::Cuda, DecodePath::Kernels);
      Engine cpu = load(tmp.path().string(), Backend::Cpu, DecodePath::Kernels);
      const int V = fast.config().vocab_size;
      std::vector<int32_t> prompt(40);
      for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(5 + (i * 37) % size_t(V - 5));
      Session sf, sr, sc;
      REQUIRE(fast.create_session(&sf));
      REQUIRE(ref.create_session(&sr));
      REQUIRE(cpu.create_session(&sc));
      std::vector<float> lf, lr, lc;
      REQUIRE(fast.forward(sf, prompt.data(), prompt.size(), Logits::Last, &lf));
      REQUIRE(ref.forward(sr, prompt.data(), prompt.size(), Logits::Last, &lr));
      REQUIRE(cpu.forward(sc, prompt.data(), prompt.size(), Logits::Last, &lc));
      const double prefill_cpu = row_error(lr.data(), lc.data(), V);
      CHECK(prefill_cpu <= kTolCpu);
      for (int step = 0; step < 3; ++step) {
        const int32_t t = argmax(lc.data(), size_t(V));
        const Status st = fast.forward(sf, &t, 1, Logits::Last, &lf);
        INFO(st.message);
        REQUIRE(st);
        REQUIRE(ref.forward(sr, &t, 1, Logits::Last, &lr));
        REQUIRE(cpu.forward(sc, &t, 1, Logits::Last, &lc));
        const double e_paths = row_error(lf.data(), lr.data(), V), e_ref_cpu = row_error(lr.data(), lc.data(), V);
        WARN(format << ", " << layers << " layers, step " << step << ": persistent vs per-kernel " << e_paths
                    << ", per-kernel vs CPU " << e_ref_cpu << " (prefill vs CPU " << prefill_cpu << ")");
        CHECK(e_paths <= kTolPaths);
        CHECK(e_ref_cpu <= kTolCpu);
      }
    }
}

TEST_CASE("persistent decode: logits match the CPU backend past the sliding window", "[gpu][persistent]") {
  testutil::TempDir tmp;
  make_e2b_model(tmp.path().string(), "w4a16");
  Engine gpu = load(tmp.path().string(), Backend::Cuda, DecodePath::Persistent);
  Engine cpu = load(tmp.path().string(), Backend::Cpu, DecodePath::Persistent);
  REQUIRE(gpu.decode_path().rfind("persistent kernel", 0) == 0);
  const int V = gpu.config().vocab_size;
  double worst = 0;
  lockstep(gpu, cpu, random_tokens(V, 600, 78), 4,
           [&](int step, const std::vector<float>& lg, const std::vector<float>& lc) {
             if (step == 0) return;  // decode steps only: the prompt's pass is not the persistent kernel's
             const double e = row_error(lg.data(), lc.data(), V);
             worst = std::max(worst, e);
             INFO("decode step " << step - 1);
             CHECK(e <= kTolCpu);
           });
  WARN("persistent decode vs the CPU backend (w4a16, 7 E2B layers): max rel err " << worst);
}

TEST_CASE("persistent decode: sampled steps draw the per-kernel path's tokens for the same seed", "[gpu][persistent]") {
  testutil::TempDir tmp;
  make_e2b_model(tmp.path().string(), "w4a16");
  Engine fast = load(tmp.path().string(), Backend::Cuda, DecodePath::Persistent);
  Engine ref = load(tmp.path().string(), Backend::Cuda, DecodePath::Kernels);
  const int V = fast.config().vocab_size, rows = 8;
  std::mt19937 rng(79);
  std::uniform_int_distribution<int> id(5, V - 1);
  std::vector<Session> sf(rows), sr(rows);
  std::vector<SamplingOptions> opts(rows);  // Gemma's defaults (T 1, top-k 64, top-p 0.95), a seed per row
  std::vector<int32_t> tok(rows), a(rows), b(rows);
  std::vector<BatchItem> itf(rows), itr(rows);
  std::vector<std::vector<int32_t>> prompts(rows);
  for (int r = 0; r < rows; ++r) {
    opts[r].seed = 100 + uint64_t(r);
    prompts[r].resize(20 + 7 * size_t(r));
    for (auto& t : prompts[r]) t = id(rng);
    REQUIRE(fast.create_session(&sf[r]));
    REQUIRE(ref.create_session(&sr[r]));
    itf[r] = BatchItem{&sf[r], prompts[r].data(), prompts[r].size()};
    itr[r] = BatchItem{&sr[r], prompts[r].data(), prompts[r].size()};
  }
  REQUIRE(fast.step(itf.data(), rows, opts.data(), a.data()));
  REQUIRE(ref.step(itr.data(), rows, opts.data(), b.data()));
  int same = 0, total = 0;
  for (int step = 0; step < 10; ++step) {
    for (int r = 0; r < rows; ++r) {
      same += a[r] == b[r];
      ++total;
      tok[r] = b[r];
      itf[r] = BatchItem{&sf[r], &tok[r], 1};
      itr[r] = BatchItem{&sr[r], &tok[r], 1};
    }
    REQUIRE(fast.step(itf.data(), rows, opts.data(), a.data()));
    REQUIRE(ref.step(itr.data(), rows, opts.data(), b.data()));
  }
  INFO("the same token in " << same << " of " << total << " draws");
  CHECK(same * 100 >= total * 95);  // a draw can flip only where a threshold sits within the paths' rounding
}

#endif  // GEMMA4_T4_MAKE_SYNTHETIC
