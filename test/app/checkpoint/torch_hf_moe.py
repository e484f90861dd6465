#!/usr/bin/env python3
"""Loads Hugging Face Mixtral / Qwen2-MoE / Qwen3-MoE directories (config.json +
model.safetensors, transformers 4's per-expert tensors) the way transformers'
MixtralForCausalLM / Qwen2MoeForCausalLM / Qwen3MoeForCausalLM use them, computes logits
in PyTorch (float64) for the tokens in REF and compares them with mtnlg's logits from REF
(safetensors with `tokens` [B, T] and `logits` [B, T, vocab]).

Written from the published structure of those models, not from mtnlg's code (and without
transformers). The attention is the Llama family's (torch_hf_llama.py describes it):
rotate-half rotary embedding, grouped-query attention, Qwen2-MoE's q/k/v biases
(qkv_bias), Qwen3-MoE's per-head RMSNorm of queries and keys before the rotation. Each
layer's MLP is either dense, down(silu(gate(h)) * up(h)) of width intermediate_size, or a
sparse block:
  probs = softmax(h @ router^T) over all experts; the num_experts_per_tok largest probs
  are kept and, for Mixtral and when norm_topk_prob, divided by their sum; the output is
  the sum over the kept experts of prob * down_e(silu(gate_e(h)) * up_e(h));
  Qwen2-MoE adds sigmoid(h . shared_expert_gate) * shared_expert(h).
Mixtral's layers are all sparse (block_sparse_moe.gate, experts.{e}.w1 gate, w3 up, w2
down); Qwen's layer l is sparse when l is not in mlp_only_layers and (l + 1) %
decoder_sparse_step == 0 (mlp.gate, mlp.experts.{e}.gate_proj / up_proj / down_proj).

  usage: torch_hf_moe.py [--flip-check DIR] HF_DIR REF [TOL] [HF_DIR REF [TOL] ...]

For each pair prints the max |diff| and checks max |diff| <= TOL (default 1e-5), that
every sparse layer routes the tokens to more than num_experts_per_tok distinct experts,
and that the model has the layers its config promises (a dense one for Qwen when
mlp_only_layers is set). With --flip-check DIR: also computes the logits with the top-k
weights normalised the other way and requires them to move by more than 100 x TOL (the
test's proof that the normalisation is exercised). Prints PASS when all holds; exit 0."""
import json, math, os, sys
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_hf_llama import inv_freq, read_file, read_weights  # safetensors reading, rotary frequencies

F = torch.nn.functional


def sparse_layer(cfg, l):
    if cfg["model_type"] == "mixtral":
        return True
    return l not in (cfg.get("mlp_only_layers") or []) and (l + 1) % cfg.get("decoder_sparse_step", 1) == 0


def renormalises(cfg):
    return cfg["model_type"] == "mixtral" or cfg.get("norm_topk_prob", False)


def moe_block(cfg, w, h, pre, flip, used):
    """The sparse block on h [N, C] with its tensors under `pre`; records the experts used."""
    mixtral = cfg["model_type"] == "mixtral"
    E = cfg["num_local_experts"] if mixtral else cfg["num_experts"]
    k = cfg["num_experts_per_tok"]
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    probs = torch.softmax(h @ w[pre + "gate.weight"].T, -1)
    top, idx = torch.topk(probs, k, -1)
    if renormalises(cfg) != flip:
        top = top / top.sum(-1, keepdim=True)
    out = torch.zeros_like(h)
    for e in range(E):
        rows, slot = torch.nonzero(idx == e, as_tuple=True)
        if rows.numel() == 0:
            continue
        used.add(e)
        x = h[rows]
        g, u, d = (w[f"{pre}experts.{e}.{n}.weight"] for n in names)
        y = (F.silu(x @ g.T) * (x @ u.T)) @ d.T
        out.index_add_(0, rows, y * top[rows, slot][:, None])
    if cfg["model_type"] == "qwen2_moe":
        s = pre + "shared_expert."
        shared = (F.silu(h @ w[s + "gate_proj.weight"].T) * (h @ w[s + "up_proj.weight"].T)) @ w[s + "down_proj.weight"].T
        out = out + torch.sigmoid(h @ w[pre + "shared_expert_gate.weight"].T) * shared
    return out


def logits_of(cfg, w, tok, flip=False, report=None):
    mt = cfg["model_type"]
    assert mt in ("mixtral", "qwen2_moe", "qwen3_moe") and cfg.get("hidden_act", "silu") == "silu", cfg
    C, H, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    G = cfg.get("num_key_value_heads") or H
    D = cfg.get("head_dim") or C // H
    eps = cfg["rms_norm_eps"]
    qkv_bias = mt == "qwen2_moe" and cfg.get("qkv_bias", True)
    B, T = tok.shape

    def rms(x, name):
        return w[name] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def lin(x, name, bias=False):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if bias else y

    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq(cfg, D)[None]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos(), emb.sin()

    def rope(x):
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
        if mt == "qwen3_moe":
            q, k = rms(q, p + "self_attn.q_norm.weight"), rms(k, p + "self_attn.k_norm.weight")
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(H // G, 1)
        v = v.repeat_interleave(H // G, 1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        a = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v
        x = x + lin(a.transpose(1, 2).reshape(B, T, H * D), p + "self_attn.o_proj")
        h = rms(x, p + "post_attention_layernorm.weight").reshape(B * T, C)
        if sparse_layer(cfg, l):
            used = set()
            pre = p + ("block_sparse_moe." if mt == "mixtral" else "mlp.")
            y = moe_block(cfg, w, h, pre, flip, used)
            if report is not None:
                report.append((l, len(used)))
        else:
            assert p + "mlp.gate.weight" not in w, f"layer {l} is dense but has a router"
            y = lin(F.silu(lin(h, p + "mlp.gate_proj")) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
            if report is not None:
                report.append((l, 0))
        x = x + y.reshape(B, T, C)
    x = rms(x, "model.norm.weight")
    tied = cfg.get("tie_word_embeddings", False)
    assert not (tied and "lm_head.weight" in w), "a tied export writes no lm_head.weight"
    return x @ (w["model.embed_tokens.weight"] if tied else w["lm_head.weight"]).T


def check(d, ref_path, tol, flip_check):
    cfg = json.load(open(os.path.join(d, "config.json")))
    w = {k: v.double() for k, v in read_weights(d).items()}
    ref = read_file(ref_path)
    tok, ours = ref["tokens"].long(), ref["logits"].double()
    report = []
    with torch.no_grad():
        theirs = logits_of(cfg, w, tok, report=report)
    diff = (ours - theirs).abs().max().item()
    ok = ours.shape == theirs.shape and diff <= tol
    k = cfg["num_experts_per_tok"]
    routes = ", ".join(f"{l}:{n}" if n else f"{l}:dense" for l, n in report)
    print(f"{cfg['architectures'][0]} {os.path.basename(d)}: logits max |diff| {diff:.3e} over "
          f"{tuple(theirs.shape)} (bound {tol:g}); experts used per layer {routes} {'ok' if ok else 'FAIL'}")
    if any(0 < n <= k for _, n in report):
        print(f"  FAIL: a sparse layer routes every token to the same {k} experts")
        ok = False
    if cfg.get("mlp_only_layers") and all(n for _, n in report):
        print("  FAIL: mlp_only_layers is set but no layer is dense")
        ok = False
    if flip_check:
        with torch.no_grad():
            moved = (logits_of(cfg, w, tok, flip=True) - theirs).abs().max().item()
        print(f"  with the top-k weights normalised the other way the logits move by {moved:.3e}")
        if moved <= 100 * tol:
            print("  FAIL: the top-k normalisation is not exercised")
            ok = False
    return ok


def main(argv):
    args, flips = list(argv), set()
    while "--flip-check" in args:
        i = args.index("--flip-check")
        flips.add(args[i + 1])
        del args[i:i + 2]
    ok, i = True, 0
    while i < len(args):
        d, ref = args[i], args[i + 1]
        i += 2
        tol = 1e-5
        if i < len(args) and not os.path.isdir(args[i]):
            tol = float(args[i])
            i += 1
        ok &= check(d, ref, tol, d in flips)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
