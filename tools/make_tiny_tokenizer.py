#!/usr/bin/env python3
"""Writes examples/tiny/tokenizer.json: a 512-token Gemma-style tokenizer for the bundled tiny model.

Usage:
    tools/make_tiny_tokenizer.py [--out PATH]     write it (default: examples/tiny/tokenizer.json)
    tools/make_tiny_tokenizer.py --check [PATH]   exit 1 unless PATH holds exactly what this script writes

The tiny model (the weights of tests/fixtures/mm_bf16: random, vocab 512) has no tokenizer of its own; the
examples pair it with this one so that they run out of the box. It has the structure of Gemma's
tokenizer.json (what include/gemma4_t4/tokenizer.hpp loads): a BPE model with byte fallback, the
normalizer that turns spaces into U+2581 "▁", the decoder chain Replace("▁" -> " ") + ByteFallback + Fuse,
and Gemma 4's special tokens as added tokens at their real ids (those below 512):

    <pad> 0, <eos> 1, <bos> 2, <unk> 3, <mask> 4, <|tool_response> 50, <|think|> 98, <|channel> 100,
    <channel|> 101, <|turn> 105, <turn|> 106; "\\n" is the plain token 107, as in Gemma's vocabulary.

The other ids: <0x00>..<0xFF> at 256..511 (byte fallback: any UTF-8 text encodes), and at the free ids
below 256 "▁", the printable ASCII letters, digits and punctuation, then the pieces of a byte-pair
encoding learnt here from a small built-in English text (most frequent pair first, ties by the pair's
text), with their merges. Deterministic: the same file every run. Python 3 standard library only.
"""

import argparse
import collections
import json
import os
import sys

VOCAB_SIZE = 512
SPACE = "\u2581"  # ▁

SPECIAL = {
    0: "<pad>",
    1: "<eos>",
    2: "<bos>",
    3: "<unk>",
    4: "<mask>",
    50: "<|tool_response>",
    98: "<|think|>",
    100: "<|channel>",
    101: "<channel|>",
    105: "<|turn>",
    106: "<turn|>",
}
NEWLINE_ID = 107
BYTES_FIRST = 256  # <0x00> .. <0xFF> take ids 256..511

BASE_CHARS = (
    "abcdefghijklmnopqrstuvwxyz"
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    "0123456789"
    ".,!?'\"-:;()"
)

# The text the merges are learnt from (plain English, the kind of thing a chat says).
CORPUS = """
Hello! How are you today? I am a small language model, and I am here to help you. What would you like to
talk about? You can ask me a question, and I will try to answer it as well as I can. The weather is nice
today, and the sun is shining. This is a test of the chat program. It runs on the computer in front of
you, on the CPU or on the GPU. The model reads your message, thinks about it, and writes an answer one
token at a time. Each token is a small piece of text: a word, part of a word, a space or a sign. Thank you
for your patience. Please tell me more about what you want to do. I think that is a good idea. Let me
know if there is anything else that I can do for you. The answer is in the text above. We can start
again whenever you want: type your next message and press enter. Good morning, good evening and good
night. There are many things in the world that are interesting: the stars in the sky, the water in the
sea, the people in the city and the animals in the forest. What is your name? My name is Gemma. I like to
read and to write, and I like to learn new things every day. This model is very small, and it has not
been trained at all, so its words do not mean anything. That is fine: it only shows that the program
works from the first line to the last. The system prompt says how the model should answer. The user
writes a message, and the model writes the answer. Then the user writes again, and the conversation goes
on and on, turn after turn, until one of them says goodbye.
"""


def learn_pieces(n_merges):
    """Byte-pair encoding over the corpus words ("▁" + word): returns (new pieces, merges) in order."""
    words = collections.Counter(SPACE + w for w in CORPUS.split())
    splits = {w: list(w) for w in words}
    for w in splits:
        for c in splits[w]:
            assert c == SPACE or c in BASE_CHARS, f"corpus character {c!r} is not a base character"
    known = set(BASE_CHARS) | {SPACE}
    pieces, merges = [], []
    while len(pieces) < n_merges:
        pairs = collections.Counter()
        for w, n in words.items():
            s = splits[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        a, b = best
        merges.append([a, b])
        if a + b not in known:
            known.add(a + b)
            pieces.append(a + b)
        for w in splits:
            s, out, i = splits[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            splits[w] = out
    return pieces, merges


def build():
    free = [i for i in range(BYTES_FIRST) if i not in SPECIAL and i != NEWLINE_ID]
    base = [SPACE] + list(BASE_CHARS)
    pieces, merges = learn_pieces(len(free) - len(base))
    assert len(base) + len(pieces) == len(free), "the corpus ran out of pairs before the vocabulary filled"
    vocab = {}
    for i, s in SPECIAL.items():
        vocab[i] = s
    vocab[NEWLINE_ID] = "\n"
    for i, s in zip(free, base + pieces):
        vocab[i] = s
    for b in range(256):
        vocab[BYTES_FIRST + b] = "<0x%02X>" % b
    assert sorted(vocab) == list(range(VOCAB_SIZE))
    assert len(set(vocab.values())) == VOCAB_SIZE
    added = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True}
        for i, s in sorted(SPECIAL.items())
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": {s: i for i, s in sorted(vocab.items())},
            "merges": merges,
        },
    }


def render():
    return json.dumps(build(), ensure_ascii=False, indent=1) + "\n"


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    default = os.path.join(root, "examples", "tiny", "tokenizer.json")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=default, help="where to write (default: %(default)s)")
    ap.add_argument("--check", nargs="?", const=default, metavar="PATH",
                    help="compare PATH (default: examples/tiny/tokenizer.json) with what would be written")
    args = ap.parse_args()
    text = render()
    if args.check:
        try:
            with open(args.check, encoding="utf-8") as f:
                same = f.read() == text
        except OSError as e:
            print(f"make_tiny_tokenizer: cannot read {args.check}: {e}", file=sys.stderr)
            return 1
        if not same:
            print(f"make_tiny_tokenizer: {args.check} differs from what tools/make_tiny_tokenizer.py writes; "
                  "run it to regenerate", file=sys.stderr)
            return 1
        print(f"make_tiny_tokenizer: {args.check} is up to date")
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"make_tiny_tokenizer: wrote {args.out} ({VOCAB_SIZE} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
