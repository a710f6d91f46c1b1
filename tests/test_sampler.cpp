// The CPU sampler (the reference for the GPU kernel): greedy, determinism per seed, and the kept
// distributions of temperature, top-k, top-p, min-p and repetition penalty, checked by frequency over many
// draws against probabilities computed here independently.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <vector>

#include "gemma4_t4.hpp"
#include "gemma4_t4/common.hpp"
#include "kernels/rng.cuh"
#include "gemma4_t4/sampler.hpp"

using namespace gemma4_t4;

namespace {

// probabilities 0.4, 0.25, 0.15, 0.1, 0.06, 0.04 spread over a 16-token vocabulary (ids 3, 7, 1, 12, 9, 0)
const int kIds[6] = {3, 7, 1, 12, 9, 0};
const double kP[6] = {0.4, 0.25, 0.15, 0.1, 0.06, 0.04};
constexpr int kV = 16;

std::vector<float> logits() {
  std::vector<float> x(kV, -30.f);  // ~0 probability elsewhere (e^-30 of the mass)
  for (int i = 0; i < 6; ++i) x[kIds[i]] = float(std::log(kP[i]));
  return x;
}

std::map<int, double> frequencies(const SamplingOptions& o, int draws, const std::vector<int32_t>& seen = {}) {
  std::map<int, double> f;
  for (int c = 0; c < draws; ++c) {
    std::vector<float> x = logits();
    f[detail::sample_ref(x.data(), kV, o, seen.data(), seen.size(), uint64_t(c))] += 1.0 / draws;
  }
  return f;
}

// expected: id -> probability; every other id must not appear.
void check_distribution(const std::map<int, double>& got, const std::map<int, double>& want) {
  for (const auto& g : got) {
    INFO("id " << g.first << " frequency " << g.second);
    REQUIRE(want.count(g.first) == 1);
  }
  for (const auto& w : want) {
    const double f = got.count(w.first) ? got.at(w.first) : 0.0;
    INFO("id " << w.first << " expected " << w.second << " got " << f);
    CHECK(std::fabs(f - w.second) < 0.015);  // ~4 sigma at 20000 draws
  }
}

std::map<int, double> renormalised(int keep, double temperature = 1.0) {
  double z = 0;
  for (int i = 0; i < keep; ++i) z += std::pow(kP[i], 1.0 / temperature);
  std::map<int, double> m;
  for (int i = 0; i < keep; ++i) m[kIds[i]] = std::pow(kP[i], 1.0 / temperature) / z;
  return m;
}

// Sampling with only the filters asked for (the defaults: temperature 1, every filter off).
SamplingOptions plain(float temperature = 1.f, int top_k = 0, float top_p = 1.f, float min_p = 0.f) {
  SamplingOptions o;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.min_p = min_p;
  return o;
}

}  // namespace

TEST_CASE("sampler: greedy is the argmax, first on ties", "[sampler]") {
  std::vector<float> x = logits();
  x[5] = x[3];  // tie with the best at a later id
  CHECK(detail::sample_ref(x.data(), kV, SamplingOptions::greedy(), nullptr, 0, 0) == 3);
  SamplingOptions k1 = plain();
  k1.top_k = 1;
  x = logits();
  CHECK(detail::sample_ref(x.data(), kV, k1, nullptr, 0, 99) == 3);
}

TEST_CASE("sampler: deterministic per seed and counter", "[sampler]") {
  SamplingOptions o = plain();
  o.seed = 42;
  int differ = 0;
  for (uint64_t c = 0; c < 200; ++c) {
    std::vector<float> a = logits(), b = logits(), d = logits();
    const int ta = detail::sample_ref(a.data(), kV, o, nullptr, 0, c);
    CHECK(ta == detail::sample_ref(b.data(), kV, o, nullptr, 0, c));
    SamplingOptions other = o;
    other.seed = 43;
    differ += ta != detail::sample_ref(d.data(), kV, other, nullptr, 0, c);
  }
  CHECK(differ > 50);  // another seed gives another sequence
}

TEST_CASE("sampler: distributions of the filters", "[sampler]") {
  const int N = 20000;
  // The ids each setting keeps, drawn N times: renormalised(n) is the n most likely with their p renormalised.
  auto keeps = [&](const SamplingOptions& o, int n, double temperature = 1.0) {
    check_distribution(frequencies(o, N), renormalised(n, temperature));
  };
  SECTION("temperature 1, no filter") { keeps(plain(), 6); }
  // The 10 far-away ids get e^-15 each at temperature 2: still negligible.
  SECTION("temperature 2 flattens: p^(1/2)") { keeps(plain(2.f), 6, 2.0); }
  SECTION("top-k 3") { keeps(plain(1.f, 3), 3); }
  SECTION("top-p 0.7 keeps the smallest prefix reaching 0.7 (0.4 + 0.25 + 0.15)") { keeps(plain(1.f, 0, 0.7f), 3); }
  SECTION("min-p 0.3 keeps p >= 0.12") { keeps(plain(1.f, 0, 1.f, 0.3f), 3); }
  SECTION("the strictest filter wins: top-k 4 with top-p 0.5") { keeps(plain(1.f, 4, 0.5f), 2); }
  SECTION("repetition penalty divides positive logits and multiplies negative ones") {
    std::vector<float> x = {2.f, -1.f, 0.5f};
    const int32_t seen[2] = {0, 1};
    detail::apply_repetition_penalty(x.data(), seen, 2, 2.f);
    CHECK(x[0] == 1.f);
    CHECK(x[1] == -2.f);
    CHECK(x[2] == 0.5f);
    SamplingOptions o = plain();
    o.repetition_penalty = 1.3f;
    const std::vector<int32_t> seen3 = {3};  // the favourite was already said: log(0.4) * 1.3
    std::map<int, double> want;
    double z = 0;
    for (int i = 0; i < 6; ++i) z += i == 0 ? std::pow(kP[0], 1.3) : kP[i];
    for (int i = 0; i < 6; ++i) want[kIds[i]] = (i == 0 ? std::pow(kP[0], 1.3) : kP[i]) / z;
    check_distribution(frequencies(o, N, seen3), want);
  }
}
