#!/usr/bin/env python3
"""Builds the tiny Gemma 4 test checkpoints and their reference outputs.

Run where torch 2.11 and transformers 5.17 are installed (the project's GPU machine has both):

    python3 tools/make_fixtures.py --out tests/fixtures

Everything is seeded; re-running gives byte-identical files. The reference is transformers'
Gemma4ForCausalLM in float32 on the CPU with eager attention. Weights are drawn in float32, rounded to
bfloat16 (or to the w4a16 grid) and only then loaded into the float32 model, so the stored file holds
exactly the weights the reference ran with.

Fixtures (each a directory with config.json, weights and reference.safetensors):
  mm_bf16     nested `gemma4` config, `model.language_model.` prefix, dummy vision/audio tensors,
              k/v/k_norm shipped for KV-shared layers (as the bf16 E2B file does), PLE, double-wide MLP,
              KV sharing of both layer types, sliding window shorter than the prompt, head dims 32/64
              with partial (proportional) RoPE on full layers. One bf16 file.
  flat_keqv   flat `gemma4_text` config, `model.` prefix, attention_k_eq_v on full layers with its own
              KV-head count, no PLE, no KV sharing, a stored lm_head.weight, float32, two shards + index.
  w4a16       the mm_bf16 architecture (other seed) as a compressed-tensors pack-quantized int4 copy:
              every decoder/PLE Linear quantized symmetric group 32, no k/v for KV-shared layers (as the
              QAT file ships); the reference runs on the dequantized weights.

reference.safetensors holds: prompt_ids [T] I32, prefill_logits [T, V] F32 (every prompt position),
decode_ids [S] I32 (greedy tokens fed at each step), decode_logits [S, V] F32 (logits after feeding
decode_ids[s]), and for w4a16 `dequant.<tensor name>` [out, in] F32 for two tensors (the unpack test).
"""

import argparse
import json
import math
import os
import sys

import torch

try:
    from safetensors.torch import save_file
except ImportError:  # pragma: no cover
    sys.exit("needs the safetensors package")

import transformers
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

PROMPT_LEN = 20
DECODE_STEPS = 16
VOCAB = 512


def base_text_config(**over):
    kw = dict(
        vocab_size=VOCAB,
        vocab_size_per_layer_input=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=7,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        global_head_dim=64,
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        sliding_window=8,
        layer_types=[
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "full_attention",
        ],
        final_logit_softcapping=30.0,
        hidden_size_per_layer_input=32,
        num_kv_shared_layers=3,
        use_double_wide_mlp=True,
        attention_k_eq_v=False,
        tie_word_embeddings=True,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        },
        pad_token_id=0,
        eos_token_id=[1, 106],
        bos_token_id=2,
    )
    kw.update(over)
    return kw


def make_model(kw):
    cfg = Gemma4TextConfig(**kw)
    try:
        cfg._attn_implementation = "eager"
    except Exception:  # older spellings
        cfg.attn_implementation = "eager"
    model = Gemma4ForCausalLM(cfg).to(torch.float32).eval()
    return cfg, model


def bf16_round(t):
    return t.to(torch.bfloat16).to(torch.float32)


def fill_weights(model, seed):
    """Deterministic weights of realistic scale; every value exactly representable in bf16."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name == "lm_head.weight":
                continue  # tied to embed_tokens
            if p.dim() == 1:  # norm weights around 1
                v = 0.6 + 0.8 * torch.rand(p.shape, generator=g)
            elif "embed_tokens" in name:
                v = torch.randn(p.shape, generator=g)
            else:  # Linear [out, in]
                v = torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1])
            p.copy_(bf16_round(v))
        for name, b in sorted(model.named_buffers()):
            if name.endswith("layer_scalar"):
                b.copy_(bf16_round(0.5 + 0.5 * torch.rand(b.shape, generator=g)))


QUANT_SUFFIXES = (
    "q_proj.weight",
    "k_proj.weight",
    "v_proj.weight",
    "o_proj.weight",
    "gate_proj.weight",
    "up_proj.weight",
    "down_proj.weight",
    "per_layer_input_gate.weight",
    "per_layer_projection.weight",
    "per_layer_model_projection.weight",
)


def quantize_w4(w):
    """Symmetric int4, group 32 along the input axis, bf16 scales. Returns (q int in [-8,7], scale bf16)."""
    out_f, in_f = w.shape
    assert in_f % 32 == 0, (w.shape,)
    groups = w.reshape(out_f, in_f // 32, 32)
    scale = (groups.abs().amax(dim=-1) / 7.0).clamp(min=1e-4).to(torch.bfloat16)
    q = torch.round(groups / scale.to(torch.float32)[..., None]).clamp(-8, 7).to(torch.int32)
    return q.reshape(out_f, in_f), scale


def dequant_w4(q, scale):
    out_f, in_f = q.shape
    return (q.reshape(out_f, in_f // 32, 32).to(torch.float32) * scale.to(torch.float32)[..., None]).reshape(
        out_f, in_f
    )


def pack_w4(q):
    """compressed-tensors pack-quantized: column 8j+k is nibble k (bits 4k..4k+3) of int32 word j, u = q + 8."""
    out_f, in_f = q.shape
    u = (q + 8).to(torch.int64).reshape(out_f, in_f // 8, 8)
    word = torch.zeros(out_f, in_f // 8, dtype=torch.int64)
    for k in range(8):
        word |= u[:, :, k] << (4 * k)
    word = torch.where(word >= 2**31, word - 2**32, word)  # reinterpret as int32
    return word.to(torch.int32)


def run_reference(model, seed):
    g = torch.Generator().manual_seed(seed + 1000)
    prompt = torch.randint(5, VOCAB, (PROMPT_LEN,), generator=g)
    prompt[0] = 2  # BOS
    with torch.no_grad():
        out = model(input_ids=prompt[None], use_cache=True)
        prefill_logits = out.logits[0].float().clone()
        pkv = out.past_key_values
        tok = int(prefill_logits[-1].argmax())
        decode_ids, decode_logits, gaps = [], [], []
        last = prefill_logits[-1]
        for _ in range(DECODE_STEPS):
            top2 = torch.topk(last, 2).values
            gaps.append(float(top2[0] - top2[1]))
            decode_ids.append(tok)
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=pkv, use_cache=True)
            pkv = out.past_key_values
            last = out.logits[0, -1].float().clone()
            decode_logits.append(last)
            tok = int(last.argmax())
        decode_logits = torch.stack(decode_logits)
        # The cached path must agree with one uncached forward over the whole sequence.
        full = torch.cat([prompt, torch.tensor(decode_ids)])
        full_logits = model(input_ids=full[None], use_cache=False).logits[0].float()
        cached = torch.cat([prefill_logits, decode_logits])
        rel = float((full_logits - cached).abs().max() / cached.abs().max())
        assert rel < 1e-4, f"reference cached vs uncached disagree: {rel}"
    print(f"  cached/uncached rel diff {rel:.2e}; min greedy top-2 gap {min(gaps):.4f}")
    return {
        "prompt_ids": prompt.to(torch.int32).contiguous(),
        "prefill_logits": prefill_logits.contiguous(),
        "decode_ids": torch.tensor(decode_ids, dtype=torch.int32),
        "decode_logits": decode_logits.contiguous(),
    }


def text_config_dict(cfg):
    d = json.loads(cfg.to_json_string(use_diff=False))
    for k in ("_attn_implementation", "attn_implementation", "_name_or_path", "transformers_version"):
        d.pop(k, None)
    d["model_type"] = "gemma4_text"
    return d


def mm_name(k):
    """Gemma4ForCausalLM name (`model.x`) -> multimodal checkpoint name (`model.language_model.x`)."""
    assert k.startswith("model."), k
    return "model.language_model." + k[len("model."):]


def state_dict_fp32(model):
    sd = {k: v.detach().clone().float().contiguous() for k, v in model.state_dict().items()}
    sd.pop("lm_head.weight", None)
    return sd


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def nested_config(text_cfg, extra=None):
    d = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": text_cfg,
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 16, "num_hidden_layers": 1},
        "audio_config": {"model_type": "gemma4_audio", "hidden_size": 16, "num_hidden_layers": 1},
        "tie_word_embeddings": True,
        "transformers_version": transformers.__version__,
    }
    if extra:
        d.update(extra)
    return d


def dummy_towers(g):
    return {
        "model.vision_tower.encoder.layers.0.mlp.fc.weight": torch.randn(16, 16, generator=g).to(torch.bfloat16),
        "model.embed_vision.embedding_projection.weight": torch.randn(64, 16, generator=g).to(torch.bfloat16),
        "model.audio_tower.layers.0.norm.weight": torch.randn(16, generator=g).to(torch.bfloat16),
        "model.embed_audio.embedding_projection.weight": torch.randn(64, 16, generator=g).to(torch.bfloat16),
    }


def shared_layer_extras(cfg, g, prefix):
    """k_proj/v_proj/k_norm of KV-shared layers, as the bf16 E2B file ships them (unused by the model)."""
    extra = {}
    first_shared = cfg.num_hidden_layers - cfg.num_kv_shared_layers
    for i in range(first_shared, cfg.num_hidden_layers):
        d = 64 if cfg.layer_types[i] == "full_attention" else 32
        kvh = cfg.num_key_value_heads
        extra[f"{prefix}layers.{i}.self_attn.k_proj.weight"] = torch.randn(kvh * d, 64, generator=g).to(torch.bfloat16)
        extra[f"{prefix}layers.{i}.self_attn.v_proj.weight"] = torch.randn(kvh * d, 64, generator=g).to(torch.bfloat16)
        extra[f"{prefix}layers.{i}.self_attn.k_norm.weight"] = torch.ones(d).to(torch.bfloat16)
    return extra


def make_mm_bf16(out_dir, seed=11):
    print("mm_bf16")
    cfg, model = make_model(base_text_config())
    fill_weights(model, seed)
    ref = run_reference(model, seed)
    g = torch.Generator().manual_seed(seed + 2000)
    tensors = {mm_name(k): v.to(torch.bfloat16) for k, v in state_dict_fp32(model).items()}
    tensors.update(shared_layer_extras(cfg, g, "model.language_model."))
    tensors.update(dummy_towers(g))
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    write_json(os.path.join(out_dir, "config.json"), nested_config(text_config_dict(cfg)))
    save_file(ref, os.path.join(out_dir, "reference.safetensors"))
    return cfg


def make_flat_keqv(out_dir, seed=23):
    print("flat_keqv")
    kw = base_text_config(
        num_key_value_heads=2,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=0,
        use_double_wide_mlp=False,
        num_hidden_layers=5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"],
    )
    cfg, model = make_model(kw)
    fill_weights(model, seed)
    ref = run_reference(model, seed)
    sd = state_dict_fp32(model)
    tensors = dict(sd)  # Gemma4ForCausalLM names: `model.` prefix
    tensors["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    names = sorted(tensors)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    os.makedirs(out_dir, exist_ok=True)
    weight_map, total = {}, 0
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, os.path.join(out_dir, fname), metadata={"format": "pt"})
        for k in keys:
            weight_map[k] = fname
            total += tensors[k].numel() * tensors[k].element_size()
    write_json(
        os.path.join(out_dir, "model.safetensors.index.json"),
        {"metadata": {"total_size": total}, "weight_map": weight_map},
    )
    d = text_config_dict(cfg)
    d["architectures"] = ["Gemma4ForCausalLM"]
    write_json(os.path.join(out_dir, "config.json"), d)
    save_file(ref, os.path.join(out_dir, "reference.safetensors"))
    return cfg


def make_w4a16(out_dir, seed=37):
    print("w4a16")
    cfg, model = make_model(base_text_config())
    fill_weights(model, seed)
    packed, dequant_keep = {}, {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(QUANT_SUFFIXES):
                q, scale = quantize_w4(p.detach().float())
                deq = dequant_w4(q, scale)
                p.copy_(deq)  # the reference runs on exactly these values
                packed[name] = (pack_w4(q), scale, p.shape)
                if name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.6.mlp.down_proj.weight"):
                    dequant_keep["dequant.model.language_model." + name[len("model."):]] = deq.clone()
    ref = run_reference(model, seed)
    ref.update(dequant_keep)
    tensors = {}
    for k, v in state_dict_fp32(model).items():
        full = mm_name(k)
        if k in packed:
            words, scale, shape = packed[k]
            base = full[: -len(".weight")]
            tensors[base + ".weight_packed"] = words.contiguous()
            tensors[base + ".weight_scale"] = scale.contiguous()
            tensors[base + ".weight_shape"] = torch.tensor(list(shape), dtype=torch.int64)
        else:
            tensors[full] = v.to(torch.bfloat16)
    g = torch.Generator().manual_seed(seed + 2000)
    tensors.update(dummy_towers(g))
    quant = {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 4,
                        "type": "int",
                        "symmetric": True,
                        "strategy": "group",
                        "group_size": 32,
                        "dynamic": False,
                        "actorder": None,
                        "observer": "minmax",
                    },
                    "input_activations": None,
                    "output_activations": None,
                    "format": "pack-quantized",
                }
            },
            "ignore": ["lm_head", "re:.*vision.*", "re:.*audio.*", "re:.*embed.*"],
        }
    }
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    write_json(os.path.join(out_dir, "config.json"), nested_config(text_config_dict(cfg), quant))
    save_file(ref, os.path.join(out_dir, "reference.safetensors"))
    return cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # one thread: summation order independent of the machine
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    make_mm_bf16(os.path.join(args.out, "mm_bf16"))
    make_flat_keqv(os.path.join(args.out, "flat_keqv"))
    make_w4a16(os.path.join(args.out, "w4a16"))
    with open(os.path.join(args.out, "VERSIONS.txt"), "w") as f:
        f.write(f"torch {torch.__version__}\ntransformers {transformers.__version__}\n")


if __name__ == "__main__":
    main()
