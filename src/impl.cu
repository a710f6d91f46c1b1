// The implementation unit behind the CMake target gemma4_t4::impl, compiled by nvcc (CUDA + CPU backends).
// src/impl.cpp is the same file for a host compiler with -DGEMMA4_T4_NO_CUDA (CPU backend only).
#define GEMMA4_T4_IMPLEMENTATION
#include "gemma4_t4.hpp"
