// Compile-only test (b): the implementation with the CPU backend only, by a host compiler, warning-free.
#define GEMMA4_T4_IMPLEMENTATION
#define GEMMA4_T4_NO_CUDA
#include "gemma4_t4.hpp"
