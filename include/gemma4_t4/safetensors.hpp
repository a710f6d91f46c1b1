// gemma4_t4 implementation part: safetensors reader.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]}, "__metadata__": {...}}
// then the data section; offsets are relative to its start. Files are memory-mapped read-only and every
// header field is validated before any pointer into the data is handed out, as strictly as the reference
// implementation (the Rust safetensors crate) does: the header is at most 100,000,000 bytes and lies inside
// the file, it is one JSON object of well-formed entries with only white space after it, each byte range
// lies inside the data section and its length equals dtype size x element count (no overflow), and the
// ranges tile the data section exactly (no gaps, no overlaps, no bytes after the last). Sharded checkpoints
// (`model.safetensors.index.json`) map each tensor to a shard file in the same directory.
// Tensor data may be unaligned (the header length is arbitrary): readers go through memcpy.
// A mapped file keeps its descriptor open: readers that touch the map after load first ask check_size()
// whether the file has shrunk meanwhile (reading a page past the new end would be SIGBUS). A file deleted
// after mapping stays readable (the mapping holds the inode).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace gemma4_t4 {
namespace detail {

// ---- dtypes ----

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, F8_E4M3, F8_E5M2 };

inline bool parse_dtype(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> table[] = {
      {"F64", DType::F64},   {"F32", DType::F32},         {"F16", DType::F16},        {"BF16", DType::BF16},
      {"I64", DType::I64},   {"I32", DType::I32},         {"I16", DType::I16},        {"I8", DType::I8},
      {"U64", DType::U64},   {"U32", DType::U32},         {"U16", DType::U16},        {"U8", DType::U8},
      {"BOOL", DType::BOOL}, {"F8_E4M3", DType::F8_E4M3}, {"F8_E5M2", DType::F8_E5M2}};
  for (const auto& e : table)
    if (s == e.first) {
      *out = e.second;
      return true;
    }
  return false;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U64: return "U64";
    case DType::U32: return "U32";
    case DType::U16: return "U16";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::F8_E5M2: return "F8_E5M2";
  }
  return "?";
}

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64:
    case DType::U64: return 8;
    case DType::F32:
    case DType::I32:
    case DType::U32: return 4;
    case DType::F16:
    case DType::BF16:
    case DType::I16:
    case DType::U16: return 2;
    default: return 1;
  }
}

// ---- one tensor ----

class MappedFile;

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping; possibly unaligned
  size_t nbytes = 0;
  const std::string* file = nullptr;  // the file it lives in (for messages)
  const MappedFile* map = nullptr;    // its mapping (TensorStore); null from parse_safetensors alone

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  std::string shape_string() const { return shape_str(shape.data(), shape.size()); }
};

// ---- the header ----

// The longest header a file may declare: the reference implementation's limit (the Rust safetensors crate's
// MAX_HEADER_SIZE, what transformers reads with). Parsing a legal header costs a few times its size in memory
// (the tensor list it produces; tests/test_loader_errors.cpp measures it), so the limit bounds that too.
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100000000;

// nlohmann/json SAX events -> TensorInfo, validated entry by entry as each closes, without building the JSON
// tree (which costs ~10x the header's size). Structure: {"name": {"dtype": S, "shape": [U...],
// "data_offsets": [U, U], other keys ignored}, "__metadata__": {"key": "string value"...}}; fields may not
// repeat. Errors stop the parse; the first is kept in `status`.
class SafetensorsHeaderReader {
 public:
  using json = nlohmann::json;

  SafetensorsHeaderReader(const std::string& where, const uint8_t* base, uint64_t data_size,
                          std::vector<TensorInfo>* out)
      : where_(where), base_(base), data_size_(data_size), out_(out) {}

  Status status;
  bool root_closed = false;  // the top-level object has ended (anything after it but white space is an error)

  bool null() { return scalar("null"); }
  bool boolean(bool) { return scalar("a boolean"); }
  bool number_integer(json::number_integer_t v) {
    if (v >= 0) return number_unsigned(static_cast<json::number_unsigned_t>(v));
    return number(std::to_string(v), "is negative");
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (skip_) return true;
    if (state_ == State::Shape) {
      if (v > (uint64_t(1) << 40) || (v != 0 && count_ > (uint64_t(1) << 62) / v))
        return bad("shape overflows (dimension " + std::to_string(v) + ")");
      count_ *= v;
      cur_.shape.push_back(static_cast<int64_t>(v));
      return true;
    }
    if (state_ == State::Offsets) {
      if (noffsets_ >= 2) return bad("data_offsets must be [begin, end]");
      offsets_[noffsets_++] = v;
      return true;
    }
    return scalar("a number");
  }
  bool number_float(json::number_float_t, const json::string_t& text) {
    // An integer literal past 2^64-1 reaches here as a float: say so rather than "not an integer".
    const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
    if (digits) return number(text, "is beyond 2^64-1, the largest offset or size a safetensors file can hold");
    return number(text, text[0] == '-' ? "is negative" : "is not an integer");
  }
  bool string(json::string_t& v) {
    if (skip_) return true;
    if (state_ == State::Dtype) {
      if (!parse_dtype(v, &cur_.dtype)) return bad("unknown dtype '" + v + "'");
      state_ = State::Entry;
      return true;
    }
    return scalar("a string");
  }
  bool binary(json::binary_t&) { return scalar("binary data"); }

  bool start_object(std::size_t) {
    if (skip_) return ++skip_, true;
    switch (state_) {
      case State::Start: state_ = State::Root; return true;
      case State::MetadataValue: state_ = State::Metadata; return true;
      case State::EntryValue:
        cur_ = TensorInfo();
        cur_.name = std::move(name_);
        count_ = 1;
        noffsets_ = 0;
        seen_ = 0;
        state_ = State::Entry;
        return true;
      case State::Field: return skip_field_value();  // an unknown field's object
      default: return scalar("an object");
    }
  }
  bool end_object() {
    if (skip_) return --skip_, true;
    switch (state_) {
      case State::Metadata: state_ = State::Root; return true;
      case State::Entry: state_ = State::Root; return finish_entry();
      case State::Root:
        state_ = State::Done;
        root_closed = true;
        return true;
      default: return true;
    }
  }
  bool start_array(std::size_t) {
    if (skip_) return ++skip_, true;
    switch (state_) {
      case State::ShapeValue: state_ = State::Shape; return true;
      case State::OffsetsValue: state_ = State::Offsets; return true;
      case State::Field: return skip_field_value();  // an unknown field's array
      default: return scalar("an array");
    }
  }
  bool end_array() {
    if (skip_) return --skip_, true;
    if (state_ == State::Offsets && noffsets_ != 2) return bad("data_offsets must be [begin, end]");
    state_ = State::Entry;
    return true;
  }
  bool key(json::string_t& k) {
    if (skip_) return true;
    if (state_ == State::Root) {
      if (k == "__metadata__") {
        if (seen_metadata_) return fail("__metadata__ appears twice");
        seen_metadata_ = true;
        state_ = State::MetadataValue;
      } else {
        name_ = std::move(k);
        state_ = State::EntryValue;
      }
      return true;
    }
    if (state_ == State::Metadata) {
      meta_key_ = std::move(k);
      state_ = State::MetadataString;
      return true;
    }
    // a field of a tensor entry
    static const char* const kFields[] = {"dtype", "shape", "data_offsets"};
    static const State kStates[] = {State::Dtype, State::ShapeValue, State::OffsetsValue};
    for (int i = 0; i < 3; ++i)
      if (k == kFields[i]) {
        if (seen_ & (1u << i)) return bad(std::string("field ") + kFields[i] + " appears twice");
        seen_ |= 1u << i;
        state_ = kStates[i];
        return true;
      }
    state_ = State::Field;  // unknown: its value is skipped (the reference ignores unknown fields too)
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    if (!status.is_ok()) return false;  // an error of ours stopped the parse: keep it
    if (root_closed)
      status = err(Code::FormatError, where_, ": header has bytes other than white space after its JSON object ",
                   "(at header byte ", position > 0 ? position - 1 : 0,
                   "); only spaces may pad the header (the writers pad it to a multiple of 8 bytes)");
    else
      status = err(Code::FormatError, where_, ": header is not well-formed JSON (", e.what(), ")");
    return false;
  }

 private:
  enum class State {
    Start,           // before the top-level value
    Root,            // in the top-level object, between entries
    Done,            // after it
    MetadataValue,   // after the key __metadata__
    Metadata,        // in __metadata__, between its entries
    MetadataString,  // after a key of __metadata__
    EntryValue,      // after a tensor's name
    Entry,           // in a tensor's object, between fields
    Dtype,           // after "dtype"
    ShapeValue,      // after "shape"
    Shape,           // in the shape array
    OffsetsValue,    // after "data_offsets"
    Offsets,         // in the data_offsets array
    Field,           // after an unknown field's key
  };

  Status fail_status(std::string what) { return err(Code::FormatError, where_, ": ", what); }
  bool fail(const std::string& what) {
    status = fail_status(what);
    return false;
  }
  bool bad(const std::string& what) { return fail("tensor '" + cur_.name + "': " + what); }

  // A value of the wrong kind for where it stands (`kind`: what it is).
  bool scalar(const char* kind) {
    if (skip_) return true;
    switch (state_) {
      case State::Field: state_ = State::Entry; return true;  // an unknown field's value
      case State::MetadataString: state_ = State::Metadata; return std::string(kind) == "a string" || meta_bad(kind);
      case State::Start: return fail("header JSON is not an object");
      case State::MetadataValue: return fail("__metadata__ is not an object");
      case State::EntryValue: return fail("tensor '" + name_ + "': entry is not an object");
      case State::Dtype: return bad("missing or non-string dtype");
      case State::ShapeValue: return bad("missing or non-array shape");
      case State::Shape: return bad(std::string("shape has a negative or non-integer dimension (") + kind + ")");
      case State::OffsetsValue: return bad("data_offsets must be [begin, end]");
      case State::Offsets: return bad(std::string("data_offsets are not non-negative integers (") + kind + ")");
      default: return fail(std::string("unexpected ") + kind + " in the header");
    }
  }
  // An unknown field's object or array: skipped whole (its nested events counted in skip_).
  bool skip_field_value() {
    skip_ = 1;
    state_ = State::Entry;
    return true;
  }
  bool meta_bad(const char* kind) {
    return fail("__metadata__ value '" + meta_key_ + "' is " + kind + ", not a string");
  }
  // A number that is not an unsigned 64-bit integer: `text` as written, `why` what is wrong with it.
  bool number(const std::string& text, const char* why) {
    if (skip_) return true;
    if (state_ == State::Shape) return bad("shape dimension " + text + " " + why);
    if (state_ == State::Offsets) return bad("data_offsets value " + text + " " + why);
    return scalar("a number");
  }

  // The entry's object has closed: every field present and consistent.
  bool finish_entry() {
    if (!(seen_ & 1u)) return bad("missing or non-string dtype");
    if (!(seen_ & 2u)) return bad("missing or non-array shape");
    if (!(seen_ & 4u)) return bad("data_offsets must be [begin, end]");
    const uint64_t b = offsets_[0], en = offsets_[1];
    if (b > en) return bad("data_offsets begin " + std::to_string(b) + " > end " + std::to_string(en));
    if (en > data_size_)
      return bad("data_offsets [" + std::to_string(b) + ", " + std::to_string(en) + ") lie outside the data section (" +
                 std::to_string(data_size_) + " bytes)");
    const uint64_t esize = dtype_size(cur_.dtype);
    if (count_ > (uint64_t(1) << 62) / esize || count_ * esize != en - b)
      return bad(std::string("byte range ") + std::to_string(en - b) + " does not match dtype " +
                 dtype_name(cur_.dtype) + " x shape " + cur_.shape_string());
    cur_.data = base_ + b;
    cur_.nbytes = static_cast<size_t>(en - b);
    out_->push_back(std::move(cur_));
    return true;
  }

  const std::string& where_;
  const uint8_t* base_;
  uint64_t data_size_;
  std::vector<TensorInfo>* out_;
  State state_ = State::Start;
  int skip_ = 0;  // depth inside an ignored value
  bool seen_metadata_ = false;
  std::string name_, meta_key_;
  TensorInfo cur_;      // the entry being read
  uint64_t count_ = 1;  // its element count so far
  uint64_t offsets_[2] = {0, 0};
  int noffsets_ = 0;
  unsigned seen_ = 0;  // fields seen: bit 0 dtype, 1 shape, 2 data_offsets
};

// Parses and validates a safetensors file's header over [data, data + size) (the whole file), as strictly as
// the reference implementation: the header length at most kMaxSafetensorsHeaderBytes and inside the file; the
// header one JSON object (no NUL bytes, only white space after it), entries as above; every byte range inside
// the data section and of dtype size x element count (no overflow); and the ranges, sorted, tile the data
// section exactly: from byte 0, no gaps, no overlaps, ending at the end of the file. `where` names the file in
// messages. Pure function: no I/O (the fuzzers call it directly).
inline Status parse_safetensors(const uint8_t* data, size_t size, const std::string& where,
                                std::vector<TensorInfo>* out) {
  out->clear();
  if (size < 8)
    return err(Code::FormatError, where, ": ", size,
               " bytes is too short for a safetensors file (needs an 8-byte header length)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > kMaxSafetensorsHeaderBytes)
    return err(Code::FormatError, where, ": header length ", n, " is over the limit of ", kMaxSafetensorsHeaderBytes,
               " bytes (the safetensors format's MAX_HEADER_SIZE); the file is corrupt or hostile");
  if (n > size - 8)
    return err(Code::FormatError, where, ": header length ", n, " runs past the end of the file (", size,
               " bytes); the file is truncated or not safetensors");
  if (n < 2) return err(Code::FormatError, where, ": header length ", n, " is too small for a JSON object");
  const char* hbeg = reinterpret_cast<const char*>(data + 8);
  // JSON text has no NUL bytes (in strings they are escaped); the JSON reader would stop at one and ignore
  // what follows it, so it is refused here.
  if (const void* nul = std::memchr(hbeg, '\0', static_cast<size_t>(n)))
    return err(Code::FormatError, where, ": header byte ", static_cast<const char*>(nul) - hbeg, " (of ", n,
               ") is NUL: the header is JSON text, padded after its object with spaces only");
  const uint64_t data_size = size - 8 - n;
  // Room for every entry up front, so the list never regrows (a regrowth holds the old and the new array at
  // once): one per "data_offsets" key in the text, at most what n bytes can hold (an entry takes >= 47).
  {
    const std::string_view text(hbeg, static_cast<size_t>(n));
    size_t keys = 0;
    for (size_t at = text.find("\"data_offsets\""); at != std::string_view::npos;
         at = text.find("\"data_offsets\"", at + 14))
      ++keys;
    out->reserve(std::min<size_t>(keys, static_cast<size_t>(n / 47 + 1)));
  }
  SafetensorsHeaderReader reader(where, data + 8 + n, data_size, out);
  const bool ok = nlohmann::json::sax_parse(hbeg, hbeg + n, &reader);
  if (!ok || !reader.status.is_ok()) {
    out->clear();
    return reader.status.is_ok() ? err(Code::FormatError, where, ": header is not well-formed JSON") : reader.status;
  }

  // Each name once (the reference keeps one of two entries of a name; the other's bytes would lie unused).
  std::vector<const TensorInfo*> order;
  order.reserve(out->size());
  for (const auto& t : *out) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->name < b->name; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->name == order[i - 1]->name) {
      const std::string name = order[i]->name;
      out->clear();
      return err(Code::FormatError, where, ": tensor '", name, "' appears twice in the header");
    }
  // The ranges, sorted by (begin, end), must tile [0, data_size): each begins where the one before ended.
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->data != b->data ? a->data < b->data : a->nbytes < b->nbytes;
  });
  const uint8_t* base = data + 8 + n;
  uint64_t covered = 0;  // bytes of the data section tiled so far
  const TensorInfo* prev = nullptr;
  Status st;
  for (const TensorInfo* t : order) {
    const uint64_t b = static_cast<uint64_t>(t->data - base);
    if (b < covered)
      st = err(Code::FormatError, where, ": tensors '", prev->name, "' and '", t->name,
               "' overlap in the data section (bytes [", b, ", ", covered, "))");
    else if (b > covered)
      st = err(Code::FormatError, where, ": bytes [", covered, ", ", b, ") of the data section belong to no tensor (",
               prev ? "a gap between '" + prev->name + "' and '" : "a gap before '", t->name,
               "'); the tensors must cover the data section exactly");
    if (!st.is_ok()) break;
    covered = b + t->nbytes;
    prev = t;
  }
  if (st.is_ok() && covered != data_size)
    st = err(Code::FormatError, where, ": bytes [", covered, ", ", data_size,
             ") at the end of the data section belong to no tensor (",
             prev ? "after the last one, '" + prev->name + "'" : std::string("the header lists none"),
             "); the tensors must cover the data section exactly");
  if (!st.is_ok()) out->clear();
  return st;
}

// ---- a mapped file ----

class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile() { close(); }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  Status open(const std::string& path) {
    close();
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      return err(errno == ENOENT ? Code::NotFound : Code::IoError, path, ": cannot open: ", std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
      Status s = err(Code::IoError, path, ": cannot stat: ", std::strerror(errno));
      ::close(fd);
      return s;
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return err(Code::IoError, path, ": not a regular file");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        Status s = err(Code::IoError, path, ": mmap of ", size_, " bytes failed: ", std::strerror(errno));
        ::close(fd);
        size_ = 0;
        return s;
      }
      data_ = static_cast<const uint8_t*>(p);
    }
    fd_ = fd;
    return Status::ok();
  }
  void close() {
    if (data_) munmap(const_cast<uint8_t*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
    data_ = nullptr;
    size_ = 0;
    fd_ = -1;
  }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

  // IoError when the file is now shorter than when it was mapped (truncated or rewritten in place). One
  // fstat: cheap enough before every pass. path: for the message.
  Status check_size(const std::string& path) const {
    if (fd_ < 0) return Status::ok();
    struct stat st;
    if (fstat(fd_, &st) != 0) return err(Code::IoError, path, ": cannot stat the mapped file: ", std::strerror(errno));
    if (static_cast<uint64_t>(st.st_size) < size_)
      return err(Code::IoError, "file ", path, " shrank from ", size_, " to ", st.st_size,
                 " bytes after it was mapped (truncated or rewritten while in use): its weights can no longer be "
                 "read; reload the checkpoint");
    return Status::ok();
  }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;  // kept open for check_size
};

// check_size of the file a tensor lives in (ok for a tensor not from a TensorStore).
inline Status check_mapped(const TensorInfo& t) { return t.map && t.file ? t.map->check_size(*t.file) : Status::ok(); }

// ---- a checkpoint: one file or shards ----

class TensorStore {
 public:
  // Opens `dir`/model.safetensors.index.json if present, else `dir`/model.safetensors; `dir` may also
  // name a single .safetensors file.
  Status open(const std::string& dir) {
    files_.clear();
    by_name_.clear();
    struct stat st;
    if (stat(dir.c_str(), &st) != 0) return err(Code::NotFound, dir, ": no such file or directory");
    if (S_ISREG(st.st_mode)) return add_file(dir, nullptr);
    const std::string index = path_join(dir, "model.safetensors.index.json");
    if (stat(index.c_str(), &st) == 0) return open_index(dir, index);
    const std::string single = path_join(dir, "model.safetensors");
    if (stat(single.c_str(), &st) != 0)
      return err(Code::NotFound, dir, ": neither model.safetensors nor model.safetensors.index.json is there");
    return add_file(single, nullptr);
  }

  // Indexes a safetensors image that is already in memory, as open() does a file: `data` [size bytes] is
  // borrowed and must outlive the store and every TensorInfo taken from it; `where` names it in messages.
  // For tests and the fuzzers (a read past the image then hits AddressSanitizer's redzone instead of the rest
  // of a mapped page).
  Status open_memory(const uint8_t* data, size_t size, const std::string& where) {
    files_.clear();
    by_name_.clear();
    return add_file(where, nullptr, data, size);
  }

  const TensorInfo* find(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &it->second;
  }
  const std::map<std::string, TensorInfo>& tensors() const { return by_name_; }
  size_t file_count() const { return files_.size(); }

  // MappedFile::check_size of every file: IoError naming the first that shrank since it was mapped.
  Status check_sizes() const {
    for (const auto& f : files_) GEMMA4_T4_TRY(f->map.check_size(f->path));
    return Status::ok();
  }

 private:
  struct File {
    std::string path;
    MappedFile map;
  };

  Status open_index(const std::string& dir, const std::string& index) {
    std::ifstream in(index, std::ios::binary);
    if (!in) return err(Code::IoError, index, ": cannot read");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return err(Code::FormatError, index, ": not a JSON object");
    auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) return err(Code::FormatError, index, ": missing object 'weight_map'");
    std::map<std::string, std::vector<std::string>> shard_names;  // shard file -> tensors it must hold
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string())
        return err(Code::FormatError, index, ": weight_map entry '", it.key(), "' is not a file name");
      const std::string f = it.value().get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f.find('\\') != std::string::npos || f == "." || f == "..")
        return err(Code::FormatError, index, ": shard name '", f, "' must be a plain file name in the same directory");
      shard_names[f].push_back(it.key());
    }
    if (shard_names.empty()) return err(Code::FormatError, index, ": weight_map is empty");
    for (const auto& s : shard_names) {
      GEMMA4_T4_TRY(add_file(path_join(dir, s.first), &s.second));
    }
    return Status::ok();
  }

  // Maps one file and indexes its tensors. `expected`: names the index assigns to it (checked present).
  // `image`: the file's contents already in memory (open_memory); then nothing is mapped.
  Status add_file(const std::string& path, const std::vector<std::string>* expected, const uint8_t* image = nullptr,
                  size_t image_size = 0) {
    files_.push_back(std::make_unique<File>());
    File& f = *files_.back();
    f.path = path;
    if (!image) {
      GEMMA4_T4_TRY(f.map.open(path));
      image = f.map.data();
      image_size = f.map.size();
    }
    std::vector<TensorInfo> ts;
    GEMMA4_T4_TRY(parse_safetensors(image, image_size, path, &ts));
    if (expected) {  // every tensor the index assigns to this shard must be in it
      std::vector<std::string> here;
      for (const auto& t : ts) here.push_back(t.name);
      std::sort(here.begin(), here.end());
      for (const auto& n : *expected)
        if (!std::binary_search(here.begin(), here.end(), n))
          return err(Code::NotFound, path, ": tensor '", n, "' listed in the index is not in this shard");
    }
    for (auto& t : ts) {
      t.file = &f.path;
      t.map = &f.map;
      if (by_name_.count(t.name))
        return err(Code::FormatError, path, ": tensor '", t.name, "' also appears in ", *by_name_[t.name].file);
      std::string key = t.name;
      by_name_.emplace(std::move(key), std::move(t));
    }
    return Status::ok();
  }

  std::vector<std::unique_ptr<File>> files_;
  std::map<std::string, TensorInfo> by_name_;
};

// Reads element i of a tensor as float (F32/F16/BF16 only; callers check dtype).
inline float load_float(const TensorInfo& t, size_t i) {
  switch (t.dtype) {
    case DType::F32: {
      float v;
      std::memcpy(&v, t.data + 4 * i, 4);
      return v;
    }
    case DType::F16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return f16_to_f32(h);
    }
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return bf16_to_f32(h);
    }
    default: return 0.f;
  }
}

}  // namespace detail
}  // namespace gemma4_t4
