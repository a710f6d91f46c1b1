// gemma4_t4 kernel lab: a SIMT emulator, so that a kernel's index maps, fragment layouts, masks and barriers can
// be checked on a machine without a GPU (dev/README.md, "Running kernels on the CPU").
//
// Compile a kernel's translation unit with a host compiler, this header first (with -DGEMMA4_T4_EMU_MAIN in exactly
// one unit of the program: it holds the runtime's definitions, below):
//   g++ -std=c++17 -O2 -fno-strict-aliasing -Wno-unknown-pragmas -x c++ -include dev/emu.hpp
//       -I/usr/local/cuda/include -Iinclude -I. FILE -o prog -lpthread
// -fno-strict-aliasing is required: device code reads registers and shared memory through reinterpret_casts
// (float4 over float, uint32 over half2), which nvcc allows and an optimising host compiler need not.
// -Wno-unknown-pragmas: device code's "#pragma unroll", which a host compiler does not know.
// kernels/common.cuh and kernels/mma.cuh take the emulated path of their inline PTX under GEMMA4_T4_EMU (which
// this header defines); launch_kernel() runs the kernel here, and emu::launch() does for a lab's own kernels.
//
// What it is: every CUDA thread of a block is a fiber on one host thread (x86-64: a 20-instruction stack switch;
// elsewhere ucontext, whose every switch is a system call); blocks run one after another (a cooperative launch
// runs as one block: cudaLaunchCooperativeKernel below).
// A fiber runs until it reaches a block barrier or a warp collective (shuffle, vote, __syncwarp, mma.sync,
// ldmatrix), then the next fiber runs. A collective completes when every lane of its mask has arrived, a block
// barrier when every live thread of the block has (exited threads count as arrived, as on sm_70+). If no fiber can
// run and some have not finished, the launch stops with "deadlock" and says where each thread waits: a barrier in
// divergent code, or a shuffle whose mask names a lane that never comes.
//   mma.sync m16n8k8 (fp16 in, fp32 accumulate): the A, B and C fragments of the 32 lanes are gathered by the
//     PTX ISA's layouts (kernels/mma.cuh's header) and D = C + A B is summed in double, then rounded to float: the
//     hardware's adds round differently, so sums agree to ~1e-6 relative, not bit for bit.
//   ldmatrix (x4, .trans): each lane's row address, the four 8 x 8 matrices read as the ISA lays them out.
//   Memory: device pointers are host pointers; `__shared__` variables are statics (shared by a block's fibers,
//     reused by the next block); atomics are plain read-modify-writes (one host thread). No races are modelled:
//     the order fibers run in is one legal schedule, not all of them; use compute-sanitizer's racecheck on a GPU.
//   Not emulated: PDL (pdl_enter is a no-op), cudaMalloc and the runtime's other calls, launches with `<<<>>>`
//     (use emu::launch), dynamic shared memory, clusters, cp.async.
// Speed: a few million fiber switches a second. A collective switches every lane, so keep problems small (a
// few blocks of a few key tiles).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define GEMMA4_T4_EMU 1

// kernels/mma.cuh moves register bits between uint32_t and half2 with memcpy (the CUDA idiom); not a bug here
#pragma GCC diagnostic ignored "-Wclass-memaccess"

// ---- the CUDA keywords as host C++ ----
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#undef __align__
#undef __restrict__
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict

namespace emu {

// ---- fibers: a stack switch that saves only what the ABI says a callee keeps ----
#if defined(__x86_64__) && !defined(GEMMA4_T4_EMU_UCONTEXT)
#define GEMMA4_T4_EMU_FAST_SWITCH 1
}  // namespace emu
// Saves rbp, rbx, r12-r15, the x87 control word and MXCSR on the current stack, stores rsp to *save, loads rsp
// from `load` and restores the same from there.
extern "C" void gemma4_t4_emu_switch(void** save, void* load);
#ifdef GEMMA4_T4_EMU_MAIN
__asm__(
    ".text\n"
    ".globl gemma4_t4_emu_switch\n"
    ".type gemma4_t4_emu_switch,@function\n"
    "gemma4_t4_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $16, %rsp\n  stmxcsr 8(%rsp)\n  fnstcw (%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  ldmxcsr 8(%rsp)\n  fldcw (%rsp)\n  addq $16, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size gemma4_t4_emu_switch, .-gemma4_t4_emu_switch\n");
#endif
namespace emu {
#endif

// What a waiting fiber waits for.
enum class Wait { None, Block, Warp, Done };

struct Fiber {
#ifdef GEMMA4_T4_EMU_FAST_SWITCH
  void* sp = nullptr;
#else
  ucontext_t ctx;
#endif
  std::unique_ptr<char[]> stack;
  uint3 tid{};
  int linear = 0;
  Wait wait = Wait::None;
  const char* where = "";  // the collective's name, for the deadlock report
};

struct Collective {                    // one warp's current collective
  unsigned mask = 0, arrived = 0;      // lanes
  const char* what = nullptr;          // its kind (every lane must be at the same one)
  unsigned gen = 0;                    // completed collectives
  unsigned char slot[2][32][40] = {};  // inputs, double-buffered by gen
  // Results computed once for all lanes by the first lane to resume (mma.sync): valid while out_gen[b] is the
  // generation that filled slot b.
  double out[2][32][4] = {};
  unsigned out_gen[2] = {~0u, ~0u};
};

struct State {
  dim3 grid, block, bidx;
  std::vector<Fiber> fibers;
  std::vector<Collective> warps;
  int live = 0, at_barrier = 0, barrier_count = 0, barrier_result = 0;
  int cur = -1;
#ifdef GEMMA4_T4_EMU_FAST_SWITCH
  void* sched_sp = nullptr;
#else
  ucontext_t sched;
#endif
  void (*body)(void*) = nullptr;
  void* body_arg = nullptr;
  size_t stack_bytes = 256 * 1024;
};

inline State& st() {
  static State s;
  return s;
}
inline Fiber& me() { return st().fibers[size_t(st().cur)]; }
inline int lane() { return me().linear & 31; }

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "emu: %s\n", what.c_str());
  std::exit(3);
}

inline void yield() {
#ifdef GEMMA4_T4_EMU_FAST_SWITCH
  gemma4_t4_emu_switch(&me().sp, st().sched_sp);
#else
  swapcontext(&me().ctx, &st().sched);
#endif
}

// Block barrier; returns the count of threads whose pred was nonzero (__syncthreads_count).
inline int block_barrier(int pred = 0) {
  State& s = st();
  me().wait = Wait::Block;
  me().where = "__syncthreads";
  s.barrier_count += pred != 0;
  ++s.at_barrier;
  yield();
  return s.barrier_result;
}

// Warp collective: stores this lane's `in` bytes, waits for every lane of `mask`, returns the slot array of the
// completed collective (valid until this lane's next collective).
inline const unsigned char (*warp_collective(const char* what, unsigned mask, const void* in, size_t bytes))[40] {
  State& s = st();
  Fiber& f = me();
  const int w = f.linear >> 5, l = f.linear & 31;
  Collective& c = s.warps[size_t(w)];
  if (!(mask >> l & 1u)) fail(std::string(what) + ": lane " + std::to_string(l) + " not in its own mask");
  if (c.arrived == 0) {
    c.mask = mask;
    c.what = what;
  } else if (c.mask != mask || std::strcmp(c.what, what) != 0) {
    fail(std::string("warp ") + std::to_string(w) + ": lane " + std::to_string(l) + " at " + what +
         " while other lanes are at " + c.what);
  }
  const unsigned buf = c.gen & 1u;
  std::memcpy(c.slot[buf][l], in, bytes);
  c.arrived |= 1u << l;
  f.wait = Wait::Warp;
  f.where = what;
  yield();
  return c.slot[buf];
}

// The scheduler's check after a fiber yields: completes a block barrier or a collective that is now whole.
inline void settle() {
  State& s = st();
  if (s.at_barrier > 0 && s.at_barrier == s.live) {
    s.barrier_result = s.barrier_count;
    s.barrier_count = 0;
    s.at_barrier = 0;
    for (Fiber& f : s.fibers)
      if (f.wait == Wait::Block) f.wait = Wait::None;
  }
  for (size_t w = 0; w < s.warps.size(); ++w) {
    Collective& c = s.warps[w];
    if (c.arrived == 0 || c.arrived != c.mask) continue;
    for (int l = 0; l < 32; ++l)
      if (c.arrived >> l & 1u) s.fibers[w * 32 + size_t(l)].wait = Wait::None;
    c.arrived = 0;
    ++c.gen;
  }
}

inline void trampoline() {
  State& s = st();
  s.body(s.body_arg);
  me().wait = Wait::Done;
  --s.live;
  yield();  // never resumed (a barrier may now be complete without this thread)
  fail("a finished thread was resumed");
}

// A fresh fiber's context: trampoline() runs when the scheduler first switches to it.
inline void start_fiber(Fiber& f, size_t bytes) {
#ifdef GEMMA4_T4_EMU_FAST_SWITCH
  // The frame gemma4_t4_emu_switch pops, top down: a return address slot for trampoline (never used), the
  // address it "returns" to (trampoline), rbp rbx r12-r15 (zero), then MXCSR and the x87 control word. The
  // return-address slot is 16-byte aligned, so trampoline starts with rsp = 8 mod 16, as after a call.
  auto top = (reinterpret_cast<uintptr_t>(f.stack.get()) + bytes) & ~uintptr_t(15);
  uint64_t* q = reinterpret_cast<uint64_t*>(top);
  q[-1] = 0;
  q[-2] = reinterpret_cast<uint64_t>(&trampoline);
  for (int i = 3; i <= 8; ++i) q[-i] = 0;
  uint32_t mxcsr;
  uint16_t cw;
  __asm__ volatile("stmxcsr %0\n fnstcw %1" : "=m"(mxcsr), "=m"(cw));
  q[-9] = mxcsr;  // at sp + 8
  q[-10] = cw;    // at sp
  f.sp = &q[-10];
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack.get();
  f.ctx.uc_stack.ss_size = bytes;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, trampoline, 0);
#endif
}

inline void resume(Fiber& f) {
#ifdef GEMMA4_T4_EMU_FAST_SWITCH
  gemma4_t4_emu_switch(&st().sched_sp, f.sp);
#else
  swapcontext(&st().sched, &f.ctx);
#endif
}

// Runs body(arg) as every thread of every block of grid x block.
inline void run_grid(dim3 grid, dim3 block, void (*body)(void*), void* arg) {
  State& s = st();
  const int nt = int(block.x * block.y * block.z);
  if (nt <= 0 || nt > 1024 || nt % 32 != 0) fail("block of " + std::to_string(nt) + " threads (1..1024, whole warps)");
  s.grid = grid;
  s.block = block;
  s.body = body;
  s.body_arg = arg;
  if (s.fibers.size() != size_t(nt)) {
    s.fibers.clear();
    s.fibers.resize(size_t(nt));
    for (Fiber& f : s.fibers) f.stack.reset(new char[s.stack_bytes]);
  }
  s.warps.assign(size_t(nt / 32), Collective());
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        s.bidx = dim3(bx, by, bz);
        s.live = nt;
        s.at_barrier = s.barrier_count = 0;
        for (Collective& c : s.warps) c.arrived = 0;
        for (int i = 0; i < nt; ++i) {
          Fiber& f = s.fibers[size_t(i)];
          f.linear = i;
          f.tid = make_uint3(unsigned(i) % block.x, unsigned(i) / block.x % block.y, unsigned(i) / (block.x * block.y));
          f.wait = Wait::None;
          start_fiber(f, s.stack_bytes);
        }
        while (s.live > 0) {
          bool ran = false;
          for (int i = 0; i < nt; ++i) {
            if (s.fibers[size_t(i)].wait != Wait::None) continue;
            s.cur = i;
            resume(s.fibers[size_t(i)]);
            s.cur = -1;
            settle();
            ran = true;
          }
          if (!ran && s.live > 0) {
            std::string where;
            for (int i = 0; i < nt; ++i)
              if (s.fibers[size_t(i)].wait != Wait::Done)
                where += " t" + std::to_string(i) + ":" + s.fibers[size_t(i)].where;
            fail("deadlock in block (" + std::to_string(bx) + "," + std::to_string(by) + "," + std::to_string(bz) +
                 "):" + where.substr(0, 2000));
          }
        }
      }
}

template <typename F, typename Tuple>
struct Call {
  F f;
  Tuple args;
  static void run(void* p) {
    auto* c = static_cast<Call*>(p);
    std::apply(c->f, c->args);
  }
};

// A stream capture's recording (cudaStreamBeginCapture .. cudaStreamEndCapture): the launches (and async copies)
// made meanwhile, replayed in order by cudaGraphLaunch.
struct Graph {
  std::vector<std::function<void()>> ops;
};
inline Graph*& capturing() {
  static Graph* g = nullptr;
  return g;
}

// kernel<<<grid, block>>>(args...), emulated; the arguments are converted to the kernel's parameter types once.
// While a stream capture is open the launch is recorded instead (with its arguments) and runs at cudaGraphLaunch.
template <typename... P, typename... A>
inline cudaError_t launch(void (*k)(P...), dim3 grid, dim3 block, A&&... args) {
  using C = Call<void (*)(P...), std::tuple<std::decay_t<P>...>>;
  auto c = std::make_shared<C>(C{k, std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)});
  if (Graph* g = capturing()) {
    g->ops.push_back([c, grid, block] { run_grid(grid, block, &C::run, c.get()); });
    return cudaSuccess;
  }
  run_grid(grid, block, &C::run, c.get());
  return cudaSuccess;
}

// A block's dynamic shared memory (GEMMA4_T4_DYNAMIC_SMEM): one buffer, shared by the block's fibers, large
// enough for any launch an sm_90 GPU takes.
inline unsigned char* dynamic_smem() {
  alignas(16) static unsigned char buf[232448];
  return buf;
}

// ---- the thread's coordinates ----
struct Coords {
  static uint3 thread() { return me().tid; }
  static uint3 block() { return make_uint3(st().bidx.x, st().bidx.y, st().bidx.z); }
  static dim3 block_dim() { return st().block; }
  static dim3 grid_dim() { return st().grid; }
};

// ---- tensor cores and shared-memory matrix loads (kernels/mma.cuh's layouts) ----

inline float h2f(uint32_t u, int hi) {
  const unsigned short b = static_cast<unsigned short>(hi ? u >> 16 : u & 0xFFFFu);
  __half_raw r;
  r.x = b;
  return __half2float(half(r));
}

// c += A (16x8) B (8x8): lane 4 g + t holds a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], b = B[2t..2t+1][g],
// c0, c1 = C[g][2t..2t+1], c2, c3 = C[g+8][2t..].
// The first lane to resume computes A B for the whole warp; each lane adds its own C.
inline void mma_16x8x8(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  const uint32_t in[3] = {a0, a1, b};
  Collective& col = st().warps[size_t(me().linear >> 5)];
  const unsigned gen = col.gen;  // the generation this collective completes
  const unsigned buf = gen & 1u;
  const auto slots = warp_collective("mma.sync.m16n8k8", 0xffffffffu, in, sizeof in);
  if (col.out_gen[buf] != gen) {
    double A[16][8], B[8][8];
    for (int l = 0; l < 32; ++l) {
      uint32_t v[3];
      std::memcpy(v, slots[l], sizeof v);
      const int g = l >> 2, t = l & 3;
      for (int j = 0; j < 2; ++j) {
        A[g][2 * t + j] = h2f(v[0], j);
        A[g + 8][2 * t + j] = h2f(v[1], j);
        B[2 * t + j][g] = h2f(v[2], j);
      }
    }
    for (int l = 0; l < 32; ++l) {
      const int g = l >> 2, t = l & 3;
      for (int i = 0; i < 4; ++i) {
        const int row = g + (i >= 2 ? 8 : 0), cc = 2 * t + (i & 1);
        double s = 0;
        for (int k = 0; k < 8; ++k) s += A[row][k] * B[k][cc];
        col.out[buf][l][i] = s;
      }
    }
    col.out_gen[buf] = gen;
  }
  const double* ab = col.out[buf][lane()];
  for (int i = 0; i < 4; ++i) c[i] = float(double(c[i]) + ab[i]);
}

// ldmatrix.x4 (.trans): lanes 8 i .. 8 i + 7 give the row addresses of matrix i.
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row_addr, bool trans) {
  const auto slots =
      warp_collective(trans ? "ldmatrix.x4.trans" : "ldmatrix.x4", 0xffffffffu, &row_addr, sizeof row_addr);
  const unsigned short* rows[32];
  for (int l = 0; l < 32; ++l) {
    const void* p;
    std::memcpy(&p, slots[l], sizeof p);
    if (reinterpret_cast<uintptr_t>(p) % 16) fail("ldmatrix: a row address that is not 16-byte aligned");
    rows[l] = static_cast<const unsigned short*>(p);
  }
  const int g = lane() >> 2, t = lane() & 3;
  for (int i = 0; i < 4; ++i) {
    unsigned short lo, hi;
    if (!trans) {
      lo = rows[8 * i + g][2 * t];
      hi = rows[8 * i + g][2 * t + 1];
    } else {
      lo = rows[8 * i + 2 * t][g];
      hi = rows[8 * i + 2 * t + 1][g];
    }
    r[i] = uint32_t(lo) | uint32_t(hi) << 16;
  }
}

// movmatrix.m8n8.trans: lane 4 g + t holds (row g, cols 2t, 2t+1) of an 8 x 8 matrix and receives (rows 2t, 2t + 1;
// col g).
inline uint32_t movmatrix_trans(uint32_t x) {
  const auto slots = warp_collective("movmatrix.trans", 0xffffffffu, &x, sizeof x);
  auto at = [&](int row, int col) {
    uint32_t v;
    std::memcpy(&v, slots[4 * row + col / 2], sizeof v);
    return (col & 1) ? v >> 16 : v & 0xFFFFu;
  };
  const int g = lane() >> 2, t = lane() & 3;
  return at(2 * t, g) | at(2 * t + 1, g) << 16;
}

// ---- warp collectives ----

template <typename T>
inline T shfl_impl(const char* what, unsigned mask, T v, int src_of_lane(int, int), int arg, int width) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffled type");
  const auto slots = warp_collective(what, mask, &v, sizeof v);
  const int l = lane(), base = l & ~(width - 1);
  int src = src_of_lane(l - base, arg);
  if (src < 0 || src >= width) src = l - base;  // out of the segment: own value
  T out;
  std::memcpy(&out, slots[base + src], sizeof out);
  return out;
}

}  // namespace emu

#define threadIdx (::emu::Coords::thread())
#define blockIdx (::emu::Coords::block())
#define blockDim (::emu::Coords::block_dim())
#define gridDim (::emu::Coords::grid_dim())

// The runtime's C++ overloads that cuda_runtime.h declares only for nvcc (a kernel function instead of a void*).
template <typename T>
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, T* f) {
  return ::cudaFuncGetAttributes(a, reinterpret_cast<const void*>(f));
}
template <typename T>
inline cudaError_t cudaFuncSetAttribute(T* f, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(f), attr, value);
}

// A cooperative launch of a typed kernel (the overload cuda_runtime.h declares for nvcc). Blocks run one after
// another here, so blocks that wait for each other cannot run as the grid asks. The kernel runs as ONE block
// instead, a GPU of one SM as a persistent kernel that deals its work over gridDim.x sees it: that block takes every
// item, in order, and never waits for another (kernels/decode_step.cuh). The grid asked for must be 1-D; its size
// is not used. The void* overload (the runtime's C API) still refuses: it has no parameter types to call with.
namespace emu {
template <typename... P, size_t... I>
inline cudaError_t launch_params(void (*k)(P...), dim3 block, void** args, std::index_sequence<I...>) {
  return launch(k, dim3(1), block, *static_cast<std::decay_t<P>*>(args[I])...);
}
}  // namespace emu
template <typename... P>
inline cudaError_t cudaLaunchCooperativeKernel(void (*k)(P...), dim3 grid, dim3 block, void** args, size_t,
                                               cudaStream_t) {
  if (grid.x < 1 || grid.y != 1 || grid.z != 1) return cudaErrorInvalidValue;
  return emu::launch_params(k, block, args, std::index_sequence_for<P...>{});
}

// ---- intrinsics ----
// fp16 ones cuda_fp16.h has only for device code: one rounding, as the hardware's fused multiply-add.
inline half2 __hfma2(half2 a, half2 b, half2 c) {
  const float2 x = __half22float2(a), y = __half22float2(b), z = __half22float2(c);
  return __halves2half2(__double2half(double(x.x) * y.x + z.x), __double2half(double(x.y) * y.y + z.y));
}
// The integer min / max device code has as built-ins (floats: fminf / fmaxf, as in device code).
#define GEMMA4_T4_EMU_MINMAX(T)                    \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
GEMMA4_T4_EMU_MINMAX(int)
GEMMA4_T4_EMU_MINMAX(unsigned)
GEMMA4_T4_EMU_MINMAX(long)
GEMMA4_T4_EMU_MINMAX(unsigned long)
GEMMA4_T4_EMU_MINMAX(long long)
GEMMA4_T4_EMU_MINMAX(unsigned long long)
#undef GEMMA4_T4_EMU_MINMAX

inline void __syncthreads() { emu::block_barrier(); }
inline int __syncthreads_count(int pred) { return emu::block_barrier(pred); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  const int z = 0;
  emu::warp_collective("__syncwarp", mask, &z, sizeof z);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
  return emu::shfl_impl<T>(
      "__shfl_xor_sync", mask, v, [](int l, int a) { return l ^ a; }, m, width);
}
template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return emu::shfl_impl<T>(
      "__shfl_sync", mask, v, [](int, int a) { return a; }, src % width, width);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
  return emu::shfl_impl<T>(
      "__shfl_up_sync", mask, v, [](int l, int a) { return l - a; }, int(d), width);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
  return emu::shfl_impl<T>(
      "__shfl_down_sync", mask, v, [](int l, int a) { return l + a; }, int(d), width);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  const int p = pred != 0;
  const auto slots = emu::warp_collective("__ballot_sync", mask, &p, sizeof p);
  unsigned b = 0;
  for (int l = 0; l < 32; ++l) {
    int v;
    std::memcpy(&v, slots[l], sizeof v);
    if (mask >> l & 1u && v) b |= 1u << l;
  }
  return b;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }

template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
template <typename T>
inline T __ldcg(const T* p) {
  return *p;
}
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __nanosleep(unsigned) { emu::yield(); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __frcp_rn(float a) { return 1.f / a; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline int __float_as_int(float f) { return int(__float_as_uint(f)); }
inline float __int_as_float(int i) { return __uint_as_float(unsigned(i)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t v = uint64_t(y) << 32 | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= unsigned(v >> (8 * ((s >> (4 * i)) & 7)) & 0xFFu) << (8 * i);
  return r;
}
template <typename T>
inline T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
inline T atomicExch(T* p, T v) {
  const T old = *p;
  *p = v;
  return old;
}
template <typename T>
inline T atomicCAS(T* p, T cmp, T v) {
  const T old = *p;
  if (old == cmp) *p = v;
  return old;
}
template <typename T>
inline T atomicMax(T* p, T v) {
  const T old = *p;
  if (v > old) *p = v;
  return old;
}
template <typename T>
inline T atomicMin(T* p, T v) {
  const T old = *p;
  if (v < old) *p = v;
  return old;
}
inline unsigned atomicInc(unsigned* p, unsigned lim) {
  const unsigned old = *p;
  *p = old >= lim ? 0 : old + 1;
  return old;
}

// ---- the runtime calls the programs make, on host memory ----
// Defined in the ONE translation unit of a program that defines GEMMA4_T4_EMU_MAIN before including this header
// (every other unit includes it without), so an emulated program links without libcudart or libcublas: memory
// is malloc'd, copies are memcpy, streams and events are tokens, time is never measured (every elapsed time is 0:
// the emulator validates, it does not time), and cublasGemmEx is a loop in double.
#ifdef GEMMA4_T4_EMU_MAIN
namespace emu {
constexpr int kSms = 4;  // what the emulated device reports
inline cudaError_t& last_error() {
  static cudaError_t e = cudaSuccess;
  return e;
}
}  // namespace emu

extern "C" {
cudaError_t cudaMalloc(void** p, size_t n) {
  *p = std::aligned_alloc(256, (n + 255) / 256 * 256 + 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int v, size_t n) {
  std::memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, enum cudaMemcpyKind) {
  std::memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, enum cudaMemcpyKind, cudaStream_t) {
  if (emu::Graph* g = emu::capturing())
    g->ops.push_back([d, s, n] { std::memmove(d, s, n); });
  else
    std::memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* d, size_t dpitch, const void* s, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind, cudaStream_t) {
  auto copy = [=] {
    for (size_t r = 0; r < height; ++r)
      std::memmove(static_cast<char*>(d) + r * dpitch, static_cast<const char*>(s) + r * spitch, width);
  };
  if (emu::Graph* g = emu::capturing())
    g->ops.push_back(copy);
  else
    copy();
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
  if (emu::Graph* g = emu::capturing())
    g->ops.push_back([p, v, n] { std::memset(p, v, n); });
  else
    std::memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t, enum cudaStreamCaptureMode) {
  if (emu::capturing()) return cudaErrorIllegalState;
  emu::capturing() = new emu::Graph;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* graph) {
  *graph = reinterpret_cast<cudaGraph_t>(emu::capturing());
  emu::capturing() = nullptr;
  return *graph ? cudaSuccess : cudaErrorIllegalState;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = reinterpret_cast<cudaGraphExec_t>(new emu::Graph(*reinterpret_cast<emu::Graph*>(graph)));
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
  for (const auto& op : reinterpret_cast<emu::Graph*>(exec)->ops) op();
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<emu::Graph*>(exec);
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<emu::Graph*>(graph);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaMallocHost(void** p, size_t n) { return cudaMalloc(p, n); }
cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {  // what the emulated device claims to have
  *total = size_t(16) << 30;
  *free = size_t(15) << 30;
  return cudaSuccess;
}
// Blocks run one after another here, so a grid whose blocks wait for each other (a persistent kernel) cannot run.
cudaError_t cudaLaunchCooperativeKernel(const void*, dim3, dim3, void**, size_t, cudaStream_t) {
  return cudaErrorCooperativeLaunchTooLarge;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, const void*, int, size_t) {
  *n = 1;
  return cudaSuccess;
}
// Kernels have no compiled attributes here: zeros (a test of register counts or shared memory learns nothing).
cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes* a, const void*) {
  std::memset(a, 0, sizeof *a);
  a->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, enum cudaFuncAttribute, int) { return cudaSuccess; }
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = emu::last_error();
  emu::last_error() = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return emu::last_error(); }
const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated runtime error"; }
const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorUnknown"; }
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = reinterpret_cast<cudaStream_t>(uintptr_t(1));
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
// Host functions: work here completes at its call, so there is no stream order to put them in; they run at the next
// cudaDeviceSynchronize (the [streams] test's gate then finds itself opened: the emulator cannot show that race).
inline std::vector<std::pair<cudaHostFn_t, void*>>& emu_host_fns() {
  static std::vector<std::pair<cudaHostFn_t, void*>> fns;
  return fns;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t fn, void* data) {
  emu_host_fns().emplace_back(fn, data);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  auto fns = std::move(emu_host_fns());
  emu_host_fns().clear();
  for (auto& f : fns) f.first(f.second);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = reinterpret_cast<cudaEvent_t>(uintptr_t(1));
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0.f;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaDeviceGetAttribute(int* v, enum cudaDeviceAttr a, int) {
  switch (a) {
    case cudaDevAttrMultiProcessorCount: *v = emu::kSms; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 7; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 5; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = 65536; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = 49152; break;
    default: *v = 0;
  }
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* p, int) {
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "CPU emulator (dev/emu.hpp)");
  p->major = 7;
  p->minor = 5;
  p->multiProcessorCount = emu::kSms;
  p->sharedMemPerBlock = 49152;
  p->warpSize = 32;
  return cudaSuccess;
}
}  // extern "C"

// ---- cuBLAS: the handle calls and cublasGemmEx (fp16 A and B, fp32 or fp16 C, fp32 compute) ----
#if __has_include(<cublas_v2.h>)
#include <cublas_v2.h>
namespace emu {
inline float gemm_in(const void* p, cudaDataType t, size_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  return __half2float(static_cast<const half*>(p)[i]);
}
}  // namespace emu
extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  *h = reinterpret_cast<cublasHandle_t>(uintptr_t(1));
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t, void*, size_t) { return CUBLAS_STATUS_SUCCESS; }
// Column-major C [m, n] = alpha op(A) op(B) + beta C, sums in double (cuBLAS's own order and rounding differ).
cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType at, int lda, const void* B, cudaDataType bt,
                            int ldb, const void* beta, void* C, cudaDataType ct, int ldc, cublasComputeType_t,
                            cublasGemmAlgo_t) {
  if ((at != CUDA_R_16F && at != CUDA_R_32F) || (bt != CUDA_R_16F && bt != CUDA_R_32F) ||
      (ct != CUDA_R_16F && ct != CUDA_R_32F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  auto run = [=] {
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        double acc = 0;
        for (int l = 0; l < k; ++l) {
          const size_t ai = ta == CUBLAS_OP_N ? size_t(i) + size_t(l) * lda : size_t(l) + size_t(i) * lda;
          const size_t bi = tb == CUBLAS_OP_N ? size_t(l) + size_t(j) * ldb : size_t(j) + size_t(l) * ldb;
          acc += double(emu::gemm_in(A, at, ai)) * emu::gemm_in(B, bt, bi);
        }
        const size_t ci = size_t(i) + size_t(j) * ldc;
        const double old = be != 0.f ? double(emu::gemm_in(C, ct, ci)) * be : 0.0;
        const float v = float(al * acc + old);
        if (ct == CUDA_R_32F)
          static_cast<float*>(C)[ci] = v;
        else
          static_cast<half*>(C)[ci] = __float2half_rn(v);
      }
  };
  if (emu::Graph* g = emu::capturing())
    g->ops.push_back(run);
  else
    run();
  return CUBLAS_STATUS_SUCCESS;
}
}  // extern "C"
#endif  // cublas_v2.h
#endif  // GEMMA4_T4_EMU_MAIN
