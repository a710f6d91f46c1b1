// Memory of a legal safetensors header's parse (issue 14): the header may be up to 100,000,000 bytes
// (detail::kMaxSafetensorsHeaderBytes), so what parsing it costs per header byte bounds what a hostile file can
// make the loader allocate. Measured with an allocation counter: this file replaces the global operator
// new / delete of the test executable; they count, for the calling thread only and only while a Meter is
// alive, the bytes live and their peak (malloc_usable_size: what the allocator really handed out).
//
// The header is the worst legal case per byte: as many tensors as fit, each one byte of data with a short
// name (the per-tensor bookkeeping dominates). The old reader built nlohmann/json's tree of the header
// first, ~10x its size (issue 14: 2 million tiny tensors, 1.72 GB RSS); the same tree is measured here for
// comparison.

#include <catch2/catch.hpp>
#include <malloc.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "gemma4_t4.hpp"
#include "gemma4_t4/common.hpp"
#include "gemma4_t4/safetensors.hpp"

namespace {

thread_local bool t_counting = false;
thread_local int64_t t_live = 0, t_peak = 0;

void* counted_alloc(std::size_t n) {
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  if (t_counting) {
    t_live += static_cast<int64_t>(malloc_usable_size(p));
    if (t_live > t_peak) t_peak = t_live;
  }
  return p;
}

void counted_free(void* p) noexcept {
  if (!p) return;
  if (t_counting) t_live -= static_cast<int64_t>(malloc_usable_size(p));
  std::free(p);
}

// Counts this thread's allocations while alive: peak() is the most bytes live at once above the start.
// Memory freed inside the window but allocated before it counts negative, which only lowers the peak.
struct Meter {
  Meter() {
    t_live = t_peak = 0;
    t_counting = true;
  }
  ~Meter() { t_counting = false; }
  int64_t peak() const { return t_peak; }
};

}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_free(p); }

namespace {

namespace d = gemma4_t4::detail;

// A legal file of `count` one-byte tensors named t0, t1, ... (header padded to 8 bytes, as writers do).
std::vector<uint8_t> many_tiny_tensors(size_t count) {
  std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
  h.reserve(count * 64);
  for (size_t i = 0; i < count; ++i)
    h += ",\"t" + std::to_string(i) + "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[" + std::to_string(i) +
         "," + std::to_string(i + 1) + "]}";
  h += "}";
  while (h.size() % 8) h += ' ';
  std::vector<uint8_t> b(8 + h.size() + count, 0x5a);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(uint64_t(h.size()) >> (8 * i));
  std::copy(h.begin(), h.end(), b.begin() + 8);
  return b;
}

uint64_t header_bytes(const std::vector<uint8_t>& b) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  return n;
}

}  // namespace

TEST_CASE("safetensors: the peak memory of parsing a legal header is a bounded multiple of its size",
          "[loader][memory]") {
  const size_t count = 200000;  // ~12 MB of header
  const std::vector<uint8_t> file = many_tiny_tensors(count);
  const double n = static_cast<double>(header_bytes(file));
  REQUIRE(n < d::kMaxSafetensorsHeaderBytes);

  int64_t parse_peak = 0, store_peak = 0, tree_peak = 0;
  {
    std::vector<d::TensorInfo> ts;
    Meter m;
    const gemma4_t4::Status st = d::parse_safetensors(file.data(), file.size(), "many.safetensors", &ts);
    parse_peak = m.peak();
    INFO(st.message);
    REQUIRE(st.is_ok());
    REQUIRE(ts.size() == count);
  }
  {
    d::TensorStore store;
    Meter m;
    REQUIRE(store.open_memory(file.data(), file.size(), "many.safetensors").is_ok());
    store_peak = m.peak();
    REQUIRE(store.tensors().size() == count);
  }
  {
    Meter m;
    const char* h = reinterpret_cast<const char*>(file.data() + 8);
    const nlohmann::json tree = nlohmann::json::parse(h, h + header_bytes(file));
    tree_peak = m.peak();
    REQUIRE(tree.size() == count + 1);
  }
  const double parse_x = parse_peak / n, store_x = store_peak / n, tree_x = tree_peak / n;
  std::printf(
      "header of %.0f bytes, %zu tensors: peak bytes allocated: parse_safetensors %lld (%.2fx the header), "
      "TensorStore::open_memory %lld (%.2fx), nlohmann::json tree of it %lld (%.2fx); at the %llu-byte limit: "
      "parse %.0f MB, TensorStore %.0f MB\n",
      n, count, static_cast<long long>(parse_peak), parse_x, static_cast<long long>(store_peak), store_x,
      static_cast<long long>(tree_peak), tree_x, static_cast<unsigned long long>(d::kMaxSafetensorsHeaderBytes),
      parse_x * d::kMaxSafetensorsHeaderBytes / 1e6, store_x * d::kMaxSafetensorsHeaderBytes / 1e6);
  CHECK(parse_x < 2.5);         // measured 1.93 (2026-12-03)
  CHECK(store_x < 5.5);         // measured 4.34
  CHECK(parse_x < tree_x / 2);  // the point of reading the header without its tree
}
