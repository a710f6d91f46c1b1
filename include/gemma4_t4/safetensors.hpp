// gemma4_t4 implementation part: safetensors reader.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]}, "__metadata__": {...}}
// then the data section; offsets are relative to its start. Files are memory-mapped read-only and every
// header field is validated before any pointer into the data is handed out: the header lies inside the
// file, the JSON is an object of well-formed entries, each byte range lies inside the data section, its
// length equals dtype size x element count (no overflow), and no two ranges overlap. Sharded checkpoints
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
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
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

// Parses and validates a safetensors header over [data, data + size) (the whole file). `where` names the
// file in messages. Pure function: no I/O (the fuzzers call it directly).
inline Status parse_safetensors(const uint8_t* data, size_t size, const std::string& where,
                                std::vector<TensorInfo>* out) {
  out->clear();
  if (size < 8)
    return err(Code::FormatError, where, ": ", size,
               " bytes is too short for a safetensors file (needs an 8-byte header length)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > size - 8)
    return err(Code::FormatError, where, ": header length ", n, " runs past the end of the file (", size,
               " bytes); the file is truncated or not safetensors");
  if (n < 2) return err(Code::FormatError, where, ": header length ", n, " is too small for a JSON object");
  const char* hbeg = reinterpret_cast<const char*>(data + 8);
  nlohmann::json header = nlohmann::json::parse(hbeg, hbeg + n, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return err(Code::FormatError, where, ": header is not well-formed JSON");
  if (!header.is_object()) return err(Code::FormatError, where, ": header JSON is not an object");
  const uint8_t* base = data + 8 + n;
  const uint64_t data_size = size - 8 - n;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) return err(Code::FormatError, where, ": __metadata__ is not an object");
      continue;
    }
    auto bad = [&](const std::string& what) { return err(Code::FormatError, where, ": tensor '", name, "': ", what); };
    if (!e.is_object()) return bad("entry is not an object");
    auto dt = e.find("dtype");
    auto sh = e.find("shape");
    auto off = e.find("data_offsets");
    if (dt == e.end() || !dt->is_string()) return bad("missing or non-string dtype");
    if (sh == e.end() || !sh->is_array()) return bad("missing or non-array shape");
    if (off == e.end() || !off->is_array() || off->size() != 2) return bad("data_offsets must be [begin, end]");
    TensorInfo t;
    t.name = name;
    if (!parse_dtype(dt->get<std::string>(), &t.dtype)) return bad("unknown dtype '" + dt->get<std::string>() + "'");
    uint64_t count = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) return bad("shape has a negative or non-integer dimension");
      const uint64_t v = d.get<uint64_t>();
      if (v > (uint64_t(1) << 40) || (v != 0 && count > (uint64_t(1) << 62) / v)) return bad("shape overflows");
      count *= v;
      t.shape.push_back(static_cast<int64_t>(v));
    }
    if (!(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      return bad("data_offsets are not non-negative integers");
    const uint64_t b = (*off)[0].get<uint64_t>(), en = (*off)[1].get<uint64_t>();
    if (b > en) return bad("data_offsets begin " + std::to_string(b) + " > end " + std::to_string(en));
    if (en > data_size)
      return bad("data_offsets [" + std::to_string(b) + ", " + std::to_string(en) + ") lie outside the data section (" +
                 std::to_string(data_size) + " bytes)");
    if (count > (uint64_t(1) << 62) / dtype_size(t.dtype) || count * dtype_size(t.dtype) != en - b)
      return bad(std::string("byte range ") + std::to_string(en - b) + " does not match dtype " + dtype_name(t.dtype) +
                 " x shape " + t.shape_string());
    t.data = base + b;
    t.nbytes = static_cast<size_t>(en - b);
    out->push_back(std::move(t));
  }
  // No overlaps: sort by start, each non-empty range must begin at or after the previous end.
  std::vector<const TensorInfo*> order;
  for (const auto& t : *out)
    if (t.nbytes) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->data < b->data; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->data < order[i - 1]->data + order[i - 1]->nbytes)
      return err(Code::FormatError, where, ": tensors '", order[i - 1]->name, "' and '", order[i]->name,
                 "' overlap in the data section");
  return Status::ok();
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
    const std::string index = dir + "/model.safetensors.index.json";
    if (stat(index.c_str(), &st) == 0) return open_index(dir, index);
    const std::string single = dir + "/model.safetensors";
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
      GEMMA4_T4_TRY(add_file(dir + "/" + s.first, &s.second));
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
