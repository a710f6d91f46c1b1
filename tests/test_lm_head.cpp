// LoadOptions::lm_head on the CPU backend: the quantized copies (weights.hpp's quantizers) against the
// checkpoint's head on the fixtures' reference prompts. The CUDA backend is held to the CPU backend's
// quantized logits by tests/gpu/test_cuda_parity.cpp; the kernels to the host quantizers bit for bit by
// tests/gpu/test_kernels.cu; the fidelity at E2B size is a benchmark (bench --lm-head-fidelity).
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "reference.hpp"
#include "gemma4_t4/config.hpp"
#include "gemma4_t4/weights.hpp"

using namespace gemma4_t4;
using namespace testref;

namespace {

struct HeadError {
  double max_rel = 0;  // max over rows of max |q - f| / max |f|
  size_t top1 = 0;     // rows whose argmax agrees
};

HeadError compare(const std::vector<float>& q, const std::vector<float>& f, size_t rows, int V) {
  HeadError e;
  for (size_t r = 0; r < rows; ++r) {
    e.max_rel = std::max(e.max_rel, row_error(&q[r * V], &f[r * V], V));
    e.top1 += argmax(&q[r * V], size_t(V)) == argmax(&f[r * V], size_t(V));
  }
  return e;
}

}  // namespace

TEST_CASE("quantizers: int8 per row and int4 group 32 round-trip within half a step, zero rows stay zero",
          "[lm_head]") {
  const size_t n = 96;
  std::vector<float> w(n);
  for (size_t i = 0; i < n; ++i) w[i] = float((int(i * 37 % 97) - 48)) * 0.0131f * (i % 32 == 5 ? 3.f : 1.f);
  std::vector<int8_t> q8(n);
  float s8 = 0;
  detail::quantize_row_int8(w.data(), n, q8.data(), &s8);
  float amax = 0;
  for (float v : w) amax = std::max(amax, std::fabs(v));
  REQUIRE(s8 == amax / 127.f);
  for (size_t i = 0; i < n; ++i) {
    INFO("int8 column " << i);
    REQUIRE(std::fabs(q8[i] * s8 - w[i]) <= 0.5f * s8 * 1.0001f);
  }
  std::vector<uint32_t> q4(n / 8);
  std::vector<uint16_t> s4(n / 32);
  detail::quantize_row_int4(w.data(), n, q4.data(), s4.data());
  for (size_t i = 0; i < n; ++i) {
    const float s = detail::f16_to_f32(s4[i / 32]);
    const int q = int((q4[i / 8] >> (4 * (i % 8))) & 0xFu) - 8;
    INFO("int4 column " << i << " q " << q << " scale " << s);
    REQUIRE(q >= -8);
    REQUIRE(q <= 7);
    REQUIRE(std::fabs(q * s - w[i]) <= 0.5f * s * 1.01f + 1e-7f);
  }
  std::vector<float> zero(n, 0.f);
  detail::quantize_row_int8(zero.data(), n, q8.data(), &s8);
  detail::quantize_row_int4(zero.data(), n, q4.data(), s4.data());
  REQUIRE(s8 == 0.f);
  for (int8_t v : q8) REQUIRE(v == 0);
  for (uint32_t v : q4) REQUIRE(v == 0x88888888u);  // q = 0 in every nibble
}

TEST_CASE("CPU backend: quantized LM heads stay close to the checkpoint's head", "[lm_head]") {
  // Tolerances: int8 moves a weight by at most max|row| / 254, int4 by max|group| / 14 (plus fp16
  // rounding); measured on these fixtures (hidden 64, so few terms average out) 0.9-1.1% and 12-15% of the
  // logit range. A wrong packing or scale gives errors of the order of the logits themselves.
  for (const char* name : {"mm_bf16", "w4a16"}) {
    const Reference ref = reference(name);
    const size_t T = ref.prompt.size();
    Engine f16 = load_engine(name, Backend::Cpu);
    std::vector<float> lf;
    {
      Session s;
      REQUIRE(f16.create_session(&s));
      REQUIRE(f16.forward(s, ref.prompt.data(), T, Logits::All, &lf));
    }
    const int V = f16.config().vocab_size, H = f16.config().hidden_size;
    for (LmHead head : {LmHead::Int8, LmHead::Int4}) {
      const std::string what = std::string(name) + " " + detail::lm_head_name(head);
      INFO(what);
      Engine q = load_engine(name, Backend::Cpu, PleLocation::Host, 1024, head);
      std::vector<float> lq;
      Session s;
      REQUIRE(q.create_session(&s));
      REQUIRE(q.forward(s, ref.prompt.data(), T, Logits::All, &lq));
      const HeadError e = compare(lq, lf, T, V);
      WARN(what << ": max rel logit error " << e.max_rel << ", top-1 agreement " << e.top1 << " / " << T);
      CHECK(e.max_rel > 0);  // it is a different head
      CHECK(e.max_rel <= (head == LmHead::Int8 ? 0.02 : 0.2));
      CHECK(e.top1 * 10 >= T * (head == LmHead::Int8 ? 9 : 7));
      // the bytes a decode step reads shrink by the head's share; the copy is accounted as weights
      const double head_f16 = double(V) * H * 2;
      CHECK(q.decode_bytes_per_token() ==
            Approx(f16.decode_bytes_per_token() - head_f16 + detail::lm_head_bytes(size_t(V), size_t(H), head)));
      CHECK(q.weight_bytes() > f16.weight_bytes());
    }
  }
}
