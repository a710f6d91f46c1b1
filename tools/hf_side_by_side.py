#!/usr/bin/env python3
"""Decode speed of the reference implementation (transformers) on a gemma4_t4 synthetic checkpoint.

    python3 tools/hf_side_by_side.py --model /tmp/e2b-bf16 [--prompt 512] [--tokens 128] [--batch 1,8]

Runs on the GPU machine (torch + transformers 5.17): builds Gemma4ForCausalLM from the checkpoint's text
config, loads the bf16 weights as fp16 onto the GPU, and times greedy generation with a static KV cache
(EOS ignored: min_new_tokens = max_new_tokens), the same prompt length / output length / concurrency as the
bench sweep. Per stream = 1000 / (ms per generated token); the prefill is timed separately (one token) and
subtracted. Prints one line per concurrency, as `hf c=N prompt=P tok/s/stream=X total=Y ttft_ms=Z`.

Each timed call is bounded by --budget seconds (SIGALRM); a call that runs past it is reported as such
instead of hanging the run. `--cache static` passes disable_compile=True: transformers otherwise compiles
the forward with torch.compile on the first static-cache call (the 2026-12-02 run spent its 120 s there);
`--cache dynamic` times the default DynamicCache path for comparison.
"""
import argparse
import json
import os
import signal
import time

import torch
from safetensors import safe_open
from transformers import Gemma4ForCausalLM, Gemma4TextConfig


def load_model(path):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    text = cfg.get("text_config", cfg)
    text = {k: v for k, v in text.items() if k not in ("architectures", "model_type", "transformers_version")}
    config = Gemma4TextConfig(**text)
    config._attn_implementation = "sdpa"
    torch.set_default_dtype(torch.float16)
    with torch.device("cuda"):
        model = Gemma4ForCausalLM(config)
    state = {}
    files = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    for name in files:
        with safe_open(os.path.join(path, name), framework="pt") as f:
            for k in f.keys():
                if k.startswith("model.language_model."):
                    state["model." + k[len("model.language_model."):]] = f.get_tensor(k).to(torch.float16)
                elif k.startswith("model.") and not k.startswith(("model.vision", "model.audio", "model.embed_vision",
                                                                  "model.embed_audio")):
                    state[k] = f.get_tensor(k).to(torch.float16)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]
    if missing:
        raise SystemExit(f"missing tensors: {missing[:8]} ({len(missing)})")
    model.tie_weights()
    return model.eval(), config


class Budget(Exception):
    pass


def _alarm(signum, frame):
    raise Budget()


def timed_generate(model, ids, new_tokens, cache, budget):
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    if cache == "static":
        kwargs.update(cache_implementation="static", disable_compile=True)
    torch.cuda.synchronize()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(budget)
    try:
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, **kwargs)
        torch.cuda.synchronize()
        return time.perf_counter() - t0
    finally:
        signal.alarm(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--cache", default="static,dynamic", help="comma-separated: static, dynamic")
    ap.add_argument("--budget", type=int, default=90, help="seconds allowed per generate call")
    args = ap.parse_args()
    t0 = time.perf_counter()
    model, config = load_model(args.model)
    print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}, fp16, sdpa; loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    g = torch.Generator().manual_seed(20250101)
    for cache in args.cache.split(","):
        for c in [int(x) for x in args.batch.split(",")]:
            ids = torch.randint(5, config.vocab_size, (c, args.prompt), generator=g)
            ids[:, 0] = 2
            ids = ids.to("cuda")
            try:
                timed_generate(model, ids, 4, cache, args.budget)  # warm-up
                ttft = timed_generate(model, ids, 1, cache, args.budget)
                total = timed_generate(model, ids, args.tokens, cache, args.budget)
            except Budget:
                print(f"hf cache={cache} c={c} prompt={args.prompt}: a generate call ran past {args.budget} s",
                      flush=True)
                continue
            per_token = (total - ttft) / (args.tokens - 1)
            print(f"hf cache={cache} c={c} prompt={args.prompt} tok/s/stream={1 / per_token:.1f} "
                  f"total={c / per_token:.1f} ttft_ms={ttft * 1e3:.1f}", flush=True)


if __name__ == "__main__":
    main()
