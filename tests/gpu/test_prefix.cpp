// Engine::copy_prefix on the CUDA backend (the server's prefix cache): a session that got its first n tokens
// copied device-to-device from another continues like a session that prefilled the same tokens itself in the
// same passes -- the copied fp16 K/V are the very values that session computes, so the logits agree to the last
// bit in practice (checked to 1e-6 relative) and greedy generations are identical. Covered: every fixture;
// prefixes shorter and longer than the sliding window and than one pass (max_pass_rows 64), so sliding rings of
// window + 64 slots wrap in source and destination; a source sized to the prefix; a destination that held
// another conversation; a prefix short of the source's end within the ring's reach, and one beyond it (refused,
// destination untouched). Run by the GPU suite (label gpu).
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "../reference.hpp"

using namespace gemma4_t4;
using namespace testref;

namespace {

constexpr size_t kCtx = 256;
constexpr int kPassRows = 64;  // the smallest pass: rings of window (8) + 64 slots

// `count` ids in [4, 512) from a fixed LCG, <bos> first.
std::vector<int32_t> ids(size_t count, uint32_t seed) {
  std::vector<int32_t> v(count);
  for (size_t i = 0; i < count; ++i) {
    seed = seed * 1664525u + 1013904223u;
    v[i] = int32_t(4 + (seed >> 8) % 508);
  }
  if (count) v[0] = 2;
  return v;
}

}  // namespace

TEST_CASE("CUDA copy_prefix: a copied prefix continues like one prefilled in place", "[gpu][prefix]") {
  const std::vector<int32_t> prompt = ids(150, 7), other = ids(100, 8), rest = ids(6, 9);
  for (const char* name : {"mm_bf16", "flat_keqv", "w4a16"}) {
    INFO(name);
    const Engine e = load_engine(name, Backend::Cuda, PleLocation::Host, kCtx, LmHead::F16, kPassRows);
    REQUIRE(e.backend() == Backend::Cuda);
    const int V = e.config().vocab_size;
    for (size_t n : {size_t(1), size_t(8), size_t(9), size_t(40), size_t(72), size_t(100), size_t(150)}) {
      for (const auto& [src_ctx, dst_ctx] : {std::pair<size_t, size_t>{kCtx, kCtx}, {n, 200}}) {
        INFO("prefix " << n << ", source context " << src_ctx << ", destination context " << dst_ctx);
        Session src, dst;
        REQUIRE(e.create_session(&src, src_ctx));
        REQUIRE(e.create_session(&dst, dst_ctx));
        REQUIRE(e.forward(src, prompt.data(), n, Logits::None, nullptr));
        REQUIRE(e.forward(dst, other.data(), other.size(), Logits::None, nullptr));  // wraps dst's rings
        const Status st = e.copy_prefix(src, dst, n);
        INFO(st.message);
        REQUIRE(st);
        REQUIRE(dst.position() == n);
        std::vector<float> got;
        REQUIRE(e.forward(dst, rest.data(), rest.size(), Logits::All, &got));
        const std::vector<float> want = fed_itself(e, prompt, n, rest, dst_ctx);
        const double err = check_rows(got, want.data(), rest.size(), V, 1e-6, std::string(name) + " after copy");
        for (size_t r = 0; r < rest.size(); ++r)
          CHECK(argmax(&got[r * V], size_t(V)) == argmax(&want[r * V], size_t(V)));
        if (err > 0) WARN(name << ": prefix " << n << ": max rel err " << err << " (not bit-identical)");
      }
    }
  }
}

TEST_CASE("CUDA copy_prefix: greedy generate() after a copy equals generate() on the whole prompt", "[gpu][prefix]") {
  const Engine e = load_engine("mm_bf16", Backend::Cuda, PleLocation::Host, kCtx, LmHead::F16, kPassRows);
  const std::vector<int32_t> system = ids(120, 11), user = {105, 17, 23, 29, 31, 106, 107, 105};
  std::vector<int32_t> whole_prompt = system;
  whole_prompt.insert(whole_prompt.end(), user.begin(), user.end());
  Session whole, snapshot, dst;
  REQUIRE(e.create_session(&whole));
  REQUIRE(e.create_session(&snapshot, system.size()));
  REQUIRE(e.create_session(&dst));
  // both feed the shared part in one call first (the same passes), then the rest
  REQUIRE(e.forward(whole, system.data(), system.size(), Logits::None, nullptr));
  REQUIRE(e.forward(snapshot, system.data(), system.size(), Logits::None, nullptr));
  REQUIRE(e.copy_prefix(snapshot, dst, system.size()));
  std::vector<int32_t> want, got;
  REQUIRE(generate(e, whole, user, greedy(24, 1.3f), nullptr, &want));
  REQUIRE(generate(e, dst, user, greedy(24, 1.3f), nullptr, &got));  // the penalty reads the copied history
  CHECK(got == want);
  CHECK(dst.position() == whole.position());
}

TEST_CASE("CUDA copy_prefix: within the ring's reach of the source's end, and beyond it", "[gpu][prefix]") {
  const Engine e = load_engine("mm_bf16", Backend::Cuda, PleLocation::Host, kCtx, LmHead::F16, kPassRows);
  const int V = e.config().vocab_size;
  const std::vector<int32_t> prompt = ids(150, 13), rest = ids(4, 14);
  // rings of 8 + 64 = 72 slots: a source at 150 holds [78, 150); a prefix of n needs [n - 8, n)
  for (const auto& [n, ok] : {std::pair<size_t, bool>{150, true}, {120, true}, {86, true}, {85, false}, {40, false}}) {
    INFO("prefix " << n);
    Session src, dst;
    REQUIRE(e.create_session(&src));
    REQUIRE(e.create_session(&dst));
    REQUIRE(e.forward(src, prompt.data(), prompt.size(), Logits::None, nullptr));
    REQUIRE(e.forward(dst, prompt.data(), 3, Logits::None, nullptr));
    const Status st = e.copy_prefix(src, dst, n);
    INFO(st.message);
    if (!ok) {
      CHECK(st.code == Code::InvalidArgument);
      CHECK(dst.position() == 3);
      continue;
    }
    REQUIRE(st);
    std::vector<float> got;
    REQUIRE(e.forward(dst, rest.data(), rest.size(), Logits::All, &got));
    // the reference prefills the n tokens in one call; the source prefilled 150 in one call: the passes differ
    // (64-row chunks at other offsets), so fp16 tolerances here
    const std::vector<float> want = fed_itself(e, prompt, n, rest, kCtx);
    check_rows(got, want.data(), rest.size(), V, 1e-2, "copy within reach");
  }
}
