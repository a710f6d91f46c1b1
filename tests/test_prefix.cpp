// Engine::copy_prefix on the CPU backend: a session that got its first n tokens copied from another gives, bit
// for bit, the logits and the sampled tokens (repetition penalty included: the history is copied too) of a
// session that fed those tokens itself -- for every fixture (sliding rings, KV-shared layers, k_eq_v, w4a16),
// for prefixes shorter and longer than the sliding window, into destinations of another max_context (ring vs
// no ring) and destinations that held another conversation; a prefix short of the source's position within
// the ring's reach; and every refusal, which leaves the destination as it was.
#include <catch2/catch.hpp>

#include <utility>
#include <vector>

#include "reference.hpp"

using namespace gemma4_t4;
using namespace testref;

namespace {

std::vector<int32_t> concat(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  std::vector<int32_t> r = a;
  r.insert(r.end(), b.begin(), b.end());
  return r;
}

}  // namespace

TEST_CASE("copy_prefix: a copied prefix continues bit for bit like one fed in place", "[prefix][cpu]") {
  for (const char* name : {"mm_bf16", "flat_keqv", "w4a16"}) {
    INFO(name);
    Reference ref;
    load_reference(name, &ref);
    const Engine e = load_engine(name, Backend::Cpu, PleLocation::Host, 64);
    const std::vector<int32_t> prompt = concat(ref.prompt, ref.decode_ids);  // 36 tokens, window 8
    const std::vector<int32_t> rest(ref.decode_ids.begin(), ref.decode_ids.begin() + 5);
    for (size_t n : {size_t(1), size_t(5), size_t(8), size_t(9), size_t(20), size_t(36)}) {
      // a source sized to the prefix (no ring while n <= the window) or roomier; destinations likewise apart
      for (const auto& [src_ctx, dst_ctx] : {std::pair<size_t, size_t>{64, 64}, {n, 48}, {n, 41}}) {
        INFO("prefix " << n << ", source context " << src_ctx << ", destination context " << dst_ctx);
        Session src, dst;
        REQUIRE(e.create_session(&src, src_ctx));
        REQUIRE(e.create_session(&dst, dst_ctx));
        REQUIRE(e.forward(src, prompt.data(), n, Logits::None, nullptr));
        // dst first holds another conversation, longer than the window: the copy must drop it
        REQUIRE(e.forward(dst, ref.decode_ids.data(), ref.decode_ids.size(), Logits::None, nullptr));
        const Status st = e.copy_prefix(src, dst, n);
        INFO(st.message);
        REQUIRE(st);
        CHECK(dst.position() == n);
        CHECK(src.position() == n);
        std::vector<float> got;
        REQUIRE(e.forward(dst, rest.data(), rest.size(), Logits::All, &got));
        const std::vector<float> want = fed_itself(e, prompt, n, rest, dst_ctx);
        REQUIRE(got.size() == want.size());
        CHECK(got == want);  // bit for bit
        // the source is unchanged and may be copied again
        Session again;
        REQUIRE(e.create_session(&again, 64));
        REQUIRE(e.copy_prefix(src, again, n));
        std::vector<float> got2;
        REQUIRE(e.forward(again, rest.data(), rest.size(), Logits::All, &got2));
        CHECK(got2 == fed_itself(e, prompt, n, rest, 64));
      }
    }
  }
}

TEST_CASE("copy_prefix: generate() after a copy equals generate() on the whole prompt (sampling, penalty)",
          "[prefix][cpu]") {
  Reference ref;
  load_reference("mm_bf16", &ref);
  const Engine e = load_engine("mm_bf16", Backend::Cpu, PleLocation::Host, 128);
  const std::vector<int32_t> system = concat(ref.prompt, ref.decode_ids);  // the shared prefix, 36 tokens
  const std::vector<int32_t> user = {105, 17, 23, 29, 31, 106, 107, 105};  // what follows it
  GenerateOptions g;
  g.max_new_tokens = 24;
  g.stop_at_eos = false;
  g.sampling.temperature = 0.8f;
  g.sampling.repetition_penalty = 1.3f;  // reads the history: the prefix's tokens must be in it
  g.sampling.seed = 1234;

  Session whole;
  REQUIRE(e.create_session(&whole));
  std::vector<int32_t> want;
  REQUIRE(generate(e, whole, concat(system, user), g, nullptr, &want));

  Session cached, dst;
  REQUIRE(e.create_session(&cached, system.size()));  // a snapshot sized to the prefix
  REQUIRE(e.forward(cached, system.data(), system.size(), Logits::None, nullptr));
  REQUIRE(e.create_session(&dst));
  REQUIRE(e.copy_prefix(cached, dst, system.size()));
  std::vector<int32_t> got;
  REQUIRE(generate(e, dst, user, g, nullptr, &got));
  CHECK(got == want);
  CHECK(dst.position() == whole.position());
}

TEST_CASE("copy_prefix: a prefix short of the source's end, within the ring's reach", "[prefix][cpu]") {
  Reference ref;
  load_reference("mm_bf16", &ref);
  const Engine e = load_engine("mm_bf16", Backend::Cpu, PleLocation::Host, 64);
  const std::vector<int32_t> prompt = concat(ref.prompt, ref.decode_ids);
  const std::vector<int32_t> rest(ref.decode_ids.begin(), ref.decode_ids.begin() + 4);
  // window 8: a source at position <= 8 still holds every position; one at 20 holds [12, 20), so n = 20 only
  struct Case {
    size_t fed, n;
    bool ok;
  };
  for (const Case c : {Case{6, 3, true}, Case{8, 1, true}, Case{8, 0, true}, Case{20, 20, true}, Case{20, 19, false},
                       Case{20, 12, false}, Case{9, 1, false}}) {
    INFO("source at " << c.fed << ", prefix " << c.n);
    Session src, dst;
    REQUIRE(e.create_session(&src));
    REQUIRE(e.create_session(&dst));
    REQUIRE(e.forward(src, prompt.data(), c.fed, Logits::None, nullptr));
    REQUIRE(e.forward(dst, prompt.data(), 2, Logits::None, nullptr));
    const Status st = e.copy_prefix(src, dst, c.n);
    INFO(st.message);
    if (!c.ok) {
      CHECK(st.code == Code::InvalidArgument);
      CHECK(st.message.find("overwritten") != std::string::npos);
      CHECK(dst.position() == 2);  // untouched
      continue;
    }
    REQUIRE(st);
    REQUIRE(dst.position() == c.n);
    std::vector<float> got;
    REQUIRE(e.forward(dst, rest.data(), rest.size(), Logits::All, &got));
    CHECK(got == fed_itself(e, prompt, c.n, rest, 64));
  }
}

TEST_CASE("copy_prefix: refusals leave the destination as it was", "[prefix][cpu][errors]") {
  Reference ref;
  load_reference("mm_bf16", &ref);
  const Engine e = load_engine("mm_bf16", Backend::Cpu, PleLocation::Host, 64);
  const Engine other = load_engine("mm_bf16", Backend::Cpu, PleLocation::Host, 64);
  Session src, dst, small, foreign, none;
  REQUIRE(e.create_session(&src));
  REQUIRE(e.create_session(&dst));
  REQUIRE(e.create_session(&small, 4));
  REQUIRE(other.create_session(&foreign));
  REQUIRE(e.forward(src, ref.prompt.data(), 10, Logits::None, nullptr));
  REQUIRE(e.forward(dst, ref.prompt.data(), 3, Logits::None, nullptr));
  auto refused = [&](const Status& st, const char* what) {
    INFO(st.message);
    CHECK(st.code == Code::InvalidArgument);
    CHECK(st.message.find(what) != std::string::npos);
  };
  refused(e.copy_prefix(src, dst, 11), "holds 10");
  refused(e.copy_prefix(src, small, 5), "context of 4");
  refused(e.copy_prefix(src, src, 5), "one session");
  refused(e.copy_prefix(src, foreign, 5), "not created by this engine");
  refused(e.copy_prefix(foreign, dst, 0), "not created by this engine");
  refused(e.copy_prefix(none, dst, 0), "invalid session");
  refused(Engine().copy_prefix(src, dst, 1), "not loaded");
  CHECK(dst.position() == 3);
  CHECK(small.position() == 0);
  std::vector<float> got;
  REQUIRE(e.forward(dst, ref.prompt.data() + 3, 2, Logits::All, &got));
  CHECK(got == fed_itself(e, ref.prompt, 3, std::vector<int32_t>(ref.prompt.begin() + 3, ref.prompt.begin() + 5), 64));
}
