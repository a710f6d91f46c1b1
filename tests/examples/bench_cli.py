#!/usr/bin/env python3
"""Runs the bench CLI on the bundled tiny model (CPU backend) and checks what it writes
(ctest: example.bench_cli).

    bench_cli.py PATH_TO_BENCH OUT_DIR

- `bench --cpu --prompts 8 --concurrency 1,2 --tokens 4 --repeats 1 --json F --csv F --svg F` exits 0;
- the JSON parses and has the documented fields: schema, backend "cpu", one cell per concurrency with
  positive tok/s and TTFT, the T4 projection labelled "projection, not measured";
- the CSV has a header and one line per cell; the SVG opens with <svg and closes;
- the table on stdout carries the projection label;
- `--sampling gemma` samples and says so (greedy by default, in options.sampling);
- `--doctor` and `--device-only --cpu` run and exit 0; `--doctor` on a model that does not load exits 1 (as its
  --help says) and never names cudaErrorInsufficientDriver (no driver: "no NVIDIA driver found"); a bad flag
  (or --sampling value) exits 2.
Python 3 standard library only.
"""

import json
import os
import subprocess
import sys

LABEL = "projection, not measured"


def fail(why, out="", err=""):
    sys.stderr.write(f"FAIL: {why}\n---- stdout ----\n{out}\n---- stderr ----\n{err}\n")
    sys.exit(1)


def run(exe, *args, want_rc=0):
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=600)
    if p.returncode != want_rc:
        fail(f"bench {' '.join(args)}: exit status {p.returncode}, wanted {want_rc}", p.stdout, p.stderr)
    return p.stdout, p.stderr


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: bench_cli.py PATH_TO_BENCH OUT_DIR")
    exe, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    paths = {k: os.path.join(out_dir, f"bench_cli.{k}") for k in ("json", "csv", "svg")}
    for p in paths.values():
        if os.path.exists(p):
            os.remove(p)

    out, err = run(exe, "--cpu", "--prompts", "8", "--concurrency", "1,2", "--tokens", "4", "--repeats", "1",
                   "--bandwidth-mib", "16", "--json", paths["json"], "--csv", paths["csv"], "--svg", paths["svg"])
    if LABEL not in out:
        fail("the table on stdout does not label the T4 projection", out, err)

    with open(paths["json"], encoding="utf-8") as f:
        try:
            j = json.load(f)
        except json.JSONDecodeError as e:
            fail(f"{paths['json']} is not JSON ({e})", out, err)
    for k in ("schema", "version", "timestamp", "model", "backend", "device", "bandwidth", "decode_bytes_per_token",
              "ceiling_tok_s", "weight_bytes", "kv", "options", "notes", "cells", "t4_projection", "cancelled"):
        if k not in j:
            fail(f"JSON has no field {k!r}: {j!r}")
    if j["schema"] != "gemma4_t4.bench/1" or j["backend"] != "cpu" or j["cancelled"]:
        fail(f"schema/backend/cancelled: {j!r}")
    if j["options"]["prompts"] != [8] or j["options"]["concurrency"] != [1, 2] or j["options"]["tokens"] != 4:
        fail(f"options do not echo the command line: {j['options']!r}")
    cells = j["cells"]
    if [c["concurrency"] for c in cells] != [1, 2]:
        fail(f"one cell per concurrency wanted: {cells!r}")
    for c in cells:
        if c["error"] or c["repeats"] != 1:
            fail(f"cell failed: {c!r}")
        for k in ("tok_s_per_stream", "tok_s_total", "ms_per_token", "ttft_ms_median", "ttft_ms_p90",
                  "prefill_tok_s", "pct_of_ceiling"):
            if not isinstance(c.get(k), (int, float)) or c[k] <= 0:
                fail(f"cell field {k} missing or not positive: {c!r}")
    if j["t4_projection"]["label"] != LABEL or len(j["t4_projection"]["cells"]) != len(cells):
        fail(f"t4_projection: {j['t4_projection']!r}")

    if j["options"].get("sampling") != "greedy":
        fail(f"options.sampling: wanted 'greedy' by default: {j['options']!r}")
    out2, err2 = run(exe, "--cpu", "--prompts", "8", "--concurrency", "1", "--tokens", "4", "--repeats", "1",
                     "--bandwidth-mib", "16", "--sampling", "gemma")
    if "sampling    temperature 1, top-k 64, top-p 0.95" not in out2:
        fail("--sampling gemma: the table does not say so", out2, err2)
    run(exe, "--cpu", "--sampling", "nucleus", want_rc=2)

    with open(paths["csv"], encoding="utf-8") as f:
        lines = f.read().splitlines()
    if len(lines) != 1 + len(cells) or not lines[0].startswith("prompt,") or LABEL not in lines[1]:
        fail(f"CSV: wanted a header and {len(cells)} lines: {lines!r}")

    with open(paths["svg"], encoding="utf-8") as f:
        svg = f.read()
    if not svg.startswith("<svg") or not svg.rstrip().endswith("</svg>") or svg.count("<polyline") != 2:
        fail("SVG: wanted <svg ...> ... </svg> with one polyline per panel for the one prompt")

    out, err = run(exe, "--doctor")
    if "doctor" not in out:
        fail("--doctor printed no report", out, err)
    # Without a driver the report says so in words (a CUDA build here has the runtime but no libcuda).
    if "cudaErrorInsufficientDriver" in out:
        fail("--doctor without an NVIDIA driver must say 'no NVIDIA driver found', not the CUDA error's name", out, err)
    # A model that does not load: the report, then exit status 1 (as --help says).
    out, err = run(exe, "--doctor", "--model", os.path.join(out_dir, "no_such_model"), want_rc=1)
    if "does not load" not in out or "no_such_model" not in out:
        fail("--doctor with a missing model: a report saying the model does not load", out, err)
    help_out, _ = run(exe, "--help")
    if "1 when it does not" not in help_out:
        fail("--help must say --doctor exits 1 when the model does not load", help_out)
    out, err = run(exe, "--device-only", "--cpu", "--bandwidth-mib", "16")
    if "host read" not in out:
        fail("--device-only --cpu printed no host bandwidth", out, err)
    run(exe, "--tokens", "1", want_rc=2)
    print("ok")


if __name__ == "__main__":
    main()
