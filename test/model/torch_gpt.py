#!/usr/bin/env python3
"""Outside oracle for mtnlg's decoder (run by test/model/test_gpt_torch_oracle.cpp).

Reads what mtnlg dumped in DIR (safetensors, parsed here by hand: 8-byte header length,
JSON header, raw little-endian data), rebuilds the same GPT in PyTorch from the same
weights, and compares the loss, every parameter gradient, and the weights and losses
after 3 AdamW steps with gradient clipping. Written from the model's definition
(pre-LN GPT-2 blocks, per-head [q|k|v] QKV layout, tanh GELU, tied output layer,
padded vocabulary masked out of the softmax) and, with meta "llama" = 1, from the Llama
family's (rotate-half or interleaved rotary positions on a fraction of each head, Llama
3.1's frequency scaling, RMSNorm, SwiGLU, grouped-query attention with K/V repeated per
group, q/k/v biases alone, tied or untied output layer, and, when the weights
attention.q_layernorm / k_layernorm are there, Qwen3's RMSNorm of each query and key
head before the rotation), not from mtnlg's code.

Metric: per tensor, ||ours - torch|| / ||torch|| <= 1e-5 (fp32), loss relative 1e-5.
Exit 0 when everything matches, 1 otherwise.
"""
import json, math, struct, sys
import numpy as np
import torch

DT = {"F32": np.float32, "F64": np.float64, "I32": np.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    base = 8 + n
    for name, e in header.items():
        b, en = e["data_offsets"]
        arr = np.frombuffer(data[base + b:base + en], dtype=DT[e["dtype"]]).reshape(e["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out, meta


def main(d):
    init, meta = read_safetensors(f"{d}/init.safetensors")
    step0, _ = read_safetensors(f"{d}/step0.safetensors")
    after, _ = read_safetensors(f"{d}/after3.safetensors")
    cfg = {k: float(v) for k, v in meta.items()}
    L, C, H = int(cfg["layers"]), int(cfg["hidden"]), int(cfg["heads"])
    V, T = int(cfg["vocab"]), int(cfg["seq"])
    eps, lr, wd, clip = cfg["eps"], cfg["lr"], cfg["wd"], cfg["clip"]
    b1, b2, adam_eps = cfg["beta1"], cfg["beta2"], cfg["adam_eps"]
    llama = int(cfg.get("llama", 0)) == 1
    D = int(cfg.get("head_dim", C // H))
    G = int(cfg.get("groups", H))
    tokens = init.pop("tokens").long()
    params = {k: v.clone().requires_grad_(True) for k, v in init.items()}

    def gelu(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    def norm(x, name):
        w = params[name + ".weight"]
        if llama:  # RMSNorm
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w
        return torch.nn.functional.layer_norm(x, (C,), w, params[name + ".bias"], eps)

    def rms_head(x, w):
        """x [B, heads, T, D]: each head vector RMS-normalised, times w [D]."""
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w

    def linear(x, name):
        y = x @ params[name + ".weight"].T
        return y + params[name + ".bias"] if name + ".bias" in params else y

    def inv_freq(rot):
        """Rotary frequencies base^(-2i/rot); Llama 3.1's scaling by wavelength when asked."""
        f = [cfg["rope_base"] ** (-2.0 * i / rot) for i in range(rot // 2)]
        if int(cfg.get("rope_scaling", 0)):
            factor, lo, hi, orig = cfg["rope_factor"], cfg["rope_low"], cfg["rope_high"], cfg["rope_original"]
            out = []
            for x in f:
                wl = 2 * math.pi / x
                if wl < orig / hi:
                    out.append(x)
                elif wl > orig / lo:
                    out.append(x / factor)
                else:
                    sm = (orig / wl - lo) / (hi - lo)
                    out.append((1 - sm) * x / factor + sm * x)
            f = out
        return torch.tensor(f, dtype=torch.float64)

    def rope(x):
        """x [B, heads, T, D]: rotates the first rot dims of each head by position."""
        rot = int(round(D * cfg.get("rope_percent", 1.0)))
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq(rot)[None, :]  # [T, rot/2]
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        r, rest = x[..., :rot], x[..., rot:]
        if int(cfg.get("rope_interleaved", 0)):
            a, b = r[..., 0::2], r[..., 1::2]
            out = torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2)
        else:  # rotate-half: pairs (i, i + rot/2)
            a, b = r[..., : rot // 2], r[..., rot // 2:]
            out = torch.cat((a * cos - b * sin, a * sin + b * cos), -1)
        return torch.cat((out, rest), -1)

    def loss_fn():
        inp, tgt = tokens[:, :-1], tokens[:, 1:]
        B = inp.shape[0]
        wte = params["embedding.word_embeddings.weight"]
        x = wte[inp]
        if not llama:
            x = x + params["embedding.position_embeddings.weight"][:T][None]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for l in range(L):
            n = f"layers.{l}."
            h = norm(x, n + "input_layernorm")
            # per key/value group: its H/G query heads, then its key, then its value
            qkv = linear(h, n + "attention.qkv").view(B, T, G, H // G + 2, D)
            q = qkv[:, :, :, : H // G].reshape(B, T, H, D).transpose(1, 2)
            k = qkv[:, :, :, H // G].transpose(1, 2).repeat_interleave(H // G, dim=1)
            v = qkv[:, :, :, H // G + 1].transpose(1, 2).repeat_interleave(H // G, dim=1)
            if n + "attention.q_layernorm.weight" in params:  # Qwen3: RMSNorm of each head, then rope
                q = rms_head(q, params[n + "attention.q_layernorm.weight"])
                k = rms_head(k, params[n + "attention.k_layernorm.weight"])
            if llama:
                q, k = rope(q), rope(k)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
            s = s.masked_fill(~mask, float("-inf"))
            a = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, H * D)
            x = x + linear(a, n + "attention.proj")
            h = norm(x, n + "post_attention_layernorm")
            if llama:
                act = torch.nn.functional.silu(linear(h, n + "mlp.fc1_gate")) * linear(h, n + "mlp.fc1_up")
            else:
                act = gelu(linear(h, n + "mlp.fc1"))
            x = x + linear(act, n + "mlp.fc2")
        x = norm(x, "final_layernorm")
        out_w = params.get("output_layer.weight", wte)
        logits = x @ out_w.T
        logits = logits[..., :V]  # padded vocabulary never counts
        return torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))

    ok = True

    def rel(a, b):
        return (a - b).norm().item() / max(b.norm().item(), 1e-30)

    def check(what, ours, ref, tol=1e-5):
        nonlocal ok
        e = rel(ours, ref)
        flag = "ok" if e <= tol else "MISMATCH"
        if e > tol:
            ok = False
        print(f"{flag:8s} {what:55s} rel err {e:.2e}")

    loss = loss_fn()
    loss.backward()
    check("loss", step0["loss"].double(), loss.detach().double().reshape(1))
    for name, prm in params.items():
        check(f"grad {name}", step0["grad." + name], prm.grad)

    decay = [p for n, p in params.items() if p.dim() > 1]
    no_decay = [p for n, p in params.items() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(b1, b2), eps=adam_eps)
    losses = []
    for it in range(3):
        opt.zero_grad()
        l = loss_fn()
        losses.append(l.item())
        l.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
        opt.step()
    check("losses of the 3 steps", after["losses"].double(), torch.tensor(losses, dtype=torch.float64))
    for name, prm in params.items():
        ours, ref = after[name], prm.detach()
        if name.endswith("attention.qkv.bias"):
            # The key bias has an exactly-zero gradient without rotary positions (softmax
            # is invariant to adding q.b_k to every score of a row), and a nearly zero one
            # with them (dims that do not rotate: exactly; the slowest frequencies turn
            # little over 16 positions), so both sides see mostly rounding noise there and
            # Adam turns noise into +-lr steps of arbitrary sign. Its first gradient is
            # compared above; after the steps, compare the query/value biases exactly and
            # bound the key bias by the largest possible Adam move.
            rot = 0
            kh = H // G  # the key's index within its group
            o, r = ours.view(G, kh + 2, D).clone(), ref.view(G, kh + 2, D).clone()
            start = init[name].view(G, kh + 2, D)[:, kh, rot:]
            moved = max((o[:, kh, rot:] - start).abs().max().item(), (r[:, kh, rot:] - start).abs().max().item())
            if moved > 3 * lr * 1.01:
                ok = False
                print(f"MISMATCH key bias moved {moved:.2e} > 3 lr")
            o[:, kh, rot:] = 0
            r[:, kh, rot:] = 0
            ours, ref = o, r
        check(f"weight after 3 AdamW steps {name}", ours, ref)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
