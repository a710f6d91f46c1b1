// Compile-only test (c): the implementation by nvcc (CUDA + CPU backends), built for sm_75 (Tesla T4).
#define GEMMA4_T4_IMPLEMENTATION
#include "gemma4_t4.hpp"
