#!/usr/bin/env python3
"""Loads Hugging Face Llama / Qwen2 / Qwen3 directories (config.json + model.safetensors, or
the shards of model.safetensors.index.json; F32, BF16 or F16) the way transformers'
LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM use them, computes logits in PyTorch for the tokens
in REF and compares them with mtnlg's logits from REF (safetensors with `tokens` [B, T]
and `logits` [B, T, vocab]).

Written from the published structure of those models, not from mtnlg's code (and without
transformers): embed_tokens; per layer x += o_proj(attention(input_layernorm(x))) and
x += down_proj(silu(gate_proj(h)) * up_proj(h)) with h = post_attention_layernorm(x);
RMSNorm w * x / sqrt(mean(x^2) + eps) computed in fp32; rotary embedding in the
rotate-half form (cos/sin of position * inv_freq repeated over both halves) with
inv_freq = theta^(-2i/head_dim) and rope_scaling {rope_type: llama3} rescaling it by
wavelength; grouped-query attention repeating each key/value head for
num_attention_heads / num_key_value_heads consecutive query heads; causal softmax
scaled by 1/sqrt(head_dim); biases: Llama's attention_bias (q, k, v, o) and mlp_bias
(gate, up, down), Qwen2's on q, k, v, Qwen3's attention_bias (q, k, v, o); Qwen3's q_norm
and k_norm: an RMSNorm (weight [head_dim]) of each query and key head after the projection
and before the rotary embedding; lm_head, or embed_tokens when tie_word_embeddings.

  usage: torch_hf_llama.py HF_DIR REF [TOL] [HF_DIR REF [TOL] ...]   (TOL default 1e-5)

For each pair prints the max |diff| and max |diff| / max |ref| and checks max |diff| <= TOL.
With --no-scaling-check DIR REF: also reports how far the logits move when the rope
scaling is ignored (the test's proof that the scaling is exercised). Prints PASS when
every pair is within its bound; exit 0 then."""
import json, math, os, struct, sys
import numpy as np
import torch

NP = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32, "BF16": np.uint16}


def read_file(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    h = json.loads(data[8:8 + n])
    h.pop("__metadata__", None)
    out = {}
    for k, e in h.items():
        b, en = e["data_offsets"]
        a = np.frombuffer(data[8 + n + b:8 + n + en], dtype=NP[e["dtype"]]).reshape(e["shape"])
        if e["dtype"] == "BF16":  # bfloat16: the top 16 bits of an fp32
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[k] = torch.from_numpy(a.astype(np.float32) if a.dtype == np.float16 else a.copy())
    return out


def read_weights(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_file(os.path.join(d, "model.safetensors"))
    wm = json.load(open(index))["weight_map"]
    out = {}
    for f in sorted(set(wm.values())):
        part = read_file(os.path.join(d, f))
        assert all(wm[k] == f for k in part), f"{f} holds tensors the index puts elsewhere"
        out.update(part)
    assert set(out) == set(wm), "index and shards disagree"
    return out


def inv_freq(cfg, dim, scaling=True):
    theta = cfg.get("rope_theta", 10000.0)
    f = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    rs = cfg.get("rope_scaling")
    if not scaling or not rs or rs.get("rope_type", rs.get("type")) in (None, "default"):
        return f
    assert rs.get("rope_type", rs.get("type")) == "llama3", rs
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    orig = rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / f
    low_wavelen, high_wavelen = orig / low, orig / high
    smooth = (orig / wavelen - low) / (high - low)
    medium = (1 - smooth) * f / factor + smooth * f
    return torch.where(wavelen < high_wavelen, f, torch.where(wavelen > low_wavelen, f / factor, medium))


def logits_of(cfg, w, tok, scaling=True):
    assert cfg["model_type"] in ("llama", "qwen2", "qwen3") and cfg.get("hidden_act", "silu") == "silu", cfg
    qwen2, qwen3 = cfg["model_type"] == "qwen2", cfg["model_type"] == "qwen3"
    C, H, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    G = cfg.get("num_key_value_heads") or H
    D = cfg.get("head_dim") or (128 if qwen3 else C // H)
    eps = cfg["rms_norm_eps"]
    qkv_bias = qwen2 or cfg.get("attention_bias", False)
    o_bias = not qwen2 and cfg.get("attention_bias", False)
    mlp_bias = not qwen2 and not qwen3 and cfg.get("mlp_bias", False)
    B, T = tok.shape

    def rms(x, name):
        x32 = x.float()
        return w[name] * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))

    def lin(x, name, bias):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if bias else y

    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq(cfg, D, scaling)[None]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos().float(), emb.sin().float()

    def rope(x):  # [B, heads, T, D]
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    mask = torch.ones(T, T, dtype=torch.bool).tril()
    x = w["model.embed_tokens.weight"][tok]
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms(x, p + "input_layernorm.weight")
        q = lin(h, p + "self_attn.q_proj", qkv_bias).view(B, T, H, D).transpose(1, 2)
        k = lin(h, p + "self_attn.k_proj", qkv_bias).view(B, T, G, D).transpose(1, 2)
        v = lin(h, p + "self_attn.v_proj", qkv_bias).view(B, T, G, D).transpose(1, 2)
        if qwen3:  # per head, over its head_dim values
            q, k = rms(q, p + "self_attn.q_norm.weight"), rms(k, p + "self_attn.k_norm.weight")
        else:
            assert p + "self_attn.q_norm.weight" not in w, "q_norm is Qwen3's"
        q, k = rope(q), rope(k)
        k = k[:, :, None].expand(B, G, H // G, T, D).reshape(B, H, T, D)  # repeat_kv
        v = v[:, :, None].expand(B, G, H // G, T, D).reshape(B, H, T, D)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        a = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v
        x = x + lin(a.transpose(1, 2).reshape(B, T, H * D), p + "self_attn.o_proj", o_bias)
        h = rms(x, p + "post_attention_layernorm.weight")
        gate = lin(h, p + "mlp.gate_proj", mlp_bias)
        x = x + lin(torch.nn.functional.silu(gate) * lin(h, p + "mlp.up_proj", mlp_bias), p + "mlp.down_proj", mlp_bias)
    x = rms(x, "model.norm.weight")
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else w["lm_head.weight"]
    if cfg.get("tie_word_embeddings", False):
        assert "lm_head.weight" not in w, "a tied export writes no lm_head.weight"
    return x @ head.T


def main(argv):
    ok = True
    scaling_dirs = set()
    args = list(argv)
    while "--no-scaling-check" in args:
        i = args.index("--no-scaling-check")
        scaling_dirs.add(args[i + 1])
        del args[i:i + 2]
    i = 0
    while i < len(args):
        d, ref_path = args[i], args[i + 1]
        i += 2
        tol = 1e-5
        if i < len(args) and not os.path.isdir(args[i]):
            tol = float(args[i])
            i += 1
        cfg = json.load(open(os.path.join(d, "config.json")))
        w = read_weights(d)
        ref = read_file(ref_path)
        tok = ref["tokens"].long()
        ours = ref["logits"]
        with torch.no_grad():
            theirs = logits_of(cfg, w, tok)
        assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
        diff = (ours - theirs).abs().max().item()
        rel = diff / theirs.abs().max().item()
        good = diff <= tol
        ok &= good
        print(f"{cfg['architectures'][0]} {os.path.basename(d)}: logits max |diff| {diff:.3e}, relative {rel:.3e} "
              f"over {tuple(theirs.shape)} (bound {tol:g}) {'ok' if good else 'FAIL'}")
        if d in scaling_dirs:
            with torch.no_grad():
                plain = logits_of(cfg, w, tok, scaling=False)
            moved = (plain - theirs).abs().max().item()
            print(f"  without rope scaling the logits move by {moved:.3e}")
            if moved <= 100 * tol:
                print("  FAIL: the rope scaling is not exercised")
                ok = False
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
