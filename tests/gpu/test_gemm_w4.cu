// kernels/gemm_w4.cuh: the w4a16 tensor-core matmul for passes of more than 16 rows and its GEMM-layout repack,
// against a host double reference taking the checkpoint layout (the operation's definition):
//   y[m][n] = sum_k x[m][k] w[n][k],  w = fp16((u - 8) * S[n][k / 32])  (the fp16 weight the kernel multiplies)
// The weights go through launch_repack_w4_gemm (the load-time repack), so the repack is tested with the kernel.
// Odd sizes: M 1, 17, 33, 64, 100, 257 (every tile configuration of launch_gemm_w4's dispatch, partial m tiles),
// N with partial 64- and 128-wide n tiles, K with partial 64- and 128-deep k tiles, padded ldx and ldy. Y is
// poisoned (NaN) including one row past M and the ldy padding, which must stay poisoned; X's row padding is NaN
// (a kernel that read past K would turn the row NaN). Tolerance: max |got - ref| / max |ref| <= 1e-3 (fp32 sums
// of up to 2080 fp16 products, in tensor-core order). Tags [gpu][gemm_w4].
#include <catch2/catch.hpp>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "../../kernels/elementwise.cuh"
#include "../../kernels/gemm_w4.cuh"
#include "../../kernels/rmsnorm.cuh"
#include "gemma4_t4.hpp"
#include "gemma4_t4/common.hpp"
#include "harness.hpp"

namespace kn = gemma4_t4::kernels;
using gemma4_t4::detail::f16_to_f32;
using gemma4_t4::detail::f32_to_f16;
using gputest::Dev;

namespace {

constexpr double kTol = 1e-3;

// x [M, ldx] fp16 bits, wq [N, K/8], s [N, K/32] fp16 bits (the checkpoint layout) -> y [M, N] in double.
std::vector<double> gemm_w4_ref(const std::vector<uint16_t>& x, int ldx, int M, int N, int K,
                                const std::vector<uint32_t>& wq, const std::vector<uint16_t>& s) {
  std::vector<double> y(size_t(M) * N);
  std::vector<double> w(static_cast<size_t>(K));
  for (int n = 0; n < N; ++n) {
    for (int k = 0; k < K; ++k) {
      const int u = int((wq[size_t(n) * (K / 8) + k / 8] >> (4 * (k % 8))) & 0xFu);
      w[size_t(k)] = f16_to_f32(f32_to_f16(float(u - 8) * f16_to_f32(s[size_t(n) * (K / 32) + k / 32])));
    }
    for (int m = 0; m < M; ++m) {
      double acc = 0;
      for (int k = 0; k < K; ++k) acc += w[size_t(k)] * f16_to_f32(x[size_t(m) * ldx + k]);
      y[size_t(m) * N + n] = acc;
    }
  }
  return y;
}

struct Problem {
  int M, N, K, ldx, ldy;
  std::vector<uint16_t> x, s;  // [M, ldx], [N, K/32] fp16 bits
  std::vector<uint32_t> wq;    // [N, K/8]
};

Problem random_problem(int M, int N, int K, int ldx, int ldy, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ux(-1.f, 1.f), us(0.002f, 0.02f);
  Problem p{M, N, K, ldx, ldy, {}, {}, {}};
  p.x.assign(size_t(M) * ldx, uint16_t(0xFFFF));  // row padding past K: NaN
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k) p.x[size_t(m) * ldx + k] = f32_to_f16(ux(rng));
  p.wq.resize(size_t(N) * K / 8);
  for (uint32_t& w : p.wq) w = uint32_t(rng());
  p.s.resize(size_t(N) * K / 32);
  for (uint16_t& v : p.s) v = f32_to_f16(us(rng));
  return p;
}

// Repack on the device, run launch_gemm_w4 (with `splits` blocks along K; C: launch_gemm_w4_cfg<C> instead), return
// Y [M + 1, ldy] as downloaded (poisoned beforehand).
template <class C = void>
std::vector<float> run(const Problem& p, const gputest::Stream& st, int splits = 1) {
  Dev<half> x(p.x.size()), s(p.s.size()), sp(p.s.size());
  Dev<uint32_t> wq(p.wq.size()), wp(p.wq.size());
  Dev<float> y(size_t(p.M + 1) * p.ldy), part(size_t(splits) * p.M * p.N + 1);
  x.upload(p.x);
  s.upload(p.s);
  wq.upload(p.wq);
  wp.poison();
  sp.poison();
  y.poison();
  REQUIRE_CUDA(kn::launch_repack_w4_gemm(wq.get(), s.get(), p.N, p.K, wp.get(), sp.get(), st.s));
  kn::GemmW4Args a;
  a.x = x.get(), a.ldx = p.ldx, a.m = p.M, a.n = p.N, a.k = p.K;
  a.wp = wp.get(), a.sp = sp.get();
  a.y = y.get(), a.ldy = p.ldy;
  a.splits = splits;
  a.part = part.get();
  part.poison();  // every partial the reduction reads is written first
  if constexpr (std::is_void_v<C>)
    REQUIRE_CUDA(kn::launch_gemm_w4(a, st.s));
  else
    REQUIRE_CUDA(kn::launch_gemm_w4_cfg<C>(a, st.s));
  st.sync();
  return y.download<float>();
}

}  // namespace

TEST_CASE("gemm_w4: launch_repack_w4_gemm + launch_gemm_w4 against the host at odd sizes, split-K too",
          "[gpu][gemm_w4]") {
  gputest::Stream st;
  const struct { int n, k; } shapes[] = {{32, 32}, {96, 416}, {160, 96}, {224, 2080}, {1056, 1568}, {256, 1536}};
  unsigned seed = 500;
  for (const auto& sh : shapes)
    for (const int M : {1, 17, 33, 64, 100, 257}) {
      const int ldx = sh.k + 8, ldy = sh.n + 2;
      const Problem p = random_problem(M, sh.n, sh.k, ldx, ldy, seed += 7);
      const std::vector<double> ref = gemm_w4_ref(p.x, ldx, M, sh.n, sh.k, p.wq, p.s);
      // no split; the engine's choice for a 132-SM GPU; every k-tile its own split (BK = 32 x G of M's tile)
      const int most = (sh.k + kn::gemm_w4_tile(M, sh.n, sh.k).bk - 1) / kn::gemm_w4_tile(M, sh.n, sh.k).bk;
      for (const int splits : {1, kn::gemm_w4_splits(M, sh.n, sh.k, 132, size_t(1) << 30), most}) {
        const std::vector<float> y = run(p, st, splits);
        std::vector<float> got(size_t(M) * sh.n);
        size_t stray = 0;
        for (int m = 0; m <= M; ++m)
          for (int n = 0; n < ldy; ++n) {
            const float v = y[size_t(m) * ldy + n];
            if (m < M && n < sh.n) {
              got[size_t(m) * sh.n + n] = v;
            } else {
              uint32_t bits;
              std::memcpy(&bits, &v, 4);
              stray += bits != 0xFFFFFFFFu;
            }
          }
        const std::string what = gputest::cat("gemm_w4 M ", M, " N ", sh.n, " K ", sh.k, ", ", splits, " splits");
        INFO(what << ": " << stray << " elements outside Y [M, N] changed");
        CHECK(stray == 0);
        gputest::check_max_rel(got, ref, kTol, what);
      }
    }
}

// XCfg's two load forms (kLean: the k-tiles inside K without predicates, rows past M and super-rows past N clamped;
// else every k-tile predicated and zeroed past K) change how a k-tile is loaded, not the sums: Y bit for bit the same,
// at partial m, n and k tiles, k-tile counts 1, 2, odd and even, and split-K (1- and 2-tile splits, odd and even first
// k-tiles).
TEST_CASE("gemm_w4: the lean and the predicated loads make the same Y bit for bit", "[gpu][gemm_w4]") {
  namespace g = kn::gemm_w4;
  using Pred = g::XCfg<4, 4, 1, 4, 2, 1, 2, 1, false>;
  static_assert(g::XSmall::kLean && !Pred::kLean, "the two forms");
  gputest::Stream st;
  const struct { int n, k; } shapes[] = {{32, 32}, {160, 96}, {96, 416}, {224, 2080}};
  unsigned seed = 900;
  for (const auto& sh : shapes)
    for (const int M : {17, 64, 100}) {
      const Problem p = random_problem(M, sh.n, sh.k, sh.k + 8, sh.n + 2, seed += 7);
      const int kt = (sh.k + g::XSmall::BK - 1) / g::XSmall::BK;
      for (const int splits : {1, 2, 3, kt}) {
        if (splits > kt) continue;
        INFO("M " << M << " N " << sh.n << " K " << sh.k << ", " << splits << " splits");
        const std::vector<float> lean = run<g::XSmall>(p, st, splits), pred = run<Pred>(p, st, splits);
        REQUIRE(lean.size() == pred.size());  // bits: the poisoned padding is NaN in both
        CHECK(std::memcmp(lean.data(), pred.data(), pred.size() * sizeof(float)) == 0);
      }
    }
}

// launch_gemm_w4_glu (the MLP's gate and up with the GELU product, one launch), each configuration (GluSmall,
// GluNarrow) at every size: against the host (the two double sums, gelu_tanh and the product in double) at odd sizes,
// and bit for bit against the unfused path at the same sums (the configuration's base tile unsplit for gate and for
// up, then launch_gelu_mul); out [M + 1, ld16] poisoned, padding must stay so. launch_gemm_w4_glu equals the
// configuration it takes for the shape (gemm_w4_glu_narrow) bit for bit.
template <class C>
void glu_one(const kn::GemmW4GluArgs& a0, const std::vector<double>& ref, half* yg_act, float* yg, float* yu,
             Dev<half>& out, const std::string& name, gputest::Stream& st, std::vector<uint16_t>* got_bits) {
  const int M = a0.m, N = a0.n, ld16 = a0.ld16;
  out.poison();
  kn::GemmW4GluArgs a = a0;
  a.out = out.get();
  REQUIRE_CUDA(kn::launch_gemm_w4_glu_cfg<C>(a, st.s));
  kn::GemmW4Args b;  // the unfused path at the same sums
  b.x = a.x, b.ldx = a.ldx, b.m = M, b.n = N, b.k = a.k, b.ldy = N;
  b.wp = a.wp[0], b.sp = a.sp[0], b.y = yg;
  REQUIRE_CUDA(kn::launch_gemm_w4_cfg<typename C::Base>(b, st.s));
  b.wp = a.wp[1], b.sp = a.sp[1], b.y = yu;
  REQUIRE_CUDA(kn::launch_gemm_w4_cfg<typename C::Base>(b, st.s));
  REQUIRE_CUDA(kn::launch_gelu_mul(yg, yu, size_t(M) * N, yg_act, st.s));
  st.sync();
  const std::vector<uint16_t> o = out.download<uint16_t>();
  std::vector<uint16_t> un(size_t(M) * N);
  REQUIRE_CUDA(cudaMemcpy(un.data(), yg_act, un.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> got(size_t(M) * N);
  size_t stray = 0, differ = 0;
  for (int m = 0; m <= M; ++m)
    for (int n = 0; n < ld16; ++n) {
      const uint16_t v = o[size_t(m) * ld16 + n];
      if (m < M && n < N) {
        got[size_t(m) * N + n] = f16_to_f32(v);
        differ += v != un[size_t(m) * N + n];
      } else {
        stray += v != 0xFFFFu;
      }
    }
  const std::string what = gputest::cat("gemm_w4 glu ", name, " M ", M, " N ", N, " K ", a.k);
  INFO(what << ": " << stray << " halves outside out [M, N] changed, " << differ << " differ from the unfused path");
  CHECK(stray == 0);
  CHECK(differ == 0);
  gputest::check_max_rel(got, ref, 2e-3, what);
  *got_bits = o;
}

TEST_CASE("gemm_w4 glu: gate, up and the GELU product in one launch, against the host and the unfused path",
          "[gpu][gemm_w4]") {
  gputest::Stream st;
  const struct { int n, k; } shapes[] = {{32, 32}, {96, 416}, {160, 96}, {1056, 1568}, {256, 1536}};
  unsigned seed = 1700;
  for (const auto& sh : shapes)
    for (const int M : {1, 17, 33, 64, 65, 100, 257}) {
      const int ldx = sh.k + 8, ld16 = sh.n + 2;
      const Problem g = random_problem(M, sh.n, sh.k, ldx, sh.n, seed += 7);
      Problem u = random_problem(M, sh.n, sh.k, ldx, sh.n, seed += 7);
      u.x = g.x;  // one X
      const std::vector<double> rg = gemm_w4_ref(g.x, ldx, M, sh.n, sh.k, g.wq, g.s);
      const std::vector<double> ru = gemm_w4_ref(g.x, ldx, M, sh.n, sh.k, u.wq, u.s);
      std::vector<double> ref(rg.size());
      for (size_t i = 0; i < ref.size(); ++i) {
        const double v = rg[i];
        const double gl = 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
        ref[i] = std::max(-65504.0, std::min(65504.0, gl * ru[i]));
      }
      Dev<half> x(g.x.size()), sg(g.s.size()), su(u.s.size()), spg(g.s.size()), spu(u.s.size());
      Dev<uint32_t> wqg(g.wq.size()), wqu(u.wq.size()), wpg(g.wq.size()), wpu(u.wq.size());
      Dev<half> out(size_t(M + 1) * ld16), act(size_t(M) * sh.n);
      Dev<float> yg(size_t(M) * sh.n), yu(size_t(M) * sh.n);
      x.upload(g.x);
      sg.upload(g.s);
      su.upload(u.s);
      wqg.upload(g.wq);
      wqu.upload(u.wq);
      REQUIRE_CUDA(kn::launch_repack_w4_gemm(wqg.get(), sg.get(), sh.n, sh.k, wpg.get(), spg.get(), st.s));
      REQUIRE_CUDA(kn::launch_repack_w4_gemm(wqu.get(), su.get(), sh.n, sh.k, wpu.get(), spu.get(), st.s));
      kn::GemmW4GluArgs a;
      a.x = x.get(), a.ldx = ldx, a.m = M, a.n = sh.n, a.k = sh.k;
      a.wp[0] = wpg.get(), a.sp[0] = spg.get(), a.wp[1] = wpu.get(), a.sp[1] = spu.get();
      a.ld16 = ld16;
      std::vector<uint16_t> small, narrow;
      glu_one<kn::gemm_w4::GluSmall>(a, ref, act.get(), yg.get(), yu.get(), out, "GluSmall", st, &small);
      glu_one<kn::gemm_w4::GluNarrow>(a, ref, act.get(), yg.get(), yu.get(), out, "GluNarrow", st, &narrow);
      {  // the other load form of each (XCfg kLean): the same act bit for bit
        namespace g = kn::gemm_w4;
        std::vector<uint16_t> small2, narrow2;
        glu_one<g::GluCfg<g::XCfg<4, 4, 1, 4, 2, 1, 2, 1, false>>>(a, ref, act.get(), yg.get(), yu.get(), out,
                                                                   "GluSmall predicated", st, &small2);
        glu_one<g::GluCfg<g::XCfg<4, 4, 1, 2, 4, 1, 2, 1, true>>>(a, ref, act.get(), yg.get(), yu.get(), out,
                                                                  "GluNarrow lean", st, &narrow2);
        CHECK(small2 == small);
        CHECK(narrow2 == narrow);
      }
      out.poison();
      a.out = out.get();
      REQUIRE_CUDA(kn::launch_gemm_w4_glu(a, st.s));  // by shape and this GPU's SM count
      st.sync();
      INFO("gemm_w4 glu by rows, M " << M << " N " << sh.n << " K " << sh.k);
      CHECK(out.download<uint16_t>() == (kn::gemm_w4_glu_narrow(M, sh.n, kn::device_sms()) ? narrow : small));
    }
  // the choice: GluNarrow only where GluSmall's blocks (N / 64 per 64 rows) would not reach every SM, at <= 64 rows
  CHECK(kn::gemm_w4_glu_narrow(33, 6144, 132));  // E2B's gate/up on an H100 / H200: 96 blocks
  CHECK(kn::gemm_w4_glu_narrow(64, 6144, 132));
  CHECK_FALSE(kn::gemm_w4_glu_narrow(65, 6144, 132));   // two row tiles
  CHECK_FALSE(kn::gemm_w4_glu_narrow(64, 12288, 132));  // 192 blocks
  CHECK_FALSE(kn::gemm_w4_glu_narrow(33, 6144, 40));    // a T4: 96 blocks on 40 SMs
  CHECK_FALSE(kn::gemm_w4_glu_narrow(33, 6144, 0));     // SM count unknown
  // refused before any launch: ld16 < N, odd ld16, N or K not a multiple of 32
  kn::GemmW4GluArgs bad;
  bad.m = 1, bad.n = 64, bad.k = 32, bad.ldx = 32, bad.ld16 = 62;
  CHECK(kn::launch_gemm_w4_glu(bad, st.s) == cudaErrorInvalidValue);
  bad.ld16 = 65;
  CHECK(kn::launch_gemm_w4_glu(bad, st.s) == cudaErrorInvalidValue);
  bad.ld16 = 64, bad.n = 48;
  CHECK(kn::launch_gemm_w4_glu(bad, st.s) == cudaErrorInvalidValue);
  bad.n = 64, bad.k = 40, bad.ldx = 40;
  CHECK(kn::launch_gemm_w4_glu(bad, st.s) == cudaErrorInvalidValue);
}

TEST_CASE("gemm_w4: the same call twice is bit-identical", "[gpu][gemm_w4]") {
  gputest::Stream st;
  for (const int M : {20, 48, 200, 300})
    for (const int splits : {1, 3}) {
      const Problem p = random_problem(M, 192, 608, 608, 192, 900u + unsigned(M));
      const std::vector<float> a = run(p, st, splits), b = run(p, st, splits);
      INFO("M " << M << ", " << splits << " splits");
      CHECK(std::memcmp(a.data(), b.data(), size_t(M) * 192 * 4) == 0);
    }
}

// The engine's residual projections past 32 rows (layers.hpp project): a split-K GEMM keeps its partial tiles and the
// residual norm adds them in split order -- the sums gemm_w4_reduce_kernel makes, so h and the next norm's fp16 row
// equal the reduce-then-norm path's bit for bit; y is left alone. Rows of 1536 (E2B's hidden size: 4 chunks per
// thread) and 4096 (8 chunks: the 2-parts-at-a-time form), split counts with and without a partial group of 4.
TEST_CASE("gemm_w4 keep_parts: residual_norm adds the partial tiles, bit for bit the reduce + residual_norm",
          "[gpu][gemm_w4]") {
  gputest::Stream st;
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> u(-1.f, 1.f), uw(0.5f, 1.5f);
  for (const int N : {1536, 4096})
    for (const int M : {33, 100})
      for (const int splits : {2, 5, 11}) {
        const int K = 2048;
        const Problem p = random_problem(M, N, K, K, N, 1000u + unsigned(M * 7 + splits));
        Dev<half> x(p.x.size()), s(p.s.size()), sp(p.s.size()), out_a(size_t(M) * N), out_b(size_t(M) * N);
        Dev<uint32_t> wq(p.wq.size()), wp(p.wq.size());
        Dev<float> y(size_t(M) * N), part(size_t(splits) * M * N), h_a(size_t(M) * N), h_b(size_t(M) * N),
            w_post(static_cast<size_t>(N)), w_next(static_cast<size_t>(N));
        x.upload(p.x);
        s.upload(p.s);
        wq.upload(p.wq);
        std::vector<float> h0(size_t(M) * N), wpost(static_cast<size_t>(N)), wnext(static_cast<size_t>(N));
        for (float& v : h0) v = u(rng);
        for (float& v : wpost) v = uw(rng);
        for (float& v : wnext) v = uw(rng);
        h_a.upload(h0);
        h_b.upload(h0);
        w_post.upload(wpost);
        w_next.upload(wnext);
        REQUIRE_CUDA(kn::launch_repack_w4_gemm(wq.get(), s.get(), N, K, wp.get(), sp.get(), st.s));
        kn::GemmW4Args a;
        a.x = x.get(), a.ldx = K, a.m = M, a.n = N, a.k = K;
        a.wp = wp.get(), a.sp = sp.get();
        a.y = y.get(), a.ldy = N;
        a.splits = splits;
        a.part = part.get();
        // the reduce, then the norm of its sums
        REQUIRE_CUDA(kn::launch_gemm_w4(a, st.s));
        REQUIRE_CUDA(kn::launch_residual_norm(h_a.get(), y.get(), w_post.get(), M, N, 1e-6f, 0.75f, kn::NextNorm::Norm,
                                              w_next.get(), out_a.get(), st.s));
        // the partial tiles into the norm; y poisoned, and left so
        y.poison();
        part.poison();
        a.keep_parts = true;
        REQUIRE_CUDA(kn::launch_gemm_w4(a, st.s));
        REQUIRE_CUDA(kn::launch_residual_norm(h_b.get(), part.get(), w_post.get(), M, N, 1e-6f, 0.75f,
                                              kn::NextNorm::Norm, w_next.get(), out_b.get(), st.s, splits,
                                              size_t(M) * N));
        st.sync();
        INFO("M " << M << " N " << N << ", " << splits << " splits");
        const std::vector<float> ha = h_a.download<float>(), hb = h_b.download<float>();
        const std::vector<uint16_t> oa = out_a.download<uint16_t>(), ob = out_b.download<uint16_t>();
        CHECK(std::memcmp(ha.data(), hb.data(), ha.size() * 4) == 0);
        CHECK(oa == ob);
        CHECK(ha != h0);
        const std::vector<uint32_t> yb = y.download<uint32_t>();
        CHECK(size_t(std::count(yb.begin(), yb.end(), yb[0])) == yb.size());  // still the poison pattern
      }
}

TEST_CASE("gemm_w4: shapes and alignments the kernel does not take -> cudaErrorInvalidValue", "[gpu][gemm_w4]") {
  gputest::Stream st;
  Dev<half> x(size_t(64) * 136), sp(64 * 4);
  Dev<uint32_t> wp(64 * 16);
  Dev<float> y(size_t(64) * 66);
  x.poison();
  wp.poison();
  sp.poison();
  const auto good = [&] {
    kn::GemmW4Args a;
    a.x = x.get(), a.ldx = 128, a.m = 40, a.n = 64, a.k = 128;
    a.wp = wp.get(), a.sp = sp.get();
    a.y = y.get(), a.ldy = 64;
    return a;
  };
  kn::GemmW4Args a = good();
  REQUIRE_CUDA(kn::launch_gemm_w4(a, st.s));
  st.sync();
  const auto bad = [&](const char* what, const kn::GemmW4Args& b) {
    INFO(what);
    CHECK(kn::launch_gemm_w4(b, st.s) == cudaErrorInvalidValue);
  };
  a = good(), a.n = 48, bad("N % 32 != 0", a);
  a = good(), a.k = 112, a.ldx = 112, bad("K % 32 != 0", a);
  a = good(), a.k = 0, bad("K == 0", a);
  a = good(), a.m = -1, bad("M < 0", a);
  a = good(), a.ldx = 96, bad("ldx < K", a);
  a = good(), a.ldx = 132, bad("ldx % 8 != 0", a);
  a = good(), a.ldy = 48, bad("ldy < N", a);
  a = good(), a.ldy = 65, bad("ldy % 2 != 0", a);
  a = good(), a.x = x.get() + 4, bad("x not 16-byte aligned", a);
  a = good(), a.wp = wp.get() + 1, bad("wp not 16-byte aligned", a);
  a = good(), a.sp = sp.get() + 2, bad("sp not 16-byte aligned", a);
  a = good(), a.y = y.get() + 1, bad("y not 8-byte aligned", a);
  Dev<float> part(size_t(4) * 300 * 64 + 4);
  a = good(), a.splits = 0, bad("splits < 1", a);
  const int ktiles = (128 + kn::gemm_w4_tile(40, 64, 128).bk - 1) / kn::gemm_w4_tile(40, 64, 128).bk;
  a = good(), a.splits = ktiles + 1, a.part = part.get(), bad("more splits than k-tiles (M 40, K 128)", a);
  a = good(), a.m = 300, a.splits = 2, bad("split-K without partials (M 300: BK 32, 4 k-tiles)", a);
  a = good(), a.m = 300, a.splits = 2, a.part = part.get() + 1, bad("partials not 16-byte aligned", a);
  a = good(), a.m = 0;
  CHECK(kn::launch_gemm_w4(a, st.s) == cudaSuccess);  // nothing to do
  Dev<half> s(64 * 4);
  Dev<uint32_t> wq(64 * 16);
  CHECK(kn::launch_repack_w4_gemm(wq.get(), s.get(), 48, 128, wp.get(), sp.get(), st.s) == cudaErrorInvalidValue);
  CHECK(kn::launch_repack_w4_gemm(wq.get(), s.get(), 64, 112, wp.get(), sp.get(), st.s) == cudaErrorInvalidValue);
  st.sync();
}
