// Compile-only test (f): GEMMA4_T4_NO_BENCH leaves the built-in benchmark out -- its declarations (so its names
// are free for the application) and its implementation (no /proc or statvfs code, no stream-read kernel) --
// and the rest of the library still builds, warning-free.
#define GEMMA4_T4_IMPLEMENTATION
#define GEMMA4_T4_NO_CUDA
#define GEMMA4_T4_NO_BENCH
#include "gemma4_t4.hpp"

#if defined(_SYS_STATVFS_H)
#error "GEMMA4_T4_NO_BENCH: the implementation must not include <sys/statvfs.h> (bench/doctor.hpp's)"
#endif

// Each of these would clash with a declaration of bench/api.hpp, were it there.
namespace gemma4_t4 {
namespace bench {
using Report = int;
using SweepOptions = int;
constexpr int run = 0;
constexpr int doctor = 0;
}  // namespace bench
}  // namespace gemma4_t4

int no_bench_use() {
  gemma4_t4::LoadOptions options;
  return static_cast<int>(options.max_context) + gemma4_t4::bench::run + gemma4_t4::bench::doctor;
}
