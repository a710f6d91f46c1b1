// The Catch2 (v2) main of gemma4_t4_tests; the tests live in tests/test_*.cpp (CMake globs them).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
