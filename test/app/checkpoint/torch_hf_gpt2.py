#!/usr/bin/env python3
"""Loads a Hugging Face GPT-2 export (DIR/config.json + DIR/model.safetensors) the way
transformers' GPT2LMHeadModel would use it — Conv1D weights [in, out], c_attn columns
[q | k | v], tied lm_head — computes logits in PyTorch for the tokens in REF and
compares with mtnlg's logits from REF (safetensors with `tokens` [B, T] and `logits`
[B, T, vocab]). Written from GPT-2's published structure, not from mtnlg's code.
Exit 0 when max |diff| / max |ref| <= 1e-5."""
import json, math, os, sys
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_hf_llama import read_file as read  # the safetensors reader (F32, F64, F16, BF16, I32)


def main(hf_dir, ref_path):
    cfg = json.load(open(f"{hf_dir}/config.json"))
    w = read(f"{hf_dir}/model.safetensors")
    ref = read(ref_path)
    C, H, L, eps = cfg["n_embd"], cfg["n_head"], cfg["n_layer"], cfg["layer_norm_epsilon"]
    assert cfg["activation_function"] == "gelu_new" and cfg["model_type"] == "gpt2"
    tok = ref["tokens"].long()
    B, T = tok.shape
    D = C // H
    gelu = lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    ln = lambda x, p: torch.nn.functional.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"], eps)
    x = w["wte.weight"][tok] + w["wpe.weight"][:T][None]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        p = f"h.{l}."
        qkv = ln(x, p + "ln_1") @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=2))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        a = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v
        x = x + a.transpose(1, 2).reshape(B, T, C) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = gelu(ln(x, p + "ln_2") @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    logits = ln(x, "ln_f") @ w["wte.weight"].T
    ours = ref["logits"]
    assert ours.shape == logits.shape, (ours.shape, logits.shape)
    err = (ours - logits).abs().max().item() / logits.abs().max().item()
    print(f"logits max relative difference {err:.2e} over {tuple(logits.shape)}")
    print("PASS" if err <= 1e-5 else "FAIL")
    return 0 if err <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
