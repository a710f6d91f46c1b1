// Faults on the CUDA backend (FAULTS in gemma4_t4.hpp): GPU allocations made to fail through the testing hook
// detail::set_alloc_fault_hook -- at load (every allocation in turn), in create_session (every KV buffer in
// turn) and during generation (the CUDA graph a decode pass builds on first use, the repetition-penalty ids
// buffer) -- and checkpoint files truncated while the backend streams them at load or reads the host PLE table
// at run time. Each must give OutOfMemory / IoError naming what failed, free what it took (the backend's live
// allocation count and cudaMemGetInfo back where they were), leave sessions as they were, and leave the engine
// (or other engines) serving with unchanged greedy tokens; without the hook the same call succeeds.
// Run by the GPU suite (label gpu), which exits 77 (skipped) without a CUDA device.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../reference.hpp"
#include "../temp_dir.hpp"
#include "harness.hpp"

using namespace gemma4_t4;
using namespace testref;
namespace fs = std::filesystem;

namespace {

// cudaMemGetInfo moves in 2 MiB pages and the CUDA context's own lazily made and lazily released allocations
// (modules loaded on a kernel's first launch, a stream's and a cuBLAS handle's internal state) land in it too:
// 6 MiB of drift between failed loads was seen on the H200 (2026-12-04) with cuBLAS's workspace already ours.
// So free memory is compared after a warm-up and within this slack (any leaked buffer of the load larger than
// it shows); detail::live_cuda_allocations() is exact and catches every leaked block, however small.
constexpr size_t kSlack = size_t(16) << 20;

// Under compute-sanitizer (tools/gpu_check.sh exports GEMMA4_T4_UNDER_TOOL for those runs) the tool keeps
// device memory of its own that grows as ours comes and goes (initcheck's shadow state: ~30-70 MiB over the
// fault tests), so free memory says nothing about our leaks there; the exact allocation count still does.
bool free_memory_comparable() {
  static const bool comparable = [] {
    const bool tool = std::getenv("GEMMA4_T4_UNDER_TOOL") != nullptr;
    if (tool)
      WARN("GEMMA4_T4_UNDER_TOOL set: free GPU memory not compared (a sanitizer holds its own); allocation counts are");
    return !tool;
  }();
  return comparable;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every allocation the hook is asked about, in order; fails those chosen.
class Recorder {
 public:
  int fail_at = -1;        // the index of the call to fail (-1: none) ...
  std::string fail_match;  // ... or every call whose `what` contains this ("" : none)

  // Installs this recorder as the hook until the guard goes (a failed REQUIRE included).
  struct Guard {
    explicit Guard(Recorder& r) {
      detail::set_alloc_fault_hook([&r](size_t bytes, const char* what) { return r.ask(bytes, what); });
    }
    ~Guard() { detail::set_alloc_fault_hook(nullptr); }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
  };

  std::vector<std::string> whats() {
    std::lock_guard<std::mutex> lock(mu_);
    return whats_;
  }
  std::string failed() {  // the `what` of the last call failed
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }
  int failures() {
    std::lock_guard<std::mutex> lock(mu_);
    return failures_;
  }

 private:
  bool ask(size_t, const char* what) {
    std::lock_guard<std::mutex> lock(mu_);
    const int index = int(whats_.size());
    whats_.emplace_back(what);
    const bool fail = index == fail_at || (!fail_match.empty() && whats_.back().find(fail_match) != std::string::npos);
    if (fail) {
      failed_ = what;
      ++failures_;
    }
    return fail;
  }
  std::mutex mu_;
  std::vector<std::string> whats_;
  std::string failed_;
  int failures_ = 0;
};

struct MemLevel {
  size_t live = 0;  // detail::live_cuda_allocations()
  size_t free = 0;  // cudaMemGetInfo
};

MemLevel mem_level() {
  REQUIRE_CUDA(cudaDeviceSynchronize());
  MemLevel m;
  m.live = detail::live_cuda_allocations();
  size_t total = 0;
  REQUIRE_CUDA(cudaMemGetInfo(&m.free, &total));
  return m;
}

// Back at `before`: every block the failed call allocated was freed. cudaMemGetInfo counts the whole device, so
// this needs the GPU to itself: another process's allocations read as our leak (tools/gpu_check.sh runs the
// [faults] cases alone; run beside the other build's suite they showed 26 MiB and 1.1 GiB "drifts" that came back
// a few loads later, 2026-12-04).
void check_level(const MemLevel& before, const std::string& what) {
  const MemLevel now = mem_level();
  INFO(what << ": backend allocations " << before.live << " -> " << now.live << ", free GPU memory " << before.free
            << " -> " << now.free << " bytes");
  CHECK(now.live == before.live);
  if (free_memory_comparable()) CHECK(now.free + kSlack >= before.free);
}

LoadOptions cuda_options(PleLocation ple = PleLocation::Host) {
  LoadOptions opt;
  opt.backend = Backend::Cuda;
  opt.max_context = 1024;
  opt.ple = ple;
  return opt;
}

}  // namespace

TEST_CASE("CUDA faults: each allocation failing at load is OutOfMemory naming it, and frees the rest",
          "[gpu][faults]") {
  struct Case {
    const char* fixture;
    PleLocation ple;
  };
  for (const Case& c : {Case{"mm_bf16", PleLocation::Host}, Case{"mm_bf16", PleLocation::Device},
                        Case{"w4a16", PleLocation::Host}, Case{"flat_keqv", PleLocation::Host}}) {
    const bool device_ple = c.ple == PleLocation::Device;
    INFO(c.fixture << (device_ple ? ", PLE on the GPU" : ", PLE on the host"));
    Reference ref;
    load_reference(c.fixture, &ref);
    const std::string dir = fixtures() + "/" + c.fixture;
    // Another engine serving beside the failing loads, with a session made before them.
    const Engine other = load_engine(c.fixture, Backend::Cuda, c.ple);
    Session kept;
    REQUIRE(other.create_session(&kept));
    const std::vector<int32_t> expected = fresh_tokens(other, ref.prompt, greedy(8));

    // Warm-up (kernels loaded, cuBLAS initialised), then count the allocations a load makes.
    std::vector<std::string> whats;
    {
      Recorder count;
      Recorder::Guard guard(count);
      Engine e;
      const Status st = Engine::load(dir, cuda_options(c.ple), &e);
      INFO(st.message);
      REQUIRE(st);
      whats = count.whats();
    }
    REQUIRE(whats.size() > 10);
    CHECK(std::count(whats.begin(), whats.end(), "cuBLAS handle") == 1);
    CHECK(std::count(whats.begin(), whats.end(), "load: staging buffer") == 1);
    CHECK(std::count(whats.begin(), whats.end(), "workspace: metadata (pinned)") == 1);

    const MemLevel before = mem_level();
    for (size_t k = 0; k < whats.size(); ++k) {
      INFO("allocation " << k << " of " << whats.size() << ": " << whats[k]);
      Recorder r;
      r.fail_at = int(k);
      Engine e;
      Status st;
      {
        Recorder::Guard guard(r);
        st = Engine::load(dir, cuda_options(c.ple), &e);
      }
      INFO(st.message);
      CHECK(st.code == Code::OutOfMemory);
      CHECK(r.failures() == 1);
      CHECK(r.failed() == whats[k]);  // the same order every load
      CHECK(contains(st.message, whats[k]));
      CHECK_FALSE(e.loaded());
      check_level(before, "load failing at allocation " + std::to_string(k));
    }

    // Without the hook the same load succeeds and generates what the other engine does; that one is unaffected.
    Engine e;
    REQUIRE(Engine::load(dir, cuda_options(c.ple), &e));
    CHECK(fresh_tokens(e, ref.prompt, greedy(8)) == expected);
    CHECK(tokens_of(other, kept, ref.prompt, greedy(8)) == expected);
  }
}

TEST_CASE("CUDA faults: each KV-cache allocation failing in create_session is OutOfMemory; nothing leaks",
          "[gpu][faults]") {
  Reference ref;
  load_reference("mm_bf16", &ref);
  const Engine engine = load_engine("mm_bf16", Backend::Cuda);
  Session kept;  // made before the faults
  REQUIRE(engine.create_session(&kept));
  const std::vector<int32_t> expected = tokens_of(engine, kept, ref.prompt, greedy(8));
  kept.reset();

  std::vector<std::string> whats;
  {
    Recorder count;
    Recorder::Guard guard(count);
    Session s;
    REQUIRE(engine.create_session(&s));
    whats = count.whats();
  }
  size_t own_kv = 0;  // layers with their own K/V: two buffers each
  for (const LayerConfig& lc : engine.config().layers) own_kv += lc.kv_shared ? 0 : 1;
  REQUIRE(whats.size() == 2 * own_kv);

  const MemLevel before = mem_level();
  for (size_t k = 0; k < whats.size(); ++k) {
    INFO("allocation " << k << ": " << whats[k]);
    Recorder r;
    r.fail_at = int(k);
    Session s;
    Status st;
    {
      Recorder::Guard guard(r);
      st = engine.create_session(&s);
    }
    INFO(st.message);
    CHECK(st.code == Code::OutOfMemory);
    CHECK(contains(st.message, whats[k]));
    CHECK(contains(st.message, "create_session: KV cache of layer"));
    CHECK_FALSE(s.valid());
    check_level(before, "create_session failing at allocation " + std::to_string(k));
  }

  CHECK(tokens_of(engine, kept, ref.prompt, greedy(8)) == expected);  // the session made before
  Session s;                                                          // and without the hook, a new one
  REQUIRE(engine.create_session(&s));
  CHECK(tokens_of(engine, s, ref.prompt, greedy(8)) == expected);
}

TEST_CASE("CUDA faults: a decode pass's CUDA graph failing to build is OutOfMemory; sessions stay usable",
          "[gpu][faults]") {
  Reference ref;
  load_reference("mm_bf16", &ref);
  constexpr int kTokens = 8;
  std::vector<int32_t> expected;  // from an engine that never saw a fault
  {
    const Engine clean = load_engine("mm_bf16", Backend::Cuda);
    expected = fresh_tokens(clean, ref.prompt, greedy(kTokens));
  }
  const Engine engine = load_engine("mm_bf16", Backend::Cuda);  // no graph built yet
  Session kept, s;
  REQUIRE(engine.create_session(&kept));
  REQUIRE(engine.create_session(&s));
  const int V = engine.config().vocab_size;

  Recorder r;
  r.fail_match = "CUDA graph";
  {
    Recorder::Guard guard(r);
    // generate(): the prompt's step (a prefill pass, no graph) works, the first decode step does not
    std::vector<int32_t> out;
    Status st = generate(engine, s, ref.prompt, greedy(kTokens), nullptr, &out);
    INFO(st.message);
    CHECK(st.code == Code::OutOfMemory);
    CHECK(contains(st.message, "decode: CUDA graph for 1 rows"));
    REQUIRE(out == std::vector<int32_t>(expected.begin(), expected.begin() + 1));
    CHECK(s.position() == ref.prompt.size());  // the prompt, not the token whose feed failed

    // Engine::forward and Engine::step (host / device logits: two graph tables) fail the same way, at once
    const MemLevel before = mem_level();
    std::vector<float> logits;
    st = engine.forward(s, out.data(), 1, Logits::Last, &logits);
    CHECK(st.code == Code::OutOfMemory);
    BatchItem item{&s, out.data(), 1};
    int32_t next = -1;
    st = engine.step(&item, 1, nullptr, &next);
    CHECK(st.code == Code::OutOfMemory);
    CHECK(s.position() == ref.prompt.size());
    check_level(before, "failed graph builds");

    // a Batch: the pass that needs the graph fails; its sessions finish with that error, the batch goes on
    Batch batch(engine);
    Session b1, b2;
    REQUIRE(engine.create_session(&b1));
    REQUIRE(engine.create_session(&b2));
    REQUIRE(batch.add(&b1, ref.prompt, greedy(kTokens), nullptr));
    REQUIRE(batch.add(&b2, ref.prompt, greedy(kTokens), nullptr));
    Status failed;
    for (int step = 0; !batch.idle() && step < 10; ++step)
      if (Status bs = batch.step(); !bs) failed = bs;
    CHECK(batch.idle());
    CHECK(failed.code == Code::OutOfMemory);
    const std::vector<BatchResult> results = batch.take_finished();
    REQUIRE(results.size() == 2);
    for (const BatchResult& res : results) {
      CHECK(res.finish == FinishReason::Error);
      CHECK(res.status.code == Code::OutOfMemory);
      CHECK(res.tokens == std::vector<int32_t>(expected.begin(), expected.begin() + 1));
      CHECK(res.session->position() == ref.prompt.size());
    }
    CHECK(r.failures() >= 4);
  }

  // The hook gone: s goes on from what it holds, exactly where an undisturbed run would; the session made
  // before the faults gives the undisturbed tokens.
  std::vector<float> logits;
  REQUIRE(engine.forward(s, &expected[0], 1, Logits::Last, &logits));
  CHECK(argmax(logits.data(), size_t(V)) == expected[1]);
  CHECK(tokens_of(engine, s, {expected[1]}, greedy(kTokens - 2)) ==
        std::vector<int32_t>(expected.begin() + 2, expected.end()));
  CHECK(tokens_of(engine, kept, ref.prompt, greedy(kTokens)) == expected);
}

TEST_CASE("CUDA faults: the repetition-penalty buffer failing to grow is OutOfMemory; nothing was fed",
          "[gpu][faults]") {
  Reference ref;
  load_reference("mm_bf16", &ref);
  constexpr int kTokens = 8;
  const GenerateOptions penalised = greedy(kTokens, 1.3f);
  std::vector<int32_t> expected, expected_plain;
  {
    const Engine clean = load_engine("mm_bf16", Backend::Cuda);
    expected = fresh_tokens(clean, ref.prompt, penalised);
    expected_plain = fresh_tokens(clean, ref.prompt, greedy(kTokens));
  }
  const Engine engine = load_engine("mm_bf16", Backend::Cuda);  // the buffer is made on first use
  Session kept, s;
  REQUIRE(engine.create_session(&kept));
  REQUIRE(engine.create_session(&s));

  Recorder r;
  r.fail_match = "repetition-penalty";
  {
    Recorder::Guard guard(r);
    const MemLevel before = mem_level();
    std::vector<int32_t> out;
    const Status st = generate(engine, s, ref.prompt, penalised, nullptr, &out);
    INFO(st.message);
    CHECK(st.code == Code::OutOfMemory);
    CHECK(contains(st.message, "step: repetition-penalty ids"));
    CHECK(out.empty());
    CHECK(s.position() == 0);
    check_level(before, "failed repetition-penalty buffer");
    // sessions that need no penalty are not affected meanwhile
    CHECK(tokens_of(engine, kept, ref.prompt, greedy(kTokens)) == expected_plain);
    kept.reset();
  }
  CHECK(r.failures() == 1);
  CHECK(tokens_of(engine, s, ref.prompt, penalised) == expected);
  CHECK(tokens_of(engine, kept, ref.prompt, penalised) == expected);
}

TEST_CASE("CUDA faults: a checkpoint truncated while the backend streams it at load is an IoError",
          "[gpu][faults][io]") {
  const Engine warm = load_engine("mm_bf16", Backend::Cuda);  // context, kernels, cuBLAS made already
  testutil::TempDir tmp;
  const fs::path dir = copy_fixture("mm_bf16", tmp.path());
  const fs::path file = dir / "model.safetensors";
  const auto full = fs::file_size(file);
  LoadOptions opt = cuda_options();
  bool truncated = false;
  opt.on_progress = [&](float f) {  // called after each chunk streamed to the GPU
    if (f > 0.f && !truncated) truncated = ::truncate(file.c_str(), off_t(full / 2)) == 0;
  };
  const MemLevel before = mem_level();
  Engine e;
  const Status st = Engine::load(dir.string(), opt, &e);
  INFO(st.message);
  CHECK(truncated);
  CHECK(st.code == Code::IoError);
  CHECK(contains(st.message, file.string()));
  CHECK(contains(st.message, "shrank from " + std::to_string(full) + " to " + std::to_string(full / 2)));
  CHECK_FALSE(e.loaded());
  check_level(before, "load stopped by a truncated file");
}

TEST_CASE("CUDA faults: a truncated checkpoint is an IoError with the PLE table on the host, harmless on the GPU",
          "[gpu][faults][io]") {
  Reference ref;
  load_reference("mm_bf16", &ref);
  for (PleLocation ple : {PleLocation::Host, PleLocation::Device}) {
    const bool host = ple == PleLocation::Host;
    INFO((host ? "PLE on the host: read from the mapped file every pass" : "PLE on the GPU: the file is not read"));
    testutil::TempDir tmp;
    const fs::path dir = copy_fixture("mm_bf16", tmp.path());
    const fs::path file = dir / "model.safetensors";
    Engine engine;
    REQUIRE(Engine::load(dir.string(), cuda_options(ple), &engine));
    const int V = engine.config().vocab_size;
    Session before, s;
    REQUIRE(engine.create_session(&before));
    REQUIRE(engine.create_session(&s));
    std::vector<float> expected, logits;
    REQUIRE(engine.forward(before, ref.prompt.data(), ref.prompt.size(), Logits::Last, &expected));

    REQUIRE(::truncate(file.c_str(), 0) == 0);
    const Status st = engine.forward(s, ref.prompt.data(), ref.prompt.size(), Logits::Last, &logits);
    INFO(st.message);
    if (host) {
      CHECK(st.code == Code::IoError);
      CHECK(contains(st.message, "shrank"));
      CHECK(s.position() == 0);
      std::vector<int32_t> out;
      CHECK(generate(engine, s, ref.prompt, greedy(4), nullptr, &out).code == Code::IoError);
      CHECK(out.empty());
    } else {
      REQUIRE(st);
      CHECK(argmax(logits.data(), size_t(V)) == argmax(expected.data(), size_t(V)));
      CHECK(logits == expected);
    }
  }
}

TEST_CASE("CUDA faults: an empty hook is no hook", "[gpu][faults]") {
  detail::set_alloc_fault_hook(std::function<bool(size_t, const char*)>());
  Reference ref;
  load_reference("w4a16", &ref);
  const Engine engine = load_engine("w4a16", Backend::Cuda);
  CHECK(engine.loaded());
  CHECK(detail::live_cuda_allocations() > 0);
}
