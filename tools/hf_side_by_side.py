#!/usr/bin/env python3
"""Decode speed of the reference implementation (transformers) on a gemma4_t4 synthetic checkpoint.

    python3 tools/hf_side_by_side.py --model /tmp/e2b-bf16 [--prompt 512] [--tokens 128] [--batch 1,8]

Runs on the GPU machine (torch + transformers 5.17): builds Gemma4ForCausalLM from the checkpoint's text
config, loads the bf16 weights as fp16 onto the GPU, and times greedy generation with a static KV cache
(EOS ignored: min_new_tokens = max_new_tokens), the same prompt length / output length / concurrency as the
bench sweep. Per stream = 1000 / (ms per generated token); the prefill is timed separately (one token) and
subtracted. Prints one line per concurrency, as `hf c=N prompt=P tok/s/stream=X total=Y ttft_ms=Z`.

Status (2026-12-02, H200): the model builds and loads (fp16, sdpa), but the first warm-up generate with a
static cache did not finish within 120 s (a compile on first use is the suspect) and the session's GPU time
ran out; no numbers from it exist yet. Next: time a plain dynamic-cache run as well, and allow the warm-up.
"""
import argparse
import json
import os
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


def timed_generate(model, ids, new_tokens):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                       cache_implementation="static", pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", default="1,8")
    args = ap.parse_args()
    model, config = load_model(args.model)
    print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}, fp16, sdpa, static cache", flush=True)
    g = torch.Generator().manual_seed(20250101)
    for c in [int(x) for x in args.batch.split(",")]:
        ids = torch.randint(5, config.vocab_size, (c, args.prompt), generator=g)
        ids[:, 0] = 2
        ids = ids.to("cuda")
        timed_generate(model, ids, 4)  # warm-up
        ttft = timed_generate(model, ids, 1)
        total = timed_generate(model, ids, args.tokens)
        per_token = (total - ttft) / (args.tokens - 1)
        print(f"hf c={c} prompt={args.prompt} tok/s/stream={1 / per_token:.1f} total={c / per_token:.1f} "
              f"ttft_ms={ttft * 1e3:.1f}", flush=True)


if __name__ == "__main__":
    main()
