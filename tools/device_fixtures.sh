#!/usr/bin/env bash
# Runs on the GPU machine: regenerates tests/fixtures with the reference implementation and returns them
# (plus the reference's source, for reading) under $OUT.
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -c "import torch, transformers, safetensors; print(torch.__version__, transformers.__version__, safetensors.__version__)"
rm -rf /tmp/fx && python3 tools/make_fixtures.py --out /tmp/fx 2>&1 | tee "$OUT/make_fixtures.log"
tar -C /tmp -czf "$OUT/fixtures.tar.gz" fx
src=$(python3 -c "import transformers, os; print(os.path.dirname(transformers.__file__))")
tar -C "$src" -czf "$OUT/reference_src.tar.gz" models/gemma4 masking_utils.py cache_utils.py modeling_rope_utils.py integrations/sdpa_attention.py
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
