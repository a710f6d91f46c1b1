// The CUDA backend's streams are cudaStreamNonBlocking: they do not wait for the legacy default stream. What the
// backend writes at load must therefore be done before a pass on any other stream can read it (device.hpp's
// upload_now / zero_now). Here a host function holds the legacy default stream closed while the PLE stager is set
// up and a pass is staged on a non-blocking stream: work the stager left on the legacy stream (its zeroing, once a
// cudaMemset) would run only when the gate opens, after the staged rows, and zero them (the suite saw it as wrong
// logits of a first pass, under a second process on the GPU; bench/RESULTS.md 2026-12-05 (e)).

#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

// the implementation parts planner.hpp stands on, in gemma4_t4.hpp's order (as test_kernels.cu does)
#include "gemma4_t4.hpp"
#include "gemma4_t4/common.hpp"
#include "gemma4_t4/safetensors.hpp"
#include "gemma4_t4/config.hpp"
#include "gemma4_t4/weights.hpp"
#include "kernels/rng.cuh"
#include "gemma4_t4/sampler.hpp"
#include "gemma4_t4/threads.hpp"
#include "gemma4_t4/backend.hpp"
#include "gemma4_t4/block.hpp"
#include "gemma4_t4/cuda/planner.hpp"
#include "harness.hpp"

namespace {

// 0: closed; 1: opened by the test; 2: opened by its timeout (something waited for the legacy stream)
struct Gate {
  std::atomic<int> state{0};
};

void CUDART_CB hold(void* p) {
  auto* g = static_cast<Gate*>(p);
  const auto t0 = std::chrono::steady_clock::now();
  while (g->state.load() == 0) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20)) {
      g->state.store(2);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

TEST_CASE("PLE stager: its zeroing is done when init returns, not left on the legacy default stream",
          "[gpu][streams]") {
  using namespace gemma4_t4;
  using namespace gemma4_t4::detail;
  ModelConfig c;  // 4 layers, the last two sharing KV: rows that stop at layer 1 (after its K/V) stage layer 0's input
  c.num_layers = 4;
  c.hidden_size_per_layer_input = 64;
  c.layers.resize(4);
  c.layers[2].kv_shared = c.layers[3].kv_shared = true;
  REQUIRE(kv_keep_layer(c) == 1);
  const int V = 16, row = c.num_layers * c.hidden_size_per_layer_input;  // elements per token
  std::vector<uint16_t> table(size_t(V) * row);
  for (size_t i = 0; i < table.size(); ++i) table[i] = uint16_t(0x3C00 + i % 977);  // bf16 bits, never zero
  TensorInfo t;
  t.name = "per_layer_table";
  t.dtype = DType::BF16;
  t.shape = {V, row};
  t.data = reinterpret_cast<const uint8_t*>(table.data());
  t.nbytes = table.size() * 2;
  const int32_t ids[3] = {5, 11, 2};

  Gate gate;
  REQUIRE_CUDA(cudaLaunchHostFunc(cudaStreamLegacy, hold, &gate));
  cudaStream_t s = nullptr;
  REQUIRE_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<uint8_t> got(size_t(3) * row * 2);
  {
    PleStager st;
    REQUIRE(st.init(c, t, 8));
    // one item of 3 tokens, Logits::Last: rows 0 and 1 bring layer 0's part (their prefix), row 2 the whole row
    const Pass pass = {Segment{nullptr, ids, 0, 3, true}};
    bool async = true;
    REQUIRE(st.stage(pass, Logits::Last, 0, s, &async));
    CHECK_FALSE(async);  // a small pass: on `s`
    REQUIRE_CUDA(cudaStreamSynchronize(s));
    const int before = gate.state.exchange(1);
    INFO("gate " << before << ": 2 = the legacy default stream was waited for while it was held");
    CHECK(before == 0);
    REQUIRE_CUDA(cudaDeviceSynchronize());  // whatever was queued behind the gate has run now
    REQUIRE_CUDA(cudaMemcpy(got.data(), st.raw(0), got.size(), cudaMemcpyDeviceToHost));
  }
  REQUIRE_CUDA(cudaStreamDestroy(s));
  const size_t row_bytes = size_t(row) * 2, prefix = size_t(kv_keep_layer(c)) * c.hidden_size_per_layer_input * 2;
  for (int r = 0; r < 3; ++r) {
    INFO("row " << r);
    const uint8_t* want = reinterpret_cast<const uint8_t*>(table.data()) + size_t(ids[r]) * row_bytes;
    const uint8_t* g = got.data() + size_t(r) * row_bytes;
    const size_t staged = r == 2 ? row_bytes : prefix;
    CHECK(std::memcmp(g, want, staged) == 0);
    const std::vector<uint8_t> zeros(row_bytes - staged, 0);
    CHECK(std::memcmp(g + staged, zeros.data(), zeros.size()) == 0);  // past the prefix: the init's zeros
  }
}
