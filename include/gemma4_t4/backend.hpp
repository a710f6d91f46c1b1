// gemma4_t4 implementation part: the interface every backend implements.
#pragma once

#include <memory>
#include <vector>

namespace gemma4_t4 {
namespace detail {

// A session's state inside one backend (its KV cache lives in the derived class).
struct BackendSession {
  virtual ~BackendSession() = default;
  size_t pos = 0;      // tokens in the cache
  size_t max_ctx = 0;  // tokens it can hold
};

struct ForwardItem {
  BackendSession* session;
  const int32_t* tokens;
  size_t n;
};

class BackendModel {
 public:
  virtual ~BackendModel() = default;
  virtual Backend kind() const = 0;
  virtual Status new_session(size_t max_ctx, std::unique_ptr<BackendSession>* out) const = 0;
  // Items were validated by the Engine (ids in range, context not exceeded, sessions distinct). Appends
  // per item 1 (Last) or n (All) rows of logits. On error no session has advanced.
  virtual Status forward(const ForwardItem* items, size_t count, Logits which, std::vector<float>* logits) const = 0;
};

}  // namespace detail
}  // namespace gemma4_t4
