// The table of bad inputs: every malformed or unsupported checkpoint must come back as its own Status, with
// the right Code and a message that names what is wrong and where (file, tensor, field), and never crash.
//
// Part 1 drives the detail-level parsers directly (detail::parse_safetensors on in-memory bytes,
// detail::TensorStore on temp directories, detail::parse_config on strings). Part 2 feeds the same tables,
// plus the weight/shape checks that only the engine does, through the public Engine::load.
//
// Every case builds its own unique temp directory (removed at the end) from a copy of a real fixture in
// tests/fixtures, mutated in one way, so each failure is caused by exactly the defect the case names.
// Message checks use key words (file name, tensor name, field name, the offending value), not sentences.

#include <catch2/catch.hpp>

#include "gemma4_t4.hpp"
#include "temp_dir.hpp"
#include "fixture_config.hpp"
#include "gemma4_t4/common.hpp"
#include "gemma4_t4/safetensors.hpp"
#include "gemma4_t4/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef GEMMA4_T4_FIXTURES
#define GEMMA4_T4_FIXTURES "tests/fixtures"
#endif

namespace {

namespace fs = std::filesystem;
namespace d = gemma4_t4::detail;
using gemma4_t4::Code;
using gemma4_t4::LayerType;
using gemma4_t4::ModelConfig;
using gemma4_t4::Status;
using gemma4_t4::WeightFormat;
using json = nlohmann::json;
using Bytes = std::vector<uint8_t>;

// ---- files and temp dirs -----------------------------------------------------------------------------------

fs::path fixture(const std::string& name) { return fs::path(GEMMA4_T4_FIXTURES) / name; }

using testutil::TempDir;

Bytes read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in.good());
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const fs::path& p, const Bytes& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  REQUIRE(out.good());
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  REQUIRE(out.good());
}

void write_text(const fs::path& p, const std::string& s) { write_bytes(p, Bytes(s.begin(), s.end())); }

json read_json(const fs::path& p) {
  const Bytes b = read_bytes(p);
  return json::parse(b.begin(), b.end());
}

void write_json(const fs::path& p, const json& j) { write_text(p, j.dump(2)); }

// Copies tests/fixtures/<name> (config, weights, reference) into dst (created).
void copy_fixture(const std::string& name, const fs::path& dst) {
  fs::create_directories(dst);
  fs::copy(fixture(name), dst, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
}

// ---- safetensors bytes ---------------------------------------------------------------------------------------

// 8-byte little-endian `header_len` (which may lie), the header text, then the data section. (memcpy into a
// sized vector: vector::insert of the string's bytes draws a false -Warray-bounds from GCC 12 at -O3.)
Bytes raw_safetensors(uint64_t header_len, const std::string& header, const Bytes& data = {}) {
  Bytes b(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(header_len >> (8 * i));
  if (!header.empty()) std::memcpy(b.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(b.data() + 8 + header.size(), data.data(), data.size());
  return b;
}

// A file whose header length is honest.
Bytes make_safetensors(const std::string& header, const Bytes& data = {}) {
  return raw_safetensors(header.size(), header, data);
}

// One tensor for the writer: its bytes are laid out in list order.
struct Entry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  Bytes data;
};

// A well-formed safetensors file (header padded to 8 bytes, as the reference writer does).
Bytes write_safetensors(const std::vector<Entry>& entries) {
  json h = json::object();
  h["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  for (const Entry& e : entries) {
    h[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {off, off + e.data.size()}}};
    off += e.data.size();
  }
  std::string header = h.dump();
  while ((8 + header.size()) % 8) header += ' ';
  Bytes data;
  for (const Entry& e : entries) data.insert(data.end(), e.data.begin(), e.data.end());
  return make_safetensors(header, data);
}

// Every tensor of a real file, in file order, with its bytes copied out.
std::vector<Entry> read_entries(const fs::path& file) {
  const Bytes b = read_bytes(file);
  std::vector<d::TensorInfo> ts;
  const Status st = d::parse_safetensors(b.data(), b.size(), file.string(), &ts);
  INFO(st.message);
  REQUIRE(st.is_ok());
  std::sort(ts.begin(), ts.end(), [](const d::TensorInfo& a, const d::TensorInfo& c) { return a.data < c.data; });
  std::vector<Entry> out;
  for (const auto& t : ts) out.push_back({t.name, d::dtype_name(t.dtype), t.shape, Bytes(t.data, t.data + t.nbytes)});
  return out;
}

// Parses `file`, lets `edit` change the tensor list, writes a new well-formed file in its place.
void rewrite_safetensors(const fs::path& file, const std::function<void(std::vector<Entry>&)>& edit) {
  std::vector<Entry> es = read_entries(file);
  edit(es);
  write_bytes(file, write_safetensors(es));
}

Entry& entry(std::vector<Entry>& es, const std::string& name) {
  auto it = std::find_if(es.begin(), es.end(), [&](const Entry& e) { return e.name == name; });
  INFO("tensor " << name);
  REQUIRE(it != es.end());
  return *it;
}

void drop_entry(std::vector<Entry>& es, const std::string& name) {
  const size_t before = es.size();
  es.erase(std::remove_if(es.begin(), es.end(), [&](const Entry& e) { return e.name == name; }), es.end());
  INFO("tensor " << name);
  REQUIRE(es.size() + 1 == before);
}

// The text model's part of a config (nested under text_config for model_type gemma4).
json& text_config(json& root) { return root.contains("text_config") ? root["text_config"] : root; }

json& quant_group0(json& root) { return root["quantization_config"]["config_groups"]["group_0"]; }

// ---- status checks ---------------------------------------------------------------------------------------

std::string codes_string(const std::vector<Code>& codes) {
  std::string s;
  for (Code c : codes) s += (s.empty() ? "" : " or ") + std::string(gemma4_t4::code_name(c));
  return s;
}

// The status is one of `codes` and its message contains every word.
void check_status(const Status& st, const std::vector<Code>& codes, const std::vector<std::string>& words) {
  INFO("got: " << gemma4_t4::code_name(st.code) << ": " << st.message);
  INFO("expected: " << codes_string(codes));
  CHECK(std::find(codes.begin(), codes.end(), st.code) != codes.end());
  CHECK_FALSE(st.message.empty());
  for (const std::string& w : words) CHECK_THAT(st.message, Catch::Matchers::Contains(w));
}

// ---- table: bad safetensors bytes ---------------------------------------------------------------------------

struct BadBytes {
  std::string label;
  Bytes bytes;
  std::vector<std::string> words;  // besides the file name
};

std::vector<BadBytes> bad_safetensors_table() {
  const Bytes data8(8, 0), data12(12, 0), data16(16, 0);
  const uint64_t max64 = std::numeric_limits<uint64_t>::max();
  std::string deep(100000, '[');
  deep += std::string(100000, ']');
  return {
      {"empty file", {}, {"0 bytes", "too short"}},
      {"file of 5 bytes", {0x10, 0, 0, 0, 0}, {"5 bytes", "too short"}},
      {"header length past EOF", raw_safetensors(100, "{}"), {"header length 100", "past the end"}},
      {"header length 0xFFFFFFFFFFFFFFFF",
       raw_safetensors(max64, "{}", data8),
       {"header length 18446744073709551615", "over the limit of 100000000 bytes"}},
      // The reference's MAX_HEADER_SIZE: one byte more is refused before anything is read or allocated.
      {"header length 100000001 (over the limit)",
       raw_safetensors(100000001, "{}", data8),
       {"header length 100000001", "over the limit of 100000000 bytes"}},
      {"header length 0", raw_safetensors(0, "", data8), {"header length 0", "too small"}},
      {"malformed JSON", make_safetensors(R"({"w": {"dtype": "F32", "shape": [2], )", data8), {"JSON"}},
      {"header JSON is an array", make_safetensors("[1, 2, 3]", data8), {"not an object"}},
      {"header JSON is 100000 nested arrays", make_safetensors(deep), {"not an object"}},
      {"__metadata__ not an object", make_safetensors(R"({"__metadata__": [1]})"), {"__metadata__"}},
      {"entry not an object", make_safetensors(R"({"w": 5})", data8), {"'w'", "not an object"}},
      {"entry missing dtype",
       make_safetensors(R"({"w": {"shape": [2], "data_offsets": [0, 8]}})", data8),
       {"'w'", "dtype"}},
      {"entry missing shape",
       make_safetensors(R"({"w": {"dtype": "F32", "data_offsets": [0, 8]}})", data8),
       {"'w'", "shape"}},
      {"entry missing data_offsets",
       make_safetensors(R"({"w": {"dtype": "F32", "shape": [2]}})", data8),
       {"'w'", "data_offsets"}},
      {"data_offsets of three numbers",
       make_safetensors(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4, 8]}})", data8),
       {"'w'", "data_offsets"}},
      {"unknown dtype Q4",
       make_safetensors(R"({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})", data8),
       {"'w'", "Q4"}},
      {"negative dim",
       make_safetensors(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", data8),
       {"'w'", "negative"}},
      {"fractional dim",
       make_safetensors(R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})", data8),
       {"'w'", "shape"}},
      {"negative data offset",
       make_safetensors(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})", data8),
       {"'w'", "data_offsets"}},
      {"data_offsets begin > end",
       make_safetensors(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", data8),
       {"'w'", "begin 8", "end 0"}},
      {"data_offsets outside the data section",
       make_safetensors(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", data8),
       {"'w'", "outside the data section", "16"}},
      {"data_offsets far outside (2^64-1)",
       make_safetensors(
           R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [18446744073709551614, 18446744073709551615]}})",
           data8),
       {"'w'", "outside the data section"}},
      {"byte count does not match dtype x shape",
       make_safetensors(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", data8),
       {"'w'", "F32", "[3]", "does not match"}},
      {"two tensors overlap",
       make_safetensors(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                        data12),
       {"'a'", "'b'", "overlap"}},
      {"one tensor inside another",
       make_safetensors(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                            "b": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]}})",
                        data16),
       {"'a'", "'b'", "overlap"}},
      // 2^32 x 2^32 elements wraps to 0 in 64 bits: a naive product would "match" the empty range.
      {"shape product overflows 64 bits",
       make_safetensors(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", data8),
       {"'w'", "overflow"}},
      {"shape with a 2^63 dim",
       make_safetensors(R"({"w": {"dtype": "U8", "shape": [9223372036854775808], "data_offsets": [0, 0]}})", data8),
       {"'w'", "overflow"}},
      // data_offsets that JSON holds as integers but 64 bits cannot: named as such, not "not an integer".
      {"data_offsets beyond 2^64-1",
       make_safetensors(R"({"w": {"dtype": "U8", "shape": [8], "data_offsets": [0, 18446744073709551616]}})", data8),
       {"'w'", "data_offsets value 18446744073709551616 is beyond 2^64-1"}},
      {"data_offsets begin beyond 2^64-1",
       make_safetensors(R"({"w": {"dtype": "U8", "shape": [8], "data_offsets": [99999999999999999999999, 8]}})", data8),
       {"'w'", "data_offsets value 99999999999999999999999 is beyond 2^64-1"}},
      {"shape dimension beyond 2^64-1",
       make_safetensors(R"({"w": {"dtype": "U8", "shape": [18446744073709551616], "data_offsets": [0, 8]}})", data8),
       {"'w'", "shape dimension 18446744073709551616 is beyond 2^64-1"}},
      {"fractional data offset",
       make_safetensors(R"({"w": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8.0]}})", data8),
       {"'w'", "data_offsets value 8.0 is not an integer"}},
      // The tensors must tile the data section: from byte 0, without gaps, to the end of the file.
      {"a gap between two tensors ([0, 4) and [8, 12))",
       make_safetensors(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                            "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                        data12),
       {"bytes [4, 8) of the data section belong to no tensor", "between 'a' and 'b'"}},
      {"a gap before the first tensor",
       make_safetensors(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", data8),
       {"bytes [0, 4) of the data section belong to no tensor", "before 'w'"}},
      {"bytes after the last tensor",
       make_safetensors(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", data12),
       {"bytes [8, 12) at the end of the data section belong to no tensor", "after the last one, 'w'"}},
      {"a data section and no tensors",
       make_safetensors(R"({"__metadata__": {"format": "pt"}})", data8),
       {"bytes [0, 8) at the end of the data section belong to no tensor", "lists none"}},
      {"an empty tensor inside another's bytes",
       make_safetensors(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                            "z": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}})",
                        data8),
       {"'a'", "'z'", "overlap"}},
      // Inside the header only white space may follow the JSON object (writers pad with spaces).
      {"NUL after the JSON object, then more JSON",
       make_safetensors(std::string(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})") +
                            std::string(1, '\0') + R"({"v": garbage)",
                        data8),
       {"header byte 61 (of 75) is NUL", "spaces only"}},
      {"NUL padding",
       make_safetensors(
           std::string(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})") + std::string(5, '\0'),
           data8),
       {"header byte 61 (of 66) is NUL"}},
      {"text after the JSON object",
       make_safetensors(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}   x)", data8),
       {"bytes other than white space after its JSON object", "header byte 64", "only spaces"}},
      {"a second JSON object after the first",
       make_safetensors(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}{"v": 1})", data8),
       {"bytes other than white space after its JSON object"}},
      // What the reference's types refuse as well: a name twice, a field twice, metadata that is not text.
      {"a tensor name twice",
       make_safetensors(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                            "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                        data8),
       {"tensor 'w' appears twice"}},
      {"a field twice",
       make_safetensors(R"({"w": {"dtype": "F32", "shape": [2], "shape": [2], "data_offsets": [0, 8]}})", data8),
       {"'w'", "field shape appears twice"}},
      {"__metadata__ value not a string",
       make_safetensors(R"({"__metadata__": {"format": {"nested": 1}}})"),
       {"__metadata__ value 'format' is an object, not a string"}},
  };
}

// ---- table: checkpoint directories -----------------------------------------------------------------------

// A copy of a real fixture at <tmp>/ckpt, mutated once; `codes`/`words` are what loading it must give.
struct DirCase {
  std::string label;
  std::string fixture;
  std::function<void(const fs::path& root, const fs::path& ckpt)> mutate;
  std::vector<Code> codes;
  std::vector<std::string> words;
};

const char* kShard1 = "model-00001-of-00002.safetensors";
const char* kShard2 = "model-00002-of-00002.safetensors";
const char* kIndex = "model.safetensors.index.json";

// Broken files: what detail::TensorStore (and so Engine::load) must refuse.
std::vector<DirCase> store_cases() {
  auto set_shard = [](const std::string& tensor, const std::string& shard) {
    return [tensor, shard](const fs::path&, const fs::path& ckpt) {
      json idx = read_json(ckpt / kIndex);
      REQUIRE(idx["weight_map"].contains(tensor));
      idx["weight_map"][tensor] = shard;
      write_json(ckpt / kIndex, idx);
    };
  };
  auto traversal = [](const std::string& shard_name) {
    return [shard_name](const fs::path& root, const fs::path& ckpt) {
      // A real shard really is there, so only the name check can stop it.
      fs::copy_file(ckpt / kShard1, root / "evil.safetensors");
      json idx = read_json(ckpt / kIndex);
      idx["weight_map"]["model.embed_tokens.weight"] = shard_name;
      write_json(ckpt / kIndex, idx);
    };
  };
  std::vector<DirCase> v;
  // Single-file checkpoints.
  v.push_back({"real model.safetensors truncated in the middle of the data",
               "mm_bf16",
               [](const fs::path&, const fs::path& ckpt) {
                 Bytes b = read_bytes(ckpt / "model.safetensors");
                 uint64_t n = 0;
                 for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
                 REQUIRE(8 + n < b.size());
                 b.resize(8 + n + (b.size() - 8 - n) / 2);
                 write_bytes(ckpt / "model.safetensors", b);
               },
               {Code::FormatError},
               {"model.safetensors", "outside the data section"}});
  v.push_back({"real model.safetensors truncated inside its header",
               "mm_bf16",
               [](const fs::path&, const fs::path& ckpt) {
                 Bytes b = read_bytes(ckpt / "model.safetensors");
                 b.resize(100);
                 write_bytes(ckpt / "model.safetensors", b);
               },
               {Code::FormatError},
               {"model.safetensors", "past the end"}});
  v.push_back({"model.safetensors missing",
               "mm_bf16",
               [](const fs::path&, const fs::path& ckpt) { REQUIRE(fs::remove(ckpt / "model.safetensors")); },
               {Code::NotFound},
               {"model.safetensors"}});
  // Sharded checkpoints.
  v.push_back({"index JSON malformed",
               "flat_keqv",
               [](const fs::path&, const fs::path& ckpt) {
                 write_text(ckpt / kIndex, R"({"metadata": {"total_size": 1}, "weight_map": {"lm_head.weight": )");
               },
               {Code::FormatError},
               {kIndex}});
  v.push_back({"index without weight_map",
               "flat_keqv",
               [](const fs::path&, const fs::path& ckpt) { write_text(ckpt / kIndex, R"({"metadata": {}})"); },
               {Code::FormatError},
               {kIndex, "weight_map"}});
  v.push_back({"index weight_map entry not a string",
               "flat_keqv",
               [](const fs::path&, const fs::path& ckpt) {
                 json idx = read_json(ckpt / kIndex);
                 idx["weight_map"]["model.embed_tokens.weight"] = 7;
                 write_json(ckpt / kIndex, idx);
               },
               {Code::FormatError},
               {kIndex, "model.embed_tokens.weight"}});
  v.push_back({"shard file deleted",
               "flat_keqv",
               [](const fs::path&, const fs::path& ckpt) { REQUIRE(fs::remove(ckpt / kShard2)); },
               {Code::NotFound},
               {kShard2}});
  v.push_back({"weight_map points to a shard that does not exist",
               "flat_keqv",
               set_shard("model.embed_tokens.weight", "model-00009-of-00002.safetensors"),
               {Code::NotFound},
               {"model-00009-of-00002.safetensors"}});
  v.push_back({"shard name with ../ (path traversal)",
               "flat_keqv",
               traversal("../evil.safetensors"),
               {Code::FormatError},
               {kIndex, "../evil.safetensors"}});
  v.push_back({"shard name with ..\\ (path traversal)",
               "flat_keqv",
               traversal("..\\evil.safetensors"),
               {Code::FormatError},
               {kIndex, "evil.safetensors"}});
  v.push_back({"shard name '..'", "flat_keqv", traversal(".."), {Code::FormatError}, {kIndex, "'..'"}});
  v.push_back({"shard name an absolute path",
               "flat_keqv",
               [](const fs::path& root, const fs::path& ckpt) {
                 fs::copy_file(ckpt / kShard1, root / "evil.safetensors");
                 json idx = read_json(ckpt / kIndex);
                 idx["weight_map"]["model.embed_tokens.weight"] = (root / "evil.safetensors").string();
                 write_json(ckpt / kIndex, idx);
               },
               {Code::FormatError},
               {kIndex, "evil.safetensors"}});
  v.push_back({"tensor listed in the index but absent from its shard",
               "flat_keqv",
               [](const fs::path&, const fs::path& ckpt) {
                 json idx = read_json(ckpt / kIndex);
                 idx["weight_map"]["model.layers.0.self_attn.not_there.weight"] = kShard2;
                 write_json(ckpt / kIndex, idx);
               },
               {Code::NotFound},
               {"model.layers.0.self_attn.not_there.weight", kShard2}});
  v.push_back({"the same tensor stored in two shards",
               "flat_keqv",
               [](const fs::path&, const fs::path& ckpt) {
                 std::vector<Entry> s1 = read_entries(ckpt / kShard1);
                 const Entry lm = entry(s1, "lm_head.weight");
                 rewrite_safetensors(ckpt / kShard2, [&](std::vector<Entry>& es) { es.push_back(lm); });
               },
               {Code::FormatError},
               {"lm_head.weight", kShard1, kShard2}});
  return v;
}

// Well-formed files whose content does not fit the config: only the engine's checks can refuse these.
std::vector<DirCase> engine_cases() {
  const std::string lm = "model.language_model.";
  std::vector<DirCase> v;
  // Weights of the bf16 checkpoint.
  v.push_back({"bf16: tensor missing (layers.1.mlp.up_proj.weight)",
               "mm_bf16",
               [lm](const fs::path&, const fs::path& ckpt) {
                 rewrite_safetensors(ckpt / "model.safetensors", [&](std::vector<Entry>& es) {
                   drop_entry(es, lm + "layers.1.mlp.up_proj.weight");
                 });
               },
               {Code::NotFound},
               {"layers.1.mlp.up_proj.weight"}});
  v.push_back({"bf16: wrong shape [120, 64] for [128, 64] (layers.1.mlp.up_proj.weight)",
               "mm_bf16",
               [lm](const fs::path&, const fs::path& ckpt) {
                 rewrite_safetensors(ckpt / "model.safetensors", [&](std::vector<Entry>& es) {
                   Entry& e = entry(es, lm + "layers.1.mlp.up_proj.weight");
                   REQUIRE(e.shape == std::vector<int64_t>{128, 64});
                   e.shape = {120, 64};
                   e.data.resize(120 * 64 * 2);
                 });
               },
               {Code::FormatError},
               {"layers.1.mlp.up_proj.weight", "120", "128"}});
  v.push_back({"bf16: transposed shape [64, 128] for [128, 64] (layers.1.mlp.gate_proj.weight)",
               "mm_bf16",
               [lm](const fs::path&, const fs::path& ckpt) {
                 rewrite_safetensors(ckpt / "model.safetensors", [&](std::vector<Entry>& es) {
                   Entry& e = entry(es, lm + "layers.1.mlp.gate_proj.weight");
                   REQUIRE(e.shape == std::vector<int64_t>{128, 64});
                   e.shape = {64, 128};
                 });
               },
               {Code::FormatError},
               {"layers.1.mlp.gate_proj.weight"}});
  v.push_back({"bf16: embed_tokens with 500 rows for vocab 512",
               "mm_bf16",
               [lm](const fs::path&, const fs::path& ckpt) {
                 rewrite_safetensors(ckpt / "model.safetensors", [&](std::vector<Entry>& es) {
                   Entry& e = entry(es, lm + "embed_tokens.weight");
                   REQUIRE(e.shape == std::vector<int64_t>{512, 64});
                   e.shape = {500, 64};
                   e.data.resize(500 * 64 * 2);
                 });
               },
               {Code::FormatError},
               {"embed_tokens.weight", "500", "512"}});
  v.push_back({"bf16: dtype I32 for a float tensor (layers.1.input_layernorm.weight)",
               "mm_bf16",
               [lm](const fs::path&, const fs::path& ckpt) {
                 rewrite_safetensors(ckpt / "model.safetensors", [&](std::vector<Entry>& es) {
                   Entry& e = entry(es, lm + "layers.1.input_layernorm.weight");
                   REQUIRE(e.shape == std::vector<int64_t>{64});
                   e.dtype = "I32";
                   e.data.assign(64 * 4, 0);
                 });
               },
               {Code::FormatError, Code::Unsupported},
               {"layers.1.input_layernorm.weight", "I32"}});
  v.push_back({"bf16: dtype I32 for a linear weight (layers.1.self_attn.q_proj.weight)",
               "mm_bf16",
               [lm](const fs::path&, const fs::path& ckpt) {
                 rewrite_safetensors(ckpt / "model.safetensors", [&](std::vector<Entry>& es) {
                   Entry& e = entry(es, lm + "layers.1.self_attn.q_proj.weight");
                   REQUIRE(e.shape == std::vector<int64_t>{128, 64});
                   e.dtype = "I32";
                   e.data.assign(128 * 64 * 4, 0);
                 });
               },
               {Code::FormatError, Code::Unsupported},
               {"layers.1.self_attn.q_proj.weight", "I32"}});
  // Config problems seen through the engine.
  v.push_back({"config.json missing",
               "mm_bf16",
               [](const fs::path&, const fs::path& ckpt) { REQUIRE(fs::remove(ckpt / "config.json")); },
               {Code::NotFound},
               {"config.json"}});
  v.push_back(
      {"config.json malformed",
       "mm_bf16",
       [](const fs::path&, const fs::path& ckpt) { write_text(ckpt / "config.json", "{\"model_type\": \"gemma4\", "); },
       {Code::FormatError},
       {"config.json"}});
  v.push_back({"config.json enable_moe_block true",
               "mm_bf16",
               [](const fs::path&, const fs::path& ckpt) {
                 json c = read_json(ckpt / "config.json");
                 text_config(c)["enable_moe_block"] = true;
                 write_json(ckpt / "config.json", c);
               },
               {Code::Unsupported},
               {"config.json", "enable_moe_block"}});
  // A field of the wrong JSON type must not surface as an escaped exception (BackendError) either.
  v.push_back({"config.json hidden_activation a number (wrong JSON type)",
               "mm_bf16",
               [](const fs::path&, const fs::path& ckpt) {
                 json c = read_json(ckpt / "config.json");
                 text_config(c)["hidden_activation"] = 42;
                 write_json(ckpt / "config.json", c);
               },
               {Code::FormatError, Code::Unsupported},
               {"config.json", "hidden_activation"}});
  // The w4a16 checkpoint.
  v.push_back({"w4a16: weight_scale of the wrong shape [100, 2] for [128, 2]",
               "w4a16",
               [lm](const fs::path&, const fs::path& ckpt) {
                 rewrite_safetensors(ckpt / "model.safetensors", [&](std::vector<Entry>& es) {
                   Entry& e = entry(es, lm + "layers.1.mlp.up_proj.weight_scale");
                   REQUIRE(e.shape == std::vector<int64_t>{128, 2});
                   e.shape = {100, 2};
                   e.data.resize(100 * 2 * 2);
                 });
               },
               {Code::FormatError},
               {"layers.1.mlp.up_proj.weight_scale", "100"}});
  v.push_back({"w4a16: weight_scale with one group too many [128, 3] for [128, 2]",
               "w4a16",
               [lm](const fs::path&, const fs::path& ckpt) {
                 rewrite_safetensors(ckpt / "model.safetensors", [&](std::vector<Entry>& es) {
                   Entry& e = entry(es, lm + "layers.1.mlp.gate_proj.weight_scale");
                   REQUIRE(e.shape == std::vector<int64_t>{128, 2});
                   e.shape = {128, 3};
                   e.data.resize(128 * 3 * 2);
                 });
               },
               {Code::FormatError},
               {"layers.1.mlp.gate_proj.weight_scale"}});
  v.push_back({"w4a16: weight_packed of the wrong shape [100, 8] for [128, 8]",
               "w4a16",
               [lm](const fs::path&, const fs::path& ckpt) {
                 rewrite_safetensors(ckpt / "model.safetensors", [&](std::vector<Entry>& es) {
                   Entry& e = entry(es, lm + "layers.1.mlp.up_proj.weight_packed");
                   REQUIRE(e.shape == std::vector<int64_t>{128, 8});
                   e.shape = {100, 8};
                   e.data.resize(100 * 8 * 4);
                 });
               },
               {Code::FormatError},
               {"layers.1.mlp.up_proj.weight_packed", "100"}});
  v.push_back({"w4a16: weight_scale missing",
               "w4a16",
               [lm](const fs::path&, const fs::path& ckpt) {
                 rewrite_safetensors(ckpt / "model.safetensors", [&](std::vector<Entry>& es) {
                   drop_entry(es, lm + "layers.1.self_attn.o_proj.weight_scale");
                 });
               },
               {Code::NotFound},
               {"layers.1.self_attn.o_proj.weight_scale"}});
  v.push_back({"w4a16: packed weights while config.json has no quantization_config",
               "w4a16",
               [](const fs::path&, const fs::path& ckpt) {
                 json c = read_json(ckpt / "config.json");
                 REQUIRE(c.erase("quantization_config") == 1);
                 write_json(ckpt / "config.json", c);
               },
               {Code::Unsupported, Code::FormatError},
               {"quantization_config"}});
  return v;
}

// Builds one case's directory under `tmp` and returns the checkpoint path.
fs::path build_case(const DirCase& c, const TempDir& tmp) {
  const fs::path ckpt = tmp.path() / "ckpt";
  copy_fixture(c.fixture, ckpt);
  c.mutate(tmp.path(), ckpt);
  return ckpt;
}

// ---- table: config.json -----------------------------------------------------------------------------------

struct ConfigCase {
  std::string label;
  std::string fixture;                // whose config.json is mutated
  std::function<void(json&)> mutate;  // on the parsed root
  Code code;
  std::vector<std::string> words;  // besides "config.json"
};

std::vector<ConfigCase> config_cases() {
  auto tc = [](std::function<void(json&)> f) { return [f](json& root) { f(text_config(root)); }; };
  auto wq = [](std::function<void(json&)> f) { return [f](json& root) { f(quant_group0(root)["weights"]); }; };
  return {
      {"model_type llama (flat)",
       "flat_keqv",
       [](json& r) { r["model_type"] = "llama"; },
       Code::Unsupported,
       {"llama"}},
      {"text_config.model_type llama (nested)",
       "mm_bf16",
       tc([](json& t) { t["model_type"] = "llama"; }),
       Code::Unsupported,
       {"text_config", "llama"}},
      {"model_type gemma4 without text_config",
       "mm_bf16",
       [](json& r) { r.erase("text_config"); },
       Code::FormatError,
       {"text_config"}},
      {"enable_moe_block true",
       "mm_bf16",
       tc([](json& t) { t["enable_moe_block"] = true; }),
       Code::Unsupported,
       {"enable_moe_block"}},
      {"num_experts 8", "flat_keqv", [](json& r) { r["num_experts"] = 8; }, Code::Unsupported, {"num_experts", "8"}},
      {"attention_bias true",
       "flat_keqv",
       [](json& r) { r["attention_bias"] = true; },
       Code::Unsupported,
       {"attention_bias"}},
      {"use_bidirectional_attention all",
       "flat_keqv",
       [](json& r) { r["use_bidirectional_attention"] = "all"; },
       Code::Unsupported,
       {"use_bidirectional_attention"}},
      {"hidden_activation silu",
       "flat_keqv",
       [](json& r) { r["hidden_activation"] = "silu"; },
       Code::Unsupported,
       {"hidden_activation", "silu"}},
      {"layer_types with chunked_attention",
       "flat_keqv",
       [](json& r) { r["layer_types"][2] = "chunked_attention"; },
       Code::Unsupported,
       {"layer_types", "chunked_attention"}},
      {"layer_types of the wrong length",
       "flat_keqv",
       [](json& r) { r["layer_types"].push_back("sliding_attention"); },
       Code::FormatError,
       {"layer_types", "num_hidden_layers"}},
      {"num_kv_shared_layers == num_hidden_layers",
       "mm_bf16",
       tc([](json& t) { t["num_kv_shared_layers"] = 7; }),
       Code::FormatError,
       {"num_kv_shared_layers", "7"}},
      {"num_kv_shared_layers > num_hidden_layers",
       "mm_bf16",
       tc([](json& t) { t["num_kv_shared_layers"] = 9; }),
       Code::FormatError,
       {"num_kv_shared_layers", "9"}},
      {"rope_type yarn on full attention",
       "flat_keqv",
       [](json& r) { r["rope_parameters"]["full_attention"]["rope_type"] = "yarn"; },
       Code::Unsupported,
       {"rope_parameters.full_attention", "rope_type", "yarn"}},
      {"rope_type yarn for every layer type",
       "flat_keqv",
       [](json& r) {
         r["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}};
       },
       Code::Unsupported,
       {"rope_type", "yarn"}},
      {"num_attention_heads not a multiple of num_key_value_heads",
       "flat_keqv",
       [](json& r) { r["num_attention_heads"] = 5; },
       Code::FormatError,
       {"num_attention_heads", "5", "num_key_value_heads"}},
      {"per-layer KV heads not dividing the heads",
       "flat_keqv",
       [](json& r) { r["per_layer_config"]["1"]["num_key_value_heads"] = 3; },
       Code::FormatError,
       {"layer 1", "3 KV heads"}},
      {"per_layer_config key not a layer",
       "flat_keqv",
       [](json& r) {
         r["per_layer_config"]["12"] = {{"head_dim", 64}};
       },
       Code::FormatError,
       {"per_layer_config", "12"}},
      {"hidden_size a string",
       "flat_keqv",
       [](json& r) { r["hidden_size"] = "64"; },
       Code::FormatError,
       {"hidden_size"}},
      {"hidden_size negative",
       "flat_keqv",
       [](json& r) { r["hidden_size"] = -64; },
       Code::FormatError,
       {"hidden_size", "-64"}},
      {"quant_method gptq",
       "w4a16",
       [](json& r) { r["quantization_config"]["quant_method"] = "gptq"; },
       Code::Unsupported,
       {"quantization_config", "gptq"}},
      {"quantization num_bits 8",
       "w4a16",
       wq([](json& w) { w["num_bits"] = 8; }),
       Code::Unsupported,
       {"quantization_config", "num_bits", "8"}},
      {"quantization symmetric false",
       "w4a16",
       wq([](json& w) { w["symmetric"] = false; }),
       Code::Unsupported,
       {"quantization_config", "asymmetric"}},
      {"quantization group_size 128",
       "w4a16",
       wq([](json& w) { w["group_size"] = 128; }),
       Code::Unsupported,
       {"quantization_config", "group_size", "128"}},
      {"quantization actorder group",
       "w4a16",
       wq([](json& w) { w["actorder"] = "group"; }),
       Code::Unsupported,
       {"quantization_config", "act-order"}},
      {"quantization strategy channel",
       "w4a16",
       wq([](json& w) { w["strategy"] = "channel"; }),
       Code::Unsupported,
       {"quantization_config", "strategy", "channel"}},
      {"quantization type float",
       "w4a16",
       wq([](json& w) { w["type"] = "float"; }),
       Code::Unsupported,
       {"quantization_config", "type", "float"}},
      {"quantization input_activations present",
       "w4a16",
       [](json& r) {
         quant_group0(r)["input_activations"] = {
             {"num_bits", 8}, {"type", "int"}, {"symmetric", true}, {"strategy", "token"}};
       },
       Code::Unsupported,
       {"quantization_config", "input", "activations"}},
      {"quantization format float-quantized",
       "w4a16",
       [](json& r) {
         r["quantization_config"]["format"] = "float-quantized";
         quant_group0(r)["format"] = "float-quantized";
       },
       Code::Unsupported,
       {"quantization_config", "float-quantized"}},
      {"quantization config_groups missing",
       "w4a16",
       [](json& r) { r["quantization_config"].erase("config_groups"); },
       Code::FormatError,
       {"quantization_config", "config_groups"}},
  };
}

Status parse_config_text(const std::string& text, ModelConfig* cfg) {
  return d::parse_config(text, "config.json", cfg);
}

std::string fixture_config_text(const std::string& name) {
  const Bytes b = read_bytes(fixture(name) / "config.json");
  return std::string(b.begin(), b.end());
}

}  // namespace

// ============================================================================================================
// Part 1: the detail-level parsers.
// ============================================================================================================

TEST_CASE("safetensors: the writer and the real fixtures parse (control for the bad-bytes table)", "[loader][errors]") {
  std::vector<d::TensorInfo> ts;
  const Bytes good = make_safetensors(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", Bytes(8, 0));
  CHECK(d::parse_safetensors(good.data(), good.size(), "good.safetensors", &ts).is_ok());
  CHECK(ts.size() == 1);
  const Bytes empty_tensor = make_safetensors(R"({"z": {"dtype": "BF16", "shape": [0, 64], "data_offsets": [0, 0]}})");
  CHECK(d::parse_safetensors(empty_tensor.data(), empty_tensor.size(), "zero.safetensors", &ts).is_ok());
  const Bytes written = write_safetensors({{"a", "BF16", {2, 3}, Bytes(12, 1)}, {"b", "I32", {4}, Bytes(16, 2)}});
  REQUIRE(d::parse_safetensors(written.data(), written.size(), "written.safetensors", &ts).is_ok());
  REQUIRE(ts.size() == 2);
  for (const char* f : {"mm_bf16/model.safetensors", "w4a16/model.safetensors",
                        "flat_keqv/model-00001-of-00002.safetensors", "flat_keqv/model-00002-of-00002.safetensors"}) {
    INFO(f);
    const Bytes b = read_bytes(fixture(f));
    const Status st = d::parse_safetensors(b.data(), b.size(), f, &ts);
    INFO(st.message);
    CHECK(st.is_ok());
    CHECK_FALSE(ts.empty());
    // A round trip through the test's writer is a valid file with the same tensors.
    const Bytes again = write_safetensors(read_entries(fixture(f)));
    std::vector<d::TensorInfo> ts2;
    CHECK(d::parse_safetensors(again.data(), again.size(), f, &ts2).is_ok());
    CHECK(ts2.size() == ts.size());
  }
}

TEST_CASE("safetensors: every bad file is its own FormatError naming the file", "[loader][errors]") {
  for (const BadBytes& c : bad_safetensors_table()) {
    INFO("case: " << c.label);
    std::vector<d::TensorInfo> ts;
    const std::string where = "bad_case.safetensors";
    Status st;
    REQUIRE_NOTHROW(st = d::parse_safetensors(c.bytes.empty() ? nullptr : c.bytes.data(), c.bytes.size(), where, &ts));
    std::vector<std::string> words = c.words;
    words.push_back(where);
    check_status(st, {Code::FormatError}, words);
  }
}

TEST_CASE("TensorStore: broken single files and shard indexes", "[loader][errors]") {
  {
    d::TensorStore store;
    const std::string missing = "/nonexistent/gemma4_t4/no_such_checkpoint";
    check_status(store.open(missing), {Code::NotFound}, {missing});
  }
  for (const DirCase& c : store_cases()) {
    INFO("case: " << c.label);
    TempDir tmp;
    const fs::path ckpt = build_case(c, tmp);
    d::TensorStore store;
    Status st;
    REQUIRE_NOTHROW(st = store.open(ckpt.string()));
    check_status(st, c.codes, c.words);
  }
}

TEST_CASE("TensorStore: open_memory indexes a file's bytes in place, as open() indexes the file", "[loader][errors]") {
  const fs::path f = fixture("w4a16/model.safetensors");
  const Bytes b = read_bytes(f);
  d::TensorStore from_file, in_memory;
  REQUIRE(from_file.open(f.string()).is_ok());
  REQUIRE(in_memory.open_memory(b.data(), b.size(), "w4a16 in memory").is_ok());
  REQUIRE(in_memory.tensors().size() == from_file.tensors().size());
  for (const auto& kv : from_file.tensors()) {
    INFO(kv.first);
    const d::TensorInfo* t = in_memory.find(kv.first);
    REQUIRE(t != nullptr);
    CHECK(t->dtype == kv.second.dtype);
    CHECK(t->shape == kv.second.shape);
    REQUIRE(t->nbytes == kv.second.nbytes);
    CHECK((t->data >= b.data() && t->data + t->nbytes <= b.data() + b.size()));  // views into b, not copies
    CHECK(std::equal(t->data, t->data + t->nbytes, kv.second.data));
  }
  const Bytes cut(b.begin(), b.begin() + 100);
  check_status(in_memory.open_memory(cut.data(), cut.size(), "cut.safetensors"), {Code::FormatError},
               {"cut.safetensors"});
  CHECK(in_memory.tensors().empty());
}

TEST_CASE("TensorStore: the engine-level cases are well-formed safetensors (their errors are semantic)",
          "[loader][errors]") {
  for (const DirCase& c : engine_cases()) {
    INFO("case: " << c.label);
    TempDir tmp;
    const fs::path ckpt = build_case(c, tmp);
    d::TensorStore store;
    const Status st = store.open(ckpt.string());
    INFO(st.message);
    CHECK(st.is_ok());
  }
}

TEST_CASE("config: every bad config.json is its own error naming the field", "[loader][errors][config]") {
  {
    ModelConfig cfg;
    check_status(parse_config_text(R"({"model_type": "gemma4_text", "hidden_size": 64,)", &cfg), {Code::FormatError},
                 {"config.json", "JSON"});
    check_status(parse_config_text("", &cfg), {Code::FormatError}, {"config.json", "JSON"});
    check_status(parse_config_text("[1, 2]", &cfg), {Code::FormatError}, {"config.json", "object"});
  }
  for (const ConfigCase& c : config_cases()) {
    INFO("case: " << c.label);
    json root = json::parse(fixture_config_text(c.fixture));
    c.mutate(root);
    ModelConfig cfg;
    Status st;
    REQUIRE_NOTHROW(st = parse_config_text(root.dump(2), &cfg));
    std::vector<std::string> words = c.words;
    words.push_back("config.json");
    check_status(st, {c.code}, words);
  }
}

// The library promises Status values, never exceptions: a field of the wrong JSON type (a number where a
// string belongs) must be a FormatError/Unsupported naming the field. An explicit null means "absent"
// (the reference's default), as transformers writes null for unset optional fields.
TEST_CASE("config: wrong-typed fields are errors, not exceptions", "[loader][errors][config]") {
  struct Case {
    std::string label, fixture;
    std::function<void(json&)> mutate;
    std::string word;
  };
  const std::vector<Case> cases = {
      {"model_type a number", "flat_keqv", [](json& r) { r["model_type"] = 5; }, "model_type"},
      {"model_type null", "flat_keqv", [](json& r) { r["model_type"] = nullptr; }, "model_type"},
      {"text_config.model_type a number", "mm_bf16", [](json& r) { r["text_config"]["model_type"] = 5; }, "model_type"},
      {"hidden_activation a list", "flat_keqv", [](json& r) { r["hidden_activation"] = json::array({1}); },
       "hidden_activation"},
      {"hidden_activation a number", "flat_keqv", [](json& r) { r["hidden_activation"] = 1; }, "hidden_activation"},
      {"rope_type a number", "flat_keqv", [](json& r) { r["rope_parameters"]["sliding_attention"]["rope_type"] = 5; },
       "rope_type"},
      {"quant_method a number", "w4a16", [](json& r) { r["quantization_config"]["quant_method"] = 5; }, "quant_method"},
      {"config group format a number", "w4a16", [](json& r) { quant_group0(r)["format"] = 7; }, "format"},
      {"weights.num_bits a string", "w4a16", [](json& r) { quant_group0(r)["weights"]["num_bits"] = "4"; }, "num_bits"},
      {"weights.symmetric a string", "w4a16", [](json& r) { quant_group0(r)["weights"]["symmetric"] = "true"; },
       "symmetric"},
      {"weights.dynamic a string", "w4a16", [](json& r) { quant_group0(r)["weights"]["dynamic"] = "no"; }, "dynamic"},
  };
  for (const Case& c : cases) {
    INFO("case: " << c.label);
    json root = json::parse(fixture_config_text(c.fixture));
    c.mutate(root);
    ModelConfig cfg;
    Status st;
    bool threw = false;
    try {
      st = parse_config_text(root.dump(2), &cfg);
    } catch (const std::exception& e) {
      threw = true;
      FAIL_CHECK("parse_config threw instead of returning a Status: " << e.what());
    }
    if (!threw) check_status(st, {Code::FormatError, Code::Unsupported}, {"config.json", c.word});
  }
}

TEST_CASE("config: explicit nulls take the reference defaults", "[loader][config]") {
  json root = json::parse(fixture_config_text("w4a16"));
  root["text_config"]["hidden_activation"] = nullptr;
  root["text_config"]["sliding_window"] = nullptr;
  quant_group0(root)["weights"]["dynamic"] = nullptr;
  ModelConfig cfg;
  const Status st = parse_config_text(root.dump(2), &cfg);
  INFO(st.message);
  REQUIRE(st.is_ok());
  CHECK(cfg.sliding_window == 512);  // Gemma4TextConfig's default
  CHECK(cfg.weight_format == WeightFormat::W4A16);
}

TEST_CASE("config: the real fixture configs parse with the expected values", "[loader][config]") {
  const LayerType S = LayerType::Sliding, F = LayerType::Full;

  SECTION("mm_bf16 and w4a16: nested gemma4, PLE, KV sharing of both types, double-wide MLP") {
    for (const char* name : {"mm_bf16", "w4a16"}) {
      INFO(name);
      ModelConfig cfg;
      const Status st = parse_config_text(fixture_config_text(name), &cfg);
      INFO(st.message);
      REQUIRE(st.is_ok());
      testutil::check_tiny_config(cfg);  // sizes, layer types, head dims, KV sharing, MLP widths
      CHECK(cfg.max_position_embeddings == 4096);
      CHECK(cfg.rms_norm_eps == Approx(1e-6f));
      CHECK(cfg.tie_word_embeddings);
      CHECK(cfg.bos_token_id == 2);
      CHECK(cfg.pad_token_id == 0);
      CHECK(cfg.eos_token_ids == std::vector<int>{1, 106});
      if (std::string(name) == "w4a16") {
        CHECK(cfg.weight_format == WeightFormat::W4A16);
        CHECK(cfg.quant_group_size == 32);
      } else {
        CHECK(cfg.weight_format == WeightFormat::Bf16);
        CHECK(cfg.quant_group_size == 0);
      }
      for (int i = 0; i < 7; ++i) {
        INFO("layer " << i);
        const auto& l = cfg.layers[i];
        CHECK_FALSE(l.k_eq_v);
        CHECK(l.rope_denominator == l.head_dim);
        CHECK(l.rope_factor == Approx(1.f));
        if (l.type == F) {  // proportional, partial_rotary_factor 0.25 of a 64-wide head: 16 channels
          CHECK(l.rope_theta == Approx(1e6f));
          CHECK(l.rope_pairs == 8);
        } else {  // default: every pair of a 32-wide head
          CHECK(l.rope_theta == Approx(1e4f));
          CHECK(l.rope_pairs == 16);
        }
      }
    }
  }

  SECTION("flat_keqv: flat gemma4_text, k_eq_v full layers with their own KV-head count, no PLE") {
    ModelConfig cfg;
    const Status st = parse_config_text(fixture_config_text("flat_keqv"), &cfg);
    INFO(st.message);
    REQUIRE(st.is_ok());
    CHECK(cfg.model_type == "gemma4_text");
    testutil::check_sizes(cfg, {64, 5, 4, 512, 0, 8, 0});
    CHECK(cfg.eos_token_ids == std::vector<int>{1, 106});
    CHECK(cfg.weight_format != WeightFormat::W4A16);
    CHECK(cfg.quant_group_size == 0);
    // Full layers (1 and 4): head dim 64, one KV head, k_eq_v; sliding: 32 and two KV heads; nothing shared.
    testutil::check_layers(cfg, 5, [&](int i) {
      const bool full = i == 1 || i == 4;
      return testutil::LayerWant{full ? F : S, full ? 64 : 32, full ? 1 : 2, false, i, 128, full};
    });
  }
}

// ============================================================================================================
// Part 2: Engine::load (the public API) on the same tables and on the semantic weight checks.
// ============================================================================================================

namespace {

gemma4_t4::LoadOptions cpu_options() {
  gemma4_t4::LoadOptions opt;
  opt.backend = gemma4_t4::Backend::Cpu;
  opt.max_context = 64;
  return opt;
}

Status load_dir(const fs::path& dir, gemma4_t4::Engine* engine) {
  return gemma4_t4::Engine::load(dir.string(), cpu_options(), engine);
}

// Engine::load of each case's directory: refused with the case's code and words, the engine left unloaded.
void check_engine_refuses(const std::vector<DirCase>& cases) {
  for (const DirCase& c : cases) {
    INFO("case: " << c.label);
    TempDir tmp;
    const fs::path ckpt = build_case(c, tmp);
    gemma4_t4::Engine engine;
    Status st;
    REQUIRE_NOTHROW(st = load_dir(ckpt, &engine));
    check_status(st, c.codes, c.words);
    CHECK_FALSE(engine.loaded());
  }
}

}  // namespace

TEST_CASE("Engine::load: the real fixtures load (control for the tables below)", "[loader][engine]") {
  for (const char* name : {"mm_bf16", "flat_keqv", "w4a16"}) {
    INFO(name);
    gemma4_t4::Engine engine;
    const Status st = load_dir(fixture(name), &engine);
    INFO(gemma4_t4::code_name(st.code) << ": " << st.message);
    REQUIRE(st.is_ok());
    CHECK(engine.loaded());
    CHECK(engine.config().num_layers == (std::string(name) == "flat_keqv" ? 5 : 7));
  }
}

TEST_CASE("Engine::load: a bad model.safetensors is a FormatError naming the file", "[loader][engine][errors]") {
  for (const BadBytes& c : bad_safetensors_table()) {
    INFO("case: " << c.label);
    TempDir tmp;
    const fs::path ckpt = tmp.path() / "ckpt";
    fs::create_directories(ckpt);
    fs::copy_file(fixture("mm_bf16") / "config.json", ckpt / "config.json");
    write_bytes(ckpt / "model.safetensors", c.bytes);
    gemma4_t4::Engine engine;
    Status st;
    REQUIRE_NOTHROW(st = load_dir(ckpt, &engine));
    std::vector<std::string> words = c.words;
    words.push_back("model.safetensors");
    check_status(st, {Code::FormatError}, words);
    CHECK_FALSE(engine.loaded());
  }
}

TEST_CASE("Engine::load: broken single files and shard indexes", "[loader][engine][errors]") {
  check_engine_refuses(store_cases());
}

TEST_CASE("Engine::load: tensors that do not fit the config, and config problems", "[loader][engine][errors]") {
  check_engine_refuses(engine_cases());
}

TEST_CASE("Engine::load: a directory that does not exist is NotFound", "[loader][engine][errors]") {
  TempDir tmp;
  const fs::path missing = tmp.path() / "no_such_checkpoint";
  gemma4_t4::Engine engine;
  const Status st = load_dir(missing, &engine);
  check_status(st, {Code::NotFound}, {"no_such_checkpoint"});
  CHECK_FALSE(engine.loaded());
}

TEST_CASE("Engine::load: out-of-range LoadOptions are refused by name, whatever the backend",
          "[loader][engine][errors]") {
  gemma4_t4::Engine engine;
  REQUIRE(load_dir(fixture("flat_keqv"), &engine).is_ok());
  for (int rows : {-1, 0, 63, 16385}) {
    gemma4_t4::LoadOptions opt;
    opt.backend = gemma4_t4::Backend::Cpu;
    opt.max_pass_rows = rows;
    const Status st = gemma4_t4::Engine::load(fixture("mm_bf16").string(), opt, &engine);
    check_status(st, {Code::InvalidArgument}, {"max_pass_rows", std::to_string(rows)});
  }
  gemma4_t4::LoadOptions opt;
  opt.backend = gemma4_t4::Backend::Cpu;
  opt.max_context = 0;
  check_status(gemma4_t4::Engine::load(fixture("mm_bf16").string(), opt, &engine), {Code::InvalidArgument},
               {"max_context"});
  REQUIRE(engine.loaded());  // the engine loaded before is untouched
  CHECK(engine.config().num_layers == 5);
  for (int rows : {64, 16384}) {  // the bounds themselves load
    gemma4_t4::Engine edge;
    opt.max_context = 256;
    opt.max_pass_rows = rows;
    const Status st = gemma4_t4::Engine::load(fixture("mm_bf16").string(), opt, &edge);
    INFO(st.message);
    CHECK(st.is_ok());
  }
}

TEST_CASE("Engine::load: the engine stays usable after a failed load", "[loader][engine][errors]") {
  TempDir tmp;
  const fs::path missing = tmp.path() / "no_such_checkpoint";
  const fs::path broken = tmp.path() / "broken";
  copy_fixture("mm_bf16", broken);
  rewrite_safetensors(broken / "model.safetensors", [](std::vector<Entry>& es) {
    drop_entry(es, "model.language_model.layers.1.mlp.up_proj.weight");
  });

  SECTION("failed loads, then a good one into the same Engine") {
    gemma4_t4::Engine engine;
    CHECK(load_dir(missing, &engine).code == Code::NotFound);
    CHECK(load_dir(broken, &engine).code == Code::NotFound);
    CHECK_FALSE(engine.loaded());
    const Status st = load_dir(fixture("mm_bf16"), &engine);
    INFO(st.message);
    REQUIRE(st.is_ok());
    REQUIRE(engine.loaded());
    CHECK(engine.config().num_layers == 7);
    gemma4_t4::Session session;
    REQUIRE(engine.create_session(&session).is_ok());
    const std::vector<int32_t> prompt = {2, 105, 7};
    std::vector<float> logits;
    REQUIRE(engine.forward(session, prompt.data(), prompt.size(), gemma4_t4::Logits::Last, &logits).is_ok());
    CHECK(logits.size() == 512);
  }

  SECTION("a failed load leaves a loaded Engine untouched") {
    gemma4_t4::Engine engine;
    REQUIRE(load_dir(fixture("flat_keqv"), &engine).is_ok());
    CHECK(load_dir(broken, &engine).code == Code::NotFound);
    CHECK(load_dir(missing, &engine).code == Code::NotFound);
    REQUIRE(engine.loaded());
    CHECK(engine.config().num_layers == 5);
    CHECK(engine.config().model_type == "gemma4_text");
    gemma4_t4::Session session;
    REQUIRE(engine.create_session(&session).is_ok());
    const int32_t token = 2;
    std::vector<float> logits;
    CHECK(engine.forward(session, &token, 1, gemma4_t4::Logits::Last, &logits).is_ok());
    CHECK(logits.size() == 512);
  }
}

// Issue 14: every strict safetensors refusal leaves an Engine as it was, and a good load after it works.
TEST_CASE("Engine::load: after each bad model.safetensors the loaded engine still works", "[loader][engine][errors]") {
  gemma4_t4::Engine engine;
  REQUIRE(load_dir(fixture("mm_bf16"), &engine).is_ok());
  const std::vector<int32_t> prompt = {2, 105, 7};
  auto logits_of = [&](gemma4_t4::Engine& e) {
    gemma4_t4::Session session;
    REQUIRE(e.create_session(&session).is_ok());
    std::vector<float> logits;
    REQUIRE(e.forward(session, prompt.data(), prompt.size(), gemma4_t4::Logits::Last, &logits).is_ok());
    return logits;
  };
  const std::vector<float> before = logits_of(engine);
  TempDir tmp;
  const fs::path ckpt = tmp.path() / "ckpt";
  fs::create_directories(ckpt);
  fs::copy_file(fixture("mm_bf16") / "config.json", ckpt / "config.json");
  for (const BadBytes& c : bad_safetensors_table()) {
    INFO("case: " << c.label);
    write_bytes(ckpt / "model.safetensors", c.bytes);
    CHECK(load_dir(ckpt, &engine).code == Code::FormatError);
    REQUIRE(engine.loaded());
    CHECK(logits_of(engine) == before);
  }
  gemma4_t4::Engine fresh;  // and one that failed first loads afterwards
  CHECK(load_dir(ckpt, &fresh).code == Code::FormatError);
  REQUIRE(load_dir(fixture("mm_bf16"), &fresh).is_ok());
  CHECK(logits_of(fresh) == before);
}

// Issue 14: a directory given with a trailing slash is named as a person would write the path, not "ckpt//x".
TEST_CASE("Engine::load: paths in messages have no doubled slash when the directory ends in /",
          "[loader][engine][errors]") {
  TempDir tmp;
  const fs::path ckpt = tmp.path() / "ckpt";
  copy_fixture("flat_keqv", ckpt);
  REQUIRE(fs::remove(ckpt / kShard2));
  for (const std::string slash : {"/", "//"}) {
    INFO("directory given as ckpt" << slash);
    gemma4_t4::Engine engine;
    Status st = gemma4_t4::Engine::load(ckpt.string() + slash, cpu_options(), &engine);
    check_status(st, {Code::NotFound}, {"ckpt/" + std::string(kShard2)});
    CHECK(st.message.find("//") == std::string::npos);
    fs::rename(ckpt / "config.json", ckpt / "config.json.away");
    st = gemma4_t4::Engine::load(ckpt.string() + slash, cpu_options(), &engine);
    check_status(st, {Code::NotFound}, {"ckpt/config.json"});
    CHECK(st.message.find("//") == std::string::npos);
    fs::rename(ckpt / "config.json.away", ckpt / "config.json");
    gemma4_t4::SamplingOptions so;
    std::vector<int> eos;
    write_text(ckpt / "generation_config.json", "{ not json");
    st = gemma4_t4::load_generation_config(ckpt.string() + slash, &so, &eos);
    check_status(st, {Code::FormatError}, {"ckpt/generation_config.json"});
    CHECK(st.message.find("//") == std::string::npos);
    fs::remove(ckpt / "generation_config.json");
  }
  CHECK(gemma4_t4::detail::path_join("/", "a") == "/a");
  CHECK(gemma4_t4::detail::path_join("", "a") == "a");
  CHECK(gemma4_t4::detail::path_join("d///", "a") == "d/a");
  CHECK(gemma4_t4::detail::path_join("d", "a") == "d/a");
}
