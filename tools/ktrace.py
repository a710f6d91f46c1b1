#!/usr/bin/env python3
"""Where a decode step's time goes, from a kernels/ktrace.cuh timeline (a quick_bench built with -DGEMMA4_T4_KTRACE).

    GEMMA4_T4_KTRACE=trace.bin quick_bench ... ; tools/ktrace.py trace.bin [--steps N]

Groups the blocks into launches (under PDL no block of a launch passes pdl_enter before every block of the one
before it has returned, so in release order a launch is `grid` consecutive blocks of one tag), the launches into
decode steps (a step begins at its embedding launch), and prints for the last N complete steps:
  per step   wall time (first block start .. last block return), launches, and the two parts of the critical path:
             gap  = release - the previous launch's last return (a kernel boundary: completion, flush, release),
             span = the launch's last return - its release (its own work after the wait);
  per kernel tag and grid, per step: launches, mean gap, mean span, their total, the mean lead (release - first
             block start: how long its blocks sat resident before the release) and release spread (last - first
             block release: later waves).
"""
import argparse
import collections
import struct
import sys

KINDS = {1: "gemv", 2: "gemv_halves", 3: "ple_fused", 4: "residual_norm", 5: "rmsnorm", 6: "attention_split",
         7: "attention_heads", 8: "attention_merge", 9: "head_norm_rope", 10: "softcap", 11: "sample", 12: "embed",
         13: "gemm_w4", 14: "elementwise", 15: "argmax"}
EPI = {0: "Store", 1: "GeluMul", 2: "GeluPle", 3: "Head"}
WL = {0: "f16", 1: "w4", 2: "w8"}
ELEM = {1: "widen", 2: "to_half", 3: "gather_rows", 4: "gelu_mul", 5: "ple_combine", 6: "ple_gate"}
GEMM = {0: "plain", 1: "x", 2: "x_glu", 3: "reduce"}


def name(tag):
    kind, v = tag >> 16, tag & 0xFFFF
    k = KINDS.get(kind, "kind%d" % kind)
    if kind == 1:
        return "gemv NT%d %s %s" % (v // 100, WL.get(v // 10 % 10, "?"), EPI.get(v % 10, "?"))
    if kind == 2:
        return "gemv_halves %s %s" % (WL.get(v // 10 % 10, "?"), EPI.get(v % 10, "?"))
    if kind == 3:
        return "ple_fused NT%d %s%s" % (v // 100, WL.get(v // 10 % 10, "?"), " halves" if v % 10 else "")
    if kind in (6, 7):
        return "%s D%d G%d" % (k, v // 10, v % 10)
    if kind == 14:
        return ELEM.get(v, "elementwise%d" % v)
    if kind == 13:
        return "gemm_w4 " + GEMM.get(v, str(v))
    if kind == 4:
        return "residual_norm KV%d" % v
    return k


def load(path):
    with open(path, "rb") as f:
        n, cap = struct.unpack("<QQ", f.read(16))
        data = f.read()
    recs = [struct.unpack_from("<QQQQQ", data, i) for i in range(0, len(data) - len(data) % 40, 40)]
    return n, cap, recs


def launches(recs):
    """Records -> launches [tag, grid, blocks, start, release, last_release, end], in release order."""
    out = []
    cur = None
    for tg, smb, start, enter, end in sorted(recs, key=lambda r: r[3]):
        tag, grid = tg >> 32, tg & 0xFFFFFFFF
        if cur is None or cur[0] != tag or cur[1] != grid or cur[2] >= grid:
            cur = [tag, grid, 0, start, enter, enter, end]
            out.append(cur)
        cur[2] += 1
        cur[3] = min(cur[3], start)
        cur[5] = max(cur[5], enter)
        cur[6] = max(cur[6], end)
    return [l for l in out if l[2] == l[1]]  # a launch the ring cut is dropped


def analyse(recs, last):
    """The last `last` complete decode steps of the records: (steps, totals, per), totals (ns, summed over the steps:
    wall, launches, gap, span) and per[(kernel name, grid)] (summed: n, gap, span, lead, spread)."""
    ls = launches(recs)
    starts = [i for i, l in enumerate(ls) if l[0] >> 16 == 12]  # embed: a decode step's first launch
    steps = [(a, b) for a, b in zip(starts, starts[1:])][-last:]
    per = collections.OrderedDict()
    tot = collections.Counter()
    for a, b in steps:
        # a step: launches a .. b - 1; its wall time from the first block start to the last return
        tot["wall"] += max(l[6] for l in ls[a:b]) - ls[a][3]
        tot["launches"] += b - a
        for i in range(a, b):
            l = ls[i]
            gap = l[4] - ls[i - 1][6] if i > a else 0
            span = l[6] - l[4]
            e = per.setdefault((name(l[0]), l[1]), collections.Counter())
            e["n"] += 1
            e["gap"] += gap
            e["span"] += span
            e["lead"] += l[4] - l[3]
            e["spread"] += l[5] - l[4]
            tot["gap"] += gap
            tot["span"] += span
    return steps, tot, per


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=8, help="the last N complete decode steps")
    args = ap.parse_args()
    n, cap, recs = load(args.trace)
    steps, tot, per = analyse(recs, args.steps)
    print("%s: %d blocks recorded, %d kept" % (args.trace, n, len(recs)))
    if not steps:
        sys.exit("no complete decode step (embed launch to embed launch) in the trace")
    k = len(steps)
    us = 1e-3 / k
    print("last %d decode steps: %.1f us a step, %.1f launches; critical path: gaps %.1f us + spans %.1f us"
          % (k, tot["wall"] * us, tot["launches"] / k, tot["gap"] * us, tot["span"] * us))
    print("%-40s %6s %7s %8s %8s %9s %8s %8s" % ("kernel", "grid", "n/step", "gap us", "span us", "us/step",
                                               "lead us", "spread"))
    rows = sorted(per.items(), key=lambda kv: -(kv[1]["gap"] + kv[1]["span"]))
    for (nm, grid), e in rows:
        c = e["n"]
        print("%-40s %6d %7.1f %8.2f %8.2f %9.1f %8.2f %8.2f" % (nm, grid, c / k, e["gap"] / c * 1e-3,
                                                              e["span"] / c * 1e-3, (e["gap"] + e["span"]) * us,
                                                              e["lead"] / c * 1e-3, e["spread"] / c * 1e-3))


if __name__ == "__main__":
    main()
