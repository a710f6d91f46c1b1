#!/usr/bin/env python3
"""tools/ktrace.py on a synthetic kernels/ktrace.cuh timeline whose launches, gaps and spans are known by construction.

The generator lays out decode steps as PDL chains: each launch is released `gap` ns after the previous launch's last
block returned; its blocks start `lead` ns before the release (a first wave of at most `slots` blocks) or after every
first-wave block has returned (the second wave, released at its start), and run `dur` ns after their release. The cases
the grouping must get right are in it: two consecutive launches of one kernel and grid, a second wave released after
every block before it has returned (as a new launch would be), a launch the ring cut (its first blocks lost), records out of order. The
check: ktrace.py's launches, steps, and per-kernel gap / span / lead / spread sums equal the generator's.
"""
import collections
import os
import random
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ktrace  # noqa: E402

EMBED, GEMV, NORM, HEAD = (12 << 16), (1 << 16) | 111, (4 << 16) | 4, (1 << 16) | 100
# one step: (tag, grid, gap before its release, block duration); the two GEMV launches of grid 6 are consecutive
STEP = [(EMBED, 1, 0, 900), (GEMV, 6, 1100, 2500), (GEMV, 6, 1300, 2100), (NORM, 1, 1200, 700),
        (HEAD, 10, 4000, 3000)]
SLOTS, LEAD = 4, 5000  # first-wave blocks per launch; how long before the release they start


def generate(steps, seed=7):
    recs, expect = [], collections.defaultdict(collections.Counter)
    t = 1_000_000
    walls = []
    for s in range(steps):
        prev_end = None
        step_start = None
        for tag, grid, gap, dur in STEP:
            release = t if prev_end is None else prev_end + gap
            ends = []
            first = []
            for b in range(min(grid, SLOTS)):  # first wave: resident before the release
                start, enter = release - LEAD, release + 10 * b
                first.append(enter + dur + 50 * b)
                recs.append((tag, grid, b, start, enter, first[-1]))
                ends.append(first[-1])
            for b in range(SLOTS, grid):  # second wave: after the whole first wave returned, released at its start
                start = max(first) + 200 + 10 * (b - SLOTS)
                enter = start
                recs.append((tag, grid, b, start, enter, enter + dur))
                ends.append(enter + dur)
            enters = [r[4] for r in recs[-grid:]]
            key = (ktrace.name(tag), grid)
            if s >= 1:  # the generator's expectations for the steps the analysis keeps (all but the first)
                e = expect[key]
                e["n"] += 1
                e["gap"] += 0 if prev_end is None else gap
                e["span"] += max(ends) - release
                e["lead"] += release - min(r[3] for r in recs[-grid:])
                e["spread"] += max(enters) - min(enters)
            if step_start is None:
                step_start = min(r[3] for r in recs[-grid:])
            prev_end = max(ends)
        walls.append(prev_end - step_start)
        t = prev_end + 30_000  # the host's turn between steps
    # the next step's embed launch closes the last step
    recs.append((EMBED, 1, 0, t - LEAD, t, t + 900))
    random.Random(seed).shuffle(recs)
    return recs, expect, walls


def main():
    recs, expect, walls = generate(4)
    # a launch the ring cut: the head's first blocks of an earlier step are gone (ring order: oldest first)
    cut = [(HEAD, 10, b, 100 + b, 200 + b, 300 + b) for b in range(7)]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.bin")
        with open(path, "wb") as f:
            rows = cut + recs
            f.write(struct.pack("<QQ", len(rows) + 3, len(rows)))
            for tag, grid, blk, start, enter, end in rows:
                f.write(struct.pack("<QQQQQ", (tag << 32) | grid, (5 << 32) | blk, start, enter, end))
        n, cap, got = ktrace.load(path)
    assert n == len(cut) + len(recs) + 3 and cap == len(cut) + len(recs) and len(got) == cap, (n, cap, len(got))
    ls = ktrace.launches(got)
    assert len(ls) == 4 * len(STEP) + 1, ("launches", len(ls))  # the cut head is dropped
    steps, tot, per = ktrace.analyse(got, 3)
    assert len(steps) == 3, steps
    assert tot["launches"] == 3 * len(STEP), tot
    assert tot["wall"] == sum(walls[1:]), (tot["wall"], walls)
    assert set(per) == set(expect), (sorted(per), sorted(expect))
    for key, e in expect.items():
        for field in ("n", "gap", "span", "lead", "spread"):
            assert per[key][field] == e[field], (key, field, per[key][field], e[field])
    assert tot["gap"] == sum(e["gap"] for e in expect.values())
    assert tot["span"] == sum(e["span"] for e in expect.values())
    print("ktrace.py: %d launches, %d steps, per-kernel gap / span / lead / spread as generated" % (len(ls), len(steps)))


if __name__ == "__main__":
    main()
