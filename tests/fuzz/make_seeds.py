#!/usr/bin/env python3
"""Writes the seed corpora of the fuzzers in tests/fuzz/ (see README.md there).

    python3 tests/fuzz/make_seeds.py OUT_DIR      # created; nothing is committed

OUT_DIR/<fuzzer>/         the seeds of each fuzzer (read-only corpus: pass it after the working corpus)
OUT_DIR/<fuzzer>.options  its libFuzzer limits, OSS-Fuzz style ("[libfuzzer]" then "max_len = N")
OUT_DIR/data/             files the harnesses read besides their input (GEMMA4_T4_FUZZ_DATA points here):
    w4a16_config_{ple,shared}.json        the micro w4a16 models fuzz_w4a16 binds every input against
    micro-0000{1,2}-of-00002.safetensors  two small shards the index inputs of fuzz_safetensors can name

Seeds are small on purpose: a fuzzer's speed is set by the size of its inputs (the JSON in them above all),
and whole fixture checkpoints (0.6-1.3 MB) ran at 180-580 executions/s, the 16 KB tiny tokenizer at 2,000.
So the file-level fuzzers get cut-down files written here: a few small tensors of every dtype, headers cut
out of the real fixtures, micro w4a16 checkpoints in the real compressed-tensors layout, micro tokenizers in
Gemma's tokenizer.json structure and the tiny one cut down. The real small files (the fixtures' config.json
and index.json, the chat conversations, slices of the tokenizer corpus) are seeds as they are. Python 3
standard library only; the same bytes every run.
"""
import json
import pathlib
import shutil
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
DATA = ROOT / "tests" / "data"

# -max_len per fuzzer: a little above the largest seed, so inputs stay small.
MAX_LEN = {
    "fuzz_safetensors": 8192,
    "fuzz_config": 8192,
    "fuzz_tokenizer": 8192,
    "fuzz_chat": 4096,
    "fuzz_w4a16": 24576,
}


# ---- output ----

def write(out, name, data):
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_bytes(data)


class Rng:
    """64-bit LCG (Knuth's MMIX constants): deterministic filler bytes without the random module."""

    def __init__(self, seed):
        self.s = seed

    def u32(self):
        self.s = (self.s * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        return self.s >> 32

    def bytes(self, n):
        return b"".join(struct.pack("<I", self.u32()) for _ in range((n + 3) // 4))[:n]

    def uniform(self, lo, hi):
        return lo + (hi - lo) * self.u32() / 2**32


# ---- safetensors ----

DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
              "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def floats(dtype, values):
    if dtype == "F32":
        return struct.pack(f"<{len(values)}f", *values)
    if dtype == "F16":
        return struct.pack(f"<{len(values)}e", *values)
    assert dtype == "BF16"  # truncated float32: what the fixtures hold is already bf16-exact
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def safetensors(tensors, metadata=None, pad=True):
    """tensors: [(name, dtype, shape, data)] in data order. pad: the header padded with spaces to a multiple
    of 8 bytes, as the safetensors library writes it."""
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        assert len(data) == DTYPE_SIZE[dtype] * numel(shape), name
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


def read_safetensors(path):
    """-> (metadata or None, [(name, dtype, shape, data)] in data order)"""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    meta = header.pop("__metadata__", None)
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return meta, [(k, v["dtype"], v["shape"], raw[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
                  for k, v in entries]


def safetensors_seeds(out, rng):
    """fuzz_safetensors: byte 0 even + a .safetensors file, or odd + a model.safetensors.index.json."""
    d = out / "fuzz_safetensors"

    def t(name, dtype, shape):
        return (name, dtype, shape, rng.bytes(DTYPE_SIZE[dtype] * numel(shape)))

    every_dtype = [t(f"t.{dt.lower()}", dt, [2, 3] if DTYPE_SIZE[dt] <= 2 else [3]) for dt in DTYPE_SIZE]
    write(d, "micro_every_dtype_meta", b"\0" + safetensors(every_dtype, {"format": "pt"}))
    write(d, "micro_every_dtype_nometa", b"\0" + safetensors(every_dtype))
    write(d, "micro_unpadded_header", b"\0" + safetensors(every_dtype[:4], {"format": "pt"}, pad=False))
    odd = [t("scalar", "F32", []), ("empty", "F16", [0, 4], b""), t("ones", "U8", [1, 1, 1, 1]),
           ("zero_row", "BF16", [3, 0], b""), t("after_empty", "I64", [1])]
    write(d, "micro_scalar_and_empty", b"\0" + safetensors(odd, {"format": "pt", "note": "edge shapes"}))
    write(d, "micro_only_metadata", b"\0" + safetensors([], {"format": "pt"}))
    write(d, "micro_empty_header", b"\0" + safetensors([]))
    # What the reader refuses since issue 14 (the reference implementation's rules), one seed each, so the
    # fuzzer starts at those checks: a header length over the 100,000,000-byte limit, a gap between tensors,
    # bytes after the last tensor, a NUL and JSON after the header's object, text after it, data_offsets
    # beyond 2^64-1, a name twice, a __metadata__ value that is not a string.
    two = [t("a", "F32", [1]), t("b", "F32", [1])]
    good = safetensors(two, {"format": "pt"})
    n = struct.unpack("<Q", good[:8])[0]
    header, body = good[8:8 + n], good[8 + n:]

    def raw(text, data=b""):
        return struct.pack("<Q", len(text)) + text + data

    write(d, "strict_header_over_limit", b"\0" + struct.pack("<Q", 100000001) + header + body)
    gap = header.replace(b'"data_offsets":[4,8]', b'"data_offsets":[8,12]')
    assert gap != header
    write(d, "strict_gap_between_tensors", b"\0" + raw(gap, body + b"\0" * 4))
    write(d, "strict_bytes_after_last_tensor", b"\0" + raw(header, body + b"\xff" * 4))
    write(d, "strict_nul_then_json_in_header", b"\0" + raw(header.rstrip() + b'\0{"v": garbage', body))
    write(d, "strict_text_after_header_object", b"\0" + raw(header.rstrip() + b"  x", body))
    write(d, "strict_offsets_beyond_2_64", b"\0" + raw(
        header.replace(b'"data_offsets":[4,8]', b'"data_offsets":[4,18446744073709551616]'), body))
    write(d, "strict_name_twice", b"\0" + raw(header.replace(b'"b":', b'"a":'), body))
    write(d, "strict_metadata_not_string", b"\0" + raw(header.replace(b'"pt"', b'["pt"]'), body))
    mm = [t("model.language_model.embed_tokens.weight", "BF16", [8, 4]),
          t("model.language_model.layers.0.input_layernorm.weight", "BF16", [4]),
          t("model.language_model.layers.0.self_attn.q_proj.weight_packed", "I32", [4, 1]),
          t("model.language_model.layers.0.self_attn.q_proj.weight_scale", "BF16", [4, 1]),
          ("model.language_model.layers.0.self_attn.q_proj.weight_shape", "I64", [2], struct.pack("<2q", 4, 8)),
          t("model.vision_tower.encoder.layers.0.mlp.fc.weight", "BF16", [2, 2]),
          t("model.audio_tower.layers.0.norm.weight", "BF16", [2]),
          t("model.embed_vision.embedding_projection.weight", "BF16", [4, 2]),
          t("model.embed_audio.embedding_projection.weight", "BF16", [4, 2]),
          t("language_model.model.norm.weight", "F16", [4]),
          t("model.layers.0.layer_scalar", "F32", [1]),
          t("lm_head.weight", "F32", [8, 4])]
    write(d, "micro_multimodal_prefixes", b"\0" + safetensors(mm, {"format": "pt"}))

    # The fixtures cut down: their real headers (names, dtypes, metadata) for the first 16 small tensors.
    for f in sorted(FIX.glob("*/*.safetensors")):
        meta, tensors = read_safetensors(f)
        small = [x for x in tensors if len(x[3]) <= 1024][:16]
        write(d, f"cut_{f.parent.name}_{f.stem}", b"\0" + safetensors(small, meta))

    # Index inputs. The harness's directory holds the two flat_keqv shards (model-0000N-of-00002) and the
    # two micro shards of OUT/data (micro-0000N-of-00002).
    for f in sorted(FIX.glob("*/model.safetensors.index.json")):
        write(d, f"{f.parent.name}_{f.name}", b"\1" + f.read_bytes())
    shards = micro_shards(rng)
    weight_map = {name: shard for shard, tensors in shards.items() for name, _, _, _ in tensors}
    index = {"metadata": {"total_size": sum(len(x[3]) for ts in shards.values() for x in ts)},
             "weight_map": weight_map}
    write(d, "micro_index.json", b"\1" + json.dumps(index, indent=2, sort_keys=True).encode())
    first = {k: v for k, v in weight_map.items() if v.startswith("micro-00001")}
    write(d, "micro_index_one_shard.json", b"\1" + json.dumps({"weight_map": first}, sort_keys=True).encode())
    return shards


def micro_shards(rng):
    """The two shards of OUT/data that the micro index seeds map tensors to."""

    def t(name, dtype, shape):
        return (name, dtype, shape, rng.bytes(DTYPE_SIZE[dtype] * numel(shape)))

    return {
        "micro-00001-of-00002.safetensors": [
            t("model.embed_tokens.weight", "F32", [4, 2]),
            t("model.layers.0.input_layernorm.weight", "BF16", [2]),
            t("model.layers.0.self_attn.k_proj.weight_packed", "I32", [2, 1]),
        ],
        "micro-00002-of-00002.safetensors": [
            t("model.norm.weight", "F16", [2]),
            ("model.layers.0.layer_scalar", "F32", [1], floats("F32", [0.5])),
        ],
    }


# ---- the micro w4a16 models ----

def micro_configs():
    """-> {file name: config.json} of the two micro models fuzz_w4a16 binds every input against. Both keep
    the fixtures' layouts and cut the text model down to width 32 (every linear's input width a multiple of
    the group size 32, as compressed-tensors requires) and vocabulary 8:
      ple:    the w4a16 fixture's nested config: one full-attention layer (head dim 64 through
              per_layer_config), per-layer embeddings of width 32, tied embeddings;
      shared: the flat_keqv fixture's flat config + the same quantization_config: two full layers with
              attention_k_eq_v (k, no v), the second KV-shared (no k/v/k_norm) with a double-wide MLP, no
              per-layer embeddings, a stored lm_head."""
    small = {"hidden_size": 32, "intermediate_size": 32, "head_dim": 32, "num_attention_heads": 1,
             "num_key_value_heads": 1, "vocab_size": 8, "vocab_size_per_layer_input": 8, "eos_token_id": [1]}
    ple = json.loads((FIX / "w4a16" / "config.json").read_text())
    ple["text_config"].update(small)
    ple["text_config"].update({"num_hidden_layers": 1, "num_kv_shared_layers": 0, "layer_types": ["full_attention"],
                               "per_layer_config": {"0": {"head_dim": 64}}, "hidden_size_per_layer_input": 32})
    shared = json.loads((FIX / "flat_keqv" / "config.json").read_text())
    shared.update(small)
    shared.update({"num_hidden_layers": 2, "num_kv_shared_layers": 1,
                   "layer_types": ["full_attention", "full_attention"],
                   "per_layer_config": {str(i): {"head_dim": 64, "num_key_value_heads": 1} for i in range(2)},
                   "use_double_wide_mlp": True, "tie_word_embeddings": False,
                   "quantization_config": ple["quantization_config"]})
    return {"w4a16_config_ple.json": ple, "w4a16_config_shared.json": shared}


def micro_layers(tc):
    """-> [(head_dim, kv_heads, kv_shared, k_eq_v, intermediate)] as include/gemma4_t4/config.hpp derives them
    (per_layer_config spelling only)."""
    L = tc["num_hidden_layers"]
    first_shared = L - tc["num_kv_shared_layers"]
    layers = []
    for i in range(L):
        plc = tc["per_layer_config"].get(str(i), {})
        full = tc["layer_types"][i] == "full_attention"
        shared = i >= first_shared
        inter = tc["intermediate_size"] * (2 if shared and tc["use_double_wide_mlp"] else 1)
        layers.append((plc.get("head_dim", tc["head_dim"]), plc.get("num_key_value_heads", tc["num_key_value_heads"]),
                       shared, bool(tc["attention_k_eq_v"]) and full, inter))
    return layers


def micro_checkpoint(cfg, rng, prefix="model.language_model.", scale_dtypes=("BF16",), shape_dtype="I64",
                     dense=(), towers=False, metadata=True):
    """A checkpoint for one of micro_configs() in the compressed-tensors pack-quantized layout (weights.hpp):
    weight_packed I32 [out, in/8], weight_scale [out, in/32], weight_shape [2] = [out, in] (shape_dtype None:
    left out). Linears whose name contains an entry of `dense` are stored as plain `.weight` BF16 instead;
    the scales' dtype cycles through scale_dtypes. towers: the dummy vision/audio tensors of the
    multimodal fixtures, which the binder skips."""
    tc = cfg.get("text_config", cfg)
    H, V, D = tc["hidden_size"], tc["vocab_size"], tc["hidden_size_per_layer_input"]
    nh, L = tc["num_attention_heads"], tc["num_hidden_layers"]
    tensors, n_linear = [], [0]

    def vec(name, n, lo=0.6, hi=1.4):
        tensors.append((prefix + name, "BF16", [n], floats("BF16", [rng.uniform(lo, hi) for _ in range(n)])))

    def mat(name, rows, cols):
        tensors.append((name, "BF16", [rows, cols], floats("BF16", [rng.uniform(-1, 1) for _ in range(rows * cols)])))

    def linear(name, out, inp):
        if any(x in name for x in dense):
            mat(prefix + name + ".weight", out, inp)
            return
        sdt = scale_dtypes[n_linear[0] % len(scale_dtypes)]
        n_linear[0] += 1
        tensors.append((prefix + name + ".weight_packed", "I32", [out, inp // 8], rng.bytes(out * inp // 2)))
        tensors.append((prefix + name + ".weight_scale", sdt, [out, inp // 32],
                        floats(sdt, [rng.uniform(0.01, 0.1) for _ in range(out * inp // 32)])))
        if shape_dtype:
            tensors.append((prefix + name + ".weight_shape", shape_dtype, [2],
                            struct.pack("<2q" if shape_dtype == "I64" else "<2i", out, inp)))

    mat(prefix + "embed_tokens.weight", V, H)
    vec("norm.weight", H)
    if not cfg.get("tie_word_embeddings", True) or not tc.get("tie_word_embeddings", True):
        mat("lm_head.weight", V, H)
    if D:
        mat(prefix + "embed_tokens_per_layer.weight", tc["vocab_size_per_layer_input"], L * D)
        linear("per_layer_model_projection", L * D, H)
        vec("per_layer_projection_norm.weight", D)
    for i, (d, kvh, shared, k_eq_v, inter) in enumerate(micro_layers(tc)):
        p = f"layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm") + (("post_per_layer_input_norm",) if D else ()):
            vec(p + n + ".weight", H)
        vec(p + "self_attn.q_norm.weight", d)
        vec(p + "layer_scalar", 1, 0.5, 1.0)
        linear(p + "self_attn.q_proj", nh * d, H)
        linear(p + "self_attn.o_proj", H, nh * d)
        if not shared:
            vec(p + "self_attn.k_norm.weight", d)
            linear(p + "self_attn.k_proj", kvh * d, H)
            if not k_eq_v:
                linear(p + "self_attn.v_proj", kvh * d, H)
        linear(p + "mlp.gate_proj", inter, H)
        linear(p + "mlp.up_proj", inter, H)
        linear(p + "mlp.down_proj", H, inter)
        if D:
            linear(p + "per_layer_input_gate", D, H)
            linear(p + "per_layer_projection", H, D)
    if towers:
        tensors.append(("model.vision_tower.encoder.layers.0.mlp.fc.weight", "BF16", [2, 2], rng.bytes(8)))
        tensors.append(("model.audio_tower.layers.0.norm.weight", "BF16", [2], rng.bytes(4)))
        tensors.append(("model.embed_vision.embedding_projection.weight", "BF16", [H, 2], rng.bytes(4 * H)))
    return safetensors(tensors, {"format": "pt"} if metadata else None)


def w4a16_seeds(out, rng):
    configs = micro_configs()
    for name, cfg in configs.items():
        write(out / "data", name, json.dumps(cfg, indent=2, sort_keys=True).encode() + b"\n")
    ple, shared = configs["w4a16_config_ple.json"], configs["w4a16_config_shared.json"]
    d = out / "fuzz_w4a16"
    # One seed in the layout the QAT checkpoint ships; the others shorter (header size sets the speed): the
    # flat "model." prefix, weight_shape (optional) left out but in one.
    write(d, "ple_real_layout", micro_checkpoint(ple, rng, towers=True))
    write(d, "ple_bare", micro_checkpoint(ple, rng, prefix="model.", shape_dtype=None, metadata=False))
    write(d, "ple_scale_dtypes", micro_checkpoint(ple, rng, prefix="model.", scale_dtypes=("F16", "F32", "BF16"),
                                                  shape_dtype="I32"))
    write(d, "shared_flat", micro_checkpoint(shared, rng, prefix="model.", shape_dtype=None))
    write(d, "shared_mixed_dense", micro_checkpoint(shared, rng, prefix="language_model.model.",
                                                    dense=("layers.1.self_attn.o_proj",), shape_dtype=None))
    return configs


# ---- tokenizer ----

SPACE = "\u2581"


def micro_tokenizer(*, normalizer="replace", pre_tokenizer=None, decoder="gemma", merges_as_pairs=False,
                    byte_fallback=True, fuse_unk=True, ignore_merges=False):
    """A tokenizer.json in the structure of Gemma's (include/gemma4_t4/tokenizer.hpp) with a 60-token
    vocabulary: specials as added tokens, "▁", a few letters, some <0xXX> byte tokens, and merges."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>", "<|think|>"]
    vocab = {s: i for i, s in enumerate(specials)}
    for piece in [SPACE] + list("abdehilmnorstuwy.,!?\n") + ["\u00e9"]:
        vocab[piece] = len(vocab)
    merges = [(SPACE, "t"), ("h", "e"), (SPACE + "t", "he"), ("l", "l"), ("he", "ll"), ("hell", "o"),
              (SPACE, "w"), ("o", "r"), (SPACE + "w", "or"), ("l", "d"), (SPACE + "wor", "ld"), ("i", "s"),
              (SPACE, "is"), ("a", "n"), (SPACE, "an"), (SPACE + "an", "d")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    for byte in (0x0A, 0x20, 0x41, 0x7E, 0x80, 0xA9, 0xC3, 0xE2, 0xF0, 0xFF):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": s != "<|think|>"} for i, s in enumerate(specials)]
    norms = {
        None: None,
        "replace": {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
        "sequence": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE},
                                                         {"type": "Replace", "pattern": {"String": " "},
                                                          "content": SPACE}]},
    }
    decoders = {
        None: None,
        "gemma": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
                                                   {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "strip": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
                                                   {"type": "ByteFallback"}, {"type": "Fuse"},
                                                   {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    }
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": norms[normalizer], "pre_tokenizer": pre_tokenizer, "post_processor": None,
        "decoder": decoders[decoder],
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": fuse_unk, "byte_fallback": byte_fallback,
                  "ignore_merges": ignore_merges, "vocab": vocab,
                  "merges": [[a, b] if merges_as_pairs else f"{a} {b}" for a, b in merges]},
    }


def tokenizer_seeds(out):
    """fuzz_tokenizer: a tokenizer.json, optionally NUL + a text to encode."""
    d = out / "fuzz_tokenizer"
    corpus = (DATA / "tokenizer" / "corpus.txt").read_bytes()
    texts = [b"Hello world", "h\u00e9llo, the world is \U0001F600 and \u2581x!\n".encode(),
             b"<|turn>user\nhello<turn|>\n<|think|>", b"\xff\xfe broken \xc3 utf8 \xe2\x96"]
    texts += [corpus[i * 997:i * 997 + 96] for i in range(4)]  # slices of the real corpus
    split = lambda b: {"type": "Split", "pattern": {"String": " "}, "behavior": b, "invert": False}
    variants = {
        "gemma": micro_tokenizer(),
        "pairs_ignore_merges": micro_tokenizer(merges_as_pairs=True, ignore_merges=True),
        "no_decoder_no_fallback": micro_tokenizer(decoder=None, byte_fallback=False, fuse_unk=False),
        "prepend_strip": micro_tokenizer(normalizer="sequence", decoder="strip"),
        "split_removed": micro_tokenizer(normalizer=None, pre_tokenizer=split("Removed")),
        "split_sequence": micro_tokenizer(normalizer=None, pre_tokenizer={
            "type": "Sequence", "pretokenizers": [split(b) for b in ("Isolated", "MergedWithPrevious",
                                                                    "MergedWithNext", "Contiguous")]}),
    }
    for k, (name, tok) in enumerate(variants.items()):
        js = json.dumps(tok, ensure_ascii=False, separators=(",", ":")).encode()
        write(d, f"micro_{name}", js)
        for j in (1 + k % (len(texts) - 1), 1 + (k + 3) % (len(texts) - 1)):  # texts[0] is the default
            write(d, f"micro_{name}_text{j}", js + b"\0" + texts[j])
    # The real tiny tokenizer (examples/tiny), cut down: its 16 KB ran at 2,000 executions/s (and its mutants
    # filled the corpus). Kept: everything but the vocabulary and merges, of which the ids below 40 (specials,
    # "▁", letters), 16 byte tokens and the first 24 merges that build on what is kept.
    tiny = json.loads((ROOT / "examples" / "tiny" / "tokenizer.json").read_text())
    full = tiny["model"]["vocab"]
    keep = {f"<0x{b:02X}>" for b in list(range(0x20, 0x28)) + [0x0A, 0x80, 0xA9, 0xC3, 0xE2, 0xF0, 0xF3, 0xFF]}
    keep |= {k for k, v in full.items() if v < 40} | {a["content"] for a in tiny["added_tokens"]}
    merges = []
    for a, b in tiny["model"]["merges"]:
        if a in keep and b in keep and a + b in full and len(merges) < 24:
            merges.append([a, b])
            keep.add(a + b)
    tiny["model"]["vocab"] = {k: v for k, v in full.items() if k in keep}
    tiny["model"]["merges"] = merges
    js = json.dumps(tiny, ensure_ascii=False, separators=(",", ":")).encode()
    write(d, "tiny_cut", js)
    write(d, "tiny_cut_corpus", js + b"\0" + corpus[:200])


# ---- config, chat ----

def config_seeds(out, micro):
    for f in sorted(FIX.glob("*/config.json")):
        write(out / "fuzz_config", f"{f.parent.name}_config.json", f.read_bytes())
    for name, cfg in micro.items():
        write(out / "fuzz_config", f"micro_{name}", json.dumps(cfg, indent=2, sort_keys=True).encode())


def chat_seeds(out):
    for i, conv in enumerate(json.loads((DATA / "chat" / "conversations.json").read_text())):
        flags = (1 if conv.get("add_bos", True) else 0) | (2 if conv.get("add_generation_prompt", True) else 0)
        flags |= 4 if conv.get("enable_thinking", False) else 0
        records = []
        for m in conv["messages"]:
            content = m.get("content", "")
            if not isinstance(content, str):
                content = json.dumps(content)
            records.append("\x1f".join([m.get("role", ""), content, m.get("reasoning", "") or ""]))
        write(out / "fuzz_chat", f"{i:03d}_{conv.get('name', 'conv')}", bytes([flags]) + "\x1e".join(records).encode())


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[1])
    for sub in list(MAX_LEN) + ["data"]:  # no stale seeds from an earlier version of this script
        shutil.rmtree(out / sub, ignore_errors=True)
    rng = Rng(20261203)
    for name, tensors in safetensors_seeds(out, rng).items():
        write(out / "data", name, safetensors(tensors, {"format": "pt"}))
    micro = w4a16_seeds(out, rng)
    config_seeds(out, micro)
    tokenizer_seeds(out)
    chat_seeds(out)
    for fuzzer, n in MAX_LEN.items():
        write(out, f"{fuzzer}.options", f"[libfuzzer]\nmax_len = {n}\n".encode())
        largest = max(len(p.read_bytes()) for p in (out / fuzzer).iterdir())
        if largest > n:
            sys.exit(f"make_seeds.py: a {fuzzer} seed has {largest} bytes, above its max_len {n}")


if __name__ == "__main__":
    main()
