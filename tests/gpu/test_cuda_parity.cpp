// CUDA backend vs the reference implementation's stored logits and vs the CPU backend (fp16 tolerances),
// for fp16 (bf16/f32 checkpoints run as fp16) and w4a16. Run by the GPU suite (label gpu).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../reference.hpp"
#include "gemma4_t4/config.hpp"
#include "gemma4_t4/weights.hpp"

using namespace gemma4_t4;
using namespace testref;

namespace {

// fp16 weights and activations into the matmuls, fp32 everywhere else: ~1e-3 of the logit range.
constexpr double kTolRef = 1e-2;

const char* const kFixtureNames[] = {"mm_bf16", "flat_keqv", "w4a16"};

void cuda_vs_reference(const std::string& name, PleLocation ple) {
  Reference ref;
  load_reference(name, &ref);
  Engine engine = load_engine(name, Backend::Cuda, ple);
  REQUIRE(engine.backend() == Backend::Cuda);
  const int V = engine.config().vocab_size;
  const size_t T = ref.prompt.size(), S = ref.decode_ids.size();

  SECTION("prefill, then greedy decode equals the reference's tokens") {
    Session s;
    REQUIRE(engine.create_session(&s));
    std::vector<float> logits;
    REQUIRE(engine.forward(s, ref.prompt.data(), T, Logits::All, &logits));
    const double e1 = check_rows(logits, ref.prefill.data(), T, V, kTolRef, name + " prefill");
    int next = argmax(&logits[(T - 1) * V], size_t(V));
    double e2 = 0;
    for (size_t step = 0; step < S; ++step) {
      INFO(name << " decode step " << step);
      REQUIRE(next == ref.decode_ids[step]);
      REQUIRE(engine.forward(s, &ref.decode_ids[step], 1, Logits::Last, &logits));
      e2 = std::max(e2, check_rows(logits, &ref.decode[step * V], 1, V, kTolRef, name + " decode"));
      next = argmax(logits.data(), size_t(V));
    }
    WARN(name << " (CUDA, PLE " << (ple == PleLocation::Host ? "host" : "device") << "): max rel err prefill " << e1
              << ", decode " << e2);
  }

  SECTION("chunked prefill equals the reference") {
    for (size_t chunk : {size_t(1), size_t(5), size_t(16)}) {
      INFO("chunk " << chunk);
      Session s;
      REQUIRE(engine.create_session(&s));
      const std::vector<float> all = forward_in_chunks(engine, s, ref.prompt, chunk);
      std::vector<float> logits;
      check_rows(all, ref.prefill.data(), T, V, kTolRef, name + " chunked prefill");
      REQUIRE(engine.forward(s, ref.decode_ids.data(), S, Logits::All, &logits));
      check_rows(logits, ref.decode.data(), S, V, kTolRef, name + " decode after chunks");
    }
  }
}

}  // namespace

TEST_CASE("CUDA parity with the reference: bf16 multimodal layout", "[gpu][parity]") {
  cuda_vs_reference("mm_bf16", PleLocation::Host);
}
TEST_CASE("CUDA parity with the reference: bf16, PLE table on the GPU", "[gpu][parity]") {
  cuda_vs_reference("mm_bf16", PleLocation::Device);
}
TEST_CASE("CUDA parity with the reference: f32 sharded, attention_k_eq_v", "[gpu][parity]") {
  cuda_vs_reference("flat_keqv", PleLocation::Host);
}
TEST_CASE("CUDA parity with the reference: w4a16", "[gpu][parity]") { cuda_vs_reference("w4a16", PleLocation::Host); }
TEST_CASE("CUDA parity with the reference: w4a16, PLE table on the GPU", "[gpu][parity]") {
  cuda_vs_reference("w4a16", PleLocation::Device);
}

TEST_CASE("CUDA batched decode: each session's greedy tokens equal running it alone", "[gpu][batch]") {
  for (const char* name : kFixtureNames) {
    INFO(name);
    const Reference ref = reference(name);
    Engine engine = load_engine(name, Backend::Cuda);
    const int V = engine.config().vocab_size;
    const size_t prefixes[] = {ref.prompt.size(), 13, 7, 1};
    const int steps = 12;
    // alone
    std::vector<std::vector<int32_t>> alone(4);
    for (int b = 0; b < 4; ++b) {
      Session s;
      REQUIRE(engine.create_session(&s));
      std::vector<float> lg;
      REQUIRE(engine.forward(s, ref.prompt.data(), prefixes[b], Logits::Last, &lg));
      int32_t tok = argmax(lg.data(), size_t(V));
      for (int i = 0; i < steps; ++i) {
        alone[b].push_back(tok);
        REQUIRE(engine.forward(s, &tok, 1, Logits::Last, &lg));
        tok = argmax(lg.data(), size_t(V));
      }
    }
    // together: prefills in one batched pass, then decode steps for all four at once
    Session ss[4];
    std::vector<BatchItem> items(4);
    for (int b = 0; b < 4; ++b) {
      REQUIRE(engine.create_session(&ss[b]));
      items[b] = BatchItem{&ss[b], ref.prompt.data(), prefixes[b]};
    }
    std::vector<float> lg;
    REQUIRE(engine.forward_batch(items.data(), 4, Logits::Last, &lg));
    REQUIRE(lg.size() == 4 * size_t(V));
    std::vector<int32_t> tok(4);
    for (int b = 0; b < 4; ++b) tok[b] = argmax(&lg[size_t(b) * V], size_t(V));
    for (int i = 0; i < steps; ++i) {
      for (int b = 0; b < 4; ++b) {
        INFO("session " << b << " step " << i);
        CHECK(tok[b] == alone[b][size_t(i)]);
        items[b] = BatchItem{&ss[b], &tok[b], 1};
      }
      REQUIRE(engine.forward_batch(items.data(), 4, Logits::Last, &lg));
      for (int b = 0; b < 4; ++b) tok[b] = argmax(&lg[size_t(b) * V], size_t(V));
    }
    for (int b = 0; b < 4; ++b) CHECK(ss[b].position() == prefixes[b] + steps);
  }
}

TEST_CASE("CUDA matches the CPU backend on a prompt longer than one pass and the sliding ring", "[gpu][cpu-vs-cuda]") {
  for (const char* name : kFixtureNames)
    for (int pass_rows : {256, 2048}) {  // three passes (ring of window + 256), one pass
      INFO(name << ", max_pass_rows " << pass_rows);
      Engine gpu = load_engine(name, Backend::Cuda, PleLocation::Host, 1024, LmHead::F16, pass_rows);
      Engine cpu = load_engine(name, Backend::Cpu);
      const int V = gpu.config().vocab_size;
      std::vector<int32_t> prompt = random_tokens(V, 700, 1234);  // >> window + ring slack
      prompt[0] = 2;
      lockstep(gpu, cpu, prompt, 8, [&](int step, const std::vector<float>& lg, const std::vector<float>& lc) {
        check_rows(lg, lc.data(), 1, V, kTolRef,
                   std::string(name) + (step == 0 ? " 700-token prefill" : " decode past the window"));
      });
    }
}

TEST_CASE("CUDA: past the last cache write only the rows whose logits are returned go on", "[gpu][parity][kv_tail]") {
  for (const char* name : kFixtureNames) {  // KV-shared layers after it (mm_bf16, w4a16), or none (flat_keqv)
    const Reference ref = reference(name);
    Engine small = load_engine(name, Backend::Cuda);
    check_kv_tail(small, ref.prompt, ref.decode_ids, 5e-3, std::string(name) + ", the fixture's prompt");
    for (int pass_rows : {256, 2048}) {  // passes of the GEMMs and flash attention before the tail; several passes
      INFO(name << ", max_pass_rows " << pass_rows);
      Engine engine = load_engine(name, Backend::Cuda, PleLocation::Host, 1024, LmHead::F16, pass_rows);
      std::vector<int32_t> prompt = random_tokens(engine.config().vocab_size, 700, 4321);
      prompt[0] = 2;
      check_kv_tail(engine, prompt, ref.decode_ids, 5e-3, std::string(name) + ", a 700-token prompt");
    }
  }
}

TEST_CASE("CUDA quantized LM heads equal the CPU backend's (same quantized values), prefill and graph decode",
          "[gpu][lm_head]") {
  for (const char* name : {"mm_bf16", "w4a16"})
    for (LmHead head : {LmHead::Int8, LmHead::Int4}) {
      const std::string what = std::string(name) + " lm_head " + detail::lm_head_name(head);
      INFO(what);
      Reference ref;
      load_reference(name, &ref);
      Engine cuda = load_engine(name, Backend::Cuda, PleLocation::Host, 1024, head);
      Engine cpu = load_engine(name, Backend::Cpu, PleLocation::Host, 1024, head);
      CHECK(cuda.decode_bytes_per_token() == cpu.decode_bytes_per_token());
      const int V = cuda.config().vocab_size;
      const size_t T = ref.prompt.size(), S = ref.decode_ids.size();
      Session sg, sc;
      REQUIRE(cuda.create_session(&sg));
      REQUIRE(cpu.create_session(&sc));
      std::vector<float> lg, lc;
      REQUIRE(cuda.forward(sg, ref.prompt.data(), T, Logits::All, &lg));
      REQUIRE(cpu.forward(sc, ref.prompt.data(), T, Logits::All, &lc));
      double worst = check_rows(lg, lc.data(), T, V, kTolRef, what + " prefill");
      for (size_t step = 0; step < S; ++step) {  // decode steps replay the CUDA graph
        REQUIRE(cuda.forward(sg, &ref.decode_ids[step], 1, Logits::Last, &lg));
        REQUIRE(cpu.forward(sc, &ref.decode_ids[step], 1, Logits::Last, &lc));
        worst = std::max(worst, check_rows(lg, lc.data(), 1, V, kTolRef, what + " decode"));
      }
      WARN(what << ": CUDA vs CPU max rel err " << worst);
    }
}

TEST_CASE("CUDA: errors leave sessions and engine usable", "[gpu][errors]") {
  Reference ref;
  load_reference("mm_bf16", &ref);
  Engine engine = load_engine("mm_bf16", Backend::Cuda, PleLocation::Host, 24);
  Session s;
  REQUIRE(engine.create_session(&s));
  std::vector<float> lg;
  const int32_t bad = engine.config().vocab_size + 3;
  CHECK(engine.forward(s, &bad, 1, Logits::Last, &lg).code == Code::InvalidArgument);
  REQUIRE(engine.forward(s, ref.prompt.data(), ref.prompt.size(), Logits::Last, &lg));
  std::vector<int32_t> more(8, 9);
  CHECK(engine.forward(s, more.data(), more.size(), Logits::Last, &lg).code == Code::ContextOverflow);
  REQUIRE(engine.forward(s, ref.decode_ids.data(), 1, Logits::Last, &lg));
  check_rows(lg, ref.decode.data(), 1, engine.config().vocab_size, kTolRef, "after errors");
  BatchItem twice[2] = {{&s, ref.decode_ids.data(), 1}, {&s, ref.decode_ids.data(), 1}};
  CHECK(engine.forward_batch(twice, 2, Logits::Last, &lg).code == Code::InvalidArgument);
  for (int rows : {0, 63, 16385}) {  // LoadOptions::max_pass_rows out of range: named, nothing loaded
    LoadOptions opt;
    opt.backend = Backend::Cuda;
    opt.max_pass_rows = rows;
    Engine bad_engine;
    const Status st = Engine::load(fixtures() + "/mm_bf16", opt, &bad_engine);
    INFO(st.message);
    CHECK(st.code == Code::InvalidArgument);
    CHECK(st.message.find("max_pass_rows") != std::string::npos);
    CHECK(!bad_engine.loaded());
  }
}

TEST_CASE("CUDA graphs: decode replays equal eager launches", "[gpu][graphs]") {
  Reference ref;
  load_reference("w4a16", &ref);
  Engine graphs = load_engine("w4a16", Backend::Cuda);
  LoadOptions opt;
  opt.backend = Backend::Cuda;
  opt.max_context = 1024;
  opt.cuda_graphs = false;
  Engine eager;
  REQUIRE(Engine::load(fixtures() + "/w4a16", opt, &eager));
  for (int batch : {1, 3}) {
    INFO("batch " << batch);
    std::vector<Session> sg(static_cast<size_t>(batch)), se(static_cast<size_t>(batch));
    std::vector<BatchItem> ig, ie;
    for (int b = 0; b < batch; ++b) {
      REQUIRE(graphs.create_session(&sg[b]));
      REQUIRE(eager.create_session(&se[b]));
      ig.push_back(BatchItem{&sg[b], ref.prompt.data(), ref.prompt.size() - size_t(b)});
      ie.push_back(BatchItem{&se[b], ref.prompt.data(), ref.prompt.size() - size_t(b)});
    }
    std::vector<float> lg, le;
    REQUIRE(graphs.forward_batch(ig.data(), ig.size(), Logits::Last, &lg));
    REQUIRE(eager.forward_batch(ie.data(), ie.size(), Logits::Last, &le));
    std::vector<int32_t> tok(static_cast<size_t>(batch));
    for (int step = 0; step < 10; ++step) {
      for (int b = 0; b < batch; ++b) {
        tok[b] = argmax(&le[size_t(b) * ref.vocab], size_t(ref.vocab));
        ig[b] = BatchItem{&sg[b], &tok[b], 1};
        ie[b] = BatchItem{&se[b], &tok[b], 1};
      }
      REQUIRE(graphs.forward_batch(ig.data(), ig.size(), Logits::Last, &lg));
      REQUIRE(eager.forward_batch(ie.data(), ie.size(), Logits::Last, &le));
      REQUIRE(lg.size() == le.size());
      double worst = 0;
      for (size_t i = 0; i < lg.size(); ++i) worst = std::max(worst, double(std::fabs(lg[i] - le[i])));
      INFO("step " << step << " max |graph - eager| " << worst);
      CHECK(worst <= 1e-3);  // the same kernels; only the attention split count (summation order) differs
    }
  }
}

// Programmatic dependent launch lets a kernel start before its predecessor ends (kernels/common.cuh); a kernel
// that touched the pass's data before pdl_enter() would race. The same kernels run in the same order either
// way, so every logit must be bit-identical to plain launches: prefill passes (cuBLAS, flash attention) and
// graph-replayed decode at 1 and 3 sessions, every fixture layout.
TEST_CASE("CUDA programmatic launch: logits equal plain launches bit for bit", "[gpu][pdl]") {
  const bench::DeviceReport dev = bench::device_report(0);
  INFO("programmatic dependent launch in use: " << (dev.pdl ? "yes" : "no") << " (" << dev.code << ")");
  if (!dev.pdl) WARN("this device / build has no PDL: both engines launch plainly (the test still compares them)");
  for (const char* name : kFixtureNames) {
    INFO(name);
    LoadOptions opt;
    opt.backend = Backend::Cuda;
    opt.max_context = 1024;
    Engine pdl, plain;
    REQUIRE(Engine::load(fixtures() + "/" + name, opt, &pdl));
    opt.programmatic_launch = false;
    REQUIRE(Engine::load(fixtures() + "/" + name, opt, &plain));
    const int V = pdl.config().vocab_size;
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> tok(0, V - 1);
    for (int batch : {1, 3}) {
      INFO("batch " << batch);
      std::vector<Session> sp(static_cast<size_t>(batch)), sq(static_cast<size_t>(batch));
      std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch));
      std::vector<BatchItem> ip, iq;
      for (int b = 0; b < batch; ++b) {
        REQUIRE(pdl.create_session(&sp[b]));
        REQUIRE(plain.create_session(&sq[b]));
        for (int i = 0; i < 300 + 37 * b; ++i) prompts[b].push_back(tok(rng));
        ip.push_back(BatchItem{&sp[b], prompts[b].data(), prompts[b].size()});
        iq.push_back(BatchItem{&sq[b], prompts[b].data(), prompts[b].size()});
      }
      std::vector<float> lp, lq;
      REQUIRE(pdl.forward_batch(ip.data(), ip.size(), Logits::All, &lp));
      REQUIRE(plain.forward_batch(iq.data(), iq.size(), Logits::All, &lq));
      REQUIRE(lp.size() == lq.size());
      CHECK(std::memcmp(lp.data(), lq.data(), lp.size() * sizeof(float)) == 0);
      std::vector<int32_t> next(static_cast<size_t>(batch));
      for (int step = 0; step < 12; ++step) {
        INFO("decode step " << step);
        for (int b = 0; b < batch; ++b) {
          next[b] = tok(rng);
          ip[b] = BatchItem{&sp[b], &next[b], 1};
          iq[b] = BatchItem{&sq[b], &next[b], 1};
        }
        REQUIRE(pdl.forward_batch(ip.data(), ip.size(), Logits::Last, &lp));
        REQUIRE(plain.forward_batch(iq.data(), iq.size(), Logits::Last, &lq));
        REQUIRE(lp.size() == lq.size());
        CHECK(std::memcmp(lp.data(), lq.data(), lp.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("CUDA step: greedy tokens sampled on the GPU equal the reference's", "[gpu][sampling]") {
  for (const char* name : kFixtureNames) {
    INFO(name);
    const Reference ref = reference(name);
    Engine engine = load_engine(name, Backend::Cuda);
    Session s;
    REQUIRE(engine.create_session(&s));
    int32_t next = -1;
    std::vector<float> lg;
    BatchItem it{&s, ref.prompt.data(), ref.prompt.size()};
    REQUIRE(engine.step(&it, 1, nullptr, &next, &lg));
    REQUIRE(lg.size() == size_t(engine.config().vocab_size));
    check_rows(lg, &ref.prefill[(ref.prompt.size() - 1) * ref.vocab], 1, ref.vocab, kTolRef, "step logits");
    for (size_t i = 0; i < ref.decode_ids.size(); ++i) {
      INFO("step " << i);
      REQUIRE(next == ref.decode_ids[i]);
      it = BatchItem{&s, &next, 1};
      int32_t t = -1;
      REQUIRE(engine.step(&it, 1, nullptr, &t, nullptr));
      next = t;
    }
  }
}

TEST_CASE("CUDA step: sampled tokens follow the CPU sampler for the same seed", "[gpu][sampling]") {
  // Same model, two backends: with identical filters and seeds the GPU kernel and the CPU reference draw
  // the same token unless the logits differ right at a boundary (fp16 vs fp32), so nearly all must agree.
  Reference ref;
  load_reference("mm_bf16", &ref);
  Engine gpu = load_engine("mm_bf16", Backend::Cuda);
  Engine cpu = load_engine("mm_bf16", Backend::Cpu);
  SamplingOptions o;  // Gemma defaults: temperature 1, top-k 64, top-p 0.95
  o.repetition_penalty = 1.2f;
  int agree = 0, total = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    o.seed = seed;
    Session sg, sc;
    REQUIRE(gpu.create_session(&sg));
    REQUIRE(cpu.create_session(&sc));
    int32_t tg = -1, tc = -1;
    BatchItem ig{&sg, ref.prompt.data(), 12}, ic{&sc, ref.prompt.data(), 12};
    REQUIRE(gpu.step(&ig, 1, &o, &tg));
    REQUIRE(cpu.step(&ic, 1, &o, &tc));
    for (int i = 0; i < 20; ++i) {
      agree += tg == tc;
      ++total;
      const int32_t feed = tc;  // keep both on the CPU's path
      ig = BatchItem{&sg, &feed, 1};
      ic = BatchItem{&sc, &feed, 1};
      REQUIRE(gpu.step(&ig, 1, &o, &tg));
      REQUIRE(cpu.step(&ic, 1, &o, &tc));
    }
  }
  WARN("GPU and CPU samplers agreed on " << agree << " of " << total << " draws");
  CHECK(agree >= total * 9 / 10);
}
