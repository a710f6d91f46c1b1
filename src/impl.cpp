// The implementation unit behind the CMake target gemma4_t4::impl, compiled by the host compiler with
// -DGEMMA4_T4_NO_CUDA (CPU backend only). src/impl.cu is the same file for nvcc (CUDA + CPU backends).
#define GEMMA4_T4_IMPLEMENTATION
#include "gemma4_t4.hpp"
