#!/usr/bin/env python3
"""The CUDA backend writes nothing through the legacy default stream.

Its streams are cudaStreamNonBlocking and do not wait for the legacy stream, so a write queued there can land after
a pass on another stream has read the memory: cudaMemset of device memory returns before it runs, cudaMemcpy from
pageable host memory before its DMA lands (bench/RESULTS.md 2026-12-05 (e): the PLE stager's cudaMemset zeroed a
first pass's rows). Writes go through a stream (include/gemma4_t4/cuda/device.hpp upload_now / zero_now).

Checks include/ and kernels/: every cudaMemset* call is an error unless it is an ...Async form; every synchronous
cudaMemcpy* call is an error unless it copies DeviceToHost (a read, which the caller orders after a stream sync).
Prints each offending call with file and line; exit status 1 if there is one.

  no_legacy_stream.py [ROOT]   (default: the repository holding this file)
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
call = re.compile(r"\b(cudaMemset(?:2D|3D)?|cudaMemcpy(?:2D|3D|ToSymbol|FromSymbol|Peer)?)\s*\(")
bad = []
for sub in ("include", "kernels"):
    for path in sorted((root / sub).rglob("*")):
        if path.suffix not in (".hpp", ".cuh", ".h") or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        for m in call.finditer(text):
            line_start = text.rfind("\n", 0, m.start()) + 1
            if text[line_start:m.start()].lstrip().startswith("//"):
                continue  # a comment
            end = text.find(";", m.end())
            args = text[m.end(): end if end >= 0 else len(text)]
            name = m.group(1)
            if name.startswith("cudaMemcpy") and "DeviceToHost" in args:
                continue
            line = text.count("\n", 0, m.start()) + 1
            bad.append(f"{path.relative_to(root)}:{line}: {name}(...) on the legacy default stream")
for b in bad:
    print(b)
print(f"no_legacy_stream: {len(bad)} call(s) on the legacy default stream in include/ and kernels/")
sys.exit(1 if bad else 0)
