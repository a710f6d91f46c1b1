// GPU kernel tests: every kernel in kernels/ against a host `_ref` taking the same arguments, built from the
// CPU backend's building blocks (rmsnorm_ref, rope_ref, rope_inv_freq, gelu_tanh_ref, argmax).
//
// Inputs come from fixed-seed std::mt19937 streams and are never zero. Every output buffer is filled with
// 0xFF bytes before the launch (NaN as fp16 and fp32, -1 as int), so an element the kernel forgot to write
// fails the check, and padding the kernel must not touch is checked to still hold the poison. Tolerances:
//   fp16 outputs                      ||got - ref|| / ||ref||       <= 2e-3
//   fp32 outputs from fp16 inputs     max |got - ref| / max |ref|   <= 1e-3
//   fp32 outputs from fp32 inputs     max |got - ref| / max |ref|   <= 1e-5
//   dequantisation, saturation, embedding rows, argmax               exact
//   sampled tokens: the CPU sampler's (sampler.hpp) where no decision is at rounding level; identical run to run
//   invariants the CUDA backend relies on: a GEMV row of an n-row batch vs the same row of a 16-row
//   batch, a matrix of a multi-matrix GEMV vs its own launch, residual_norm's next norm vs rmsnorm   bit-exact
// Every case is tagged [gpu]; tests/gpu/main.cpp skips the suite visibly where no GPU is present.
#include <catch2/catch.hpp>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../../kernels/attention.cuh"
#include "../../kernels/elementwise.cuh"
#include "../../kernels/gemv.cuh"
#include "../../kernels/rmsnorm.cuh"
#include "../../kernels/rope_kv.cuh"
#include "../../kernels/sample.cuh"

#include "gemma4_t4.hpp"
#include "gemma4_t4/common.hpp"
#include "gemma4_t4/safetensors.hpp"
#include "gemma4_t4/config.hpp"
#include "gemma4_t4/weights.hpp"
#include "kernels/rng.cuh"
#include "gemma4_t4/sampler.hpp"
#include "gemma4_t4/backend.hpp"
#include "gemma4_t4/cpu_backend.hpp"
#include "gemma4_t4/cuda/planner.hpp"  // the PLE stager (the streams test at the end)
#include "harness.hpp"

namespace gputest_kernels {

// (A kernel template may not live in an anonymous namespace: nvcc's host stubs could not name it.)
// gemv_block as the persistent decode kernel runs it: x staged in shared memory ([n][ldx], GemvX::Shared) or
// read through L2 (GemvX::Coherent), several items per block (items b, b + gridDim.x, ...). Must equal the
// standalone kernels (GemvX::Global) bit for bit: the same sums in the same order.
template <int NT, int WL, gemma4_t4::kernels::GemvEpilogue E, gemma4_t4::kernels::GemvX XS>
__global__ void gemv_items_kernel(const gemma4_t4::kernels::GemvArgs a) {
  GEMMA4_T4_DYNAMIC_SMEM(smem);
  float* red = reinterpret_cast<float*>(smem);
  half* xs = reinterpret_cast<half*>(smem + sizeof(float) * gemma4_t4::kernels::gemv_red_floats<NT>());
  if (XS == gemma4_t4::kernels::GemvX::Shared) {
    for (int i = int(threadIdx.x); i < a.n * a.in; i += int(blockDim.x)) xs[(i / a.in) * a.ldx + i % a.in] = a.x[i];
    __syncthreads();
  }
  for (int t = int(blockIdx.x), k = 0; t < a.first_block[a.count]; t += int(gridDim.x), ++k) {
    if (k > 0) __syncthreads();
    gemma4_t4::kernels::gemv_block<NT, WL, E, XS>(a, t, red, xs, nullptr);
  }
}

// w4_pairs4 against w4_pair (kernels/mma.cuh) for 2^20 words: every pattern of a word's low half with every nibble
// value in its high half (so each pair s meets all 256 nibble pairs), at each of `nscales` scales. out[0]: words
// compared; out[1]: pairs that differ.
__global__ void w4_pairs4_kernel(const uint32_t* scales, int nscales, unsigned* out) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t word = (i & 0xFFFFu) | (((i >> 16) & 0xFu) * 0x1111u << 16);
  unsigned bad = 0;
  for (int k = 0; k < nscales; ++k) {
    uint32_t p[4];
    gemma4_t4::kernels::w4_pairs4(word, scales[k], p);
    for (int s = 0; s < 4; ++s) bad += p[s] != gemma4_t4::kernels::w4_pair(word, s, scales[k]) ? 1u : 0u;
  }
  atomicAdd(out, 1u);
  if (bad) atomicAdd(out + 1, bad);
}

}  // namespace gputest_kernels

namespace {

namespace kn = gemma4_t4::kernels;
using gemma4_t4::detail::f16_to_f32;
using gemma4_t4::detail::f32_to_f16;
using namespace gputest;

// ---- harness (REQUIRE_CUDA, cat, Dev, Stream: harness.hpp) ----

constexpr uint16_t kPoison16 = 0xFFFFu;      // an fp16 NaN
constexpr uint32_t kPoison32 = 0xFFFFFFFFu;  // an fp32 NaN, int -1

constexpr double kTolF16 = 2e-3;      // fp16 outputs, relative L2
constexpr double kTolF32Half = 1e-3;  // fp32 outputs from fp16 inputs, relative to max |ref|
constexpr double kTolF32 = 1e-5;      // fp32 outputs from fp32 inputs, relative to max |ref|

// Host twin of to_half_sat: clamp to the fp16 range, then round to nearest even.
uint16_t f32_to_f16_sat(float v) { return f32_to_f16(std::min(std::max(v, -kn::kHalfMax), kn::kHalfMax)); }

// fp16 outputs: every element written (the poison is NaN) and ||got - ref|| / ||ref|| <= tol.
void check_rel_l2(const std::vector<float>& got, const std::vector<double>& ref, double tol, const std::string& what) {
  REQUIRE(got.size() == ref.size());
  size_t unwritten = 0, first_unwritten = 0, worst = 0;
  double num = 0, den = 0, worst_err = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      if (unwritten++ == 0) first_unwritten = i;
      continue;
    }
    const double e = double(got[i]) - ref[i];
    num += e * e;
    den += ref[i] * ref[i];
    if (std::fabs(e) > worst_err) worst_err = std::fabs(e), worst = i;
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  INFO(what << ": " << unwritten << " of " << got.size() << " elements not written or not finite (first at "
            << first_unwritten << "); ||err|| / ||ref|| = " << rel << " (tolerance " << tol << "); worst element "
            << worst << ": got " << got[worst] << ", ref " << ref[worst]);
  REQUIRE(unwritten == 0);
  REQUIRE(rel <= tol);
}

// ---- host references (same arguments as the launchers, host vectors for device pointers) ----

// rmsnorm: out[r] = norm(x[src(r)]) * w, src(r) = row_index[r] or r.     out: [rows, cols]
std::vector<double> rmsnorm_host_ref(const std::vector<float>& x, int ldx, const std::vector<int>* row_index,
                                     const std::vector<float>& w, int rows, int cols, float eps) {
  std::vector<double> out(size_t(rows) * cols);
  std::vector<float> t(static_cast<size_t>(cols));
  for (int r = 0; r < rows; ++r) {
    const int src = row_index ? (*row_index)[size_t(r)] : r;
    gemma4_t4::detail::rmsnorm_ref(&x[size_t(src) * ldx], w.data(), cols, eps, t.data());
    for (int c = 0; c < cols; ++c) out[size_t(r) * cols + c] = t[size_t(c)];
  }
  return out;
}

// head_norm_rope for one (row, head): x[d] -> norm (w may be null) -> rope (inv_freq may be null).
std::vector<float> head_norm_rope_ref(const float* x, int d, const float* w, float eps, const float* inv_freq,
                                      int pos) {
  std::vector<float> t(x, x + d);
  gemma4_t4::detail::rmsnorm_ref(t.data(), w, d, eps, t.data());
  if (inv_freq) gemma4_t4::detail::rope_ref(t.data(), d, inv_freq, pos);
  return t;
}

// y[r, o] = sum_i x[r, i] * W[o, i] for r < n (double accumulation).    W: [out, in], x: [n, in]
std::vector<double> gemv_ref(const std::vector<float>& W, const std::vector<float>& x, int n, int out, int in) {
  std::vector<double> y(size_t(n) * out);
  for (int r = 0; r < n; ++r)
    for (int o = 0; o < out; ++o) {
      double s = 0;
      for (int i = 0; i < in; ++i) s += double(W[size_t(o) * in + i]) * x[size_t(r) * in + i];
      y[size_t(r) * out + o] = s;
    }
  return y;
}

// w4a16 packing per gemv.cuh: q[o, i] in [-8, 7]; word j of row o holds columns 8j..8j+7, nibble k = q + 8.
std::vector<uint32_t> pack_w4(const std::vector<int>& q, int out, int in) {
  std::vector<uint32_t> Wq(size_t(out) * (in / 8), 0u);
  for (int o = 0; o < out; ++o)
    for (int i = 0; i < in; ++i)
      Wq[size_t(o) * (in / 8) + i / 8] |= uint32_t(q[size_t(o) * in + i] + 8) << (4 * (i % 8));
  return Wq;
}

// Packed words in the checkpoint's order -> the GEMV word order the kernels read (what the load does on the device).
std::vector<uint32_t> gemv_order(std::vector<uint32_t> Wq) {
  for (uint32_t& w : Wq) w = kn::w4_gemv_word(w);
  return Wq;
}

// The dense weight the packed words + scales mean, in fp32 (exact: a 4-bit integer times an fp16 scale).
std::vector<float> unpack_w4_ref(const std::vector<uint32_t>& Wq, const std::vector<uint16_t>& S, int out, int in) {
  std::vector<float> W(size_t(out) * in);
  for (int o = 0; o < out; ++o)
    for (int i = 0; i < in; ++i) {
      const uint32_t u = (Wq[size_t(o) * (in / 8) + i / 8] >> (4 * (i % 8))) & 0xFu;
      W[size_t(o) * in + i] = float(int(u) - 8) * f16_to_f32(S[size_t(o) * (in / 32) + i / 32]);
    }
  return W;
}

// Host twin of AttnArgs: the K/V caches as fp16 values widened to float.
struct AttnHost {
  int D = 0, rows = 0, heads = 0, kv_heads = 0, window = 0, layer = 0, layers = 0;
  std::vector<float> q;                  // [rows, heads, D]
  std::vector<std::vector<float>> k, v;  // [seqs * layers] -> [capacity, kv_heads, D]
  std::vector<int> capacity;             // [seqs * layers]
  std::vector<int> seq, pos;             // [rows]
};

int attn_lo(int p, int window) { return window > 0 ? std::max(0, p - window + 1) : 0; }

// out[r, h] = softmax_j(q . k_j) v_j over j in [lo, p], K/V of head h / group at slot j % capacity.
std::vector<double> attention_ref(const AttnHost& a) {
  const int D = a.D, group = a.heads / a.kv_heads;
  std::vector<double> out(size_t(a.rows) * a.heads * D, 0.0);
  std::vector<double> sc, o(static_cast<size_t>(D));
  for (int r = 0; r < a.rows; ++r) {
    const int idx = a.seq[size_t(r)] * a.layers + a.layer, p = a.pos[size_t(r)], lo = attn_lo(p, a.window);
    const int cap = a.capacity[size_t(idx)];
    for (int h = 0; h < a.heads; ++h) {
      const int g = h / group;
      const float* qh = &a.q[(size_t(r) * a.heads + h) * D];
      sc.assign(size_t(p - lo + 1), 0.0);
      double mx = -INFINITY;
      for (int j = lo; j <= p; ++j) {
        const float* kr = &a.k[size_t(idx)][(size_t(j % cap) * a.kv_heads + g) * D];
        double s = 0;
        for (int c = 0; c < D; ++c) s += double(qh[c]) * kr[c];
        sc[size_t(j - lo)] = s;
        mx = std::max(mx, s);
      }
      double sum = 0;
      std::fill(o.begin(), o.end(), 0.0);
      for (int j = lo; j <= p; ++j) {
        const double e = std::exp(sc[size_t(j - lo)] - mx);
        sum += e;
        const float* vr = &a.v[size_t(idx)][(size_t(j % cap) * a.kv_heads + g) * D];
        for (int c = 0; c < D; ++c) o[size_t(c)] += e * vr[c];
      }
      for (int c = 0; c < D; ++c) out[(size_t(r) * a.heads + h) * D + c] = o[size_t(c)] / sum;
    }
  }
  return out;
}

// ---- rmsnorm.cuh ----

TEST_CASE("rmsnorm: fp16 rows from fp32 rows, contiguous and gathered with a row stride", "[gpu]") {
  std::mt19937 rng(101);
  Stream st;
  const float eps = 1e-6f;
  for (int rows : {1, 3, 17})
    // vectorised (cols % 4 == 0, contiguous: 32-, 128-, 256-thread blocks) and scalar (cols % 4 != 0, the
    // gathered rows' stride cols + 5, cols > 8192) kernels
    for (int cols : {8, 24, 300, 1538, 1544, 2056, 9000})
      for (bool gather : {false, true}) {
        const int src_rows = gather ? rows + 5 : rows, ldx = gather ? cols + 5 : cols;
        std::vector<float> x = rand_f32(rng, size_t(src_rows) * ldx, -3.f, 3.f);  // [src_rows, ldx] fp32
        for (int r = 0; r < src_rows; ++r)  // rows of very different scales: the norm must remove them
          for (int c = 0; c < ldx; ++c) x[size_t(r) * ldx + c] *= std::pow(10.f, float(r % 5 - 2));
        const std::vector<float> w = rand_f32(rng, size_t(cols), -2.f, 2.f);  // [cols] fp32
        std::vector<int> row_index(static_cast<size_t>(rows));                // [rows], repeats allowed
        for (int r = 0; r < rows; ++r) row_index[size_t(r)] = (r * 7 + 3) % src_rows;

        Dev<float> dx(x.size()), dw(w.size());
        Dev<int> di(row_index.size());
        Dev<half> dout(size_t(rows) * cols);  // [rows, cols] fp16
        dx.upload(x);
        dw.upload(w);
        di.upload(row_index);
        dout.poison();
        REQUIRE_CUDA(kn::launch_rmsnorm(dx.get(), ldx, gather ? di.get() : nullptr, dw.get(), rows, cols, eps,
                                        dout.get(), st.s));
        st.sync();
        check_rel_l2(widen(dout.download<uint16_t>()),
                     rmsnorm_host_ref(x, ldx, gather ? &row_index : nullptr, w, rows, cols, eps), kTolF16,
                     cat("rmsnorm rows ", rows, " cols ", cols, " gather ", gather));
      }
}

// A residual_norm case's random inputs, drawn in this order, and their device copies.
struct ResidualNormInputs {
  ResidualNormInputs(std::mt19937& rng, int rows, int cols)
      : h(rand_f32(rng, size_t(rows) * cols, -4.f, 4.f)),
        y(rand_f32(rng, size_t(rows) * cols, -50.f, 50.f)),
        w_post(rand_f32(rng, size_t(cols), -2.f, 2.f)),
        w_next(rand_f32(rng, size_t(cols), -2.f, 2.f)),
        dh(h.size()),
        dy(y.size()),
        dwp(w_post.size()),
        dwn(w_next.size()) {
    dh.upload(h);
    dy.upload(y);
    dwp.upload(w_post);
    dwn.upload(w_next);
  }
  const std::vector<float> h;       // [rows, cols] fp32 residual
  const std::vector<float> y;       // [rows, cols] fp32 block output
  const std::vector<float> w_post;  // [cols] fp32
  const std::vector<float> w_next;  // [cols] fp32
  Dev<float> dh, dy, dwp, dwn;      // the same on the device
};

TEST_CASE("residual_norm: h += norm(y) * w_post, scaled, then the next norm / copy / nothing", "[gpu]") {
  std::mt19937 rng(102);
  Stream st;
  const float eps = 1e-6f;
  const kn::NextNorm modes[] = {kn::NextNorm::None, kn::NextNorm::Norm, kn::NextNorm::Copy};
  for (int rows : {1, 3, 17})
    for (int cols : {8, 24, 300, 1538, 1544, 2056, 9000})  // vectorised and scalar kernels (see rmsnorm)
      for (kn::NextNorm next : modes)
        for (float scalar : {1.f, 0.73f}) {
          const size_t n = size_t(rows) * cols;
          const ResidualNormInputs in(rng, rows, cols);

          // reference
          std::vector<double> h_ref(n), o_ref(n);
          std::vector<float> yn(static_cast<size_t>(cols)), hn(static_cast<size_t>(cols)), on(hn.size());
          for (int r = 0; r < rows; ++r) {
            gemma4_t4::detail::rmsnorm_ref(&in.y[size_t(r) * cols], in.w_post.data(), cols, eps, yn.data());
            for (int c = 0; c < cols; ++c) hn[size_t(c)] = (in.h[size_t(r) * cols + c] + yn[size_t(c)]) * scalar;
            if (next == kn::NextNorm::Norm)
              gemma4_t4::detail::rmsnorm_ref(hn.data(), in.w_next.data(), cols, eps, on.data());
            else
              on = hn;
            for (int c = 0; c < cols; ++c) {
              h_ref[size_t(r) * cols + c] = hn[size_t(c)];
              o_ref[size_t(r) * cols + c] = on[size_t(c)];
            }
          }

          Dev<half> dout(n);  // [rows, cols] fp16
          dout.poison();
          // w_next is only read by NextNorm::Norm: the other modes get nullptr, as the CUDA backend passes.
          REQUIRE_CUDA(kn::launch_residual_norm(in.dh.get(), in.dy.get(), in.dwp.get(), rows, cols, eps, scalar, next,
                                                next == kn::NextNorm::Norm ? in.dwn.get() : nullptr, dout.get(), st.s));
          st.sync();
          const std::string what =
              cat("residual_norm rows ", rows, " cols ", cols, " next ", int(next), " scalar ", scalar);
          check_max_rel(in.dh.download<float>(), h_ref, kTolF32, what + " (h)");
          const std::vector<uint16_t> out = dout.download<uint16_t>();
          if (next == kn::NextNorm::None) {
            INFO(what << ": NextNorm::None must leave out16 untouched");
            REQUIRE(std::all_of(out.begin(), out.end(), [](uint16_t b) { return b == kPoison16; }));
          } else {
            check_rel_l2(widen(out), o_ref, kTolF16, what + " (out16)");
          }
        }
}

// The CUDA backend folds layer l+1's input rmsnorm into layer l's last residual_norm: the fused output must
// be the separate rmsnorm of the updated residual, bit for bit (same block size, same reduction order).
TEST_CASE("residual_norm NextNorm::Norm equals rmsnorm of the updated residual, bit for bit", "[gpu]") {
  std::mt19937 rng(103);
  Stream st;
  const float eps = 1e-6f;
  for (int rows : {1, 3, 17})
    for (int cols : {8, 300, 1536, 1538, 2056, 9000})  // vectorised and scalar kernels
      for (float scalar : {1.f, 0.73f}) {
        const size_t n = size_t(rows) * cols;
        const ResidualNormInputs in(rng, rows, cols);
        Dev<half> fused(n), separate(n);  // [rows, cols] fp16
        fused.poison();
        separate.poison();
        REQUIRE_CUDA(kn::launch_residual_norm(in.dh.get(), in.dy.get(), in.dwp.get(), rows, cols, eps, scalar,
                                              kn::NextNorm::Norm, in.dwn.get(), fused.get(), st.s));
        REQUIRE_CUDA(
            kn::launch_rmsnorm(in.dh.get(), cols, nullptr, in.dwn.get(), rows, cols, eps, separate.get(), st.s));
        st.sync();
        const std::vector<uint16_t> a = fused.download<uint16_t>(), b = separate.download<uint16_t>();
        size_t diff = 0;
        for (size_t i = 0; i < n; ++i) diff += a[i] != b[i] || a[i] == kPoison16;
        INFO("rows " << rows << " cols " << cols << " scalar " << scalar << ": " << diff << " of " << n
                     << " halves differ (or unwritten)");
        REQUIRE(diff == 0);
      }
}

// ---- rope_kv.cuh ----

std::vector<float> make_inv_freq(int d, int pairs, float theta, float factor) {
  gemma4_t4::LayerConfig lc;
  lc.head_dim = d;
  lc.rope_pairs = pairs;
  lc.rope_denominator = d;
  lc.rope_theta = theta;
  lc.rope_factor = factor;
  return gemma4_t4::detail::rope_inv_freq(lc);  // [d / 2] fp32, zeros past `pairs`
}

TEST_CASE("head_norm_rope: per-head norm + RoPE into a contiguous fp16 buffer (queries)", "[gpu]") {
  std::mt19937 rng(201);
  Stream st;
  const float eps = 1e-6f;
  enum Rope { kFull, kPartial, kNone };
  for (int d : {32, 64, 128, 256, 512})
    for (int heads : {1, 3, 8})
      for (int rows : {1, 3, 17})
        for (bool weighted : {true, false})
          for (Rope rope : {kFull, kPartial, kNone}) {
            const int ld_in = heads * d + 3;  // an odd row stride: plain fp32 loads must not care
            const std::vector<float> in = rand_f32(rng, size_t(rows) * ld_in, -20.f, 20.f);  // [rows, ld_in] fp32
            const std::vector<float> w = rand_f32(rng, size_t(d), -2.f, 2.f);                // [d] fp32
            const std::vector<float> inv_freq =  // [d / 2] fp32; partial: 1/4 of the pairs, zeros after
                rope == kPartial ? make_inv_freq(d, d / 8, 1e6f, 8.f) : make_inv_freq(d, d / 2, 1e4f, 1.f);
            std::vector<int> pos(static_cast<size_t>(rows));  // [rows]
            std::uniform_int_distribution<int> upos(0, 9000);
            for (int& p : pos) p = upos(rng);

            Dev<float> din(in.size()), dw(w.size()), dinv(inv_freq.size());
            Dev<int> dpos(pos.size());
            Dev<half> dout(size_t(rows) * heads * d);  // [rows, heads, d] fp16
            din.upload(in);
            dw.upload(w);
            dinv.upload(inv_freq);
            dpos.upload(pos);
            dout.poison();
            REQUIRE_CUDA(kn::launch_head_norm_rope(din.get(), ld_in, rows, heads, d, weighted ? dw.get() : nullptr, eps,
                                                   rope == kNone ? nullptr : dinv.get(), dpos.get(), dout.get(),
                                                   kn::KvTarget{}, st.s));
            st.sync();

            std::vector<double> ref(size_t(rows) * heads * d);
            for (int r = 0; r < rows; ++r)
              for (int h = 0; h < heads; ++h) {
                const std::vector<float> t =
                    head_norm_rope_ref(&in[size_t(r) * ld_in + size_t(h) * d], d, weighted ? w.data() : nullptr, eps,
                                       rope == kNone ? nullptr : inv_freq.data(), pos[size_t(r)]);
                std::copy(t.begin(), t.end(), ref.begin() + std::ptrdiff_t((size_t(r) * heads + h) * d));
              }
            check_rel_l2(widen(dout.download<uint16_t>()), ref, kTolF16,
                         cat("head_norm_rope d ", d, " heads ", heads, " rows ", rows, " weighted ", weighted, " rope ",
                             int(rope)));
          }
}

// What a head_norm_rope launch wrote into the KV caches: row r of in ([rows, ld_in] fp32, sequence seq[r],
// position pos[r]) as heads of d values, normed with w and rotated by inv_freq (both null for V).
struct KvWrite {
  KvWrite(const std::vector<int>& seq_, const std::vector<int>& pos_, const std::vector<float>& in_, int ld_in_,
          int heads_, int d_, const float* w_, const float* inv_freq_, float eps_)
      : seq(seq_.data()),
        pos(pos_.data()),
        in(in_.data()),
        ld_in(ld_in_),
        heads(heads_),
        d(d_),
        w(w_),
        inv_freq(inv_freq_),
        eps(eps_) {}
  const int* seq;  // [rows]
  const int* pos;  // [rows]
  const float* in;
  int ld_in, heads, d;
  const float* w;
  const float* inv_freq;
  float eps;
};

// Reads back sequence s's cache c ([cap, heads, d] fp16 bits) after the launch wrote rows r < rows of that
// sequence at slot pos[r] % cap (rows 0: none): appends each written head and its reference to got / ref and
// returns how many halves of the slots no row maps to lost the poison.
size_t read_kv_cache(const std::vector<uint16_t>& c, int cap, int s, int rows, const KvWrite& k,
                     std::vector<float>& got, std::vector<double>& ref) {
  std::vector<bool> written(size_t(cap), false);
  for (int r = 0; r < rows; ++r) {
    if (k.seq[r] != s) continue;
    const int slot = k.pos[r] % cap;
    written[size_t(slot)] = true;
    for (int h = 0; h < k.heads; ++h) {
      const std::vector<float> o =
          head_norm_rope_ref(k.in + size_t(r) * k.ld_in + size_t(h) * k.d, k.d, k.w, k.eps, k.inv_freq, k.pos[r]);
      for (int i = 0; i < k.d; ++i) {
        got.push_back(f16_to_f32(c[(size_t(slot) * k.heads + h) * k.d + i]));
        ref.push_back(o[size_t(i)]);
      }
    }
  }
  size_t stray = 0;
  for (int slot = 0; slot < cap; ++slot)
    if (!written[size_t(slot)])
      for (size_t i = 0; i < size_t(k.heads) * k.d; ++i) stray += c[size_t(slot) * k.heads * k.d + i] != kPoison16;
  return stray;
}

TEST_CASE("head_norm_rope: K/V rows into per-(sequence, layer) caches, full and ring slots", "[gpu]") {
  std::mt19937 rng(202);
  Stream st;
  const float eps = 1e-6f;
  constexpr int kSeqs = 3, kLayers = 2, kLayer = 1;
  // Layer 1 capacities: seq 0 a full cache, seqs 1 and 2 rings that wrap inside this batch. Layer 0 is
  // never written and must stay poisoned.
  const std::vector<int> capacity = {32, 64, 20, 8, 12, 16};  // [seqs * layers]
  // (sequence, first position, rows): positions within a sequence are consecutive and fewer than its
  // capacity, so no two rows of the batch share a slot.
  struct Run {
    int seq, first, count;
  };
  const Run runs[] = {{0, 0, 6}, {1, 1003, 6}, {2, 29, 5}};
  std::vector<int> seq, pos;  // [rows]
  for (const Run& run : runs)
    for (int i = 0; i < run.count; ++i) {
      seq.push_back(run.seq);
      pos.push_back(run.first + i);
    }
  std::vector<size_t> order(seq.size());  // interleave the sequences
  for (size_t i = 0; i < order.size(); ++i) order[i] = (i * 5) % order.size();
  {
    std::vector<int> s2, p2;
    for (size_t i : order) s2.push_back(seq[i]), p2.push_back(pos[i]);
    seq = s2;
    pos = p2;
  }
  const int rows = int(seq.size());  // 17

  for (int d : {32, 64, 128, 256, 512})
    for (int heads : {1, 2})
      for (bool is_k : {true, false}) {  // K: weight + RoPE; V: neither (Gemma 4's v_norm)
        const int ld_in = heads * d;
        const std::vector<float> in = rand_f32(rng, size_t(rows) * ld_in, -20.f, 20.f);  // [rows, heads * d]
        const std::vector<float> w = rand_f32(rng, size_t(d), -2.f, 2.f);
        const std::vector<float> inv_freq = make_inv_freq(d, d / 2, 1e4f, 1.f);

        std::vector<std::unique_ptr<Dev<half>>> caches;  // [seqs * layers] -> [capacity, heads, d] fp16
        std::vector<half*> base;
        for (int c : capacity) {
          caches.push_back(std::make_unique<Dev<half>>(size_t(c) * heads * d));
          caches.back()->poison();
          base.push_back(caches.back()->get());
        }
        Dev<half*> dbase(base.size());
        Dev<int> dcap(capacity.size()), dseq(seq.size()), dpos(pos.size());
        Dev<float> din(in.size()), dw(w.size()), dinv(inv_freq.size());
        dbase.upload(base);
        dcap.upload(capacity);
        dseq.upload(seq);
        dpos.upload(pos);
        din.upload(in);
        dw.upload(w);
        dinv.upload(inv_freq);
        kn::KvTarget kv;
        kv.base = dbase.get();
        kv.capacity = dcap.get();
        kv.seq = dseq.get();
        kv.layer = kLayer;
        kv.layers = kLayers;
        REQUIRE_CUDA(kn::launch_head_norm_rope(din.get(), ld_in, rows, heads, d, is_k ? dw.get() : nullptr, eps,
                                               is_k ? dinv.get() : nullptr, dpos.get(), nullptr, kv, st.s));
        st.sync();

        const std::string what = cat("head_norm_rope KV d ", d, " kv_heads ", heads, is_k ? " K" : " V");
        std::vector<float> got;
        std::vector<double> ref;
        const KvWrite k(seq, pos, in, ld_in, heads, d, is_k ? w.data() : nullptr, is_k ? inv_freq.data() : nullptr,
                        eps);
        for (int s = 0; s < kSeqs; ++s)
          for (int l = 0; l < kLayers; ++l) {
            const int idx = s * kLayers + l;
            const size_t stray = read_kv_cache(caches[size_t(idx)]->download<uint16_t>(), capacity[size_t(idx)], s,
                                               l == kLayer ? rows : 0, k, got, ref);
            INFO(what << ": seq " << s << " layer " << l << ": " << stray << " halves written outside the rows' slots");
            REQUIRE(stray == 0);
          }
        REQUIRE(got.size() == size_t(rows) * heads * d);
        check_rel_l2(got, ref, kTolF16, what);
      }
}

TEST_CASE("head_norm_rope multi: a layer's q, k and v targets in one launch", "[gpu]") {
  std::mt19937 rng(203);
  Stream st;
  const float eps = 1e-6f;
  constexpr int kSeqs = 2;
  const std::vector<int> capacity = {40, 12};  // [seqs] (one layer): a full cache and a ring that wraps
  const std::vector<int> seq = {0, 1, 1, 0, 1};
  const std::vector<int> pos = {3, 20, 21, 4, 22};  // seq 1: slots 8, 9, 10 of 12
  const int rows = int(seq.size());
  for (int d : {64, 256, 512})
    for (int q_heads : {3, 8})
      for (int kv_heads : {1, 2})
        for (int count : {1, 3}) {  // 1: a KV-shared layer (queries only)
          const int ldq = q_heads * d + 5, ldk = kv_heads * d;
          const std::vector<float> qin = rand_f32(rng, size_t(rows) * ldq, -20.f, 20.f);  // [rows, ldq] fp32
          const std::vector<float> kin = rand_f32(rng, size_t(rows) * ldk, -20.f, 20.f);  // [rows, ldk] fp32
          const std::vector<float> vin = rand_f32(rng, size_t(rows) * ldk, -20.f, 20.f);
          const std::vector<float> qw = rand_f32(rng, size_t(d), -2.f, 2.f), kw = rand_f32(rng, size_t(d), -2.f, 2.f);
          const std::vector<float> inv_freq = make_inv_freq(d, d / 8, 1e6f, 8.f);  // partial RoPE
          Dev<float> dqin(qin.size()), dkin(kin.size()), dvin(vin.size()), dqw(qw.size()), dkw(kw.size()),
              dinv(inv_freq.size());
          Dev<int> dcap(capacity.size()), dseq(seq.size()), dpos(pos.size());
          Dev<half> dq(size_t(rows) * q_heads * d);        // [rows, q_heads, d] fp16
          std::vector<std::unique_ptr<Dev<half>>> kc, vc;  // [seqs] -> [capacity, kv_heads, d] fp16
          std::vector<half*> kbase, vbase;
          for (int c : capacity) {
            kc.push_back(std::make_unique<Dev<half>>(size_t(c) * kv_heads * d));
            vc.push_back(std::make_unique<Dev<half>>(size_t(c) * kv_heads * d));
            kc.back()->poison();
            vc.back()->poison();
            kbase.push_back(kc.back()->get());
            vbase.push_back(vc.back()->get());
          }
          Dev<half*> dkb(kbase.size()), dvb(vbase.size());
          dqin.upload(qin);
          dkin.upload(kin);
          dvin.upload(vin);
          dqw.upload(qw);
          dkw.upload(kw);
          dinv.upload(inv_freq);
          dcap.upload(capacity);
          dseq.upload(seq);
          dpos.upload(pos);
          dkb.upload(kbase);
          dvb.upload(vbase);
          dq.poison();

          kn::KvTarget kv;
          kv.capacity = dcap.get();
          kv.seq = dseq.get();
          kv.layer = 0;
          kv.layers = 1;
          kn::HeadNormTarget t[3];
          t[0].in = dqin.get();
          t[0].ld_in = ldq;
          t[0].heads = q_heads;
          t[0].w = dqw.get();
          t[0].inv_freq = dinv.get();
          t[0].out = dq.get();
          t[1].in = dkin.get();
          t[1].ld_in = ldk;
          t[1].heads = kv_heads;
          t[1].w = dkw.get();
          t[1].inv_freq = dinv.get();
          t[1].kv = kv;
          t[1].kv.base = dkb.get();
          t[2].in = dvin.get();
          t[2].ld_in = ldk;
          t[2].heads = kv_heads;
          t[2].kv = kv;
          t[2].kv.base = dvb.get();
          REQUIRE_CUDA(kn::launch_head_norm_rope_multi(t, count, rows, d, eps, dpos.get(), st.s));
          st.sync();

          const std::string what =
              cat("head_norm_rope multi d ", d, " q_heads ", q_heads, " kv_heads ", kv_heads, " targets ", count);
          std::vector<double> qref(size_t(rows) * q_heads * d);
          for (int r = 0; r < rows; ++r)
            for (int h = 0; h < q_heads; ++h) {
              const std::vector<float> o = head_norm_rope_ref(&qin[size_t(r) * ldq + size_t(h) * d], d, qw.data(), eps,
                                                              inv_freq.data(), pos[size_t(r)]);
              std::copy(o.begin(), o.end(), qref.begin() + std::ptrdiff_t((size_t(r) * q_heads + h) * d));
            }
          check_rel_l2(widen(dq.download<uint16_t>()), qref, kTolF16, what + " (q)");

          for (int is_k = 1; is_k >= 0; --is_k) {
            const std::vector<float>& in = is_k ? kin : vin;
            std::vector<float> got;
            std::vector<double> ref;
            const KvWrite k(seq, pos, in, ldk, kv_heads, d, is_k ? kw.data() : nullptr,
                            is_k ? inv_freq.data() : nullptr, eps);
            size_t stray = 0;
            for (int s = 0; s < kSeqs; ++s)
              stray += read_kv_cache((is_k ? kc : vc)[size_t(s)]->download<uint16_t>(), capacity[size_t(s)], s,
                                     count == 3 ? rows : 0, k, got, ref);
            const std::string w2 = what + (is_k ? " (k)" : " (v)");
            INFO(w2 << ": " << stray << " halves written outside the rows' slots");
            REQUIRE(stray == 0);
            if (count == 3) check_rel_l2(got, ref, kTolF16, w2);
          }
        }
}

// ---- gemv.cuh ----

// A random weight matrix in one of the two layouts, its device copy, and the dense values it means.
struct GemvWeights {
  int out = 0, in = 0;
  bool w4 = false;
  std::vector<float> dense;             // [out, in] fp32: the fp16 values, or (q - 8) * scale rounded to fp16
  std::unique_ptr<Dev<half>> w16, s16;  // [out, in] fp16 | [out, in / 32] fp16 scales
  std::unique_ptr<Dev<uint32_t>> wq;    // [out, in / 8] packed int4

  kn::GemvMat mat(float* y, int ldy) const {
    kn::GemvMat m;
    m.w16 = w4 ? nullptr : w16->get();
    m.wq = w4 ? wq->get() : nullptr;
    m.s = w4 ? s16->get() : nullptr;
    m.out = out;
    m.y = y;
    m.ldy = ldy;
    return m;
  }
};

// fp16: uniform in [-amp, amp]; w4a16: q uniform in [-8, 7], scales uniform in [0.002, 0.05] * amp.
std::unique_ptr<GemvWeights> make_gemv_weights(std::mt19937& rng, bool w4, int out, int in, float amp) {
  auto g = std::make_unique<GemvWeights>();
  g->out = out;
  g->in = in;
  g->w4 = w4;
  if (w4) {
    std::uniform_int_distribution<int> uq(-8, 7);
    std::vector<int> q(size_t(out) * in);  // [out, in] int4 values
    for (int& v : q) v = uq(rng);
    const std::vector<uint32_t> Wq = pack_w4(q, out, in);  // [out, in / 8]
    const std::vector<uint16_t> S =
        rand_f16(rng, size_t(out) * (in / 32), 0.002f * amp, 0.05f * amp);  // [out, in / 32]
    // The kernels multiply fp16 weights on the tensor cores: (q - 8) * scale rounded to fp16 (RNE), exactly the
    // weights prefill's dequant_w4 builds. The reference uses the same rounded values.
    g->dense = unpack_w4_ref(Wq, S, out, in);
    for (float& v : g->dense) v = f16_to_f32(f32_to_f16(v));
    g->wq = std::make_unique<Dev<uint32_t>>(Wq.size());
    g->wq->upload(gemv_order(Wq));
    g->s16 = std::make_unique<Dev<half>>(S.size());
    g->s16->upload(S);
  } else {
    const std::vector<uint16_t> W = rand_f16(rng, size_t(out) * in, -amp, amp);  // [out, in] fp16
    g->dense = widen(W);
    g->w16 = std::make_unique<Dev<half>>(W.size());
    g->w16->upload(W);
  }
  return g;
}

// An output element as fp32, and whether it still holds the poison: fp32 values or fp16 bits.
float as_f32(float v) { return v; }
float as_f32(uint16_t h) { return f16_to_f32(h); }
bool is_poison(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits == kPoison32;
}
bool is_poison(uint16_t h) { return h == kPoison16; }

// y: [32, ld] after a launch for n rows -- fp32 (a store's y) or fp16 bits (a fused epilogue's out16). Returns
// y[:n, :cols] row-major ([n, cols]) as fp32; everything else must still hold the poison.
template <typename T>
std::vector<float> gemv_written(const std::vector<T>& y, int ld, int n, int cols, const std::string& what) {
  std::vector<float> got;
  size_t stray = 0;
  for (int r = 0; r < kn::kGemvMaxRows; ++r)
    for (int o = 0; o < ld; ++o) {
      const T v = y[size_t(r) * ld + o];
      if (r < n && o < cols)
        got.push_back(as_f32(v));
      else
        stray += !is_poison(v);
    }
  INFO(what << ": " << stray << (sizeof(T) == 4 ? " floats written outside y" : " halves written outside out16")
            << "[:n, :" << cols << "]");
  REQUIRE(stray == 0);
  return got;
}

// Bit-for-bit equality of a row block (batched decode must equal one-row decode).
void require_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  REQUIRE(a.size() <= b.size());
  size_t diff = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && diff++ == 0) first = i;
  INFO(what << ": " << diff << " of " << a.size() << " floats differ bitwise; first at " << first);
  REQUIRE(diff == 0);
}

std::vector<double> head_rows(const std::vector<double>& all, int n, int cols) {
  return std::vector<double>(all.begin(), all.begin() + std::ptrdiff_t(size_t(n) * cols));
}

// `in` values per layout: one 16-byte unit per row, and k-tile counts that pick each work split (1, 2, 4
// and 8 warps per row tile, the fallback for a count no power of two divides) with partial last tiles.
const std::vector<int>& gemv_ins(bool w4) {
  static const std::vector<int> f16 = {8, 40, 104, 376, 1536, 1544};  // k-tiles 1, 2, 4, 12, 48, 49
  static const std::vector<int> q4 = {32, 96, 256, 416, 1536, 2080};  // k-tiles 1, 1, 2, 4, 12, 17
  return w4 ? q4 : f16;
}

// launch_gemv of W on the first n rows of random x, for each n of ns (32 first), y [32, ldy] poisoned before each:
// every launch against the host reference, nothing written outside y[:n, :out], and each n < 32 bit for bit the
// same rows as n = 32 (batched decode equals one-row decode).
void check_gemv_rows(const GemvWeights& W, int ldy, const std::vector<int>& ns, std::mt19937& rng, Stream& st) {
  const int out = W.out, in = W.in;
  const std::vector<uint16_t> x = rand_f16(rng, size_t(kn::kGemvMaxRows) * in, -1.f, 1.f);  // [32, in] fp16
  Dev<half> dx(x.size());
  Dev<float> dy(size_t(kn::kGemvMaxRows) * ldy);  // [32, ldy] fp32
  dx.upload(x);
  const std::vector<double> ref_all = gemv_ref(W.dense, widen(x), kn::kGemvMaxRows, out, in);
  std::vector<float> got32;  // y[:32, :out] of the 32-row launch
  for (int n : ns) {
    dy.poison();
    const kn::GemvMat m = W.mat(dy.get(), ldy);
    REQUIRE_CUDA(kn::launch_gemv(m.w16, m.wq, m.s, dx.get(), n, out, in, dy.get(), ldy, st.s));
    st.sync();
    const std::string what = cat("gemv ", W.w4 ? "w4a16" : "fp16", " n ", n, " out ", out, " in ", in);
    const std::vector<float> got = gemv_written(dy.download<float>(), ldy, n, out, what);
    check_max_rel(got, head_rows(ref_all, n, out), kTolF32Half, what);
    if (n == kn::kGemvMaxRows)
      got32 = got;
    else
      require_same_bits(got, got32, what + " vs the same rows of n = 32");
  }
}

TEST_CASE("gemv: y = x W^T, fp16 and w4a16 weights, 1..32 rows, strided y, batch-independent rows", "[gpu]") {
  std::mt19937 rng(301);
  Stream st;
  std::vector<int> ns;  // 32 .. 1
  for (int n = kn::kGemvMaxRows; n >= 1; --n) ns.push_back(n);
  for (bool w4 : {false, true})
    for (int in : gemv_ins(w4))
      for (int out : {1, 7, 33, 1000, 2051})
        check_gemv_rows(*make_gemv_weights(rng, w4, out, in, 1.f), out + 3, ns, rng, st);
}

// A launch of more than kGemvManyBlocks blocks at gemv_split's warps per row tile (the LM head's shape) takes at most
// 2: the same x W^T, batch-independent. Out just past the threshold at 4 warps (32 rows per block), both layouts.
TEST_CASE("gemv: launches of many row tiles take 2 warps per row tile, same results", "[gpu]") {
  std::mt19937 rng(307);
  Stream st;
  for (bool w4 : {false, true}) {
    const int in = w4 ? 416 : 104;  // 4 k-tiles: gemv_split gives 4 warps
    REQUIRE(kn::gemv_split((in / (w4 ? 32 : 8) + 3) / 4) == 4);
    const int out = kn::kGemvManyBlocks * 32 + 17;
    const auto W = make_gemv_weights(rng, w4, out, in, 1.f);
    const std::vector<int> ns = {32, 9, 1};
    Dev<half> px(size_t(kn::kGemvMaxRows) * in);  // buffers for the plan's checks only
    Dev<float> py(size_t(kn::kGemvMaxRows) * out);
    for (int n : ns) {  // the partition, whatever the rows
      kn::GemvArgs a;
      a.x = px.get(), a.n = n, a.in = in, a.mat[0] = W->mat(py.get(), out), a.count = 1;
      unsigned blocks = 0;
      REQUIRE_CUDA(kn::gemv_plan(a, 1, kn::GemvEpilogue::Store, true, &blocks));
      REQUIRE(a.kw == 2);
      REQUIRE(blocks == unsigned((out + 63) / 64));
    }
    check_gemv_rows(*W, out, ns, rng, st);
  }
}

// The w4a16 GEMV's dequant (w4_pairs4: a word's four pairs with one shift, the odd nibbles scaled in place) gives
// w4_pair's fp16 weights bit for bit: every nibble pair, scales of both signs from subnormal to the largest fp16
// (products that overflow included), and zero.
TEST_CASE("gemv: w4_pairs4 equals w4_pair bit for bit, every nibble pair, scales of both signs", "[gpu]") {
  const std::vector<uint16_t> s16 = {0x3C00, 0xBC00, 0x2E66, 0x0001, 0x8001, 0x03FF,
                                     0x7BFF, 0xFBFF, 0x1400, 0x5A00, 0x0000};
  std::vector<uint32_t> sc;
  for (const uint16_t s : s16) sc.push_back(uint32_t(s) | (uint32_t(s) << 16));
  Dev<uint32_t> dsc(sc.size());
  dsc.upload(sc);
  Dev<unsigned> out(2);
  out.upload(std::vector<unsigned>{0u, 0u});
  const Stream st;
  REQUIRE_CUDA(kn::launch_kernel(gputest_kernels::w4_pairs4_kernel, (1u << 20) / 256, 256, kn::Launch(st.s), dsc.get(),
                                 int(sc.size()), out.get()));
  const std::vector<unsigned> r = out.download<unsigned>();
  CHECK(r[0] == (1u << 20));
  CHECK(r[1] == 0u);
}

// A w4a16 launch whose row-tile blocks at gemv_split's warps would fill more than one and at most two waves of two
// blocks per SM takes half the warps (gemv_wave_kw): one wave of blocks of twice the rows; fp16 launches keep theirs.
// The policy on several SM counts; on this GPU's, the plan of such a launch and its results (x W^T,
// batch-independent), both layouts.
TEST_CASE("gemv: w4a16 launches of one to two extra waves take half the warps per row tile, same results", "[gpu]") {
  for (int wl : {kn::kGemvF16, kn::kGemvW4, kn::kGemvW8})
    for (int sms : {0, 4, 40, 132, 170})
      for (int kw : {1, 2, 4, 8})
        for (int blocks : {1, 2 * sms, 2 * sms + 1, 3 * sms, 4 * sms, 4 * sms + 1, 8 * sms + 3}) {
          const int got = kn::gemv_wave_kw(kw, wl, blocks, sms);
          INFO("layout " << wl << " kw " << kw << " blocks " << blocks << " on " << sms << " SMs: " << got);
          REQUIRE((got == kw || (kw > 1 && got == kw / 2)));
          if (wl != kn::kGemvW4) REQUIRE(got == kw);
          const int rows_before = 16 * (kn::kGemvWarps / kw), out = blocks * rows_before;
          const int after = (out + 16 * (kn::kGemvWarps / got) - 1) / (16 * (kn::kGemvWarps / got));
          if (sms <= 0 || blocks <= 2 * sms) REQUIRE(got == kw);  // one wave already, or the GPU unknown
          if (got != kw) REQUIRE(after <= 2 * sms);               // halved: one wave
          if (wl == kn::kGemvW4 && got == kw && kw > 1 && blocks > 2 * sms && sms > 0)
            REQUIRE(blocks > 4 * sms);  // kept: halving would not fit one wave
        }
  const int sms = kn::device_sms();
  REQUIRE(sms > 0);
  std::mt19937 rng(308);
  Stream st;
  for (bool w4 : {false, true}) {
    const int in = w4 ? 416 : 104;  // 4 k-tiles: gemv_split gives 4 warps, 32 rows per block
    REQUIRE(kn::gemv_split((in / (w4 ? 32 : 8) + 3) / 4) == 4);
    const int out = 3 * sms * 32 + 5;  // 3 sms + 1 blocks at 4 warps
    const auto W = make_gemv_weights(rng, w4, out, in, 1.f);
    const std::vector<int> ns = {32, 9, 1};
    Dev<half> px(size_t(kn::kGemvMaxRows) * in);
    Dev<float> py(size_t(kn::kGemvMaxRows) * out);
    for (int n : ns) {
      kn::GemvArgs a;
      a.x = px.get(), a.n = n, a.in = in, a.mat[0] = W->mat(py.get(), out), a.count = 1;
      unsigned blocks = 0;
      REQUIRE_CUDA(kn::gemv_plan(a, 1, kn::GemvEpilogue::Store, true, &blocks));
      REQUIRE(a.kw == (w4 ? 2 : 4));
      REQUIRE(blocks == unsigned(w4 ? (out + 63) / 64 : (out + 31) / 32));
    }
    check_gemv_rows(*W, out, ns, rng, st);
  }
}

// The residual projections' k-split (layers.hpp project): ksplit blocks per row tile write ksplit parts, and
// launch_residual_norm adds them in part order. Each part stays batch-independent, the parts' sum is the GEMV, and
// the residual norm over the parts equals the residual norm of their sum (taken in part order) bit for bit.
TEST_CASE("gemv k-split: parts sum to x W^T, batch-independent; residual_norm adds them in part order", "[gpu]") {
  std::mt19937 rng(307);
  Stream st;
  const int R = kn::kGemvMaxRows;
  for (bool w4 : {false, true})
    for (int in : gemv_ins(w4)) {
      const int ktiles = (in / (w4 ? 32 : 8) + 3) / 4, kw = kn::gemv_split(ktiles);
      if (ktiles / kw < 2) continue;  // no room for a second part
      for (int out : {33, 1536, 2051}) {
        const auto W = make_gemv_weights(rng, w4, out, in, 1.f);
        const std::vector<uint16_t> x = rand_f16(rng, size_t(R) * in, -1.f, 1.f);  // [32, in] fp16
        const int ldy = out + 3;
        const size_t ld = size_t(R) * ldy + 5;  // parts apart by more than their rows
        Dev<half> dx(x.size());
        dx.upload(x);
        Dev<float> dparts(size_t(kn::kGemvMaxSplit) * ld);
        const std::vector<double> ref_all = gemv_ref(W->dense, widen(x), R, out, in);
        for (int parts = 2; parts <= kn::kGemvMaxSplit && kw * parts <= ktiles; ++parts) {
          std::vector<std::vector<float>> whole(static_cast<size_t>(parts));  // each part of the 32-row launch
          for (int n : {R, 9, 1}) {
            dparts.poison();
            const kn::GemvMat m = W->mat(dparts.get(), ldy);
            REQUIRE_CUDA(kn::launch_gemv(m.w16, m.wq, m.s, dx.get(), n, out, in, dparts.get(), ldy, st.s, parts, ld));
            st.sync();
            const std::string what =
                cat("gemv k-split ", w4 ? "w4a16" : "fp16", " parts ", parts, " n ", n, " out ", out, " in ", in);
            const std::vector<float> all = dparts.download<float>();
            std::vector<float> sum;
            for (int q = 0; q < parts; ++q) {
              const std::vector<float> part(all.begin() + std::ptrdiff_t(size_t(q) * ld),
                                            all.begin() + std::ptrdiff_t(size_t(q) * ld + size_t(R) * ldy));
              const std::vector<float> got = gemv_written(part, ldy, n, out, cat(what, " part ", q));
              for (size_t k = size_t(R) * ldy; k < ld; ++k) REQUIRE(is_poison(all[size_t(q) * ld + k]));
              if (q == 0)
                sum = got;
              else
                for (size_t k = 0; k < got.size(); ++k) sum[k] += got[k];
              if (n == R)
                whole[size_t(q)] = got;
              else
                require_same_bits(got, whole[size_t(q)], cat(what, " part ", q, " vs the same rows of n = 32"));
            }
            check_max_rel(sum, head_rows(ref_all, n, out), kTolF32Half, what);
            for (int q = parts; q < kn::kGemvMaxSplit; ++q)
              for (size_t k = 0; k < ld; ++k) REQUIRE(is_poison(all[size_t(q) * ld + k]));
          }
        }
      }
    }

  // residual_norm over parts == residual_norm of their sum, bit for bit (vectorised and scalar kernels)
  const float eps = 1e-6f;
  for (int rows : {1, 5, 32})
    for (int cols : {1536, 1538})
      for (int parts : {2, 3, 4}) {
        const size_t n = size_t(rows) * cols, ld = n + 4;
        const ResidualNormInputs a(rng, rows, cols);
        const std::vector<float> extra = rand_f32(rng, size_t(parts - 1) * n, -50.f, 50.f);
        std::vector<float> all(size_t(parts) * ld, 0.f), sum(a.y);
        for (int q = 0; q < parts; ++q)
          for (size_t k = 0; k < n; ++k) {
            const float v = q == 0 ? a.y[k] : extra[size_t(q - 1) * n + k];
            all[size_t(q) * ld + k] = v;
            if (q > 0) sum[k] += v;
          }
        Dev<float> dall(all.size()), dsum(n), h1(n), h2(n);
        dall.upload(all);
        dsum.upload(sum);
        h1.upload(a.h);
        h2.upload(a.h);
        Dev<half> o1(n), o2(n);
        REQUIRE_CUDA(kn::launch_residual_norm(h1.get(), dall.get(), a.dwp.get(), rows, cols, eps, 0.73f,
                                              kn::NextNorm::Norm, a.dwn.get(), o1.get(), st.s, parts, ld));
        REQUIRE_CUDA(kn::launch_residual_norm(h2.get(), dsum.get(), a.dwp.get(), rows, cols, eps, 0.73f,
                                              kn::NextNorm::Norm, a.dwn.get(), o2.get(), st.s));
        st.sync();
        const std::string what = cat("residual_norm rows ", rows, " cols ", cols, " parts ", parts);
        require_same_bits(h1.download<float>(), h2.download<float>(), what + " (h)");
        const std::vector<uint16_t> b1 = o1.download<uint16_t>(), b2 = o2.download<uint16_t>();
        INFO(what << " (out16)");
        REQUIRE(b1 == b2);
      }

  // refused: more parts than the warps have k-tiles, parts closer than n * ldy, a k-split of a fused epilogue,
  // too few floats between the norm's parts
  {
    const auto W = make_gemv_weights(rng, true, 64, 256, 1.f);  // 2 k-tiles, 2 warps per row tile: 1 part only
    Dev<half> dx(size_t(R) * 256);
    Dev<float> dy(size_t(4) * R * 64);
    const kn::GemvMat m = W->mat(dy.get(), 64);
    REQUIRE(kn::launch_gemv(m.w16, m.wq, m.s, dx.get(), 1, 64, 256, dy.get(), 64, st.s, 2, size_t(R) * 64) ==
            cudaErrorInvalidValue);
    const auto W2 = make_gemv_weights(rng, true, 64, 2048, 1.f);  // 16 k-tiles, 8 warps: 2 parts fit
    const kn::GemvMat m2 = W2->mat(dy.get(), 64);
    Dev<half> dx2(size_t(R) * 2048);
    REQUIRE(kn::launch_gemv(m2.w16, m2.wq, m2.s, dx2.get(), 3, 64, 2048, dy.get(), 64, st.s, 2, 2 * 64) ==
            cudaErrorInvalidValue);
    REQUIRE(kn::launch_gemv(m2.w16, m2.wq, m2.s, dx2.get(), 3, 64, 2048, dy.get(), 64, st.s, 3, 0) ==
            cudaErrorInvalidValue);
    REQUIRE(kn::launch_gemv(m2.w16, m2.wq, m2.s, dx2.get(), 3, 64, 2048, dy.get(), 64, st.s, 0, 0) ==
            cudaErrorInvalidValue);
    kn::GemvArgs g;
    g.x = dx2.get();
    g.n = 1;
    g.in = 2048;
    g.mat[0] = m2;
    g.mat[1] = m2;
    g.out16 = reinterpret_cast<half*>(dy.get());
    g.ld16 = 64;
    g.ksplit = 2;
    g.split_ld = size_t(R) * 64;
    REQUIRE(kn::launch_gemv_args(g, 2, kn::GemvEpilogue::GeluMul, st.s) == cudaErrorInvalidValue);
    Dev<float> h(64);
    Dev<half> o(64);
    REQUIRE(kn::launch_residual_norm(h.get(), dy.get(), h.get(), 1, 64, 1e-6f, 1.f, kn::NextNorm::None, nullptr,
                                     o.get(), st.s, 2, 63) == cudaErrorInvalidValue);
    REQUIRE(kn::launch_residual_norm(h.get(), dy.get(), h.get(), 1, 64, 1e-6f, 1.f, kn::NextNorm::None, nullptr,
                                     o.get(), st.s, 0, 64) == cudaErrorInvalidValue);
  }
}

// The split policy (gemv_store_splits): no parts where the row tiles fill a wave of two blocks per SM; else all
// the parts that fit the wave, more only while a warp's share stays above 6 k-tiles; shape and GPU only.
TEST_CASE("gemv k-split policy: parts only where the row tiles leave the GPU short", "[gpu]") {
  for (int sms : {40, 80, 132, 170})
    for (bool w4 : {false, true})
      for (int out : {256, 1536, 2048, 6144, 262144})
        for (int in : {256, 1536, 2048, 6144, 12288}) {
          const int wl = w4 ? kn::kGemvW4 : kn::kGemvF16;
          const int s = kn::gemv_store_splits(out, in, wl, sms);
          const int ktiles = (in / (w4 ? 32 : 8) + 3) / 4, kw = kn::gemv_split(ktiles);
          const long long tiles = (out + 16 * (kn::kGemvWarps / kw) - 1) / (16 * (kn::kGemvWarps / kw));
          const auto share = [&](int parts) { return (ktiles + kw * parts - 1) / (kw * parts); };
          INFO("out " << out << " in " << in << (w4 ? " w4a16" : " fp16") << " on " << sms << " SMs: " << s
                      << " parts, " << tiles << " row-tile blocks");
          REQUIRE(s >= 1);
          REQUIRE(s <= kn::kGemvMaxSplit);
          REQUIRE(kw * s <= ktiles);
          if (tiles >= 2LL * sms) REQUIRE(s == 1);
          if (s > 1 && tiles * s > 2LL * sms) REQUIRE(share(s - 1) > 6);  // past the wave only for long shares
          const bool room = s < kn::kGemvMaxSplit && kw * (s + 1) <= ktiles && tiles < 2LL * sms;
          if (room) REQUIRE((tiles * (s + 1) > 2LL * sms && share(s) <= 6));  // one more would break a rule
        }
}

// Past 16 rows a launch runs as two 16-row halves (gemv_halves_kernel) or as one block per row tile (NT 4), by the
// policy. Both forms of every launch kind the engine makes at 17..32 rows, forced through GemvArgs::halves: the same
// bits, nothing written past row n (the other tests here take the policy's form, the halves at their sizes).
TEST_CASE("gemv halves: two 16-row halves equal one block per row tile bit for bit, every epilogue; the policy",
          "[gpu]") {
  for (int sms : {40, 132, 170}) {
    REQUIRE(kn::gemv_halves(1, sms));
    REQUIRE(kn::gemv_halves(2u * unsigned(sms), sms));
    REQUIRE_FALSE(kn::gemv_halves(2u * unsigned(sms) + 1u, sms));
  }
  REQUIRE_FALSE(kn::gemv_halves(1, 0));  // the SM count unknown: one block per row tile
  std::mt19937 rng(309);
  Stream st;
  constexpr int R = kn::kGemvMaxRows, L = 3, layer = 1;
  for (bool w4 : {false, true})
    for (int in : {w4 ? 416 : 376, w4 ? 6144 : 1536}) {
      const int outs[3] = {1000, 33, 256};  // Store: three matrices; GeluMul: 0 and a twin; GeluPle: 2 (D)
      std::vector<std::unique_ptr<GemvWeights>> W;
      for (int out : outs) W.push_back(make_gemv_weights(rng, w4, out, in, w4 ? 1.f : 0.25f));
      const auto up = make_gemv_weights(rng, w4, outs[0], in, w4 ? 1.f : 0.25f);
      const std::vector<uint16_t> x = rand_f16(rng, size_t(R) * in, -1.f, 1.f);
      const std::vector<float> ple = rand_f32(rng, size_t(R) * L * outs[2], -3.f, 3.f);
      Dev<half> dx(x.size());
      Dev<float> dple(ple.size());
      dx.upload(x);
      dple.upload(ple);
      const int ktiles = (in / (w4 ? 32 : 8) + 3) / 4, parts = kn::gemv_split(ktiles) * 2 <= ktiles ? 2 : 1;
      for (int n : {17, 24, 31, R}) {
        // [form][launch]: fp32 y of the three Store matrices, the k-split's parts; fp16 out of GeluMul, GeluPle
        std::vector<std::vector<float>> got[2];
        for (int form = 0; form < 2; ++form) {
          const std::string how = cat(w4 ? "w4a16" : "fp16", " in ", in, " n ", n, form ? " halves" : " one block");
          std::vector<std::unique_ptr<Dev<float>>> y;
          for (int i = 0; i < 3; ++i) {
            y.push_back(std::make_unique<Dev<float>>(size_t(R) * (outs[i] + 1)));
            y.back()->poison();
          }
          kn::GemvArgs a;
          a.x = dx.get();
          a.n = n;
          a.in = in;
          a.halves = form;
          a.count = 3;
          for (int i = 0; i < 3; ++i) a.mat[i] = W[size_t(i)]->mat(y[size_t(i)]->get(), outs[i] + 1);
          REQUIRE_CUDA(kn::launch_gemv_args(a, 3, kn::GemvEpilogue::Store, st.s));
          Dev<float> dparts(size_t(parts) * R * outs[0]);
          dparts.poison();
          kn::GemvArgs k = a;
          k.count = 1;
          k.mat[0] = W[0]->mat(dparts.get(), outs[0]);
          k.mat[1] = k.mat[2] = kn::GemvMat{};
          k.ksplit = parts;
          k.split_ld = size_t(R) * outs[0];
          REQUIRE_CUDA(kn::launch_gemv_args(k, 1, kn::GemvEpilogue::Store, st.s));
          Dev<half> dmul(size_t(R) * (outs[0] + 3)), dple16(size_t(R) * outs[2]);
          dmul.poison();
          dple16.poison();
          kn::GemvArgs g = a;
          g.count = 1;
          g.mat[0] = W[0]->mat(nullptr, 0);
          g.mat[1] = up->mat(nullptr, 0);
          g.mat[2] = kn::GemvMat{};
          g.out16 = dmul.get();
          g.ld16 = outs[0] + 3;
          REQUIRE_CUDA(kn::launch_gemv_args(g, 2, kn::GemvEpilogue::GeluMul, st.s));
          kn::GemvArgs p = g;
          p.mat[0] = W[2]->mat(nullptr, 0);
          p.mat[1] = kn::GemvMat{};
          p.out16 = dple16.get();
          p.ld16 = outs[2];
          p.ple = dple.get();
          p.ple_ld = L * outs[2];
          p.ple_off = layer * outs[2];
          REQUIRE_CUDA(kn::launch_gemv_args(p, 1, kn::GemvEpilogue::GeluPle, st.s));
          st.sync();
          for (int i = 0; i < 3; ++i)
            got[form].push_back(
                gemv_written(y[size_t(i)]->download<float>(), outs[i] + 1, n, outs[i], cat("store ", i, ", ", how)));
          const std::vector<float> all_parts = dparts.download<float>();
          for (int q = 0; q < parts; ++q)
            got[form].push_back(
                gemv_written(std::vector<float>(all_parts.begin() + std::ptrdiff_t(size_t(q) * R * outs[0]),
                                                all_parts.begin() + std::ptrdiff_t(size_t(q + 1) * R * outs[0])),
                             outs[0], n, outs[0], cat("k-split part ", q, ", ", how)));
          got[form].push_back(gemv_written(dmul.download<uint16_t>(), outs[0] + 3, n, outs[0], cat("gelu_mul, ", how)));
          got[form].push_back(gemv_written(dple16.download<uint16_t>(), outs[2], n, outs[2], cat("gelu_ple, ", how)));
        }
        REQUIRE(got[0].size() == got[1].size());
        for (size_t i = 0; i < got[0].size(); ++i)
          require_same_bits(got[1][i], got[0][i],
                            cat("gemv halves ", w4 ? "w4a16" : "fp16", " in ", in, " n ", n, " launch ", i));
      }
    }
}

TEST_CASE("gemv multi: up to 3 matrices sharing x in one launch equal separate launches bit for bit", "[gpu]") {
  std::mt19937 rng(304);
  Stream st;
  const std::vector<std::vector<int>> out_sets = {{2051}, {7, 2051}, {33, 1, 1000}, {2048, 256, 256}};
  for (bool w4 : {false, true})
    for (int in : {w4 ? 416 : 376, 1536})
      for (const std::vector<int>& outs : out_sets) {
        const int count = int(outs.size());
        std::vector<std::unique_ptr<GemvWeights>> W;
        std::vector<std::unique_ptr<Dev<float>>> dy, dsingle;  // [32, ldy_i] fp32 each
        std::vector<int> ldy;
        std::vector<std::vector<double>> ref_all;
        const std::vector<uint16_t> x = rand_f16(rng, size_t(kn::kGemvMaxRows) * in, -1.f, 1.f);  // [32, in] fp16
        for (int i = 0; i < count; ++i) {
          W.push_back(make_gemv_weights(rng, w4, outs[size_t(i)], in, 1.f));
          ldy.push_back(outs[size_t(i)] + 1 + i);
          dy.push_back(std::make_unique<Dev<float>>(size_t(kn::kGemvMaxRows) * ldy.back()));
          dsingle.push_back(std::make_unique<Dev<float>>(size_t(kn::kGemvMaxRows) * ldy.back()));
          ref_all.push_back(gemv_ref(W.back()->dense, widen(x), kn::kGemvMaxRows, outs[size_t(i)], in));
        }
        Dev<half> dx(x.size());
        dx.upload(x);
        for (int n = 1; n <= kn::kGemvMaxRows; ++n) {
          kn::GemvMat mats[kn::kGemvMaxMats];
          for (int i = 0; i < count; ++i) {
            dy[size_t(i)]->poison();
            dsingle[size_t(i)]->poison();
            mats[i] = W[size_t(i)]->mat(dy[size_t(i)]->get(), ldy[size_t(i)]);
          }
          REQUIRE_CUDA(kn::launch_gemv_multi(mats, count, dx.get(), n, in, st.s));
          for (int i = 0; i < count; ++i) {
            const kn::GemvMat m = W[size_t(i)]->mat(dsingle[size_t(i)]->get(), ldy[size_t(i)]);
            REQUIRE_CUDA(kn::launch_gemv(m.w16, m.wq, m.s, dx.get(), n, m.out, in, m.y, m.ldy, st.s));
          }
          st.sync();
          for (int i = 0; i < count; ++i) {
            const int out = outs[size_t(i)];
            const std::string what = cat("gemv multi ", w4 ? "w4a16" : "fp16", " in ", in, " matrices ", count,
                                         " matrix ", i, " (out ", out, ") n ", n);
            const std::vector<float> got = gemv_written(dy[size_t(i)]->download<float>(), ldy[size_t(i)], n, out, what);
            check_max_rel(got, head_rows(ref_all[size_t(i)], n, out), kTolF32Half, what);
            const std::vector<float> single =
                gemv_written(dsingle[size_t(i)]->download<float>(), ldy[size_t(i)], n, out, what + " (single)");
            require_same_bits(got, single, what + " vs launch_gemv");
          }
        }
      }
}

TEST_CASE("gemv gelu_mul: half(gelu_tanh(x Wg^T) * (x Wu^T)) in one launch, fp16 and w4a16, 1..32 rows", "[gpu]") {
  std::mt19937 rng(305);
  Stream st;
  for (bool w4 : {false, true})
    for (int in : {w4 ? 96 : 40, w4 ? 1536 : 1544})
      for (int I : {7, 1000, 2051}) {
        // amplitudes for gate values of a few units: GELU's curved part, not just its linear tail
        const float amp = w4 ? 1.f : 0.25f;
        const auto Wg = make_gemv_weights(rng, w4, I, in, amp), Wu = make_gemv_weights(rng, w4, I, in, amp);
        const std::vector<uint16_t> x = rand_f16(rng, size_t(kn::kGemvMaxRows) * in, -1.f, 1.f);  // [32, in] fp16
        const std::vector<double> g = gemv_ref(Wg->dense, widen(x), kn::kGemvMaxRows, I, in);
        const std::vector<double> u = gemv_ref(Wu->dense, widen(x), kn::kGemvMaxRows, I, in);
        std::vector<double> ref_all(g.size());  // [32, I]
        for (size_t i = 0; i < g.size(); ++i) ref_all[i] = double(gemma4_t4::detail::gelu_tanh_ref(float(g[i]))) * u[i];
        const int ld16 = I + 5;
        Dev<half> dx(x.size()), dout(size_t(kn::kGemvMaxRows) * ld16);  // out16: [32, ld16] fp16
        dx.upload(x);
        for (int n = 1; n <= kn::kGemvMaxRows; ++n) {
          dout.poison();
          REQUIRE_CUDA(kn::launch_gemv_gelu_mul(Wg->mat(nullptr, 0), Wu->mat(nullptr, 0), dx.get(), n, in, dout.get(),
                                                ld16, st.s));
          st.sync();
          const std::string what = cat("gemv gelu_mul ", w4 ? "w4a16" : "fp16", " n ", n, " I ", I, " in ", in);
          check_rel_l2(gemv_written(dout.download<uint16_t>(), ld16, n, I, what), head_rows(ref_all, n, I), kTolF16,
                       what);
        }
      }
}

TEST_CASE("gemv gelu_ple: half(gelu_tanh(x Wg^T) * ple[:, layer]) in one launch, fp16 and w4a16", "[gpu]") {
  std::mt19937 rng(306);
  Stream st;
  constexpr int L = 7;
  for (bool w4 : {false, true})
    for (int in : {w4 ? 96 : 40, 1536})
      for (int D : {8, 256, 300})
        for (int layer : {0, 3, L - 1}) {
          const auto Wg = make_gemv_weights(rng, w4, D, in, w4 ? 1.f : 0.25f);
          const std::vector<uint16_t> x = rand_f16(rng, size_t(kn::kGemvMaxRows) * in, -1.f, 1.f);    // [32, in]
          const std::vector<float> ple = rand_f32(rng, size_t(kn::kGemvMaxRows) * L * D, -3.f, 3.f);  // [32, L, D]
          const std::vector<double> g = gemv_ref(Wg->dense, widen(x), kn::kGemvMaxRows, D, in);
          std::vector<double> ref_all(g.size());  // [32, D]
          for (int r = 0; r < kn::kGemvMaxRows; ++r)
            for (int k = 0; k < D; ++k)
              ref_all[size_t(r) * D + k] = double(gemma4_t4::detail::gelu_tanh_ref(float(g[size_t(r) * D + k]))) *
                                           ple[(size_t(r) * L + layer) * D + k];
          Dev<half> dx(x.size()), dout(size_t(kn::kGemvMaxRows) * D);  // out16: [n, D] fp16 (32 rows allocated)
          Dev<float> dple(ple.size());
          dx.upload(x);
          dple.upload(ple);
          for (int n = 1; n <= kn::kGemvMaxRows; ++n) {
            dout.poison();
            REQUIRE_CUDA(
                kn::launch_gemv_gelu_ple(Wg->mat(nullptr, 0), dx.get(), n, in, dple.get(), L, layer, dout.get(), st.s));
            st.sync();
            const std::string what =
                cat("gemv gelu_ple ", w4 ? "w4a16" : "fp16", " n ", n, " D ", D, " in ", in, " layer ", layer);
            check_rel_l2(gemv_written(dout.download<uint16_t>(), D, n, D, what), head_rows(ref_all, n, D), kTolF16,
                         what);
          }
        }
}

// launch_ple_fused: the PLE gate (GELU times the per-layer inputs, act rounded to fp16) and per_layer_projection in one
// launch, its D / 32 slice parts summed on the host in slice order against the double reference of the two matmuls
// and against the two-launch path (launch_gemv_gelu_ple, then launch_gemv); rows 17..32 as two halves; every n < 32
// bit for bit the same parts as n = 32 (batch independence); nothing written outside the parts' [n, H] rows.
TEST_CASE("ple_fused: gate + GELU * ple + projection in one launch, parts in slice order; fp16 and w4a16",
          "[gpu][ple_fused]") {
  std::mt19937 rng(311);
  Stream st;
  constexpr int L = 5, R = kn::kGemvMaxRows;
  for (bool w4 : {false, true})
    for (int H : {w4 ? 96 : 40, 1536, w4 ? 608 : 264})  // partial projection blocks (256 outputs each) but at 1536
      for (int D : {32, 96, 256}) {
        const int layer = (H + D) % L, slices = D / kn::kPleSlice;
        const auto Wg = make_gemv_weights(rng, w4, D, H, w4 ? 1.f : 0.25f);          // [D, H]
        const auto Wp = make_gemv_weights(rng, w4, H, D, w4 ? 1.f : 0.25f);          // [H, D]
        const std::vector<uint16_t> x = rand_f16(rng, size_t(R) * H, -1.f, 1.f);     // [32, H]
        const std::vector<float> ple = rand_f32(rng, size_t(R) * L * D, -3.f, 3.f);  // [32, L, D]
        // the reference: act rounded to fp16 as the kernels store it, then the projection in double
        const std::vector<double> g = gemv_ref(Wg->dense, widen(x), R, D, H);
        std::vector<float> act(size_t(R) * D);
        for (int r = 0; r < R; ++r)
          for (int k = 0; k < D; ++k)
            act[size_t(r) * D + k] = f16_to_f32(f32_to_f16_sat(
                gemma4_t4::detail::gelu_tanh_ref(float(g[size_t(r) * D + k])) * ple[(size_t(r) * L + layer) * D + k]));
        const std::vector<double> ref_all = gemv_ref(Wp->dense, act, R, H, D);  // [32, H]
        const size_t part_ld = size_t(R) * H + 5;
        Dev<half> dx(x.size()), dact(size_t(R) * D);
        Dev<float> dple(ple.size()), dparts(size_t(slices) * part_ld), dy(size_t(R) * H);
        dx.upload(x);
        dple.upload(ple);
        std::vector<float> got32;
        for (int n : {R, 31, 17, 16, 9, 8, 3, 1}) {
          const std::string what = cat("ple_fused ", w4 ? "w4a16" : "fp16", " n ", n, " H ", H, " D ", D);
          dparts.poison();
          REQUIRE_CUDA(kn::launch_ple_fused(Wg->mat(nullptr, 0), Wp->mat(nullptr, 0), dx.get(), n, H, dple.get(), L,
                                            layer, dparts.get(), part_ld, st.s));
          st.sync();
          const std::vector<float> parts = dparts.download<float>();
          std::vector<float> sum(size_t(n) * H), rows;  // the parts added in slice order, as residual_norm does
          size_t stray = 0;
          for (int s = 0; s < slices; ++s)
            for (size_t i = 0; i < part_ld; ++i) {
              const float v = parts[size_t(s) * part_ld + i];
              if (i >= size_t(n) * H) {
                stray += !is_poison(v);
                continue;
              }
              REQUIRE(!is_poison(v));
              sum[i] = s == 0 ? v : sum[i] + v;
              rows.push_back(v);
            }
          INFO(what << ": " << stray << " floats written outside the parts' rows");
          REQUIRE(stray == 0);
          check_max_rel(sum, head_rows(ref_all, n, H), kTolF32Half, what);
          // the two-launch path: the same act (to fp16 rounding of the gate's sums), the projection in one k-loop
          dact.poison();
          dy.poison();
          REQUIRE_CUDA(
              kn::launch_gemv_gelu_ple(Wg->mat(nullptr, 0), dx.get(), n, H, dple.get(), L, layer, dact.get(), st.s));
          const kn::GemvMat pm = Wp->mat(dy.get(), H);
          REQUIRE_CUDA(kn::launch_gemv(pm.w16, pm.wq, pm.s, dact.get(), n, H, D, dy.get(), H, st.s));
          st.sync();
          std::vector<float> two = dy.download<float>();
          two.resize(size_t(n) * H);
          std::vector<double> two_d(two.begin(), two.end());
          check_max_rel(sum, two_d, 2 * kTolF32Half, what + " vs the two launches");
          if (n == R) {
            got32 = rows;
          } else {  // slice s's rows [0, n) of the n = 32 launch
            std::vector<float> same;
            for (int s = 0; s < slices; ++s)
              same.insert(same.end(), got32.begin() + std::ptrdiff_t(size_t(s) * R * H),
                          got32.begin() + std::ptrdiff_t(size_t(s) * R * H + size_t(n) * H));
            require_same_bits(rows, same, what + " vs the same rows of n = 32");
          }
        }
      }
}

// What launch_ple_fused refuses, before launching: D not in 32-column slices (or too many), layouts that differ, a
// projection that is not [H, D], parts too short, more than 32 rows; nothing to do for n = 0.
TEST_CASE("ple_fused: shapes the launcher does not take -> cudaErrorInvalidValue", "[gpu][ple_fused]") {
  std::mt19937 rng(313);
  Stream st;
  constexpr int H = 96, L = 2;
  const auto g4 = make_gemv_weights(rng, true, 64, H, 1.f), p4 = make_gemv_weights(rng, true, H, 64, 1.f);
  const auto p16 = make_gemv_weights(rng, false, H, 64, 1.f), g48 = make_gemv_weights(rng, true, 48, H, 1.f);
  const auto p4w = make_gemv_weights(rng, true, H + 32, 64, 1.f);
  Dev<half> dx(size_t(kn::kGemvMaxRows) * H);
  Dev<float> dple(size_t(kn::kGemvMaxRows) * L * 64), dparts(size_t(2) * kn::kGemvMaxRows * H);
  const size_t ld = size_t(kn::kGemvMaxRows) * H;
  auto launch = [&](const GemvWeights& g, const GemvWeights& p, int n, size_t part_ld, int layer = 0) {
    return kn::launch_ple_fused(g.mat(nullptr, 0), p.mat(nullptr, 0), dx.get(), n, H, dple.get(), L, layer,
                                dparts.get(), part_ld, st.s);
  };
  REQUIRE(launch(*g4, *p4, 0, ld) == cudaSuccess);  // nothing to do
  REQUIRE(launch(*g4, *p4, kn::kGemvMaxRows + 1, ld) == cudaErrorInvalidValue);
  REQUIRE(launch(*g48, *p4, 4, ld) == cudaErrorInvalidValue);        // D = 48: not whole 32-column slices
  REQUIRE(launch(*g4, *p16, 4, ld) == cudaErrorInvalidValue);        // the gate w4a16, the projection fp16
  REQUIRE(launch(*g4, *p4w, 4, ld) == cudaErrorInvalidValue);        // projection of 128 outputs, not H
  REQUIRE(launch(*g4, *p4, 4, 4 * H - 1) == cudaErrorInvalidValue);  // parts shorter than [n, H]
  REQUIRE(launch(*g4, *p4, 4, ld, L) == cudaErrorInvalidValue);      // layer past L
  REQUIRE(launch(*g4, *p4, 4, ld) == cudaSuccess);
  st.sync();
  REQUIRE_FALSE(kn::ple_fused_shape(kn::kPleSlice * (kn::kPleMaxSlices + 1)));
  REQUIRE(kn::ple_fused_shape(256));
}

template <int NT, int WL, kn::GemvEpilogue E>
void launch_gemv_items(kn::GemvArgs a, int nmats, bool shared, unsigned grid, cudaStream_t s) {
  unsigned blocks = 0;
  REQUIRE_CUDA(kn::gemv_plan(a, nmats, E, true, &blocks));
  REQUIRE(blocks > 0);
  a.ldx = a.in + 8;
  const size_t smem = sizeof(float) * kn::gemv_red_floats<NT>() + size_t(NT * 8) * a.ldx * sizeof(half);
  auto k = shared ? gputest_kernels::gemv_items_kernel<NT, WL, E, kn::GemvX::Shared>
                  : gputest_kernels::gemv_items_kernel<NT, WL, E, kn::GemvX::Coherent>;
  REQUIRE_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  REQUIRE_CUDA(kn::launch_kernel_smem(k, std::min(grid, blocks), kn::kGemvWarps * 32, smem, kn::Launch(s), a));
}

template <int WL, kn::GemvEpilogue E>
void launch_gemv_items_n(const kn::GemvArgs& a, int nmats, bool shared, unsigned grid, cudaStream_t s) {
  if (a.n <= 8)
    launch_gemv_items<1, WL, E>(a, nmats, shared, grid, s);
  else
    launch_gemv_items<2, WL, E>(a, nmats, shared, grid, s);
}

TEST_CASE("gemv_block: x from shared memory or through L2, several items per block, equals the launches bit for bit",
          "[gpu][persistent]") {
  std::mt19937 rng(309);
  Stream st;
  constexpr int L = 3, layer = 1;
  for (bool w4 : {false, true})
    for (int in : {1536, 2048, 6144})
      for (int n : {1, 5, 9, 16})
        for (unsigned grid : {7u, 132u}) {
          const std::string tag = cat(w4 ? "w4a16" : "fp16", " in ", in, " n ", n, " grid ", grid);
          const std::vector<uint16_t> x = rand_f16(rng, size_t(kn::kGemvMaxRows) * in, -1.f, 1.f);  // [32, in]
          Dev<half> dx(x.size());
          dx.upload(x);
          // Store, three matrices (q/k/v-like)
          const int outs[3] = {2048, 256, 1000};
          std::vector<std::unique_ptr<GemvWeights>> W;
          std::vector<std::unique_ptr<Dev<float>>> ya, yb;
          kn::GemvArgs a, b;
          a.x = b.x = dx.get();
          a.n = b.n = n;
          a.in = b.in = in;
          a.count = b.count = 3;
          for (int i = 0; i < 3; ++i) {
            W.push_back(make_gemv_weights(rng, w4, outs[i], in, 1.f));
            ya.push_back(std::make_unique<Dev<float>>(size_t(kn::kGemvMaxRows) * outs[i]));
            yb.push_back(std::make_unique<Dev<float>>(size_t(kn::kGemvMaxRows) * outs[i]));
            ya.back()->poison();
            yb.back()->poison();
            a.mat[i] = W.back()->mat(ya.back()->get(), outs[i]);
            b.mat[i] = W.back()->mat(yb.back()->get(), outs[i]);
          }
          REQUIRE_CUDA(kn::launch_gemv_multi(a.mat, 3, dx.get(), n, in, st.s));
          for (bool shared : {true, false}) {
            for (auto& y : yb) y->poison();
            if (w4)
              launch_gemv_items_n<kn::kGemvW4, kn::GemvEpilogue::Store>(b, 3, shared, grid, st.s);
            else
              launch_gemv_items_n<kn::kGemvF16, kn::GemvEpilogue::Store>(b, 3, shared, grid, st.s);
            st.sync();
            for (int i = 0; i < 3; ++i)
              require_same_bits(
                  gemv_written(yb[size_t(i)]->download<float>(), outs[i], n, outs[i], tag + " store (items)"),
                  gemv_written(ya[size_t(i)]->download<float>(), outs[i], n, outs[i], tag + " store"),
                  cat(tag, shared ? " shared" : " coherent", " store, matrix ", i));
          }
          // GeluMul (gate, up) and GeluPle
          const int I = 1000, D = 256;
          const auto Wg = make_gemv_weights(rng, w4, I, in, w4 ? 1.f : 0.25f),
                     Wu = make_gemv_weights(rng, w4, I, in, w4 ? 1.f : 0.25f),
                     Wp = make_gemv_weights(rng, w4, D, in, w4 ? 1.f : 0.25f);
          const std::vector<float> ple = rand_f32(rng, size_t(kn::kGemvMaxRows) * L * D, -3.f, 3.f);  // [32, L, D]
          Dev<float> dple(ple.size());
          dple.upload(ple);
          Dev<half> oa(size_t(kn::kGemvMaxRows) * I), ob(size_t(kn::kGemvMaxRows) * I);
          Dev<half> pa(size_t(kn::kGemvMaxRows) * D), pb(size_t(kn::kGemvMaxRows) * D);
          oa.poison();
          pa.poison();
          REQUIRE_CUDA(
              kn::launch_gemv_gelu_mul(Wg->mat(nullptr, 0), Wu->mat(nullptr, 0), dx.get(), n, in, oa.get(), I, st.s));
          REQUIRE_CUDA(
              kn::launch_gemv_gelu_ple(Wp->mat(nullptr, 0), dx.get(), n, in, dple.get(), L, layer, pa.get(), st.s));
          for (bool shared : {true, false}) {
            ob.poison();
            pb.poison();
            kn::GemvArgs g;
            g.x = dx.get();
            g.n = n;
            g.in = in;
            g.mat[0] = Wg->mat(nullptr, 0);
            g.mat[1] = Wu->mat(nullptr, 0);
            g.out16 = ob.get();
            g.ld16 = I;
            kn::GemvArgs q;
            q.x = dx.get();
            q.n = n;
            q.in = in;
            q.mat[0] = Wp->mat(nullptr, 0);
            q.out16 = pb.get();
            q.ld16 = D;
            q.ple = dple.get();
            q.ple_ld = L * D;
            q.ple_off = layer * D;
            if (w4) {
              launch_gemv_items_n<kn::kGemvW4, kn::GemvEpilogue::GeluMul>(g, 2, shared, grid, st.s);
              launch_gemv_items_n<kn::kGemvW4, kn::GemvEpilogue::GeluPle>(q, 1, shared, grid, st.s);
            } else {
              launch_gemv_items_n<kn::kGemvF16, kn::GemvEpilogue::GeluMul>(g, 2, shared, grid, st.s);
              launch_gemv_items_n<kn::kGemvF16, kn::GemvEpilogue::GeluPle>(q, 1, shared, grid, st.s);
            }
            st.sync();
            const std::string how = shared ? " shared" : " coherent";
            REQUIRE(gemv_written(ob.download<uint16_t>(), I, n, I, tag + how + " gelu_mul (items)") ==
                    gemv_written(oa.download<uint16_t>(), I, n, I, tag + " gelu_mul"));
            REQUIRE(gemv_written(pb.download<uint16_t>(), D, n, D, tag + how + " gelu_ple (items)") ==
                    gemv_written(pa.download<uint16_t>(), D, n, D, tag + " gelu_ple"));
          }
        }
}

// The load's reorder (launch_w4_gemv_order, in place) against the layout written out column by column: GEMV nibble
// s holds checkpoint column 2s and nibble s + 4 column 2s + 1; and the host w4_gemv_word the tests pack with.
TEST_CASE("w4_gemv_order: checkpoint words -> the GEMV word order, in place, odd counts", "[gpu]") {
  std::mt19937 rng(311);
  Stream st;
  for (size_t n : {size_t(1), size_t(255), size_t(257), size_t(100003)}) {
    std::vector<uint32_t> w(n);
    for (uint32_t& v : w) v = uint32_t(rng());
    w[0] = 0x76543210u;  // nibble i = i: the order itself
    Dev<uint32_t> d(n);
    d.upload(w);
    REQUIRE_CUDA(kn::launch_w4_gemv_order(d.get(), n, st.s));
    st.sync();
    const std::vector<uint32_t> got = d.download<uint32_t>();
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) {
      uint32_t want = 0;
      for (int c = 0; c < 8; ++c) want |= ((w[i] >> (4 * c)) & 0xFu) << (4 * (c % 2 == 0 ? c / 2 : 4 + c / 2));
      if (got[i] != want || kn::w4_gemv_word(w[i]) != want) ++wrong;
    }
    INFO("words " << n << ": first 0x" << std::hex << got[0]);
    REQUIRE(got[0] == 0x75316420u);
    REQUIRE(wrong == 0);
  }
  REQUIRE_CUDA(kn::launch_w4_gemv_order(nullptr, 0, st.s));  // nothing to do
}

TEST_CASE("dequant_w4: packed int4 + fp16 scales -> fp16 weights, bit-exact", "[gpu]") {
  std::mt19937 rng(303);
  Stream st;
  std::uniform_int_distribution<int> uq(-8, 7);
  std::uniform_real_distribution<float> ue(-24.f, 12.f);  // scales 2^-24 (fp16 subnormal) .. 2^12
  for (int in : {32, 96, 1536})
    for (int out : {1, 7, 33, 1000}) {
      std::vector<int> q(size_t(out) * in);
      for (int& v : q) v = uq(rng);
      const std::vector<uint32_t> Wq = pack_w4(q, out, in);  // [out, in / 8] u32
      std::vector<uint16_t> S(size_t(out) * (in / 32));      // [out, in / 32] fp16, both signs
      for (size_t i = 0; i < S.size(); ++i) S[i] = f32_to_f16((i % 3 == 2 ? -1.f : 1.f) * std::exp2(ue(rng)));
      Dev<uint32_t> dWq(Wq.size());
      Dev<half> dS(S.size()), dout(size_t(out) * in);  // out16: [out, in] fp16
      dWq.upload(gemv_order(Wq));
      dS.upload(S);
      dout.poison();
      REQUIRE_CUDA(kn::launch_dequant_w4(dWq.get(), dS.get(), out, in, dout.get(), st.s));
      st.sync();
      const std::vector<uint16_t> got = dout.download<uint16_t>();
      size_t wrong = 0, first = 0;
      for (int o = 0; o < out; ++o)
        for (int i = 0; i < in; ++i) {
          const size_t at = size_t(o) * in + i;
          const uint16_t want =
              f32_to_f16(float(q[at]) * f16_to_f32(S[size_t(o) * (in / 32) + i / 32]));  // (u - 8) * scale, RNE
          if (got[at] != want && wrong++ == 0) first = at;
        }
      INFO("dequant_w4 out " << out << " in " << in << ": " << wrong << " halves differ; first at " << first << " (q "
                             << q[first] << ", got 0x" << std::hex << got[first] << ")");
      REQUIRE(wrong == 0);
    }
}

TEST_CASE("quantized LM head: device quantizers equal the host ones bit for bit; int8 and int4 GEMVs", "[gpu]") {
  // LoadOptions::lm_head: the CUDA backend quantizes the fp16 head with launch_quantize_int8/int4 and the CPU
  // backend with quantize_row_int8/int4 (weights.hpp); both must give the same bytes. Then the GEMV over the
  // quantized copy must equal the dense reference of the values they mean (int8: scale * (q . x), int4:
  // fp16(q * scale) . x). Row 0 is all zeros (scale 0) and row 1 has one zero group.
  std::mt19937 rng(307);
  Stream st;
  for (int in : {32, 96, 1536})
    for (int out : {2, 33, 1000, 2051}) {
      std::vector<uint16_t> W = rand_f16(rng, size_t(out) * in, -0.08f, 0.08f);  // [out, in] fp16
      for (int i = 0; i < in; ++i) W[size_t(i)] = 0;                             // row 0
      for (int i = 0; i < 32; ++i) W[size_t(in) + i] = 0;                        // row 1, group 0
      const std::vector<float> Wf = widen(W);
      Dev<half> dW(W.size());
      dW.upload(W);
      // host quantization, row by row
      std::vector<int8_t> q8(W.size());
      std::vector<float> r8(static_cast<size_t>(out));
      std::vector<uint32_t> q4(W.size() / 8);
      std::vector<uint16_t> s4(W.size() / 32);
      for (int o = 0; o < out; ++o) {
        gemma4_t4::detail::quantize_row_int8(&Wf[size_t(o) * in], size_t(in), &q8[size_t(o) * in], &r8[size_t(o)]);
        gemma4_t4::detail::quantize_row_int4(&Wf[size_t(o) * in], size_t(in), &q4[size_t(o) * in / 8],
                                             &s4[size_t(o) * in / 32]);
      }
      Dev<int8_t> dq8(q8.size());
      Dev<float> dr8(r8.size());
      Dev<uint32_t> dq4(q4.size());
      Dev<half> ds4(s4.size());
      dq8.poison();
      dr8.poison();
      dq4.poison();
      ds4.poison();
      REQUIRE_CUDA(kn::launch_quantize_int8(dW.get(), out, in, dq8.get(), dr8.get(), st.s));
      REQUIRE_CUDA(kn::launch_quantize_int4(dW.get(), out, in, dq4.get(), ds4.get(), st.s));
      st.sync();
      const std::string shape = cat(" out ", out, " in ", in);
      {
        INFO("int8 quantization" << shape);
        REQUIRE(dq8.download<int8_t>() == q8);
        const std::vector<float> got = dr8.download<float>();
        REQUIRE(std::memcmp(got.data(), r8.data(), r8.size() * 4) == 0);
        REQUIRE(r8[0] == 0.f);
      }
      {
        INFO("int4 quantization" << shape);
        REQUIRE(dq4.download<uint32_t>() == gemv_order(q4));  // the device copy is in the GEMV word order
        REQUIRE(ds4.download<uint16_t>() == s4);
      }
      // dense meaning of each copy
      std::vector<float> dense8(W.size()), dense4 = unpack_w4_ref(q4, s4, out, in);
      for (size_t i = 0; i < dense8.size(); ++i) dense8[i] = float(q8[i]);
      for (float& v : dense4) v = f16_to_f32(f32_to_f16(v));  // the kernel's fp16(q * scale)
      const std::vector<uint16_t> x = rand_f16(rng, size_t(kn::kGemvMaxRows) * in, -1.f, 1.f);
      Dev<half> dx(x.size());
      dx.upload(x);
      std::vector<double> ref8 = gemv_ref(dense8, widen(x), kn::kGemvMaxRows, out, in);
      for (int r = 0; r < kn::kGemvMaxRows; ++r)
        for (int o = 0; o < out; ++o) ref8[size_t(r) * out + o] *= r8[size_t(o)];
      const std::vector<double> ref4 = gemv_ref(dense4, widen(x), kn::kGemvMaxRows, out, in);
      const int ldy = out + 1;
      Dev<float> dy(size_t(kn::kGemvMaxRows) * ldy);
      for (int w8 = 1; w8 >= 0; --w8) {
        std::vector<float> got16;
        for (int n : {16, 9, 8, 1}) {
          dy.poison();
          if (w8)
            REQUIRE_CUDA(kn::launch_gemv_w8(dq8.get(), dr8.get(), dx.get(), n, out, in, dy.get(), ldy, st.s));
          else
            REQUIRE_CUDA(kn::launch_gemv(nullptr, dq4.get(), ds4.get(), dx.get(), n, out, in, dy.get(), ldy, st.s));
          st.sync();
          const std::string what = cat(w8 ? "gemv int8" : "gemv int4 head", shape, " n ", n);
          const std::vector<float> got = gemv_written(dy.download<float>(), ldy, n, out, what);
          check_max_rel(got, head_rows(w8 ? ref8 : ref4, n, out), kTolF32Half, what);
          if (n == 16)
            got16 = got;
          else
            require_same_bits(got, got16, what + " vs the same rows of n = 32");
        }
      }
    }
  // shapes the int8 GEMV refuses: in % 16 != 0, a fused epilogue, a scale-less matrix
  Dev<int8_t> w(64 * 24);
  Dev<float> r(64), y(64 * 16);
  Dev<half> x(16 * 24);
  REQUIRE(kn::launch_gemv_w8(w.get(), r.get(), x.get(), 1, 64, 24, y.get(), 64, st.s) == cudaErrorInvalidValue);
  REQUIRE(kn::launch_gemv_w8(w.get(), nullptr, x.get(), 1, 64, 16, y.get(), 64, st.s) == cudaErrorInvalidValue);
  kn::GemvMat g;
  g.w8 = w.get();
  g.rs = r.get();
  g.out = 64;
  REQUIRE(kn::launch_gemv_gelu_mul(g, g, x.get(), 1, 16, reinterpret_cast<half*>(y.get()), 64, st.s) ==
          cudaErrorInvalidValue);
}

// ---- attention.cuh ----

// Random q and caches for an AttnHost whose shape, seq, pos and capacity are set: fp16 bits and their widened
// copies. |q| <= qa; K, V in [-1, 1].
struct AttnData {
  AttnHost h;
  std::vector<uint16_t> q16;                    // [rows, heads, D] fp16
  std::vector<std::vector<uint16_t>> k16, v16;  // [seqs * layers] -> [capacity, kv_heads, D] fp16
};

void attn_fill(std::mt19937& rng, AttnData& d, float qa) {
  AttnHost& a = d.h;
  d.q16 = rand_f16(rng, size_t(a.rows) * a.heads * a.D, -qa, qa);
  a.q = widen(d.q16);
  d.k16.clear();
  d.v16.clear();
  a.k.clear();
  a.v.clear();
  for (int c : a.capacity) {
    d.k16.push_back(rand_f16(rng, size_t(c) * a.kv_heads * a.D, -1.f, 1.f));
    d.v16.push_back(rand_f16(rng, size_t(c) * a.kv_heads * a.D, -1.f, 1.f));
    a.k.push_back(widen(d.k16.back()));
    a.v.push_back(widen(d.v16.back()));
  }
}

// AttnData on the device, with scratch for up to max_splits splits and zeroed arrival counters.
struct AttnDev {
  DevKvCaches kv;
  std::unique_ptr<Dev<int>> cap, seq, pos;
  std::unique_ptr<Dev<half>> q, out;            // out: [rows, heads * D] fp16
  std::unique_ptr<Dev<float>> part_o, part_ml;  // [rows, heads, splits, D], [rows, heads, splits, 2] fp32
  std::unique_ptr<Dev<unsigned>> counters;      // [rows, kv_heads]
  int max_splits = 0;

  AttnDev(const AttnData& d, int max_splits_) : kv(d.k16, d.v16), max_splits(max_splits_) {
    const AttnHost& a = d.h;
    cap = std::make_unique<Dev<int>>(a.capacity.size());
    seq = std::make_unique<Dev<int>>(a.seq.size());
    pos = std::make_unique<Dev<int>>(a.pos.size());
    cap->upload(a.capacity);
    seq->upload(a.seq);
    pos->upload(a.pos);
    q = std::make_unique<Dev<half>>(d.q16.size());
    q->upload(d.q16);
    out = std::make_unique<Dev<half>>(size_t(a.rows) * a.heads * a.D);
    part_o = std::make_unique<Dev<float>>(size_t(a.rows) * a.heads * max_splits * a.D);
    part_ml = std::make_unique<Dev<float>>(size_t(a.rows) * a.heads * max_splits * 2);
    counters = std::make_unique<Dev<unsigned>>(size_t(a.rows) * a.heads);  // [rows, kv_heads, head slices]
    counters->upload(std::vector<unsigned>(counters->size(), 0u));
  }

  kn::AttnArgs args(const AttnHost& a, int splits, bool with_counters, int head_split = 1, int late_keys = -1) const {
    REQUIRE(splits <= max_splits);
    kn::AttnArgs r;
    r.head_split = head_split;
    r.late_keys = late_keys;
    r.q = q->get();
    r.kbase = kv.kb->get();
    r.vbase = kv.vb->get();
    r.capacity = cap->get();
    r.seq = seq->get();
    r.pos = pos->get();
    r.layer = a.layer;
    r.layers = a.layers;
    r.rows = a.rows;
    r.heads = a.heads;
    r.kv_heads = a.kv_heads;
    r.window = a.window;
    r.splits = splits;
    r.part_o = part_o->get();
    r.part_ml = part_ml->get();
    r.out = out->get();
    r.counters = with_counters ? counters->get() : nullptr;
    return r;
  }

  void poison() {
    part_o->poison();
    part_ml->poison();
    out->poison();
  }

  // out against the reference; every counter back at zero (the last block of each (row, KV head) reset it).
  void check(const std::vector<double>& ref, const std::string& what) const {
    check_rel_l2(widen(out->download<uint16_t>()), ref, kTolF16, what);
    const std::vector<unsigned> c = counters->download<unsigned>();
    INFO(what);
    REQUIRE(size_t(std::count(c.begin(), c.end(), 0u)) == c.size());
  }
};

// How launch_attention merges `splits` splits: "1 split", "fused" or "2 launches" (for messages).
std::string attn_merge_mode(int splits, bool counters, int group, int D, int head_split = 1) {
  if (splits == 1) return "1 split";
  return counters && splits <= kn::attention_fused_splits(group / head_split, D) ? "fused" : "2 launches";
}

TEST_CASE("attention: split-K flash decoding over ring/full caches, GQA groups 1..8, splits 1/3/7/20, both merges",
          "[gpu]") {
  std::mt19937 rng(401);
  Stream st;
  constexpr int kLayers = 2, kLayer = 1, kWindow = 24;  // 3 sequences
  // Rows of three sequences: a first token (one key), a 3-token chunk, a late decode token. The rows of a
  // sequence share its cache.
  const std::vector<int> seq = {1, 0, 2, 1, 1};       // [rows]
  const std::vector<int> pos = {37, 0, 150, 38, 39};  // [rows]
  const int rows = int(seq.size());
  // Layer-1 capacities per window: sliding (window 24) rings that wrap (seq 2: 150 -> slot 6 of 24; keys
  // 127..150 are 24 distinct slots), or full caches holding every position (window 0, and window 200 > every
  // position, which takes the sliding code path with lo = 0). Layer 0 gets other sizes and other data.
  const std::vector<int> cap_ring = {7, 24, 9, 32, 11, 24};  // [seqs * layers]
  const std::vector<int> cap_full = {7, 1, 9, 40, 11, 151};
  for (int D : {32, 64, 128, 256, 512})
    for (int kv_heads : {1, 2})
      for (int group = 1; group <= 8; ++group)
        for (int window : {0, kWindow, 200}) {
          AttnData d;
          AttnHost& a = d.h;
          a.D = D;
          a.rows = rows;
          a.heads = kv_heads * group;
          a.kv_heads = kv_heads;
          a.window = window;
          a.layer = kLayer;
          a.layers = kLayers;
          a.seq = seq;
          a.pos = pos;
          a.capacity = window == kWindow ? cap_ring : cap_full;
          // Soft scores (|q.k| ~ 1) for kv_heads 1, sharp ones (|q.k| ~ 0.3 sqrt(D)) for kv_heads 2.
          attn_fill(rng, d, kv_heads == 1 ? 3.f / std::sqrt(float(D)) : 1.f);
          const std::vector<double> ref = attention_ref(a);
          AttnDev dev(d, 20);
          REQUIRE(kn::attention_supported(D, group));

          // Each row splits its own keys over `splits` ranges of whole tiles: with 7 splits the one-key row (pos
          // 0) leaves 6 empty, the 151-key row leaves 2 empty; 1 split walks 5 tiles with online-softmax
          // rescales. With counters the merge fuses into the split kernel up to attention_fused_splits (20
          // splits at D = 512 and groups 7, 8 exceed it: two launches); without, it is always a second launch.
          // The same counters serve every launch: a counter left non-zero would break the next fused merge.
          for (int splits : {1, 3, 7, 20})
            for (bool counters : {false, true}) {
              if (splits == 1 && counters) continue;
              dev.poison();
              REQUIRE_CUDA(kn::launch_attention(dev.args(a, splits, counters), D, st.s));
              st.sync();
              dev.check(ref, cat("attention D ", D, " kv_heads ", kv_heads, " group ", group, " window ", window,
                                 " splits ", splits, " (", attn_merge_mode(splits, counters, group, D), ")"));
            }
        }
}

TEST_CASE("attention: 1..16 rows of different sessions at different positions, the backend's split policy", "[gpu]") {
  std::mt19937 rng(402);
  Stream st;
  int dev_id = 0, sms = 0;
  REQUIRE_CUDA(cudaGetDevice(&dev_id));
  REQUIRE_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev_id));
  constexpr int kMaxPos = 400, kWindow = 96, kBudget = 1024;
  for (int rows : {1, 2, 5, 9, 16})
    for (int D : {64, 256, 512})
      for (int group : {8, 3})
        for (int window : {0, kWindow}) {
          AttnData d;
          AttnHost& a = d.h;
          a.D = D;
          a.rows = rows;
          a.kv_heads = group == 3 ? 2 : 1;
          a.heads = a.kv_heads * group;
          a.window = window;
          a.layer = 0;
          a.layers = 1;
          // Row r is session rows - 1 - r (the table order is not the row order), at a random position; row 0 is
          // a first token (one key) so that most of its splits are empty.
          std::uniform_int_distribution<int> upos(1, kMaxPos);
          for (int r = 0; r < rows; ++r) {
            a.seq.push_back(rows - 1 - r);
            a.pos.push_back(r == 0 ? 0 : upos(rng));
          }
          a.capacity.assign(size_t(rows), window ? window + 16 : kMaxPos + 1);  // rings of window + 16 slots
          attn_fill(rng, d, 3.f / std::sqrt(float(D)));
          const std::vector<double> ref = attention_ref(a);
          const int keys = window ? window : kMaxPos + 1;
          const int policy = kn::attention_splits_for(rows, a.kv_heads, group, D, keys, sms, kBudget);
          REQUIRE(policy >= 1);
          REQUIRE(rows * policy <= kBudget);
          const int fused_max = kn::attention_fused_splits(group, D);
          AttnDev dev(d, std::max(policy, fused_max + 1));
          // The policy's count, then the most the fused merge takes and one more (a second launch); each
          // launched twice on the same counters.
          for (int splits : {policy, fused_max, fused_max + 1})
            for (int rep = 0; rep < 2; ++rep) {
              dev.poison();
              REQUIRE_CUDA(kn::launch_attention(dev.args(a, splits, true), D, st.s));
              st.sync();
              dev.check(ref, cat("attention rows ", rows, " D ", D, " group ", group, " kv_heads ", a.kv_heads,
                                 " window ", window, " splits ", splits, " (", attn_merge_mode(splits, true, group, D),
                                 ") launch ", rep + 1));
            }
          // Decode passes as the backend launches them: head slices (the policy's, and every power of two that
          // divides the group) and the PDL prologue's key split (late_keys 1: each row's own key read after the
          // wait, the rest before; 0: every key before; launched without PDL here, so this checks which keys
          // each load takes, not the ordering). Every row is a session of its own, as in a decode pass.
          const int hs_policy = kn::attention_head_split_for(rows, a.kv_heads, group, keys, sms);
          REQUIRE(group % hs_policy == 0);
          for (int hs = 1; hs <= group; hs *= 2) {
            if (group % hs != 0) break;
            const int sp = kn::attention_splits_for(rows, a.kv_heads, group, D, keys, sms, kBudget, hs);
            REQUIRE(sp <= dev.max_splits);
            for (int late : {1, 0, -1}) {
              dev.poison();
              REQUIRE_CUDA(kn::launch_attention(dev.args(a, sp, true, hs, late), D, st.s));
              st.sync();
              dev.check(ref, cat("attention rows ", rows, " D ", D, " group ", group, " kv_heads ", a.kv_heads,
                                 " window ", window, " splits ", sp, " (", attn_merge_mode(sp, true, group, D, hs),
                                 ") head_split ", hs, hs == hs_policy ? " (policy)" : "", " late_keys ", late));
            }
          }
        }
}

TEST_CASE("attention: a captured CUDA graph replays with the same counters as the sequences grow", "[gpu]") {
  std::mt19937 rng(403);
  Stream st;
  constexpr int kRows = 3, kWindow = 48, kCap = 200;  // full caches hold positions < 200; rings 48 + 16 slots
  for (int D : {256, 512})
    for (int window : {0, kWindow})
      // 6 splits: fused; 40: more than the fused merge takes (32 at D = 256, 16 at D = 512), so the graph holds
      // the split kernel and the merge kernel
      for (int splits : {6, 40}) {
        AttnData d;
        AttnHost& a = d.h;
        a.D = D;
        a.rows = kRows;
        a.heads = 8;
        a.kv_heads = 1;
        a.window = window;
        a.layer = 0;
        a.layers = 1;
        a.seq = {0, 1, 2};
        a.pos = {0, 5, 60};
        a.capacity.assign(kRows, window ? window + 16 : kCap);
        attn_fill(rng, d, 3.f / std::sqrt(float(D)));
        AttnDev dev(d, splits);
        const kn::AttnArgs args = dev.args(a, splits, true);

        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        REQUIRE_CUDA(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
        const cudaError_t le = kn::launch_attention(args, D, st.s);
        REQUIRE_CUDA(cudaStreamEndCapture(st.s, &graph));
        REQUIRE_CUDA(le);
        REQUIRE_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        // Decode steps: every row one position further (new positions uploaded, same graph), then a jump that
        // fills splits that were empty so far.
        for (int step = 0; step < 5; ++step) {
          if (step > 0)
            for (int r = 0; r < kRows; ++r) a.pos[size_t(r)] += step < 4 ? 1 : 100 + 7 * r;
          dev.pos->upload(a.pos);
          const std::vector<double> ref = attention_ref(a);
          dev.poison();
          REQUIRE_CUDA(cudaGraphLaunch(exec, st.s));
          st.sync();
          dev.check(ref, cat("graph replay D ", D, " window ", window, " splits ", splits, " (",
                             attn_merge_mode(splits, true, 8, D), ") step ", step));
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      }
}

TEST_CASE("attention split policy: scratch budget, tiles, fused merge where it pays", "[gpu]") {
  // E2B at one row on an H200 (132 SMs) and a T4 (40): the 512-key layers get 16 one-tile splits, fused.
  for (int sms : {132, 40})
    for (int D : {256, 512}) {
      const int s = kn::attention_splits_for(1, 1, 8, D, 512, sms, 1024);
      CHECK(s == 16);
      CHECK(s <= kn::attention_fused_splits(8, D));
    }
  // long contexts: about two blocks per SM, merged by a second launch
  CHECK(kn::attention_splits_for(1, 1, 8, 512, 4096, 132, 1024) == 128);
  CHECK(kn::attention_splits_for(1, 1, 8, 512, 32768, 132, 1024) == 264);
  CHECK(kn::attention_splits_for(1, 1, 8, 512, 32768, 40, 1024) == 80);
  // 1024 keys: 16 two-tile splits, fused, rather than 32 one-tile splits and a second launch
  CHECK(kn::attention_splits_for(1, 1, 8, 512, 1024, 132, 1024) == 16);
  for (int rows = 1; rows <= 512; rows += rows < 16 ? 1 : 37)
    for (int keys : {1, 31, 33, 512, 4096, 32768})
      for (int D : {32, 256, 512}) {
        const int s = kn::attention_splits_for(rows, 1, 8, D, keys, 132, 1024);
        INFO("rows " << rows << " keys " << keys << " D " << D << " -> splits " << s);
        CHECK(s >= 1);
        CHECK((s == 1 || rows * s <= 1024));
        CHECK(s <= std::max(1, (keys + kn::kAttnTile - 1) / kn::kAttnTile));
        CHECK(s <= kn::kAttnMaxSplits);
      }
  CHECK(kn::attention_fused_splits(8, 512) == 16);
  CHECK(kn::attention_fused_splits(1, 32) == kn::kAttnFusedSplits);
  // Head slices (E2B: group 8, one KV head; H200 132 SMs): one session's 512-key layers take 8 slices of 16
  // one-tile splits (128 blocks, each merging one head), 8 sessions 2, 16 sessions none; a 4096-key bound 2;
  // a group that is not a power of two only its powers of two (3: 1; 6: 2).
  CHECK(kn::attention_head_split_for(1, 1, 8, 512, 132) == 8);
  CHECK(kn::attention_splits_for(1, 1, 8, 512, 512, 132, 1024, 8) == 16);
  CHECK(kn::attention_head_split_for(8, 1, 8, 512, 132) == 2);
  CHECK(kn::attention_head_split_for(16, 1, 8, 512, 132) == 1);
  CHECK(kn::attention_head_split_for(1, 1, 8, 4096, 132) == 2);
  CHECK(kn::attention_head_split_for(1, 2, 3, 512, 132) == 1);
  CHECK(kn::attention_head_split_for(1, 1, 6, 512, 132) == 2);
  // full layers of one session at a 640-key bound: 20 one-tile splits with 8 slices (the fused merge takes 64
  // at one head of D 512), where one slice gets 16 splits of up to two tiles
  CHECK(kn::attention_splits_for(1, 1, 8, 512, 640, 132, 1024, 8) == 20);
  CHECK(kn::attention_splits_for(1, 1, 8, 512, 640, 132, 1024, 1) == 16);
  // Past 32 rows, given the split kernel's blocks per SM: the most splits whose grid fits one wave. E2B on 132 SMs
  // (D 256 at two blocks per SM, D 512 at one): 128 rows 2 and 1 splits (the rule above: 3, i.e. 384 blocks for 264
  // slots), 64 rows 4 and 2, 33 rows 8; at most 32 rows, or the occupancy unknown (0), the rule above.
  CHECK(kn::attention_splits_for(128, 1, 8, 256, 512, 132, 1024, 1, 2) == 2);
  CHECK(kn::attention_splits_for(128, 1, 8, 512, 32768, 132, 1024, 1, 1) == 1);
  CHECK(kn::attention_splits_for(64, 1, 8, 256, 512, 132, 1024, 1, 2) == 4);
  CHECK(kn::attention_splits_for(64, 1, 8, 512, 32768, 132, 1024, 1, 1) == 2);
  CHECK(kn::attention_splits_for(33, 1, 8, 256, 512, 132, 1024, 1, 2) == 8);
  CHECK(kn::attention_splits_for(128, 1, 8, 256, 512, 132, 1024, 1, 0) == 3);
  for (int rows : {1, 16, 32})
    CHECK(kn::attention_splits_for(rows, 1, 8, 256, 512, 132, 1024, 1, 2) ==
          kn::attention_splits_for(rows, 1, 8, 256, 512, 132, 1024));
  for (int rows = 33; rows <= 512; rows += 23)
    for (int keys : {1, 31, 512, 4096, 32768})
      for (int D : {256, 512})
        for (int per_sm : {1, 2, 3})
          for (int sms : {40, 132}) {
            const int s = kn::attention_splits_for(rows, 1, 8, D, keys, sms, 1024, 1, per_sm);
            INFO("rows " << rows << " keys " << keys << " D " << D << " per SM " << per_sm << " SMs " << sms << " -> "
                         << s);
            CHECK(s >= 1);
            CHECK((s == 1 || rows * s <= sms * per_sm));  // one wave
            CHECK((s == 1 || rows * s <= 1024));
            CHECK(s <= std::max(1, (keys + kn::kAttnTile - 1) / kn::kAttnTile));
          }
  // the occupancy the planner asks for: E2B's head dims run, others are not asked
  CHECK(kn::attention_blocks_per_sm(256, 8) >= 1);
  CHECK(kn::attention_blocks_per_sm(512, 8) >= 1);
  CHECK(kn::attention_blocks_per_sm(96, 8) == 0);
  CHECK(kn::attention_blocks_per_sm(256, 9) == 0);
}

// ---- attention.cuh: heads mode ----

// One layer of a decode pass for launch_attention_heads, on the host: every row a session of its own (the table
// order reversed), the q/k/v GEMV's fp32 output, the norms' weights, the RoPE table, and the caches before the
// pass. The launch reads (and on layers with a cache of their own writes) table column kLayer; column 0 must not
// change.
enum class HeadsLayer { Own, KeqV, Shared };  // own K and V; V from the k_proj output (k_eq_v); KV-shared: q only

struct HeadsCase {
  static constexpr int kLayers = 2, kLayer = 1;
  static constexpr float kEps = 1e-6f;
  int D = 0, rows = 0, heads = 0, kv_heads = 0, window = 0;
  HeadsLayer kind = HeadsLayer::Own;
  std::vector<float> q, k, v;                   // [rows, heads * D], [rows, kv_heads * D] fp32 (v = k: KeqV)
  std::vector<float> qw, kw, inv_freq;          // [D], [D], [D / 2] fp32
  std::vector<int> seq, pos, capacity;          // [rows], [rows], [seqs * layers]
  std::vector<std::vector<uint16_t>> k16, v16;  // [seqs * layers] -> [capacity, kv_heads, D] fp16, before

  bool writes() const { return kind != HeadsLayer::Shared; }
  const std::vector<float>& v_in() const { return kind == HeadsLayer::KeqV ? k : v; }
  int slot(int r) const { return pos[size_t(r)] % capacity[size_t(seq[size_t(r)] * kLayers + kLayer)]; }
};

// Positions: row 0 a first token (one key), row 1 inside the window / early, row 2 past a ring's capacity (its
// slot wrapped), the rest uniform; full layers' caches hold every position, rings window + 16 slots.
HeadsCase make_heads_case(std::mt19937& rng, int D, int group, int kv_heads, int rows, int window, HeadsLayer kind) {
  constexpr int kMaxPos = 300;
  HeadsCase c;
  c.D = D;
  c.rows = rows;
  c.kv_heads = kv_heads;
  c.heads = kv_heads * group;
  c.window = window;
  c.kind = kind;
  const int ring = window + 16;
  std::uniform_int_distribution<int> upos(1, window ? 3 * ring : kMaxPos);
  for (int r = 0; r < rows; ++r) {
    c.seq.push_back(rows - 1 - r);
    c.pos.push_back(r == 0   ? 0
                    : r == 1 ? (window ? window / 2 + 3 : 40)
                    : r == 2 ? (window ? 2 * ring + 7 : kMaxPos)
                             : upos(rng));
  }
  c.capacity.assign(size_t(rows) * HeadsCase::kLayers, 0);
  for (int s = 0; s < rows; ++s) {
    c.capacity[size_t(s) * HeadsCase::kLayers] = 5 + s;  // column 0: never read nor written
    c.capacity[size_t(s) * HeadsCase::kLayers + HeadsCase::kLayer] = window ? ring : kMaxPos + 1;
  }
  // Inputs as head_norm_rope's tests take them; weights small enough for soft scores (|q.k| ~ 2 at D = 512).
  c.q = rand_f32(rng, size_t(rows) * c.heads * D, -20.f, 20.f);
  c.k = rand_f32(rng, size_t(rows) * kv_heads * D, -20.f, 20.f);
  c.v = rand_f32(rng, size_t(rows) * kv_heads * D, -20.f, 20.f);
  c.qw = rand_f32(rng, size_t(D), -0.3f, 0.3f);
  c.kw = rand_f32(rng, size_t(D), -1.f, 1.f);
  // sliding layers rotate every pair; full layers as Gemma 4's proportional RoPE: a quarter, zeros after
  c.inv_freq = window ? make_inv_freq(D, D / 2, 1e4f, 1.f) : make_inv_freq(D, D / 8, 1e6f, 8.f);
  for (int cap : c.capacity) {
    c.k16.push_back(rand_f16(rng, size_t(cap) * kv_heads * D, -1.f, 1.f));
    c.v16.push_back(rand_f16(rng, size_t(cap) * kv_heads * D, -1.f, 1.f));
  }
  return c;
}

// The case on the device: inputs, caches (reset to the case's before every launch), q16 for the two-launch
// path, scratch for up to max_splits splits, zeroed arrival counters ([rows, kv_heads, head slices]).
struct HeadsDev {
  const HeadsCase& c;
  DevKvCaches kv;
  Dev<int> cap, seq, pos;
  Dev<float> q, k, v, qw, kw, inv;
  Dev<half> q16, out;  // [rows, heads, D] fp16
  Dev<float> part_o, part_ml;
  Dev<unsigned> counters;
  int max_splits;

  HeadsDev(const HeadsCase& c_, int max_splits_)
      : c(c_),
        kv(c_.k16, c_.v16),
        cap(c_.capacity.size()),
        seq(c_.seq.size()),
        pos(c_.pos.size()),
        q(c_.q.size()),
        k(c_.k.size()),
        v(c_.v.size()),
        qw(c_.qw.size()),
        kw(c_.kw.size()),
        inv(c_.inv_freq.size()),
        q16(c_.q.size()),
        out(c_.q.size()),
        part_o(c_.q.size() * size_t(max_splits_)),
        part_ml(size_t(c_.rows) * c_.heads * max_splits_ * 2),
        counters(size_t(c_.rows) * c_.heads),
        max_splits(max_splits_) {
    cap.upload(c.capacity);
    seq.upload(c.seq);
    pos.upload(c.pos);
    q.upload(c.q);
    k.upload(c.k);
    v.upload(c.v);
    qw.upload(c.qw);
    kw.upload(c.kw);
    inv.upload(c.inv_freq);
    counters.upload(std::vector<unsigned>(counters.size(), 0u));
  }

  void reset() {
    for (size_t i = 0; i < c.k16.size(); ++i) {
      kv.kc[i]->upload(c.k16[i]);
      kv.vc[i]->upload(c.v16[i]);
    }
    q16.poison();
    out.poison();
    part_o.poison();
    part_ml.poison();
  }

  kn::AttnArgs args(int head_split, int splits, bool with_counters) const {
    REQUIRE(splits <= max_splits);
    kn::AttnArgs a;
    a.q = q16.get();
    a.kbase = kv.kb->get();
    a.vbase = kv.vb->get();
    a.capacity = cap.get();
    a.seq = seq.get();
    a.pos = pos.get();
    a.layer = HeadsCase::kLayer;
    a.layers = HeadsCase::kLayers;
    a.rows = c.rows;
    a.heads = c.heads;
    a.kv_heads = c.kv_heads;
    a.window = c.window;
    a.splits = splits;
    a.head_split = head_split;
    a.late_keys = c.writes() ? 1 : 0;  // as LayerEncoder::attend sets it for decode passes
    a.part_o = part_o.get();
    a.part_ml = part_ml.get();
    a.out = out.get();
    a.counters = with_counters ? counters.get() : nullptr;
    return a;
  }

  kn::AttnHeads heads() const {
    kn::AttnHeads h;
    h.q = q.get();
    h.q_w = qw.get();
    h.inv_freq = inv.get();
    if (c.writes()) {
      h.k = k.get();
      h.v = c.kind == HeadsLayer::KeqV ? k.get() : v.get();
      h.k_w = kw.get();
    }
    h.eps = HeadsCase::kEps;
    return h;
  }

  // Today's two launches, as LayerEncoder::heads and ::attend make them.
  void two_launches(const kn::AttnArgs& a, const Stream& st) const {
    kn::KvTarget kt;
    kt.capacity = cap.get();
    kt.seq = seq.get();
    kt.layer = HeadsCase::kLayer;
    kt.layers = HeadsCase::kLayers;
    kn::HeadNormTarget t[3];
    t[0].in = q.get();
    t[0].ld_in = c.heads * c.D;
    t[0].heads = c.heads;
    t[0].w = qw.get();
    t[0].inv_freq = inv.get();
    t[0].out = q16.get();
    t[1].in = k.get();
    t[1].ld_in = c.kv_heads * c.D;
    t[1].heads = c.kv_heads;
    t[1].w = kw.get();
    t[1].inv_freq = inv.get();
    t[1].kv = kt;
    t[1].kv.base = kv.kb->get();
    t[2].in = c.kind == HeadsLayer::KeqV ? k.get() : v.get();
    t[2].ld_in = c.kv_heads * c.D;
    t[2].heads = c.kv_heads;
    t[2].kv = kt;
    t[2].kv.base = kv.vb->get();
    REQUIRE_CUDA(kn::launch_head_norm_rope_multi(t, c.writes() ? 3 : 1, c.rows, c.D, HeadsCase::kEps, pos.get(), st.s));
    REQUIRE_CUDA(kn::launch_attention(a, c.D, st.s));
  }

  struct State {
    std::vector<uint16_t> out;                // [rows, heads, D] fp16 bits
    std::vector<std::vector<uint16_t>> k, v;  // the caches
  };
  State state(const std::string& what) const {
    State s;
    s.out = out.download<uint16_t>();
    for (size_t i = 0; i < c.k16.size(); ++i) {
      s.k.push_back(kv.kc[i]->download<uint16_t>());
      s.v.push_back(kv.vc[i]->download<uint16_t>());
    }
    const std::vector<unsigned> cnt = counters.download<unsigned>();
    INFO(what << ": every arrival counter back at zero");
    REQUIRE(size_t(std::count(cnt.begin(), cnt.end(), 0u)) == cnt.size());
    return s;
  }
};

// The host's side of a case: q heads and the rows' own K / V as the kernels round them (norm + RoPE, fp16), the
// caches after the pass, and attention_ref over them.
struct HeadsRef {
  AttnHost h;
  std::vector<double> out;
  std::vector<std::vector<float>> own_k, own_v;  // [rows] -> [kv_heads * D] (writes() only)
};

HeadsRef heads_ref(const HeadsCase& c) {
  HeadsRef r;
  AttnHost& a = r.h;
  const int D = c.D;
  a.D = D;
  a.rows = c.rows;
  a.heads = c.heads;
  a.kv_heads = c.kv_heads;
  a.window = c.window;
  a.layer = HeadsCase::kLayer;
  a.layers = HeadsCase::kLayers;
  a.capacity = c.capacity;
  a.seq = c.seq;
  a.pos = c.pos;
  auto rounded = [](std::vector<float> t) {
    for (float& x : t) x = f16_to_f32(f32_to_f16_sat(x));
    return t;
  };
  a.q.resize(c.q.size());
  for (int i = 0; i < c.rows * c.heads; ++i) {
    const std::vector<float> t = rounded(head_norm_rope_ref(&c.q[size_t(i) * D], D, c.qw.data(), HeadsCase::kEps,
                                                            c.inv_freq.data(), c.pos[size_t(i / c.heads)]));
    std::copy(t.begin(), t.end(), a.q.begin() + std::ptrdiff_t(size_t(i) * D));
  }
  for (size_t i = 0; i < c.k16.size(); ++i) {
    a.k.push_back(widen(c.k16[i]));
    a.v.push_back(widen(c.v16[i]));
  }
  if (c.writes()) {
    for (int row = 0; row < c.rows; ++row) {
      const size_t idx = size_t(c.seq[size_t(row)] * HeadsCase::kLayers + HeadsCase::kLayer);
      std::vector<float> ok, ov;
      for (int g = 0; g < c.kv_heads; ++g) {
        const size_t in = (size_t(row) * c.kv_heads + g) * D, at = (size_t(c.slot(row)) * c.kv_heads + g) * D;
        const std::vector<float> kr = rounded(
            head_norm_rope_ref(&c.k[in], D, c.kw.data(), HeadsCase::kEps, c.inv_freq.data(), c.pos[size_t(row)]));
        const std::vector<float> vr =
            rounded(head_norm_rope_ref(&c.v_in()[in], D, nullptr, HeadsCase::kEps, nullptr, 0));
        std::copy(kr.begin(), kr.end(), a.k[idx].begin() + std::ptrdiff_t(at));
        std::copy(vr.begin(), vr.end(), a.v[idx].begin() + std::ptrdiff_t(at));
        ok.insert(ok.end(), kr.begin(), kr.end());
        ov.insert(ov.end(), vr.begin(), vr.end());
      }
      r.own_k.push_back(ok);
      r.own_v.push_back(ov);
    }
  }
  r.out = attention_ref(a);
  return r;
}

// After a heads-mode launch: (a) every output bit and every cache bit equal to the two launches', and no cache half
// outside the rows' own slots (column kLayer, layers that own their cache) changed; (b) out and the own slots
// against the host.
void check_heads(const HeadsCase& c, const HeadsRef& ref, const HeadsDev::State& two, const HeadsDev::State& one,
                 const std::string& what) {
  {
    size_t diff = 0;
    for (size_t i = 0; i < two.out.size(); ++i) diff += two.out[i] != one.out[i];
    INFO(what << ": " << diff << " of " << two.out.size() << " output halves differ from the two launches'");
    REQUIRE(diff == 0);
  }
  const size_t hd = size_t(c.kv_heads) * c.D;
  std::vector<float> got;
  std::vector<double> want;
  for (size_t idx = 0; idx < c.k16.size(); ++idx)
    for (int kv = 0; kv < 2; ++kv) {
      const std::vector<uint16_t>& a = kv ? two.v[idx] : two.k[idx];
      const std::vector<uint16_t>& b = kv ? one.v[idx] : one.k[idx];
      const std::vector<uint16_t>& before = kv ? c.v16[idx] : c.k16[idx];
      size_t diff = 0, stray = 0;
      for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
      int own_slot = -1, own_row = -1;  // the row of this sequence writes one slot of column kLayer
      for (int r = 0; r < c.rows; ++r)
        if (c.writes() && size_t(c.seq[size_t(r)] * HeadsCase::kLayers + HeadsCase::kLayer) == idx)
          own_slot = c.slot(r), own_row = r;
      for (size_t i = 0; i < b.size(); ++i)
        if (int(i / hd) != own_slot) stray += b[i] != before[i];
      INFO(what << ": cache " << idx << (kv ? " V" : " K") << ": " << diff << " halves differ from the two launches', "
                << stray << " changed outside the row's own slot");
      REQUIRE(diff == 0);
      REQUIRE(stray == 0);
      if (own_row >= 0) {
        const std::vector<float>& o = kv ? ref.own_v[size_t(own_row)] : ref.own_k[size_t(own_row)];
        for (size_t i = 0; i < hd; ++i) {
          got.push_back(f16_to_f32(b[size_t(own_slot) * hd + i]));
          want.push_back(o[i]);
        }
      }
    }
  if (c.writes()) {
    REQUIRE(got.size() == size_t(c.rows) * hd * 2);
    check_rel_l2(got, want, kTolF16, what + ": the rows' own K and V");
  }
  check_rel_l2(widen(one.out), ref.out, kTolF16, what + ": out");
}

// Every head slicing that divides the group and the splits a decode pass takes (the policy's, one, and past what
// the fused merge takes: a second launch), with and without merge counters where the merge could fuse.
void heads_sweep(std::mt19937& rng, int D, int group, int kv_heads, int rows, int window, HeadsLayer kind, int sms) {
  const HeadsCase c = make_heads_case(rng, D, group, kv_heads, rows, window, kind);
  const HeadsRef ref = heads_ref(c);
  const int keys = window ? window : *std::max_element(c.pos.begin(), c.pos.end()) + 1;
  const char* kinds[] = {"own K/V", "k_eq_v", "KV-shared"};
  HeadsDev dev(c, kn::attention_fused_splits(1, D) + 1);
  Stream st;
  for (int hs = 1; hs <= group && group % hs == 0; hs *= 2) {
    const int policy = kn::attention_splits_for(rows, kv_heads, group, D, keys, sms, 1024, hs);
    std::vector<std::pair<int, bool>> runs = {{1, false}, {policy, true}, {policy, false}};
    const int fused_max = kn::attention_fused_splits(group / hs, D);
    if (fused_max + 1 <= dev.max_splits && rows <= 3) runs.push_back({fused_max + 1, true});
    for (const auto& run : runs) {
      const int splits = std::min(run.first, dev.max_splits);
      const std::string what = cat("heads mode D ", D, " group ", group, " kv_heads ", kv_heads, " rows ", rows,
                                   " window ", window, " ", kinds[int(kind)], " head_split ", hs, " splits ", splits,
                                   " (", attn_merge_mode(splits, run.second, group, D, hs), ")");
      INFO(what);
      const kn::AttnArgs a = dev.args(hs, splits, run.second);
      dev.reset();
      dev.two_launches(a, st);
      st.sync();
      const HeadsDev::State two = dev.state(what + " (two launches)");
      dev.reset();
      REQUIRE_CUDA(kn::launch_attention_heads(a, dev.heads(), D, st.s));
      st.sync();
      const HeadsDev::State one = dev.state(what);
      check_heads(c, ref, two, one, what);
    }
  }
}

int device_sms() {
  int dev = 0, sms = 0;
  REQUIRE_CUDA(cudaGetDevice(&dev));
  REQUIRE_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

TEST_CASE("attention heads mode: E2B shapes equal head_norm_rope + attention bit for bit, and the host",
          "[gpu][attention_heads]") {
  std::mt19937 rng(501);
  const int sms = device_sms();
  // E2B: 8 query heads on one KV head; sliding layers D 256 (window 96 here: rings of 112 slots), full D 512
  for (int D : {256, 512})
    for (int window : {0, 96})
      for (HeadsLayer kind : {HeadsLayer::Own, HeadsLayer::KeqV, HeadsLayer::Shared})
        for (int rows : {1, 3, 9, 16}) heads_sweep(rng, D, 8, 1, rows, window, kind, sms);
}

TEST_CASE("attention heads mode: every head dim, padded groups, two KV heads", "[gpu][attention_heads]") {
  std::mt19937 rng(502);
  const int sms = device_sms();
  for (int D : {32, 64, 128, 256, 512})
    for (int group : {3, 2, 1})  // 3: padded to 4 query heads per block; 2 KV heads
      for (int window : {0, 24})
        for (HeadsLayer kind : {HeadsLayer::Own, HeadsLayer::Shared})
          heads_sweep(rng, D, group, 2, 3, window, kind, sms);
}

TEST_CASE("attention heads mode: the launcher refuses what the mode does not take before launching",
          "[gpu][attention_heads]") {
  Stream st;
  REQUIRE_CUDA(cudaGetLastError());
  kn::AttnArgs a;
  a.rows = 1;
  a.heads = 8;
  a.kv_heads = 1;
  kn::AttnHeads h;
  const float* p = reinterpret_cast<const float*>(uintptr_t(256));  // never dereferenced
  a.late_keys = 1;
  REQUIRE(kn::launch_attention_heads(a, h, 256, st.s) == cudaErrorInvalidValue);  // no q
  h.q = p;
  REQUIRE(kn::launch_attention_heads(a, h, 256, st.s) == cudaErrorInvalidValue);  // late_keys 1 without k
  h.k = p;
  REQUIRE(kn::launch_attention_heads(a, h, 256, st.s) == cudaErrorInvalidValue);  // k without v
  h.v = p;
  a.late_keys = 0;
  REQUIRE(kn::launch_attention_heads(a, h, 256, st.s) == cudaErrorInvalidValue);  // k with late_keys 0
  a.late_keys = -1;
  REQUIRE(kn::launch_attention_heads(a, h, 256, st.s) == cudaErrorInvalidValue);
  a.late_keys = 1;
  REQUIRE(kn::launch_attention_heads(a, h, 96, st.s) == cudaErrorInvalidValue);  // head dim
  a.rows = 0;
  REQUIRE_CUDA(kn::launch_attention_heads(a, h, 256, st.s));  // no rows: nothing
  st.sync();
  REQUIRE_CUDA(cudaGetLastError());  // nothing was launched
}

// ---- elementwise.cuh ----

TEST_CASE("embed: h[r] = float(E[id[r]]) * scale, exact", "[gpu]") {
  std::mt19937 rng(501);
  Stream st;
  constexpr int kVocab = 37;
  for (int H : {8, 24, 1544, 2056, 8960})  // 8960 = L * D of the PLE table rows on E2B
    for (int rows : {1, 3, 17}) {
      const std::vector<uint16_t> E = rand_f16(rng, size_t(kVocab) * H, -1.f, 1.f);  // [V, H] fp16
      std::vector<int> ids(static_cast<size_t>(rows));                               // [rows], repeats allowed
      std::uniform_int_distribution<int> uid(0, kVocab - 1);
      for (int& id : ids) id = uid(rng);
      ids[0] = kVocab - 1;  // the last table row
      const float scale = std::sqrt(float(H));
      Dev<half> dE(E.size());
      Dev<int> dids(ids.size());
      Dev<float> dh(size_t(rows) * H);  // [rows, H] fp32
      dE.upload(E);
      dids.upload(ids);
      dh.poison();
      REQUIRE_CUDA(kn::launch_embed(dE.get(), dids.get(), rows, H, scale, dh.get(), st.s));
      st.sync();
      const std::vector<float> h = dh.download<float>();
      size_t wrong = 0;
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < H; ++c)
          wrong += !(h[size_t(r) * H + c] == f16_to_f32(E[size_t(ids[size_t(r)]) * H + c]) * scale);
      INFO("embed H " << H << " rows " << rows << ": " << wrong << " floats differ");
      REQUIRE(wrong == 0);
    }
}

namespace {
// gather_rows of T (float or half, as raw bits: exact copies) at odd widths, row counts and strides.
template <typename T>
void check_gather_rows(std::mt19937& rng) {
  std::uniform_int_distribution<uint32_t> bits;
  Stream st;
  for (int width : {1, 7, 1536, 8960})  // 1536 = E2B's residual row, 8960 = its per-layer inputs (L * D)
    for (int rows : {1, 3, 33})
      for (bool indexed : {true, false}) {
        const size_t ld_src = size_t(width) + 5, ld_dst = size_t(width) + 3, src_rows = size_t(rows) * 2 + 1;
        using Bits = typename std::conditional<sizeof(T) == 4, uint32_t, uint16_t>::type;
        std::vector<Bits> src(src_rows * ld_src);
        for (Bits& v : src) v = Bits(bits(rng) & 0x3bff3bffu);  // finite values of either type
        std::vector<int> idx(static_cast<size_t>(rows));        // increasing, as the selected rows are, gaps between
        for (int r = 0; r < rows; ++r) idx[size_t(r)] = 2 * r + (r % 2);
        Dev<T> dsrc(src.size()), ddst(size_t(rows) * ld_dst);
        Dev<int> didx(idx.size());
        dsrc.upload(src);
        didx.upload(idx);
        ddst.poison();
        REQUIRE_CUDA(kn::launch_gather_rows(dsrc.get(), ld_src, indexed ? didx.get() : nullptr, rows, width, ddst.get(),
                                            ld_dst, st.s));
        st.sync();
        const std::vector<Bits> got = ddst.template download<Bits>();
        size_t wrong = 0;
        for (int r = 0; r < rows; ++r)
          for (size_t c = 0; c < ld_dst; ++c) {
            const size_t from = size_t(indexed ? idx[size_t(r)] : r) * ld_src + c;
            const Bits want = c < size_t(width) ? src[from] : Bits(~Bits(0));  // the poison: past width unwritten
            wrong += got[size_t(r) * ld_dst + c] != want;
          }
        INFO("gather_rows " << sizeof(T) * 8 << "-bit width " << width << " rows " << rows
                            << (indexed ? " indexed" : " in order") << ": " << wrong << " elements differ");
        REQUIRE(wrong == 0);
      }
}
}  // namespace

TEST_CASE("gather_rows: dst[r] = src[idx[r]] (idx null: src[r]), fp32 and fp16, exact, nothing past width written",
          "[gpu]") {
  std::mt19937 rng(502);
  check_gather_rows<float>(rng);
  check_gather_rows<half>(rng);
}

TEST_CASE("widen: raw bf16 / fp16 / fp32 bits -> fp32, bit-exact against the host loader", "[gpu]") {
  std::mt19937 rng(503);
  std::uniform_int_distribution<uint32_t> bits;
  Stream st;
  for (size_t n : {size_t(1), size_t(257), size_t(8960 * 3 + 1)})
    for (kn::RawFloat type : {kn::RawFloat::F32, kn::RawFloat::F16, kn::RawFloat::BF16}) {
      const size_t es = type == kn::RawFloat::F32 ? 4 : 2;
      std::vector<uint8_t> raw(n * es);
      for (uint8_t& b : raw) b = uint8_t(bits(rng));  // every bit pattern: NaN, inf, subnormals included
      Dev<uint8_t> dx(raw.size());
      Dev<float> dout(n);
      dx.upload(raw);
      dout.poison();
      REQUIRE_CUDA(kn::launch_widen(dx.get(), type, n, dout.get(), st.s));
      st.sync();
      const std::vector<uint32_t> got = dout.download<uint32_t>();
      gemma4_t4::detail::TensorInfo t;  // the host loader's view of the same bytes
      t.dtype = type == kn::RawFloat::F32   ? gemma4_t4::detail::DType::F32
                : type == kn::RawFloat::F16 ? gemma4_t4::detail::DType::F16
                                            : gemma4_t4::detail::DType::BF16;
      t.data = raw.data();
      size_t wrong = 0, first = 0;
      for (size_t i = 0; i < n; ++i) {
        const float want = gemma4_t4::detail::load_float(t, i);
        uint32_t wb;
        std::memcpy(&wb, &want, 4);
        const bool nan_both = std::isnan(want) && ((got[i] & 0x7f800000u) == 0x7f800000u && (got[i] & 0x7fffffu));
        if (got[i] != wb && !nan_both && wrong++ == 0) first = i;
      }
      INFO("widen type " << int(type) << " n " << n << ": " << wrong << " floats differ; first at " << first);
      REQUIRE(wrong == 0);
    }
}

TEST_CASE("to_half: saturating fp32 -> fp16, bit-exact", "[gpu]") {
  std::mt19937 rng(502);
  Stream st;
  for (size_t n : {size_t(1), size_t(255), size_t(256), size_t(257), size_t(10007)}) {
    std::vector<float> x = rand_f32(rng, n, -2.f, 2.f);  // [n] fp32
    const std::vector<float> big = rand_f32(rng, n, -1e5f, 1e5f);
    for (size_t i = 0; i < n; i += 3) x[i] = big[i];  // a third past or near the fp16 range
    if (n > 2) x[1] = INFINITY, x[2] = -INFINITY;
    Dev<float> dx(n);
    Dev<half> dout(n);
    dx.upload(x);
    dout.poison();
    REQUIRE_CUDA(kn::launch_to_half(dx.get(), n, dout.get(), st.s));
    st.sync();
    const std::vector<uint16_t> got = dout.download<uint16_t>();
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < n; ++i)
      if (got[i] != f32_to_f16_sat(x[i]) && wrong++ == 0) first = i;
    INFO("to_half n " << n << ": " << wrong << " halves differ; first at " << first << " (x " << x[first] << ")");
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("gelu_mul: half(gelu_tanh(g) * u)", "[gpu]") {
  std::mt19937 rng(503);
  Stream st;
  for (size_t n : {size_t(1), size_t(257), size_t(10007), size_t(3 * 6144 + 1)}) {
    const std::vector<float> g = rand_f32(rng, n, -6.f, 6.f), u = rand_f32(rng, n, -3.f, 3.f);  // [n] fp32
    Dev<float> dg(n), du(n);
    Dev<half> dout(n);
    dg.upload(g);
    du.upload(u);
    dout.poison();
    REQUIRE_CUDA(kn::launch_gelu_mul(dg.get(), du.get(), n, dout.get(), st.s));
    st.sync();
    std::vector<double> ref(n);
    for (size_t i = 0; i < n; ++i) ref[i] = double(gemma4_t4::detail::gelu_tanh_ref(g[i])) * u[i];
    check_rel_l2(widen(dout.download<uint16_t>()), ref, kTolF16, cat("gelu_mul n ", n));
  }
}

TEST_CASE("gelu_mul_rows: a joint gate/up GEMM's [rows, 2 I] output", "[gpu]") {
  std::mt19937 rng(509);
  Stream st;
  for (int rows : {1, 33, 300})
    for (int I : {1, 255, 6144}) {
      const size_t ld = 2 * size_t(I) + (I % 2);  // the joint layout (+1 column where I is odd: ld > 2 I taken too)
      const std::vector<float> y = rand_f32(rng, size_t(rows) * ld, -6.f, 6.f);
      Dev<float> dy(y.size());
      Dev<half> dout(size_t(rows) * I + 64);  // 64 halves past the rows: must stay poisoned
      dy.upload(y);
      dout.poison();
      REQUIRE_CUDA(kn::launch_gelu_mul_rows(dy.get(), dy.get() + I, ld, rows, I, dout.get(), st.s));
      st.sync();
      const std::vector<uint16_t> got = dout.download<uint16_t>();
      std::vector<double> ref(size_t(rows) * I);
      for (int r = 0; r < rows; ++r)
        for (int i = 0; i < I; ++i) {
          const float g = y[r * ld + i], u = y[r * ld + I + i];
          ref[size_t(r) * I + i] = double(gemma4_t4::detail::gelu_tanh_ref(g)) * u;
        }
      const std::vector<uint16_t> head(got.begin(), got.begin() + ref.size());
      check_rel_l2(widen(head), ref, kTolF16, cat("gelu_mul_rows rows ", rows, " I ", I));
      for (size_t i = ref.size(); i < got.size(); ++i) REQUIRE(got[i] == 0xFFFFu);  // past the rows: still poisoned
      // bit for bit the products of the one-element-per-thread kernel over the two halves copied apart, one float
      // past 16-byte alignment (the 4-wide kernel takes aligned rows only)
      std::vector<float> g(ref.size() + 1, 0.f), u(ref.size() + 1, 0.f);
      for (int r = 0; r < rows; ++r)
        for (int i = 0; i < I; ++i) {
          g[1 + size_t(r) * I + i] = y[r * ld + i];
          u[1 + size_t(r) * I + i] = y[r * ld + I + i];
        }
      Dev<float> dg(g.size()), du(u.size());
      Dev<half> dpacked(ref.size());
      dg.upload(g);
      du.upload(u);
      REQUIRE_CUDA(kn::launch_gelu_mul(dg.get() + 1, du.get() + 1, ref.size(), dpacked.get(), st.s));
      st.sync();
      REQUIRE(dpacked.download<uint16_t>() == head);
    }
  const float* none = nullptr;
  REQUIRE(kn::launch_gelu_mul_rows(none, none, 7, 2, 8, nullptr, st.s) == cudaErrorInvalidValue);  // ld < cols
  REQUIRE_CUDA(kn::launch_gelu_mul_rows(none, none, 8, 0, 8, nullptr, st.s));                      // no rows
}

TEST_CASE("gelu_mul_rows fp16: a joint gate/up GEMM's fp16 output, values past fp16 clamped", "[gpu]") {
  std::mt19937 rng(510);
  Stream st;
  const uint16_t kInf = 0x7C00u, kNegInf = 0xFC00u;
  for (int rows : {1, 33, 300})
    for (int I : {1, 255, 6144}) {
      const size_t ld = 2 * size_t(I) + (I % 2);
      std::vector<uint16_t> y = rand_f16(rng, size_t(rows) * ld, -6.f, 6.f);
      // a few infinities where a GEMM's fp16 output would overflow (gate and up, both signs)
      for (int k = 0; k < 4 && rows * I > 8; ++k) {
        const size_t r = size_t(k) % size_t(rows), i = size_t(k * 7) % size_t(I);
        y[r * ld + (k < 2 ? 0 : size_t(I)) + i] = (k & 1) ? kNegInf : kInf;
      }
      Dev<half> dy(y.size());
      Dev<half> dout(size_t(rows) * I + 64);
      dy.upload(y);
      dout.poison();
      REQUIRE_CUDA(kn::launch_gelu_mul_rows(dy.get(), dy.get() + I, ld, rows, I, dout.get(), st.s));
      st.sync();
      const std::vector<uint16_t> got = dout.download<uint16_t>();
      std::vector<double> ref(size_t(rows) * I);
      auto in = [](uint16_t h) { return std::min(std::max(f16_to_f32(h), -65504.f), 65504.f); };
      for (int r = 0; r < rows; ++r)
        for (int i = 0; i < I; ++i) {
          const double v = double(gemma4_t4::detail::gelu_tanh_ref(in(y[r * ld + i]))) * in(y[r * ld + I + i]);
          ref[size_t(r) * I + i] = std::min(std::max(v, -65504.0), 65504.0);  // the act saturates to fp16
        }
      const std::vector<uint16_t> head(got.begin(), got.begin() + ref.size());
      for (uint16_t h : head) REQUIRE(std::isfinite(f16_to_f32(h)));
      check_rel_l2(widen(head), ref, kTolF16, cat("gelu_mul_rows fp16 rows ", rows, " I ", I));
      for (size_t i = ref.size(); i < got.size(); ++i) REQUIRE(got[i] == 0xFFFFu);
      // the fp32 kernel on the same (clamped) values computes the same products bit for bit
      std::vector<float> y32(y.size());
      for (size_t i = 0; i < y.size(); ++i) y32[i] = in(y[i]);
      Dev<float> dy32(y32.size());
      Dev<half> d32(ref.size());
      dy32.upload(y32);
      REQUIRE_CUDA(kn::launch_gelu_mul_rows(dy32.get(), dy32.get() + I, ld, rows, I, d32.get(), st.s));
      st.sync();
      REQUIRE(d32.download<uint16_t>() == head);
    }
}

TEST_CASE("ple_combine: (rmsnorm(proj * pscale) * w + tok * tscale) * mix", "[gpu]") {
  std::mt19937 rng(504);
  Stream st;
  const float eps = 1e-6f, mix = float(1.0 / std::sqrt(2.0)), pscale = float(1.0 / std::sqrt(1536.0));
  for (int rows : {1, 3})
    for (int L : {1, 7})
      for (int D : {8, 24, 100, 256, 1000}) {  // 32-, 64- and 256-thread blocks
        const size_t n = size_t(rows) * L * D;
        const std::vector<float> proj = rand_f32(rng, n, -20.f, 20.f);   // [rows, L, D] fp32
        const std::vector<float> tok = rand_f32(rng, n, -0.05f, 0.05f);  // [rows, L, D] fp32
        const std::vector<float> w = rand_f32(rng, size_t(D), -2.f, 2.f);
        const float tscale = std::sqrt(float(D));
        Dev<float> dproj(n), dtok(n), dw(w.size()), dple(n);
        dproj.upload(proj);
        dtok.upload(tok);
        dw.upload(w);
        dple.poison();
        REQUIRE_CUDA(kn::launch_ple_combine(dproj.get(), dtok.get(), dw.get(), rows, L, D, pscale, tscale, mix, eps,
                                            dple.get(), st.s));
        st.sync();
        std::vector<double> ref(n);
        std::vector<float> c(static_cast<size_t>(D));
        for (size_t rl = 0; rl < size_t(rows) * L; ++rl) {
          for (int k = 0; k < D; ++k) c[size_t(k)] = proj[rl * D + k] * pscale;
          gemma4_t4::detail::rmsnorm_ref(c.data(), w.data(), D, eps, c.data());
          for (int k = 0; k < D; ++k) ref[rl * D + k] = (c[size_t(k)] + tok[rl * D + k] * tscale) * mix;
        }
        check_max_rel(dple.download<float>(), ref, kTolF32, cat("ple_combine rows ", rows, " L ", L, " D ", D));
      }
}

TEST_CASE("ple_gate: half(gelu_tanh(g) * ple[:, layer])", "[gpu]") {
  std::mt19937 rng(505);
  Stream st;
  constexpr int L = 7;
  for (int rows : {1, 3, 17})
    for (int D : {8, 256, 300})
      for (int layer : {0, 3, L - 1}) {
        const std::vector<float> g = rand_f32(rng, size_t(rows) * D, -6.f, 6.f);        // [rows, D] fp32
        const std::vector<float> ple = rand_f32(rng, size_t(rows) * L * D, -3.f, 3.f);  // [rows, L, D] fp32
        Dev<float> dg(g.size()), dple(ple.size());
        Dev<half> dout(size_t(rows) * D);  // [rows, D] fp16
        dg.upload(g);
        dple.upload(ple);
        dout.poison();
        REQUIRE_CUDA(kn::launch_ple_gate(dg.get(), dple.get(), rows, L, D, layer, dout.get(), st.s));
        st.sync();
        std::vector<double> ref(size_t(rows) * D);
        for (int r = 0; r < rows; ++r)
          for (int k = 0; k < D; ++k)
            ref[size_t(r) * D + k] =
                double(gemma4_t4::detail::gelu_tanh_ref(g[size_t(r) * D + k])) * ple[(size_t(r) * L + layer) * D + k];
        check_rel_l2(widen(dout.download<uint16_t>()), ref, kTolF16,
                     cat("ple_gate rows ", rows, " D ", D, " layer ", layer));
      }
}

// The consumers of a split-K int4 GEMM's partial tiles past 32 rows (layers.hpp mm_parts; gemm_w4.cuh keep_parts):
// head_norm_rope (a joint q/k/v product: three targets in one [rows, ld] buffer) and ple_gate add `parts` arrays in
// part order -- the sums the GEMM's reduce kernel writes -- so their outputs equal a launch on the host-summed input
// bit for bit (fp32 additions in the same order, on both sides).
TEST_CASE("head_norm_rope and ple_gate: partial tiles added in part order equal the summed input bit for bit",
          "[gpu]") {
  std::mt19937 rng(508);
  Stream st;
  constexpr int rows = 5, L = 3;
  for (int parts : {2, 3, 7}) {
    const auto summed = [&](const std::vector<float>& pa, size_t n) {  // ((p0 + p1) + p2) + ... in fp32
      std::vector<float> s(pa.begin(), pa.begin() + std::ptrdiff_t(n));
      for (int p = 1; p < parts; ++p)
        for (size_t i = 0; i < n; ++i) s[i] += pa[size_t(p) * n + i];
      return s;
    };
    for (int d : {64, 256}) {
      const int qh = 3, kvh = 1, ld = (qh + 2 * kvh) * d + 8;  // [q | k | v | padding] per row
      const size_t n = size_t(rows) * ld;
      const std::vector<float> pa = rand_f32(rng, n * parts, -2.f, 2.f);
      const std::vector<float> sum = summed(pa, n);
      const std::vector<float> qw = rand_f32(rng, size_t(d), 0.5f, 1.5f), kw = rand_f32(rng, size_t(d), 0.5f, 1.5f);
      const std::vector<float> inv = rand_f32(rng, size_t(d / 2), 0.f, 0.5f);
      const std::vector<int> pos = {0, 7, 100, 3, 511};
      Dev<float> dparts(pa.size()), dsum(sum.size()), dqw(qw.size()), dkw(kw.size()), dinv(inv.size());
      Dev<int> dpos(pos.size());
      dparts.upload(pa);
      dsum.upload(sum);
      dqw.upload(qw);
      dkw.upload(kw);
      dinv.upload(inv);
      dpos.upload(pos);
      std::vector<uint16_t> outs[2];
      for (int run = 0; run < 2; ++run) {
        Dev<half> out(size_t(rows) * (qh + 2 * kvh) * d);
        out.poison();
        const float* base = run == 0 ? dsum.get() : dparts.get();
        kn::HeadNormTarget t[3];
        t[0].in = base, t[0].ld_in = ld, t[0].heads = qh, t[0].w = dqw.get(), t[0].inv_freq = dinv.get();
        t[0].out = out.get();
        t[1].in = base + qh * d, t[1].ld_in = ld, t[1].heads = kvh, t[1].w = dkw.get(), t[1].inv_freq = dinv.get();
        t[1].out = out.get() + size_t(rows) * qh * d;
        t[2].in = base + (qh + kvh) * d, t[2].ld_in = ld, t[2].heads = kvh;
        t[2].out = out.get() + size_t(rows) * (qh + kvh) * d;
        REQUIRE_CUDA(kn::launch_head_norm_rope_multi(t, 3, rows, d, 1e-6f, dpos.get(), st.s, run == 0 ? 1 : parts,
                                                     run == 0 ? 0 : n));
        st.sync();
        outs[run] = out.download<uint16_t>();
      }
      INFO("head_norm_rope d " << d << ", " << parts << " parts");
      REQUIRE(outs[0] == outs[1]);
    }
    for (int D : {256, 300}) {
      const size_t n = size_t(rows) * D;
      const std::vector<float> pa = rand_f32(rng, n * parts, -3.f, 3.f);
      const std::vector<float> sum = summed(pa, n);
      const std::vector<float> ple = rand_f32(rng, size_t(rows) * L * D, -3.f, 3.f);
      Dev<float> dparts(pa.size()), dsum(sum.size()), dple(ple.size());
      dparts.upload(pa);
      dsum.upload(sum);
      dple.upload(ple);
      std::vector<uint16_t> outs[2];
      for (int run = 0; run < 2; ++run) {
        Dev<half> out(n);
        out.poison();
        REQUIRE_CUDA(kn::launch_ple_gate(run == 0 ? dsum.get() : dparts.get(), dple.get(), rows, L, D, 1, out.get(),
                                         st.s, run == 0 ? 1 : parts, run == 0 ? 0 : n));
        st.sync();
        outs[run] = out.download<uint16_t>();
      }
      INFO("ple_gate D " << D << ", " << parts << " parts");
      REQUIRE(outs[0] == outs[1]);
    }
  }
  // parts past part_ld's reach are refused before launching
  REQUIRE(kn::launch_ple_gate(nullptr, nullptr, rows, L, 8, 0, nullptr, st.s, 2, 8) == cudaErrorInvalidValue);
  kn::HeadNormTarget t;
  t.heads = 1;
  REQUIRE(kn::launch_head_norm_rope_multi(&t, 1, rows, 64, 1e-6f, nullptr, st.s, 2, 0) == cudaErrorInvalidValue);
}

TEST_CASE("softcap: x = tanh(x / cap) * cap in place; cap <= 0 leaves x alone", "[gpu]") {
  std::mt19937 rng(506);
  Stream st;
  for (size_t n : {size_t(1), size_t(257), size_t(10007), size_t(4096), size_t(2) * 262144})
    for (float cap : {30.f, 0.f, -1.f}) {
      const std::vector<float> x = rand_f32(rng, n, -200.f, 200.f);  // [n] fp32
      Dev<float> dx(n);
      dx.upload(x);
      REQUIRE_CUDA(kn::launch_softcap(dx.get(), n, cap, st.s));  // n % 4 == 0: 4 per thread
      st.sync();
      const std::vector<float> got = dx.download<float>();
      if (cap > 0.f) {
        std::vector<double> ref(n);
        for (size_t i = 0; i < n; ++i) ref[i] = std::tanh(double(x[i]) / cap) * cap;
        check_max_rel(got, ref, kTolF32, cat("softcap n ", n, " cap ", cap));
        // bit for bit the one-per-thread kernel's values: the same row one float past 16-byte alignment
        std::vector<float> x1(n + 1, 0.f);
        std::copy(x.begin(), x.end(), x1.begin() + 1);
        Dev<float> dx1(n + 1);
        dx1.upload(x1);
        REQUIRE_CUDA(kn::launch_softcap(dx1.get() + 1, n, cap, st.s));
        st.sync();
        const std::vector<float> got1 = dx1.download<float>();
        INFO("softcap n " << n << ": 4-wide and 1-wide kernels");
        REQUIRE(std::memcmp(got1.data() + 1, got.data(), n * sizeof(float)) == 0);
      } else {
        INFO("softcap n " << n << " cap " << cap << " must be a no-op");
        REQUIRE(std::memcmp(got.data(), x.data(), n * sizeof(float)) == 0);
      }
    }
}

TEST_CASE("argmax_rows: first index of the row maximum, exact", "[gpu]") {
  std::mt19937 rng(507);
  Stream st;
  for (int V : {1, 7, 255, 256, 257, 1000, 262145})
    for (int rows : {1, 3, 17}) {
      std::vector<float> x = rand_f32(rng, size_t(rows) * V, -10.f, 10.f);  // [rows, V] fp32
      std::uniform_int_distribution<int> ui(0, V - 1);
      for (int r = 0; r < rows; ++r) {
        float* xr = &x[size_t(r) * V];
        switch (r % 5) {
          case 0: break;  // random
          case 1:         // the maximum 1..3 times: the first wins
            for (int t = 0; t <= r % 3; ++t) xr[ui(rng)] = 20.f + r;
            break;
          case 2: xr[V - 1] = 100.f; break;                 // at the end
          case 3: std::fill(xr, xr + V, 1.5f); break;       // all equal: 0
          case 4: std::fill(xr, xr + V, -INFINITY); break;  // nothing beats -inf: 0
        }
      }
      Dev<float> dx(x.size());
      Dev<int> dout(static_cast<size_t>(rows));  // [rows] int
      dx.upload(x);
      dout.poison();
      REQUIRE_CUDA(kn::launch_argmax_rows(dx.get(), rows, V, dout.get(), st.s));
      st.sync();
      const std::vector<int> got = dout.download<int>();
      for (int r = 0; r < rows; ++r) {
        INFO("argmax_rows V " << V << " rows " << rows << " row " << r);
        REQUIRE(got[size_t(r)] == gemma4_t4::argmax(&x[size_t(r) * V], size_t(V)));
      }
    }
}

// The sampling kernel's greedy path (temperature <= 0 or top_k == 1): one pass, 16-byte loads when the row
// allows them (V % 4 == 0), scalar otherwise; the same first-index-of-the-maximum as gemma4_t4::argmax, after the
// repetition penalty.
TEST_CASE("sample_kernel greedy: first index of the row maximum after the penalty, exact", "[gpu]") {
  std::mt19937 rng(509);
  Stream st;
  for (int V : {1, 7, 256, 1000, 1001, 262144, 262145})
    for (int rows : {1, 6}) {
      std::vector<float> x = rand_f32(rng, size_t(rows) * V, -10.f, 10.f);  // [rows, V] fp32
      std::uniform_int_distribution<int> ui(0, V - 1);
      std::vector<kn::SampleParams> params(static_cast<size_t>(rows));
      std::vector<int> seen;
      for (int r = 0; r < rows; ++r) {
        float* xr = &x[size_t(r) * V];
        kn::SampleParams& p = params[size_t(r)];
        p.temperature = r % 2 ? 0.f : 0.8f;
        p.top_k = r % 2 ? 0 : 1;  // both spellings of greedy
        switch (r) {
          case 1:  // the maximum 1..3 times: the first wins
            for (int t = 0; t < 3; ++t) xr[ui(rng)] = 20.f;
            break;
          case 2: xr[V - 1] = 100.f; break;            // at the end
          case 3: std::fill(xr, xr + V, 1.5f); break;  // all equal: 0
          case 4: std::fill(xr, xr + V, -INFINITY); break;
          case 5:  // the penalty (1.5) demotes the top ids seen: the next best wins
            p.penalty = 1.5f;
            p.seen_offset = int(seen.size());
            for (int t = 0; t < std::min(V, 4); ++t) {  // distinct ids, as the engine passes them
              const int id = int((size_t(t) * 7919 + 13) % size_t(V));
              xr[id] = 15.f - t;
              seen.push_back(id);
            }
            p.seen_count = int(seen.size()) - p.seen_offset;
            break;
          default: break;
        }
      }
      std::vector<float> want = x;  // the reference: penalty as sampler.hpp applies it, then argmax
      for (int r = 0; r < rows; ++r) {
        const kn::SampleParams& p = params[size_t(r)];
        for (int i = 0; i < p.seen_count; ++i) {
          float& v = want[size_t(r) * V + size_t(seen[size_t(p.seen_offset + i)])];
          v = v > 0.f ? v / p.penalty : v * p.penalty;
        }
      }
      Dev<float> dx(x.size());
      Dev<kn::SampleParams> dp(params.size());
      Dev<int> dseen(std::max<size_t>(seen.size(), 1)), dout(static_cast<size_t>(rows));
      dx.upload(x);
      dp.upload(params);
      if (!seen.empty()) dseen.upload(seen);
      dout.poison();
      REQUIRE_CUDA(kn::launch_sample(dx.get(), rows, V, dp.get(), dseen.get(), dout.get(), st.s));
      st.sync();
      const std::vector<int> got = dout.download<int>();
      for (int r = 0; r < rows; ++r) {
        INFO("sample_kernel greedy V " << V << " row " << r);
        REQUIRE(got[size_t(r)] == gemma4_t4::argmax(&want[size_t(r) * V], size_t(V)));
      }
    }
}

// ---- sampling: the candidate path, the full-row path and the CPU sampler ----

// One parameter set of the sampling tests.
struct SampleCase {
  const char* name;
  float temperature;
  int top_k;
  float top_p, min_p, penalty;
  bool ties;  // a group of equal logits holds the top-k threshold: more than kSampleCand keys >= it where V allows
};

const SampleCase kSampleCases[] = {
    {"Gemma defaults: T 1, top-k 64, top-p 0.95", 1.f, 64, 0.95f, 0.f, 1.f, false},
    {"T 0.7, top-k 40, top-p 0.5", 0.7f, 40, 0.5f, 0.f, 1.f, false},
    {"top-k 64 on a tie group (candidate overflow)", 1.f, 64, 0.95f, 0.f, 1.f, true},
    {"top-p 0.9 alone", 1.f, 0, 0.9f, 0.f, 1.f, false},
    {"min-p 0.05, top-k 64", 1.f, 64, 1.f, 0.05f, 1.f, false},
    {"repetition penalty 1.3", 1.f, 64, 0.95f, 0.f, 1.3f, false},
    {"T 1.5, top-k 500, top-p 0.9 (block-sum top-p)", 1.5f, 500, 0.9f, 0.f, 1.f, false},
    {"top-k 1000, top-p 0.95 (radix passes)", 1.f, 1000, 0.95f, 0.f, 1.f, false},
    {"top-k 2000, top-p 0.95 (above kSampleCand)", 1.f, 2000, 0.95f, 0.f, 1.f, false},
    {"T 0.01", 0.01f, 64, 0.95f, 0.f, 1.f, false},
};

// One launch's rows: logits ~ N(0, 2.5^2) (a spread of several units, so decisions rarely sit on a float
// boundary), parameters, seen ids (sorted, unique per row, as the engine passes them).
struct SampleBatch {
  int V = 0, rows = 0;
  std::vector<float> x;                  // [rows, V] fp32
  std::vector<kn::SampleParams> params;  // [rows]
  std::vector<int> seen;                 // every row's seen ids
};

SampleBatch make_sample_batch(std::mt19937& rng, int V, int rows, const SampleCase& c, uint64_t seed) {
  SampleBatch b;
  b.V = V;
  b.rows = rows;
  b.x.resize(size_t(rows) * V);
  b.params.resize(size_t(rows));
  std::normal_distribution<float> nd(0.f, 2.5f);
  for (int r = 0; r < rows; ++r) {
    float* xr = &b.x[size_t(r) * V];
    for (int i = 0; i < V; ++i) xr[i] = nd(rng);
    if (c.ties) {  // a few distinct logits above min(1500, V / 2) equal ones, every other logit below them
      std::vector<int> perm(static_cast<size_t>(V));
      for (int i = 0; i < V; ++i) perm[size_t(i)] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      const int high = std::min(40, V / 8), tied = std::min(1500, V / 2);
      for (int t = 0; t < V; ++t) {
        float& v = xr[perm[size_t(t)]];
        v = t < high ? 14.f + 0.05f * float(t) : t < high + tied ? 12.5f : std::min(v, 12.f);
      }
    }
    kn::SampleParams& p = b.params[size_t(r)];
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.penalty = c.penalty;
    p.seed = seed + uint64_t(r);
    p.counter = 1000 + 7 * uint64_t(r);
    p.seen_offset = int(b.seen.size());
    if (c.penalty != 1.f) {  // the 10 largest logits (the penalty moves the draw) and 20 random ids
      std::vector<int> ids(static_cast<size_t>(V));
      for (int i = 0; i < V; ++i) ids[size_t(i)] = i;
      const int top = std::min(V, 10);
      std::partial_sort(ids.begin(), ids.begin() + top, ids.end(), [&](int a, int e) { return xr[a] > xr[e]; });
      std::vector<int> s(ids.begin(), ids.begin() + top);
      std::uniform_int_distribution<int> ui(0, V - 1);
      for (int t = 0; t < 20; ++t) s.push_back(ui(rng));
      std::sort(s.begin(), s.end());
      s.erase(std::unique(s.begin(), s.end()), s.end());
      b.seen.insert(b.seen.end(), s.begin(), s.end());
    }
    p.seen_count = int(b.seen.size()) - p.seen_offset;
  }
  return b;
}

gemma4_t4::SamplingOptions sampling_options(const kn::SampleParams& p) {
  gemma4_t4::SamplingOptions o;
  o.temperature = p.temperature;
  o.top_k = p.top_k;
  o.top_p = p.top_p;
  o.min_p = p.min_p;
  o.repetition_penalty = p.penalty;
  o.seed = p.seed;
  return o;
}

// The kernel's tokens for a batch (the logits are uploaded afresh: the penalty changes them in place).
std::vector<int> run_sample(const SampleBatch& b, const Stream& st) {
  Dev<float> dx(b.x.size());
  Dev<kn::SampleParams> dp(b.params.size());
  Dev<int> dseen(std::max<size_t>(b.seen.size(), 1)), dout(static_cast<size_t>(b.rows));  // [rows] int
  dx.upload(b.x);
  dp.upload(b.params);
  if (!b.seen.empty()) dseen.upload(b.seen);
  dout.poison();
  REQUIRE_CUDA(kn::launch_sample(dx.get(), b.rows, b.V, dp.get(), dseen.get(), dout.get(), st.s));
  st.sync();
  return dout.download<int>();
}

// The CPU sampler's token for one row, and how far its decisions lie from a float boundary: the min-p
// threshold from the nearest logit (relative, where min-p is the binding threshold), the top-p target from
// the cumulative masses of the groups of equal logits on either side (relative to the mass), u from the ends
// of the drawn token's share (relative to the total). The kernel sums in float (__expf, other orders), so it
// may decide otherwise only where a margin is at rounding level.
struct RefSample {
  int token = -1;
  double minp = 1.0, cut = 1.0, draw = 1.0;
};

RefSample ref_sample(const SampleBatch& b, int r) {
  namespace d = gemma4_t4::detail;
  const kn::SampleParams& p = b.params[size_t(r)];
  const gemma4_t4::SamplingOptions o = sampling_options(p);
  const int V = b.V;
  const int32_t* seen = b.seen.data() + p.seen_offset;
  std::vector<float> x(b.x.begin() + ptrdiff_t(r) * V, b.x.begin() + ptrdiff_t(r + 1) * V);
  RefSample out;
  std::vector<float> y = x;
  out.token = d::sample_ref(y.data(), V, o, seen, size_t(p.seen_count), p.counter);
  d::apply_repetition_penalty(x.data(), seen, size_t(p.seen_count), o.repetition_penalty);
  const float T = o.temperature, m = *std::max_element(x.begin(), x.end());
  float thr = -INFINITY, kth = -INFINITY;
  if (o.top_k > 0 && o.top_k < V) {
    std::vector<float> v = x;
    std::nth_element(v.begin(), v.begin() + (o.top_k - 1), v.end(), std::greater<float>());
    kth = v[size_t(o.top_k - 1)];
  }
  if (o.min_p > 0.f) {
    const float t = m + T * std::log(o.min_p);
    if (t > kth) {
      double near = INFINITY;
      for (float v : x) near = std::min(near, std::fabs(double(v) - double(t)));
      out.minp = near / std::max(1.0, std::fabs(double(t)));
    }
    thr = std::max(thr, t);
  }
  thr = std::max(thr, kth);
  if (o.top_p < 1.f) {
    std::vector<float> kept;
    for (float v : x)
      if (v >= thr) kept.push_back(v);
    std::sort(kept.begin(), kept.end(), std::greater<float>());
    double z0 = 0.0;
    for (float v : kept) z0 += std::exp(double(v - m) / T);
    const double target = double(o.top_p) * z0;
    double cum = 0.0;
    for (size_t i = 0; i < kept.size();) {
      size_t j = i;
      double g = 0.0;
      for (; j < kept.size() && kept[j] == kept[i]; ++j) g += std::exp(double(kept[j] - m) / T);
      if (cum + g >= target) {  // the first group has no group above it to take the cut instead
        out.cut = (i == 0 ? cum + g - target : std::min(cum + g - target, target - cum)) / z0;
        thr = std::max(thr, kept[i]);
        break;
      }
      cum += g;
      i = j;
    }
  }
  double z = 0.0;
  for (float v : x)
    if (v >= thr) z += std::exp(double(v - m) / T);
  const double u = d::uniform01(o.seed, p.counter) * z;
  double cum = 0.0;
  for (int i = 0; i < V; ++i)
    if (x[size_t(i)] >= thr) {
      const double before = cum;
      cum += std::exp(double(x[size_t(i)] - m) / T);
      if (cum > u) {
        out.draw = std::min(u - before, cum - u) / z;
        REQUIRE(i == out.token);  // this walk is sample_ref's
        break;
      }
    }
  return out;
}

constexpr double kMinpMargin = 1e-6;  // ~16 ulps: logf on the device vs std::log on the host
constexpr double kMassMargin = 3e-5;  // float sums of __expf over up to ~1e5 kept ids, in the kernel's orders

bool away_from_boundary(const RefSample& r) {
  return r.minp >= kMinpMargin && r.cut >= kMassMargin && r.draw >= kMassMargin;
}
constexpr int kSampleSizes[] = {262144, 1000, 4099, 64};  // 4099: odd rows, scalar loads; 64, 1000: all candidates

// Every path of the non-greedy kernel: candidates found in pass 2, after radix passes, candidate overflow
// (ties) into the full-row path, top-k above kSampleCand, no top-k; top-p by per-candidate sums and by block
// sums; min-p; the penalty. Where no decision is at rounding level the token is the CPU sampler's.
TEST_CASE("sample_kernel: sampled tokens equal the CPU sampler's away from float boundaries", "[gpu]") {
  std::mt19937 rng(513);
  Stream st;
  int checked = 0, total = 0;
  for (int V : kSampleSizes)
    for (const SampleCase& c : kSampleCases) {
      const SampleBatch b = make_sample_batch(rng, V, 8, c, 77);
      const std::vector<int> got = run_sample(b, st);
      for (int r = 0; r < b.rows; ++r) {
        const RefSample ref = ref_sample(b, r);
        INFO("sample_kernel V " << V << ", " << c.name << ", row " << r << ": got " << got[size_t(r)]
                                << ", CPU sampler " << ref.token << "; margins min-p " << ref.minp << ", top-p "
                                << ref.cut << ", draw " << ref.draw);
        REQUIRE(got[size_t(r)] >= 0);
        REQUIRE(got[size_t(r)] < V);
        ++total;
        if (away_from_boundary(ref)) {
          ++checked;
          REQUIRE(got[size_t(r)] == ref.token);
        }
      }
    }
  INFO(checked << " of " << total << " draws away from a float boundary");
  REQUIRE(checked >= total * 3 / 4);  // top-p alone keeps thousands of ids: its cut is often at rounding level
}

// Rows at the edges of the algorithm: nothing above -inf, every logit equal (ties overflow the candidates),
// T near 0, top-p 0 (keeps the top key), top-k at the candidate capacity and just above it, half the row
// -inf (the per-thread maxima bound is weak). Both paths draw the same token, the CPU sampler's where no
// decision is at rounding level (262144 equal logits: u's float rounding alone moves it by ~0.01 ids).
TEST_CASE("sample_kernel: edge rows draw the same token on both paths, the CPU sampler's", "[gpu]") {
  struct Edge {
    const char* name;
    int V;
    float temperature;
    int top_k;
    float top_p;
    int fill;  // 0 N(0, 2.5^2), 1 all -inf, 2 all 1.5, 3 odd ids -inf
  };
  const Edge edges[] = {
      {"all -inf", 262144, 1.f, 64, 0.95f, 1},     {"all -inf", 4099, 1.f, 64, 0.95f, 1},
      {"all -inf", 64, 1.f, 64, 0.95f, 1},         {"all -inf, top-p alone", 262144, 1.f, 0, 0.9f, 1},
      {"all equal", 262144, 1.f, 64, 0.95f, 2},    {"all equal", 1000, 1.f, 64, 0.95f, 2},
      {"T 1e-30", 262144, 1e-30f, 64, 0.95f, 0},   {"top-p 0", 262144, 1.f, 64, 0.f, 0},
      {"top-p 0", 1000, 1.f, 0, 0.f, 0},           {"top-k V - 1", 1000, 1.f, 999, 0.95f, 0},
      {"top-k 1024", 262144, 1.f, 1024, 0.95f, 0}, {"top-k 1025", 262144, 1.f, 1025, 0.95f, 0},
      {"top-k 1024", 1025, 1.f, 1024, 0.95f, 0},   {"half -inf", 262144, 1.f, 64, 0.95f, 3},
  };
  std::mt19937 rng(516);
  Stream st;
  for (const Edge& e : edges) {
    SampleBatch b;
    b.V = e.V;
    b.rows = 4;
    b.x.resize(size_t(b.rows) * e.V);
    b.params.resize(size_t(b.rows));
    std::normal_distribution<float> nd(0.f, 2.5f);
    for (size_t i = 0; i < b.x.size(); ++i) {
      const float v = nd(rng);
      b.x[i] = e.fill == 1 || (e.fill == 3 && i % 2 == 1) ? -INFINITY : e.fill == 2 ? 1.5f : v;
    }
    for (int r = 0; r < b.rows; ++r) {
      kn::SampleParams& p = b.params[size_t(r)];
      p.temperature = e.temperature;
      p.top_k = e.top_k;
      p.top_p = e.top_p;
      p.seed = 5 + uint64_t(r);
      p.counter = 11 * uint64_t(r);
    }
    const std::vector<int> got = run_sample(b, st);
    for (int r = 0; r < b.rows; ++r) {
      const RefSample ref = ref_sample(b, r);
      INFO("sample_kernel edge: " << e.name << ", V " << e.V << ", row " << r << ": kernel " << got[size_t(r)]
                                  << ", CPU sampler " << ref.token << "; margins min-p " << ref.minp << ", top-p "
                                  << ref.cut << ", draw " << ref.draw);
      REQUIRE(got[size_t(r)] >= 0);
      REQUIRE(got[size_t(r)] < b.V);
      if (away_from_boundary(ref)) REQUIRE(got[size_t(r)] == ref.token);
    }
  }
}

TEST_CASE("sample_kernel: the same logits and parameters give the same token on every run", "[gpu]") {
  std::mt19937 rng(514);
  Stream st;
  for (int V : {262144, 4099, 1000})
    for (const SampleCase& c : kSampleCases) {
      const SampleBatch b = make_sample_batch(rng, V, 16, c, 91);
      const std::vector<int> first = run_sample(b, st);
      for (int rep = 0; rep < 2; ++rep) {
        INFO("sample_kernel V " << V << ", " << c.name << ", run " << rep + 2);
        REQUIRE(run_sample(b, st) == first);
      }
    }
}

// ---- launchers: empty work and refused shapes ----

TEST_CASE("launchers: empty work is a no-op, unsupported shapes are refused before any launch", "[gpu]") {
  Stream st;
  REQUIRE_CUDA(cudaGetLastError());  // nothing sticky from earlier cases
  REQUIRE_CUDA(kn::launch_gemv(nullptr, nullptr, nullptr, nullptr, 0, 10, 32, nullptr, 10, st.s));
  REQUIRE_CUDA(kn::launch_gemv(nullptr, nullptr, nullptr, nullptr, 4, 0, 32, nullptr, 0, st.s));
  REQUIRE(kn::launch_gemv(nullptr, nullptr, nullptr, nullptr, kn::kGemvMaxRows + 1, 10, 32, nullptr, 10, st.s) ==
          cudaErrorInvalidValue);
  {
    // Refused before any launch: mixed layouts, no layout, `in` off the layout's granule, a misaligned x,
    // gate and up of different sizes, more than 3 matrices. (The pointers are never dereferenced.)
    const half* w16 = reinterpret_cast<const half*>(uintptr_t(256));
    const uint32_t* wq = reinterpret_cast<const uint32_t*>(uintptr_t(512));
    const half* sc = reinterpret_cast<const half*>(uintptr_t(768));
    const half* x = reinterpret_cast<const half*>(uintptr_t(1024));
    float* y = reinterpret_cast<float*>(uintptr_t(2048));
    half* o16 = reinterpret_cast<half*>(uintptr_t(4096));
    REQUIRE(kn::launch_gemv(w16, wq, sc, x, 1, 10, 32, y, 10, st.s) == cudaErrorInvalidValue);
    REQUIRE(kn::launch_gemv(nullptr, nullptr, nullptr, x, 1, 10, 32, y, 10, st.s) == cudaErrorInvalidValue);
    REQUIRE(kn::launch_gemv(nullptr, wq, sc, x, 1, 10, 40, y, 10, st.s) == cudaErrorInvalidValue);        // in % 32
    REQUIRE(kn::launch_gemv(w16, nullptr, nullptr, x, 1, 10, 12, y, 10, st.s) == cudaErrorInvalidValue);  // in % 8
    REQUIRE(kn::launch_gemv(w16, nullptr, nullptr, x + 1, 1, 10, 32, y, 10, st.s) == cudaErrorInvalidValue);
    REQUIRE(kn::launch_gemv(w16, nullptr, nullptr, x, 1, 10, 32, y, 9, st.s) == cudaErrorInvalidValue);  // ldy
    kn::GemvMat f16m, w4m;
    f16m.w16 = w16;
    f16m.out = 10;
    f16m.y = y;
    f16m.ldy = 10;
    w4m.wq = wq;
    w4m.s = sc;
    w4m.out = 10;
    w4m.y = y;
    w4m.ldy = 10;
    const kn::GemvMat mixed[2] = {f16m, w4m};
    REQUIRE(kn::launch_gemv_multi(mixed, 2, x, 1, 32, st.s) == cudaErrorInvalidValue);
    const kn::GemvMat four[4] = {f16m, f16m, f16m, f16m};
    REQUIRE(kn::launch_gemv_multi(four, 4, x, 1, 32, st.s) == cudaErrorInvalidValue);
    REQUIRE(kn::launch_gemv_multi(four, 0, x, 1, 32, st.s) == cudaErrorInvalidValue);
    REQUIRE_CUDA(kn::launch_gemv_multi(four, 3, x, 0, 32, st.s));  // no rows
    kn::GemvMat up = f16m;
    up.out = 11;
    REQUIRE(kn::launch_gemv_gelu_mul(f16m, up, x, 1, 32, o16, 11, st.s) == cudaErrorInvalidValue);
    REQUIRE(kn::launch_gemv_gelu_mul(f16m, w4m, x, 1, 32, o16, 10, st.s) == cudaErrorInvalidValue);
    REQUIRE(kn::launch_gemv_gelu_mul(f16m, f16m, x, kn::kGemvMaxRows + 1, 32, o16, 10, st.s) == cudaErrorInvalidValue);
    REQUIRE_CUDA(kn::launch_gemv_gelu_mul(f16m, f16m, x, 0, 32, o16, 10, st.s));
    REQUIRE(kn::launch_gemv_gelu_ple(f16m, x, 1, 32, nullptr, 7, 0, o16, st.s) == cudaErrorInvalidValue);  // no ple
    REQUIRE(kn::launch_gemv_gelu_ple(f16m, x, 1, 32, y, 7, 7, o16, st.s) == cudaErrorInvalidValue);        // layer
    REQUIRE_CUDA(kn::launch_gemv_gelu_ple(f16m, x, 0, 32, y, 7, 0, o16, st.s));
  }
  REQUIRE_CUDA(kn::launch_dequant_w4(nullptr, nullptr, 0, 32, nullptr, st.s));
  REQUIRE_CUDA(kn::launch_rmsnorm(nullptr, 8, nullptr, nullptr, 0, 8, 1e-6f, nullptr, st.s));
  REQUIRE_CUDA(kn::launch_residual_norm(nullptr, nullptr, nullptr, 0, 8, 1e-6f, 1.f, kn::NextNorm::Norm, nullptr,
                                        nullptr, st.s));
  REQUIRE_CUDA(kn::launch_head_norm_rope(nullptr, 64, 0, 1, 64, nullptr, 1e-6f, nullptr, nullptr, nullptr,
                                         kn::KvTarget{}, st.s));
  {
    kn::HeadNormTarget t[4];
    REQUIRE_CUDA(kn::launch_head_norm_rope_multi(t, 3, 0, 64, 1e-6f, nullptr, st.s));  // no rows
    REQUIRE_CUDA(kn::launch_head_norm_rope_multi(t, 3, 2, 64, 1e-6f, nullptr, st.s));  // no heads
    t[0].heads = 1;
    REQUIRE(kn::launch_head_norm_rope_multi(t, 4, 2, 64, 1e-6f, nullptr, st.s) == cudaErrorInvalidValue);
    REQUIRE(kn::launch_head_norm_rope_multi(t, 1, 2, 63, 1e-6f, nullptr, st.s) == cudaErrorInvalidValue);
  }
  REQUIRE_CUDA(kn::launch_embed(nullptr, nullptr, 0, 8, 1.f, nullptr, st.s));
  REQUIRE_CUDA(kn::launch_gather_rows<float>(nullptr, 8, nullptr, 0, 8, nullptr, 8, st.s));
  REQUIRE_CUDA(kn::launch_gather_rows<half>(nullptr, 8, nullptr, 0, 8, nullptr, 8, st.s));
  REQUIRE_CUDA(kn::launch_to_half(nullptr, 0, nullptr, st.s));
  REQUIRE_CUDA(kn::launch_gelu_mul(nullptr, nullptr, 0, nullptr, st.s));
  REQUIRE_CUDA(kn::launch_ple_combine(nullptr, nullptr, nullptr, 0, 1, 8, 1.f, 1.f, 1.f, 1e-6f, nullptr, st.s));
  REQUIRE_CUDA(kn::launch_ple_gate(nullptr, nullptr, 0, 1, 8, 0, nullptr, st.s));
  REQUIRE_CUDA(kn::launch_softcap(nullptr, 0, 30.f, st.s));
  REQUIRE_CUDA(kn::launch_argmax_rows(nullptr, 0, 8, nullptr, st.s));

  kn::AttnArgs a;
  a.rows = 0;
  a.heads = 8;
  a.kv_heads = 1;
  REQUIRE_CUDA(kn::launch_attention(a, 64, st.s));
  a.rows = 1;
  REQUIRE(kn::launch_attention(a, 96, st.s) == cudaErrorInvalidValue);  // head dim
  a.heads = 9;
  REQUIRE(kn::launch_attention(a, 64, st.s) == cudaErrorInvalidValue);  // 9 query heads per KV head
  a.heads = 8;
  a.splits = 0;
  REQUIRE(kn::launch_attention(a, 64, st.s) == cudaErrorInvalidValue);  // no key range
  a.splits = kn::kAttnMaxSplits + 1;
  REQUIRE(kn::launch_attention(a, 64, st.s) == cudaErrorInvalidValue);  // more splits than the merge weighs
  REQUIRE_FALSE(kn::attention_supported(96, 1));
  REQUIRE_FALSE(kn::attention_supported(64, 9));
  REQUIRE_FALSE(kn::attention_supported(64, 0));
  REQUIRE(kn::attention_supported(512, 8));

  st.sync();
  REQUIRE_CUDA(cudaGetLastError());  // nothing was launched
}

// ---- resources ----

template <int D, int G>
void add_attention_split(std::vector<KernelUse>& ks) {
  ks.push_back({cat("attention_split_kernel<", D, ",", G, ">"),
                reinterpret_cast<const void*>(&kn::attention_split_kernel<D, G>), kn::attn_block<D>()});
  ks.push_back({cat("attention_heads_kernel<", D, ",", G, ">"),
                reinterpret_cast<const void*>(&kn::attention_heads_kernel<D, G>), kn::attn_block<D>()});
}

template <int D>
void add_attention(std::vector<KernelUse>& ks) {
  add_attention_split<D, 1>(ks);
  add_attention_split<D, 2>(ks);
  add_attention_split<D, 4>(ks);
  add_attention_split<D, 8>(ks);
  ks.push_back(
      {cat("attention_merge_kernel<", D, ">"), reinterpret_cast<const void*>(&kn::attention_merge_kernel<D>), 32});
}

template <int NT, int WL, kn::GemvEpilogue E>
void add_gemv_e(std::vector<KernelUse>& ks) {
  const char* names[] = {"Store", "GeluMul", "GeluPle"};
  const char* layouts[] = {"f16", "w4", "w8"};
  ks.push_back({cat("gemv_kernel<", NT, ",", layouts[WL], ",", names[int(E)], ">"),
                reinterpret_cast<const void*>(&kn::gemv_kernel<NT, WL, E>), kn::kGemvWarps * 32});
  if constexpr (NT == 4)
    ks.push_back({cat("gemv_halves_kernel<", layouts[WL], ",", names[int(E)], ">"),
                  reinterpret_cast<const void*>(&kn::gemv_halves_kernel<WL, E>), kn::kGemvWarps * 32});
}

template <int NT, int WL>
void add_gemv(std::vector<KernelUse>& ks) {
  add_gemv_e<NT, WL, kn::GemvEpilogue::Store>(ks);
  if constexpr (WL != kn::kGemvW8) {  // int8: Store only
    add_gemv_e<NT, WL, kn::GemvEpilogue::GeluMul>(ks);
    add_gemv_e<NT, WL, kn::GemvEpilogue::GeluPle>(ks);
  }
}

TEST_CASE("every kernel fits Turing limits (64 KiB shared memory, block size, registers)", "[gpu]") {
  std::vector<KernelUse> ks;
  ks.push_back({"rmsnorm_kernel", reinterpret_cast<const void*>(&kn::rmsnorm_kernel), kn::norm_threads(1 << 20)});
  ks.push_back(
      {"residual_norm_kernel", reinterpret_cast<const void*>(&kn::residual_norm_kernel), kn::norm_threads(1 << 20)});
  ks.push_back({"head_norm_rope_kernel", reinterpret_cast<const void*>(&kn::head_norm_rope_kernel),
                kn::head_norm_threads(512)});  // d = 512, the largest head attention supports
  add_gemv<1, kn::kGemvF16>(ks);               // every instantiation the launchers use: 8-row tiles x layout x epilogue
  add_gemv<2, kn::kGemvF16>(ks);
  add_gemv<1, kn::kGemvW4>(ks);
  add_gemv<2, kn::kGemvW4>(ks);
  add_gemv<1, kn::kGemvW8>(ks);
  add_gemv<2, kn::kGemvW8>(ks);
  add_gemv<4, kn::kGemvF16>(ks);  // and the two-halves form of 17..32 rows
  add_gemv<4, kn::kGemvW4>(ks);
  add_gemv<4, kn::kGemvW8>(ks);
  ks.push_back({"ple_fused_kernel<1, F16>",
                reinterpret_cast<const void*>(&kn::ple_fused_kernel<1, kn::kGemvF16, false>), kn::kGemvWarps * 32});
  ks.push_back({"ple_fused_kernel<2, F16>",
                reinterpret_cast<const void*>(&kn::ple_fused_kernel<2, kn::kGemvF16, false>), kn::kGemvWarps * 32});
  ks.push_back({"ple_fused_kernel<2, F16, halves>",
                reinterpret_cast<const void*>(&kn::ple_fused_kernel<2, kn::kGemvF16, true>), kn::kGemvWarps * 32});
  ks.push_back({"ple_fused_kernel<1, W4>", reinterpret_cast<const void*>(&kn::ple_fused_kernel<1, kn::kGemvW4, false>),
                kn::kGemvWarps * 32});
  ks.push_back({"ple_fused_kernel<2, W4>", reinterpret_cast<const void*>(&kn::ple_fused_kernel<2, kn::kGemvW4, false>),
                kn::kGemvWarps * 32});
  ks.push_back({"ple_fused_kernel<2, W4, halves>",
                reinterpret_cast<const void*>(&kn::ple_fused_kernel<2, kn::kGemvW4, true>), kn::kGemvWarps * 32});
  ks.push_back({"dequant_w4_kernel", reinterpret_cast<const void*>(&kn::dequant_w4_kernel), 256});
  ks.push_back({"quantize_int8_kernel", reinterpret_cast<const void*>(&kn::quantize_int8_kernel), 256});
  ks.push_back({"quantize_int4_kernel", reinterpret_cast<const void*>(&kn::quantize_int4_kernel), 256});
  add_attention<32>(ks);
  add_attention<64>(ks);
  add_attention<128>(ks);
  add_attention<256>(ks);
  add_attention<512>(ks);
  ks.push_back({"embed_kernel", reinterpret_cast<const void*>(&kn::embed_kernel), 256});
  ks.push_back({"gather_rows_kernel<float>", reinterpret_cast<const void*>(&kn::gather_rows_kernel<float>), 256});
  ks.push_back({"gather_rows_kernel<half>", reinterpret_cast<const void*>(&kn::gather_rows_kernel<half>), 256});
  ks.push_back({"to_half_kernel", reinterpret_cast<const void*>(&kn::to_half_kernel), 256});
  ks.push_back({"widen_kernel", reinterpret_cast<const void*>(&kn::widen_kernel), 256});
  ks.push_back({"gelu_mul_kernel<1, float>", reinterpret_cast<const void*>(&kn::gelu_mul_kernel<1, float>), 256});
  ks.push_back({"gelu_mul_kernel<4, float>", reinterpret_cast<const void*>(&kn::gelu_mul_kernel<4, float>), 256});
  ks.push_back({"gelu_mul_kernel<1, half>", reinterpret_cast<const void*>(&kn::gelu_mul_kernel<1, half>), 256});
  ks.push_back({"gelu_mul_kernel<4, half>", reinterpret_cast<const void*>(&kn::gelu_mul_kernel<4, half>), 256});
  ks.push_back({"ple_combine_kernel", reinterpret_cast<const void*>(&kn::ple_combine_kernel), 256});
  ks.push_back({"ple_gate_kernel", reinterpret_cast<const void*>(&kn::ple_gate_kernel), 256});
  ks.push_back({"softcap_kernel<1>", reinterpret_cast<const void*>(&kn::softcap_kernel<1>), 256});
  ks.push_back({"softcap_kernel<4>", reinterpret_cast<const void*>(&kn::softcap_kernel<4>), 256});
  ks.push_back({"argmax_rows_kernel", reinterpret_cast<const void*>(&kn::argmax_rows_kernel), 256});
  ks.push_back({"sample_kernel", reinterpret_cast<const void*>(&kn::sample_kernel), kn::kSampleThreads});

  // Warn only: sincosf keeps a local array for its slow path (large angles): head_norm_rope_kernel and
  // attention_heads_kernel (32 B of stack each, no spills).
  check_turing_limits("kernel", ks, LocalMemory::kWarn);
}

}  // namespace

// The CUDA backend's streams are cudaStreamNonBlocking: they do not wait for the legacy default stream. What the
// backend writes at load must therefore be done before a pass on any other stream can read it (device.hpp's
// upload_now / zero_now). Here a host function holds the legacy default stream closed while the PLE stager is set
// up and a pass is staged on a non-blocking stream: work the stager left on the legacy stream (its zeroing, once a
// cudaMemset) would run only when the gate opens, after the staged rows, and zero them (the suite saw it as wrong
// logits of a first pass, under a second process on the GPU; bench/RESULTS.md 2026-12-05 (e)).

namespace streams_test {

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

}  // namespace streams_test

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

  streams_test::Gate gate;
  REQUIRE_CUDA(cudaLaunchHostFunc(cudaStreamLegacy, streams_test::hold, &gate));
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
