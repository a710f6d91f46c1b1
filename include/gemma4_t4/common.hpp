// gemma4_t4 implementation part: shared helpers (errors, number formats). Included by gemma4_t4.hpp
// inside GEMMA4_T4_IMPLEMENTATION; not a public header.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>

namespace gemma4_t4 {

namespace detail {

// ---- errors ----

// err(Code::FormatError, "file ", path, ": tensor ", name, " ...") -> Status with the parts concatenated.
template <typename... Parts>
Status err(Code code, Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return Status(code, os.str());
}

#define GEMMA4_T4_TRY(expr)           \
  do {                                \
    ::gemma4_t4::Status st_ = (expr); \
    if (!st_) return st_;             \
  } while (0)

// ---- number formats ----

inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even float -> fp16 bits; overflow gives +-inf (callers range-check first).
inline uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (absx < 0x38800000u) {                                               // subnormal or zero in fp16
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t shift = 113 - (absx >> 23);
    const uint32_t man = (absx & 0x7fffffu) | 0x800000u;
    uint32_t r = man >> (shift + 13);
    const uint32_t rem = man & ((1u << (shift + 13)) - 1);
    const uint32_t half = 1u << (shift + 12);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = ((absx - 0x38000000u) >> 13);
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

// dir + "/" + name without a doubled slash when dir ends in one ("ckpt/" + "config.json" -> "ckpt/config.json"),
// so messages name paths as a person would write them.
inline std::string path_join(const std::string& dir, const std::string& name) {
  size_t end = dir.size();
  while (end > 1 && dir[end - 1] == '/') --end;
  if (end == 0) return name;
  if (end == 1 && dir[0] == '/') return "/" + name;
  return dir.substr(0, end) + "/" + name;
}

inline std::string shape_str(const int64_t* dims, size_t n) {
  std::string s = "[";
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace detail
}  // namespace gemma4_t4
