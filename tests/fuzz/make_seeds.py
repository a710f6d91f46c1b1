#!/usr/bin/env python3
"""Writes the seed corpora of the fuzzers in tests/fuzz/ from the repository's real files.

    python3 tests/fuzz/make_seeds.py OUT_DIR      # OUT_DIR/<fuzzer>/ per fuzzer (created; nothing committed)

Seeds are the fixtures themselves (tests/fixtures/*), the tiny tokenizer (examples/tiny), the chat
conversations (tests/data/chat) and the tokenizer corpus (tests/data/tokenizer/corpus.txt, in slices). The
33 MB cached Gemma tokenizer.json is left out: far above the fuzzers' -max_len.
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
DATA = ROOT / "tests" / "data"


def write(out, name, data):
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_bytes(data)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[1])

    # safetensors: byte 0 even = one .safetensors file, odd = an index.json
    for f in sorted(FIX.glob("*/*.safetensors")):
        write(out / "fuzz_safetensors", f"{f.parent.name}_{f.name}", b"\0" + f.read_bytes())
    for f in sorted(FIX.glob("*/model.safetensors.index.json")):
        write(out / "fuzz_safetensors", f"{f.parent.name}_{f.name}", b"\1" + f.read_bytes())

    for f in sorted(FIX.glob("*/config.json")):
        write(out / "fuzz_config", f"{f.parent.name}_config.json", f.read_bytes())

    tiny = (ROOT / "examples" / "tiny" / "tokenizer.json").read_bytes()
    corpus = (DATA / "tokenizer" / "corpus.txt").read_bytes()
    write(out / "fuzz_tokenizer", "tiny_plain", tiny)
    for i in range(8):  # slices of the real corpus as texts to encode
        piece = corpus[i * 512:(i + 1) * 512]
        write(out / "fuzz_tokenizer", f"tiny_corpus_{i}", tiny + b"\0" + piece)

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

    write(out / "fuzz_w4a16", "w4a16_model.safetensors", (FIX / "w4a16" / "model.safetensors").read_bytes())


if __name__ == "__main__":
    main()
