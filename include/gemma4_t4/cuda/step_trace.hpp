// gemma4_t4 implementation part, CUDA backend: where a persistent decode step's time goes
// (LoadOptions::PersistentTuning::trace). The kernel (kernels/decode_step.cuh) stamps, per instruction and per
// block with items, when the block's wait begins, when it ends and when its items are counted; after each step
// this copies the stamps to the host and accumulates, per instruction:
//   release  the first block's wait ends - the previous instruction's last count: the counter's latency;
//   span     the last count - the first block's wait end: the instruction on the critical path;
//   spread   the last block's wait end - the first's: blocks still busy with earlier instructions;
//   work     the longest single block's items (wait end to count);
//   x build  the longest single block's x rows (GEMVs that build them: wait end to x ready);
//   item 1   the longest single block's first item (x ready, or wait end, to its first item done).
// When the engine closes, a table grouped by what the instructions compute is written to the trace file.
#pragma once

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "../../../kernels/decode_step.cuh"
#include "device.hpp"

namespace gemma4_t4 {
namespace detail {

class StepTrace {
 public:
  static constexpr int kSlots = kernels::kStepTraceSlots;
  unsigned long long* dev = nullptr;  // [count][grid][kSlots] ns, zeroed before each traced launch
  int grid = 0;                       // blocks of the launch being traced

  size_t bytes() const { return size_t(count_) * size_t(max_grid_) * kSlots * sizeof(unsigned long long); }

  // Opens the file now, so that an unwritable path is an error at load, not a silent loss at close.
  Status init(DeviceMemory& mem, const std::string& path, int count, int max_grid) {
    file_ = std::fopen(path.c_str(), "w");
    if (!file_) return err(Code::IoError, "persistent decode trace: cannot write ", path);
    count_ = count;
    max_grid_ = max_grid;
    GEMMA4_T4_TRY(mem.alloc(size_t(count) * size_t(max_grid) * kSlots, "persistent decode: trace", &dev));
    host_.resize(size_t(count) * size_t(max_grid) * kSlots);
    sum_.assign(size_t(count), Sums{});
    return Status::ok();
  }

  // After the traced step's stream has synchronised.
  Status add() {
    const size_t n = size_t(count_) * size_t(grid) * kSlots;
    GEMMA4_T4_CUDA_TRY(cudaMemcpy(host_.data(), dev, n * sizeof(unsigned long long), cudaMemcpyDeviceToHost),
                       "persistent decode: trace download");
    unsigned long long prev_end = 0, first = ~0ull, last = 0;
    for (int i = 0; i < count_; ++i) {
      unsigned long long t1_min = ~0ull, t1_max = 0, t2_max = 0, work = 0, xb = 0, item1 = 0;
      int blocks = 0;
      for (int b = 0; b < grid; ++b) {
        const unsigned long long* t = &host_[(size_t(i) * size_t(grid) + size_t(b)) * kSlots];
        if (t[2] == 0) continue;  // no items in this instruction
        ++blocks;
        first = std::min(first, t[0]);
        t1_min = std::min(t1_min, t[1]);
        t1_max = std::max(t1_max, t[1]);
        t2_max = std::max(t2_max, t[2]);
        work = std::max(work, t[2] - t[1]);
        if (t[3]) xb = std::max(xb, t[3] - t[1]);
        if (t[4]) item1 = std::max(item1, t[4] - (t[3] ? t[3] : t[1]));
      }
      if (blocks == 0) continue;
      Sums& s = sum_[size_t(i)];
      if (prev_end && t1_min > prev_end) s.release += double(t1_min - prev_end);
      s.span += double(t2_max - t1_min);
      s.spread += double(t1_max - t1_min);
      s.work += double(work);
      s.xbuild += double(xb);
      s.item1 += double(item1);
      s.blocks += blocks;
      prev_end = t2_max;
      last = std::max(last, t2_max);
    }
    if (last > first) step_ns_ += double(last - first);
    ++steps_;
    return Status::ok();
  }

  // The table (microseconds per step, means over the traced steps), grouped by label; closes the file.
  void write(const std::vector<std::string>& labels) {
    if (!file_) return;
    struct Group {
      int n = 0;  // instructions with this label
      Sums s;     // their sums
    };
    std::map<std::string, Group> groups;
    double total = 0;
    for (int i = 0; i < count_ && i < int(labels.size()); ++i) {
      Group& g = groups[labels[size_t(i)]];
      const Sums& s = sum_[size_t(i)];
      ++g.n;
      g.s += s;
      total += s.release + s.span;
    }
    const double k = steps_ ? 1e-3 / double(steps_) : 0.0;  // ns summed over steps -> us per step
    std::fprintf(file_, "persistent decode step trace: %ld steps, %d instructions, %d blocks\n", steps_, count_, grid);
    std::fprintf(file_, "step (first wait to last count): %.1f us; release + span summed: %.1f us\n", step_ns_ * k,
                 total * k);
    std::fprintf(file_, "%-36s %5s %12s %12s %12s %12s %12s %12s %12s %8s\n", "instruction", "n", "release us",
                 "span us", "span/instr", "spread/instr", "work/instr", "xbuild/instr", "item1/instr", "blocks");
    for (const auto& [label, g] : groups) {
      const Sums& s = g.s;
      std::fprintf(file_, "%-36s %5d %12.1f %12.1f %12.2f %12.2f %12.2f %12.2f %12.2f %8.0f\n", label.c_str(), g.n,
                   s.release * k, s.span * k, s.span * k / g.n, s.spread * k / g.n, s.work * k / g.n,
                   s.xbuild * k / g.n, s.item1 * k / g.n, steps_ ? s.blocks / double(steps_) / g.n : 0.0);
    }
    std::fclose(file_);
    file_ = nullptr;
  }

  StepTrace() = default;
  ~StepTrace() {
    if (file_) std::fclose(file_);
  }
  StepTrace(const StepTrace&) = delete;
  StepTrace& operator=(const StepTrace&) = delete;

 private:
  struct Sums {  // ns summed over the traced steps (blocks: a count)
    double release = 0, span = 0, spread = 0, work = 0, xbuild = 0, item1 = 0, blocks = 0;
    Sums& operator+=(const Sums& o) {
      release += o.release;
      span += o.span;
      spread += o.spread;
      work += o.work;
      xbuild += o.xbuild;
      item1 += o.item1;
      blocks += o.blocks;
      return *this;
    }
  };
  std::FILE* file_ = nullptr;
  int count_ = 0, max_grid_ = 0;
  std::vector<unsigned long long> host_;
  std::vector<Sums> sum_;
  double step_ns_ = 0;
  long steps_ = 0;
};

}  // namespace detail
}  // namespace gemma4_t4
