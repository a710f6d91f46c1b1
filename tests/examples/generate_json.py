#!/usr/bin/env python3
"""Runs examples/generate on the bundled tiny model (CPU backend) and checks its output
(ctest: example.generate_json).

    generate_json.py PATH_TO_GENERATE

- `--json`: stdout is one JSON object with the documented fields and types (text, tokens, finish_reason,
  prompt_tokens, generated_tokens, timing {ttft_ms, decode_ms, prefill_tok_s, decode_tok_s}, model,
  backend) and consistent values (as many tokens as --max-tokens allows, the stop token counted in
  generated_tokens only);
- greedy output is the same run after run; text mode prints the same text as --json reports;
- the prompt from stdin equals the prompt as an argument; --raw differs from the chat template;
- a missing model: exit status 1 and a JSON object with finish_reason "error" and the path in "error";
- an empty prompt (an empty argument, white space, empty stdin) is an error (exit status 1), not a generation;
- with no prompt and a terminal on stdin (a pseudo-terminal), generate says it reads the prompt from standard
  input, then answers what is typed there (ended by Ctrl-D); with a pipe it says nothing of the kind.
Python 3 standard library only.
"""

import json
import os
import pty
import select
import subprocess
import sys
import time


def run(exe, *args, stdin=None):
    p = subprocess.run([exe, "--cpu", *args], input=stdin, capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


def fail(why, out="", err=""):
    sys.stderr.write(f"FAIL: {why}\n---- stdout ----\n{out}\n---- stderr ----\n{err}\n")
    sys.exit(1)


def as_json(exe, *args, stdin=None, want_rc=0):
    rc, out, err = run(exe, "--json", *args, stdin=stdin)
    if rc != want_rc:
        fail(f"generate --json {' '.join(args)}: exit status {rc}, wanted {want_rc}", out, err)
    try:
        return json.loads(out)
    except json.JSONDecodeError as e:
        fail(f"generate --json {' '.join(args)}: stdout is not JSON ({e})", out, err)


def check_fields(j, max_tokens):
    types = {"text": str, "tokens": list, "finish_reason": str, "prompt_tokens": int, "generated_tokens": int,
             "timing": dict, "model": str, "backend": str}
    for k, t in types.items():
        if not isinstance(j.get(k), t):
            fail(f"field {k!r} missing or not a {t.__name__}: {j!r}")
    for k in ("ttft_ms", "decode_ms", "prefill_tok_s", "decode_tok_s"):
        if not isinstance(j["timing"].get(k), (int, float)) or j["timing"][k] < 0:
            fail(f"timing.{k} missing or negative: {j!r}")
    if not all(isinstance(t, int) and 0 <= t < 512 for t in j["tokens"]):
        fail(f"tokens must be ids of the 512-token vocabulary: {j!r}")
    if j["backend"] != "cpu":
        fail(f"--cpu, yet backend {j['backend']!r}")
    if j["prompt_tokens"] <= 0 or j["timing"]["ttft_ms"] <= 0:
        fail(f"prompt_tokens and ttft_ms must be > 0: {j!r}")
    n, g = len(j["tokens"]), j["generated_tokens"]
    if j["finish_reason"] == "length":
        if not n == g == max_tokens:
            fail(f"finish_reason length: {n} tokens, {g} generated, --max-tokens {max_tokens}: {j!r}")
    elif j["finish_reason"] == "stop":
        if not g == n + 1 <= max_tokens:
            fail(f"finish_reason stop: generated_tokens counts the stop token: {j!r}")
    else:
        fail(f"finish_reason {j['finish_reason']!r}: wanted stop or length: {j!r}")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: generate_json.py PATH_TO_GENERATE")
    exe = sys.argv[1]
    greedy = ["--temperature", "0", "--max-tokens", "12"]

    a = as_json(exe, *greedy, "Hello, how are you?")
    check_fields(a, 12)
    b = as_json(exe, *greedy, "Hello, how are you?")
    if (a["tokens"], a["text"]) != (b["tokens"], b["text"]):
        fail(f"greedy output differs between two runs:\n{a!r}\n{b!r}")
    s = as_json(exe, *greedy, stdin="Hello, how are you?\n")
    if s["tokens"] != a["tokens"] or s["prompt_tokens"] != a["prompt_tokens"]:
        fail(f"the prompt from stdin (trimmed by the template) must give what the argument gives:\n{a!r}\n{s!r}")
    r = as_json(exe, *greedy, "--raw", "<bos>Hello, how are you?")
    check_fields(r, 12)
    if r["prompt_tokens"] >= a["prompt_tokens"]:
        fail(f"--raw feeds the text without the chat template (fewer tokens):\n{a!r}\n{r!r}")
    sampled = as_json(exe, "--seed", "3", "--max-tokens", "20", "--top-k", "40", "Tell me a story.")
    check_fields(sampled, 20)

    rc, out, err = run(exe, *greedy, "Hello, how are you?")
    if rc != 0 or out != a["text"] + "\n":
        fail(f"text mode must print the text --json reports (exit status {rc}); --json text {a['text']!r}", out, err)
    if "prompt tokens" not in err:
        fail("text mode: the timing line goes to stderr", out, err)

    e = as_json(exe, "--model", "/no/such/model/dir", "Hello", want_rc=1)
    if e.get("finish_reason") != "error" or "/no/such/model/dir" not in e.get("error", ""):
        fail(f"a missing model: finish_reason error naming the path: {e!r}")
    for label, args, stdin in (("an empty argument", [""], None), ("white space", [" ", "\t"], None),
                               ("empty stdin", [], ""), ("white space on stdin", [], " \n\n")):
        rc, out, err = run(exe, *greedy, *args, stdin=stdin)
        if rc != 1 or "prompt" not in err or "empty" not in err or out.strip():
            fail(f"{label}: an empty prompt must be an error (exit status 1, 'the prompt ... is empty' on stderr, "
                 f"nothing generated); exit status {rc}", out, err)
        if "reading the prompt" in err:
            fail(f"{label}: stdin is not a terminal, yet generate says it reads it", out, err)
        e = as_json(exe, *greedy, *args, stdin=stdin, want_rc=1)
        if e.get("finish_reason") != "error" or "empty" not in e.get("error", ""):
            fail(f"{label} with --json: finish_reason error: {e!r}")
    print("ok: generate --json")
    terminal_prompt(exe, greedy, a["text"])
    print("ok: generate reads the prompt from a terminal")


def terminal_prompt(exe, greedy, want_text):
    """No prompt, stdin a terminal: the notice comes first; the typed line (Ctrl-D ends it) is the prompt."""
    pid, fd = pty.fork()
    if pid == 0:
        try:
            os.execv(exe, [exe, "--cpu", *greedy])
        finally:
            os._exit(127)
    out = b""

    def read_until(pred, timeout=120):
        nonlocal out
        deadline = time.monotonic() + timeout
        while not pred() and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    data = b""
                if not data:
                    return
                out += data

    read_until(lambda: b"reading the prompt from standard input" in out)
    if b"reading the prompt from standard input" not in out:
        os.kill(pid, 9)
        fail("no prompt on a terminal: generate must say it reads the prompt from standard input",
             out.decode(errors="replace"))
    os.write(fd, b"Hello, how are you?\n\x04")
    read_until(lambda: False)  # to the end of the output
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    text = out.decode(errors="replace").replace("\r\n", "\n")
    if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0) or want_text not in text:
        fail(f"the prompt typed at the terminal must be answered as the argument is (status {status})", text)


if __name__ == "__main__":
    main()
