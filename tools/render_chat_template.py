#!/usr/bin/env python3
"""Render Gemma 4's official chat template for a list of conversations: the expected strings of tests/test_chat.cpp.

    python3 tools/render_chat_template.py \
        --template tests/data/chat/gemma4_e2b_chat_template.jinja2 \
        --conversations tests/data/chat/conversations.json \
        --out tests/data/chat/expected.json

The template is compiled the way transformers' apply_chat_template does (transformers/utils/chat_template_utils.py):
an ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the loopcontrols extension, the `tojson` filter
and the `raise_exception` / `strftime_now` globals, rendered with messages, tools=None, documents=None,
add_generation_prompt, the special tokens (bos_token "<bos>", ...) and the template kwargs (enable_thinking).
Only jinja2 is needed (no transformers, no network).

conversations.json: a list of {"name", "messages": [{"role", "content"[, "reasoning"]}], "add_generation_prompt",
"enable_thinking", "add_bos"} (the three flags default to true, false, true). add_bos false renders with
bos_token "" (the C++ ChatOptions::add_bos). Writes {"template_sha256", "python", "jinja2", "cases": [{"name",
"text"}]} in the same order.
"""
import argparse
import hashlib
import json
import platform
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def compile_template(source):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def render(template, case):
    special = {"bos_token": "<bos>" if case.get("add_bos", True) else "", "eos_token": "<eos>",
               "pad_token": "<pad>", "unk_token": "<unk>"}
    return template.render(messages=case["messages"], tools=None, documents=None,
                           add_generation_prompt=case.get("add_generation_prompt", True),
                           enable_thinking=case.get("enable_thinking", False), **special)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--template", required=True)
    ap.add_argument("--conversations", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    with open(args.template, "rb") as f:
        raw = f.read()
    template = compile_template(raw.decode("utf-8"))
    with open(args.conversations, encoding="utf-8") as f:
        cases = json.load(f)
    names = [c["name"] for c in cases]
    if len(set(names)) != len(names):
        sys.exit("duplicate conversation names")
    out = {
        "template_sha256": hashlib.sha256(raw).hexdigest(),
        "python": platform.python_version(),
        "jinja2": jinja2.__version__,
        "cases": [{"name": c["name"], "text": render(template, c)} for c in cases],
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"rendered {len(cases)} conversations -> {args.out}")


if __name__ == "__main__":
    main()
