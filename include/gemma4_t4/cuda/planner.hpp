// gemma4_t4 implementation part, CUDA backend: how a batch becomes passes, and what each pass needs staged
// before its kernels run -- its metadata, its attention splits and its per-layer-embedding rows.
//
// A pass: up to R = LoadOptions::max_pass_rows rows of up to kMaxSeqs sessions (prefill chunks and decode
// tokens alike), each item's tokens in order. A decode pass (one token per session, every row's logits
// wanted) can replay a CUDA graph (cuda/executor.hpp): one per row count up to 32 (the GEMVs' rows), above
// that one per bucket (kDecodeBuckets), the pass padded to the bucket's rows. A padding row is a token at
// position 0 of a session of its own whose one-slot cache is the workspace's pad_k / pad_v: it writes and
// reads only that, and rows never mix (every kernel's row is a function of its own inputs), so the real
// rows' results are those of the unpadded pass.
//
// PLE rows (LoadOptions::ple == Host, the default): the table stays in the mapped checkpoint; the rows of a
// pass's tokens are copied as stored (bf16 / fp16 / fp32; 17.5 KB per token on E2B) into pinned memory and
// uploaded, then widened on the GPU. Decode passes: one memcpy per row and an upload on the compute stream.
// Larger passes: gathered by the host's threads (parallel_for) and uploaded on a copy stream; the next
// pass's rows are gathered into the other half of the buffers while the GPU runs this one, and the compute
// stream waits on an event before the widen. (Measured on the H200 host: gathering in two chunks, the first
// uploaded while the second is gathered, took longer than one: each chunk pays the thread start-ups.)
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "../../../kernels/elementwise.cuh"
#include "workspace.hpp"

namespace gemma4_t4 {
namespace detail {

struct CudaSession : BackendSession {
  DeviceMemory mem;
  std::vector<half*> k, v;  // per layer: [slots, kv_heads, d] fp16; null on KV-shared layers
  std::vector<int> slots;   // per layer (kv_slots)
};

struct Segment {
  CudaSession* s;
  const int32_t* tokens;
  size_t pos;  // position of tokens[0]
  int n;
  bool last;  // holds the item's final token
};
using Pass = std::vector<Segment>;
using Plan = std::vector<Pass>;

// The items' tokens in passes of <= max_rows rows and <= kMaxSeqs sessions.
inline Plan split_passes(const ForwardItem* items, size_t count, int max_rows) {
  Plan plan(1);
  int rows = 0;
  for (size_t i = 0; i < count; ++i) {
    size_t done = 0;
    while (done < items[i].n) {
      if (rows == max_rows || int(plan.back().size()) == kMaxSeqs) {
        plan.emplace_back();
        rows = 0;
      }
      const size_t take = std::min(items[i].n - done, size_t(max_rows - rows));
      plan.back().push_back(Segment{&static_cast<CudaSession&>(*items[i].session), items[i].tokens + done,
                                    items[i].session->pos + done, int(take), done + take == items[i].n});
      rows += int(take);
      done += take;
    }
  }
  return plan;
}

inline int pass_rows(const Pass& pass) {
  int n = 0;
  for (const Segment& g : pass) n += g.n;
  return n;
}

// Rows of the pass whose logits `which` selects.
inline int selected_rows(const Pass& pass, Logits which) {
  int n = 0;
  for (const Segment& g : pass) n += which == Logits::All ? g.n : which == Logits::Last && g.last ? 1 : 0;
  return n;
}

// One token per session and every row's logits wanted: the shape a decode graph is captured for.
inline bool is_decode_pass(const Pass& pass, Logits which) {
  if (which == Logits::None || pass.empty() || int(pass.size()) > kMaxSeqs) return false;
  for (const Segment& g : pass)
    if (g.n != 1 || (which == Logits::Last && !g.last)) return false;
  return true;
}

// Decode-graph row counts past the GEMVs' 32: a pass of n rows replays the graph of the smallest bucket >= n.
constexpr int kDecodeBuckets[] = {48, 64, 96, 128};
static_assert(kDecodeBuckets[3] == kMaxSeqs, "the largest bucket holds a pass of kMaxSeqs sessions");

// The rows of the graph a decode pass of n rows replays: n itself up to 32, else its bucket; 0 (no graph)
// when that is more than the workspace's max_rows.
inline int decode_graph_rows(int n, int max_rows) {
  if (n <= kernels::kGemvMaxRows) return n <= max_rows ? n : 0;
  for (const int b : kDecodeBuckets)
    if (n <= b) return b <= max_rows ? b : 0;
  return 0;
}

// Index of a decode graph by its rows (decode_graph_rows' values): 0..31, then the buckets.
constexpr int kDecodeGraphs = kernels::kGemvMaxRows + int(sizeof(kDecodeBuckets) / sizeof(kDecodeBuckets[0]));
inline int decode_graph_index(int rows) {
  if (rows <= kernels::kGemvMaxRows) return rows - 1;
  int i = kernels::kGemvMaxRows;
  for (const int b : kDecodeBuckets) {
    if (rows == b) return i;
    ++i;
  }
  return -1;
}

struct PassShape {
  int rows = 0, selected = 0, max_pos = 0;
};

// Whether row t of segment g is one whose logits `which` returns: every row (All), an item's last (Last). The one
// rule for fill_meta's selected rows and the PLE stager's whole rows.
inline bool row_selected(Logits which, const Segment& g, int t) {
  return which == Logits::All || (which == Logits::Last && g.last && t == g.n - 1);
}

// Row sh.rows (its seq and pos written) as the next selected row.
inline void select_row(const PassMeta& m, PassShape* sh) {
  m.sel[sh->selected] = sh->rows;
  m.sel_seq[sh->selected] = m.seq[sh->rows];
  m.sel_pos[sh->selected] = m.pos[sh->rows];
  ++sh->selected;
}

// Writes a pass's metadata into the host view: rows (ids, seq, pos), the selected rows, and the cache table
// of its sessions; then, up to pad_to rows (a decode bucket), padding rows (see the header; pad_k / pad_v:
// the workspace's one-slot caches): selected, so that the graph's head writes their (unused) logits after the
// real rows'. The padding session's caches follow the pass's first session's layout (null on KV-shared layers).
inline PassShape fill_meta(const Pass& pass, Logits which, int layers, const PassMeta& m, int pad_to = 0,
                           half* pad_k = nullptr, half* pad_v = nullptr) {
  PassShape sh;
  for (size_t s = 0; s < pass.size(); ++s) {
    const Segment& g = pass[s];
    for (int t = 0; t < g.n; ++t) {
      m.ids[sh.rows] = g.tokens[t];
      m.seq[sh.rows] = int(s);
      m.pos[sh.rows] = int(g.pos + t);
      sh.max_pos = std::max(sh.max_pos, m.pos[sh.rows]);
      if (row_selected(which, g, t)) select_row(m, &sh);
      ++sh.rows;
    }
    for (int l = 0; l < layers; ++l) {
      m.slots[s * layers + l] = g.s->slots[l];
      m.k[s * layers + l] = g.s->k[l];
      m.v[s * layers + l] = g.s->v[l];
    }
  }
  if (sh.rows < pad_to) {
    const int s = int(pass.size());  // < pad_to <= kMaxSeqs: one session index more
    for (int l = 0; l < layers; ++l) {
      const bool own = pass.front().s->k[size_t(l)] != nullptr;  // KV-shared layers read an earlier layer's
      m.slots[s * layers + l] = 1;
      m.k[s * layers + l] = own ? pad_k : nullptr;
      m.v[s * layers + l] = own ? pad_v : nullptr;
    }
    const int32_t id = m.ids[sh.rows - 1];
    while (sh.rows < pad_to) {
      m.ids[sh.rows] = id;
      m.seq[sh.rows] = s;
      m.pos[sh.rows] = 0;
      select_row(m, &sh);
      ++sh.rows;
    }
  }
  return sh;
}

// Key ranges per row for the layers of this window (0 = full), and query-head slices per KV head
// (kernels::attention_head_split_for: a power of two that divides every such layer's group): about one 32-key
// tile per block while the grid fits the GPU's SMs about twice (past 32 rows: as many as one wave of the split kernel
// holds, at its occupancy for this head dim), a count the fused merge takes where that costs at most twice the tiles
// per block, bounded by the partials' scratch (kSplitBudget). head_split false: one
// slice (the persistent kernel's attention takes no slices).
struct AttnPlan {
  int splits = 1, head_split = 1;
};
inline AttnPlan attention_plan(const ModelConfig& c, int sms, int rows, int max_keys, int window,
                               bool head_split = true) {
  const int keys = window ? std::min(window, max_keys) : max_keys;
  int group = 1, hd = 0, kvh = 0, pow2 = 0;  // the layers this count serves (sliding iff window > 0); all if none
  for (int pass = 0; pass < 2 && hd == 0; ++pass)
    for (const LayerConfig& lc : c.layers)
      if (pass == 1 || (lc.type == LayerType::Sliding) == (window > 0)) {
        const int g = c.num_heads / lc.num_kv_heads;
        group = std::max(group, g);
        hd = std::max(hd, lc.head_dim);
        kvh = kvh ? std::min(kvh, lc.num_kv_heads) : lc.num_kv_heads;
        const int low = g & -g;  // the largest power of two dividing g
        pow2 = pow2 ? std::min(pow2, low) : low;
      }
  AttnPlan p;
  p.head_split = head_split ? kernels::attention_head_split_for(rows, kvh, std::max(pow2, 1), keys, sms) : 1;
  // past kAttnManyRows rows: as many splits as one wave of the split kernel holds (its blocks per SM at this head dim)
  const int per_sm = kernels::attention_blocks_per_sm(hd, std::max(group / p.head_split, 1));
  p.splits = kernels::attention_splits_for(rows, kvh, group, hd, keys, sms, kSplitBudget, p.head_split, per_sm);
  return p;
}
inline int attention_splits(const ModelConfig& c, int sms, int rows, int max_keys, int window) {
  return attention_plan(c, sms, rows, max_keys, window, false).splits;
}

// The PLE rows of passes, from the mapped table to the device (see the header). Two halves of every buffer:
// the rows of the pass running now and of the next.
class PleStager {
 public:
  PleStager() = default;
  PleStager(const PleStager&) = delete;
  PleStager& operator=(const PleStager&) = delete;
  ~PleStager() {
    for (cudaEvent_t e : copied_)
      if (e) cudaEventDestroy(e);
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
    cuda_free(Mem::Pinned, host_);
  }

  Status init(const ModelConfig& c, const TensorInfo& table, int max_rows) {
    table_ = &table;
    const size_t layer_bytes = size_t(c.hidden_size_per_layer_input) * (table.dtype == DType::F32 ? 4 : 2);
    row_bytes_ = size_t(c.num_layers) * layer_bytes;
    pass_bytes_ = size_t(max_rows) * row_bytes_;
    max_rows_ = max_rows;
    raw_type_ = table.dtype == DType::BF16  ? kernels::RawFloat::BF16
                : table.dtype == DType::F16 ? kernels::RawFloat::F16
                                            : kernels::RawFloat::F32;
    // the layers a row runs through when its logits are not returned (block.hpp kv_keep_layer: their PLE branches)
    prefix_bytes_ = size_t(kv_keep_layer(c)) * layer_bytes;
    GEMMA4_T4_TRY(mem_.alloc(2 * pass_bytes_, "workspace: PLE rows (raw, 2 passes)", &dev_));
    GEMMA4_T4_TRY(cuda_alloc(Mem::Pinned, 2 * pass_bytes_, "workspace: PLE rows (pinned, 2 passes)", &host_));
    GEMMA4_T4_CUDA_TRY(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "cudaStreamCreate (copies)");
    // rows staged in part keep what was there past their prefix: zeros until a whole row was staged there (done
    // before the first upload on any stream: zero_now)
    GEMMA4_T4_CUDA_TRY(zero_now(dev_, 2 * pass_bytes_, copy_stream_), "PLE rows (raw)");
    for (cudaEvent_t& e : copied_)
      GEMMA4_T4_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return Status::ok();
  }

  // More rows than a decode step: worth the host's threads and the copy stream.
  static bool large(const Pass& pass) { return pass_rows(pass) > kernels::kGemvMaxRows; }

  // Brings the rows of a pass's tokens into half `buf`: synchronously ordered on `stream` for small passes
  // (*async = false), else uploaded on the copy stream with copied_[buf] recorded (*async = true). Up to
  // pad_to rows: padding rows (fill_meta's) repeat the last token's. A row whose logits `which` does not select
  // stops after kv_keep_layer's K/V (block.hpp): where at most kWholeRowsMax rows are selected, the others bring
  // only the layers' part of their row that it reads (the prefix), the rest of it left as it was.
  Status stage(const Pass& pass, Logits which, int buf, cudaStream_t stream, bool* async, int pad_to = 0) {
    uint8_t* host = host_ + size_t(buf) * pass_bytes_;
    uint8_t* dev = dev_ + size_t(buf) * pass_bytes_;
    const uint8_t* table = table_->data;
    const size_t row = row_bytes_;
    ids_.clear();
    whole_.clear();
    for (const Segment& g : pass) {
      for (int t = 0; t < g.n; ++t)
        if (row_selected(which, g, t)) whole_.push_back(int(ids_.size()) + t);
      ids_.insert(ids_.end(), g.tokens, g.tokens + g.n);
    }
    for (int r = int(ids_.size()); !ids_.empty() && r < pad_to; ++r) {  // padding rows are selected
      ids_.push_back(ids_.back());
      whole_.push_back(r);
    }
    const size_t n = ids_.size();
    const bool part = prefix_bytes_ < row && whole_.size() < n && whole_.size() <= kWholeRowsMax;
    const size_t take = part ? prefix_bytes_ : row;  // bytes of every row but whole_'s
    auto copy = [&](size_t b, size_t e) {
      for (size_t r = b; r < e; ++r) std::memcpy(host + r * row, table + size_t(ids_[r]) * row, take);
    };
    *async = large(pass);
    if (*async)
      parallel_for(n, double(n * take), copy);
    else  // not worth a thread or a second stream
      copy(0, n);
    const cudaStream_t s = *async ? copy_stream_ : stream;
    if (part) {
      GEMMA4_T4_CUDA_TRY(cudaMemcpy2DAsync(dev, row, host, row, take, n, cudaMemcpyHostToDevice, s), "PLE rows upload");
      for (const int r : whole_) {  // the selected rows' remainders
        const size_t at = size_t(r) * row + take;
        std::memcpy(host + at, table + size_t(ids_[size_t(r)]) * row + take, row - take);
        GEMMA4_T4_CUDA_TRY(cudaMemcpyAsync(dev + at, host + at, row - take, cudaMemcpyHostToDevice, s),
                           "PLE rows upload");
      }
    } else {
      GEMMA4_T4_CUDA_TRY(cudaMemcpyAsync(dev, host, n * row, cudaMemcpyHostToDevice, s), "PLE rows upload");
    }
    if (*async) GEMMA4_T4_CUDA_TRY(cudaEventRecord(copied_[buf], copy_stream_), "PLE rows upload");
    return Status::ok();
  }

  // Makes `stream` wait for an asynchronous upload of half `buf`, then widens its `rows` rows into tok
  // ([rows, L * D] fp32).
  Status widen(int buf, bool async, int rows, float* tok, const kernels::Launch& ln) const {
    if (async) GEMMA4_T4_CUDA_TRY(cudaStreamWaitEvent(ln.stream, copied_[buf], 0), "PLE rows upload");
    const size_t elems = size_t(rows) * row_bytes_ / (raw_type_ == kernels::RawFloat::F32 ? 4 : 2);
    GEMMA4_T4_CUDA_TRY(kernels::launch_widen(dev_ + size_t(buf) * pass_bytes_, raw_type_, elems, tok, ln),
                       "PLE rows widen");
    return Status::ok();
  }

  // Makes `stream` wait for an asynchronous upload of half `buf` (no widen: the reader takes the raw rows).
  cudaError_t wait(int buf, cudaStream_t stream) const { return cudaStreamWaitEvent(stream, copied_[buf], 0); }

  // No upload of a pass that will not run may still read the pinned rows when the next call writes them.
  void drain() const {
    if (copy_stream_) cudaStreamSynchronize(copy_stream_);
  }

  // Half `buf` of the raw rows on the device ([R, L * D] as stored) and its type: the persistent decode
  // executor reads them itself.
  const uint8_t* raw(int buf) const { return dev_ + size_t(buf) * pass_bytes_; }
  kernels::RawFloat raw_type() const { return raw_type_; }

 private:
  // Passes with more selected rows than this stage whole rows (one upload instead of one per selected row).
  static constexpr size_t kWholeRowsMax = 8;

  const TensorInfo* table_ = nullptr;
  size_t row_bytes_ = 0, pass_bytes_ = 0;
  size_t prefix_bytes_ = 0;  // of a row: the per-layer inputs of the layers before kv_keep_layer
  int max_rows_ = 0;
  kernels::RawFloat raw_type_ = kernels::RawFloat::BF16;
  DeviceMemory mem_;
  uint8_t* dev_ = nullptr;   // 2 x [R, L * D] rows as stored
  uint8_t* host_ = nullptr;  // pinned mirror
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t copied_[2] = {};  // recorded on copy_stream_ after a half's upload
  std::vector<int32_t> ids_;    // the pass's token ids, in row order
  std::vector<int> whole_;      // rows staged whole (selected), in row order
};

}  // namespace detail
}  // namespace gemma4_t4
