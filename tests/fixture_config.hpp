// The model configs of the tiny fixtures (tests/fixtures/README.md) as the loader must read them, and the
// field-by-field checks behind them. Shared by the config tests (test_loader_errors.cpp) and the
// synthetic-checkpoint tests (test_synthetic.cpp: `make_synthetic --model tiny` copies mm_bf16's config).
#pragma once

#include <catch2/catch.hpp>

#include <cstddef>
#include <initializer_list>

#include "gemma4_t4.hpp"

namespace testutil {

// One field of a config: its name, the value read and the value it must have (integers, enums and flags).
struct Field {
  const char* name;
  long long got, want;
};

// CHECKs every field; a failure names the field.
inline void check_fields(std::initializer_list<Field> fields) {
  for (const Field& f : fields) {
    INFO(f.name);
    CHECK(f.got == f.want);
  }
}

// The Field `name` of `got` and of `want`, two structs that name it alike.
#define TESTUTIL_FIELD(name) \
  testutil::Field { #name, (long long)(got.name), (long long)(want.name) }

// The sizes every config check looks at (named as in ModelConfig).
struct Sizes {
  int hidden_size, num_layers, num_heads, vocab_size, hidden_size_per_layer_input, sliding_window, num_kv_shared_layers;
};

inline void check_sizes(const gemma4_t4::ModelConfig& got, const Sizes& want) {
  check_fields({TESTUTIL_FIELD(hidden_size), TESTUTIL_FIELD(num_layers), TESTUTIL_FIELD(num_heads),
                TESTUTIL_FIELD(vocab_size), TESTUTIL_FIELD(hidden_size_per_layer_input), TESTUTIL_FIELD(sliding_window),
                TESTUTIL_FIELD(num_kv_shared_layers)});
}

// What one layer must read as (named as in LayerConfig).
struct LayerWant {
  gemma4_t4::LayerType type;
  int head_dim, num_kv_heads;
  bool kv_shared;
  int kv_source, intermediate_size;
  bool k_eq_v;
};

// Layer i of the n layers must read as want_of(i).
template <class WantOf>
void check_layers(const gemma4_t4::ModelConfig& c, int n, const WantOf& want_of) {
  REQUIRE(c.layers.size() == size_t(n));
  for (int i = 0; i < n; ++i) {
    INFO("layer " << i);
    const gemma4_t4::LayerConfig& got = c.layers[size_t(i)];
    const LayerWant want = want_of(i);
    check_fields({TESTUTIL_FIELD(type), TESTUTIL_FIELD(head_dim), TESTUTIL_FIELD(num_kv_heads),
                  TESTUTIL_FIELD(kv_shared), TESTUTIL_FIELD(kv_source), TESTUTIL_FIELD(intermediate_size),
                  TESTUTIL_FIELD(k_eq_v)});
  }
}

// mm_bf16 and w4a16: nested gemma4, 7 layers of width 64 (4 heads, 1 KV head), vocabulary 512, per-layer
// embeddings of width 32, window 8, soft-cap 30; layers S S F S S F F (head dim 32 sliding / 64 full), the last
// 3 sharing KV (sources 3, 2, 2) with the double-wide MLP (256 instead of 128).
inline void check_tiny_config(const gemma4_t4::ModelConfig& c) {
  CHECK(c.model_type == "gemma4");
  check_sizes(c, {64, 7, 4, 512, 32, 8, 3});
  CHECK(c.vocab_size_per_layer_input == 512);
  CHECK(c.final_logit_softcapping == 30.f);
  check_layers(c, 7, [](int i) {
    using T = gemma4_t4::LayerType;
    static const int kSource[7] = {0, 1, 2, 3, 3, 2, 2};
    const bool full = i == 2 || i >= 5;  // S S F S S F F
    return LayerWant{full ? T::Full : T::Sliding, full ? 64 : 32, 1, i >= 4, kSource[i], i >= 4 ? 256 : 128, false};
  });
}

}  // namespace testutil
