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

With meta "moe" = 1, the layers of the bit mask "moe_layers" have a routed-experts MLP
written from Megatron-Core's formulas (router logits x W_r^T; top-k of the logits then a
softmax over those k, the top-k of the full softmax, or the top-k of sigmoid + expert bias
with the chosen sigmoids renormalised; the scaling factor; an expert capacity keeping each
expert's highest weights; each expert fc2(act(fc1(x))) weighted by its routing weight;
a shared expert with its sigmoid gate), the switch balancing loss (per micro batch or per
sequence) and the router z-loss, each averaged over the micro batches (Megatron-Core's
per-micro-batch scaling), and after each optimizer step the expert bias moves by rate x
sign(mean count - count). Computed in float64 (the routing compared exactly).

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
    moe = int(cfg.get("moe", 0)) == 1
    buffers = {k: init.pop(k).double() for k in list(init) if k.endswith("router.expert_bias")}
    ftype = torch.float64 if moe else torch.float32
    params = {k: v.clone().to(ftype).requires_grad_(True) for k, v in init.items()}
    micro = int(cfg.get("micro_batches", 1))
    step_counts = {}  # per MoE layer: tokens per expert (after drops) over the step
    global_counts = {}  # global_aux_loss: per MoE layer, [balancing counts so far, micro batches]

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

    def act_fn(pre):
        if llama:
            g, u = pre.chunk(2, -1)
            return torch.nn.functional.silu(g) * u
        return gelu(pre)

    def route(x, n):
        """x [N, C] -> (routing weights [N, k], experts [N, k], kept [N, k], balancing loss, z-loss)."""
        E, k = int(cfg["experts"]), int(cfg["topk"])
        logits = x @ params[n + "mlp.router.weight"].T
        N = logits.shape[0]
        z = cfg["z_coeff"] * (torch.logsumexp(logits, -1) ** 2).mean()
        if int(cfg["sigmoid"]):
            s = torch.sigmoid(logits)
            bias = buffers.get(n + "mlp.router.expert_bias", torch.zeros(E, dtype=torch.float64))
            idx = torch.topk(s.detach() + bias, k, -1).indices
            w = s.gather(1, idx)
            if k > 1:
                w = w / (w.sum(-1, keepdim=True) + 1e-20)
            scores = s / (s.sum(-1, keepdim=True) + 1e-20)
        else:
            if int(cfg["pre_softmax"]):
                w, idx = torch.topk(torch.softmax(logits, -1), k, -1)
            else:
                top, idx = torch.topk(logits, k, -1)
                w = torch.softmax(top, -1)
            scores = torch.softmax(logits, -1)
        if cfg["scaling"] > 0:
            w = w * cfg["scaling"]
        keep = torch.ones(N, k, dtype=torch.bool)
        if cfg["capacity"] > 0:
            cap = math.ceil(N * k / E * cfg["capacity"])
            for e in range(E):
                slots = [(n_, j) for n_ in range(N) for j in range(k) if idx[n_, j] == e]
                slots.sort(key=lambda t: (-w[t].item(), t[0]))
                for t in slots[cap:]:
                    keep[t] = False
        # the balancing loss: its own top-k of the scores (no bias, no drops)
        groups = N // T if int(cfg["seq_aux"]) else 1
        aux = torch.zeros((), dtype=torch.float64)
        if cfg["aux_coeff"] > 0:
            sel = torch.topk(scores.detach(), k, -1).indices
            if int(cfg.get("global_aux", 0)):  # the running average of the step's micro batches' counts
                run = global_counts.setdefault(n, [torch.zeros(E, dtype=torch.float64), 0])
                run[0] = run[0] + torch.zeros(E, dtype=torch.float64).index_add_(
                    0, sel.reshape(-1), torch.ones(sel.numel(), dtype=torch.float64))
                run[1] += 1
                aux = cfg["aux_coeff"] * E / (k * N * N) * (scores.sum(0) * (run[0] / run[1])).sum()
                groups = 0
            for g in range(groups):
                r = slice(g * N // groups, (g + 1) * N // groups)
                cnt = torch.zeros(E, dtype=torch.float64).index_add_(
                    0, sel[r].reshape(-1), torch.ones(sel[r].numel(), dtype=torch.float64))
                Tg = N // groups
                aux = aux + cfg["aux_coeff"] * E / (k * Tg * Tg) * (scores[r].sum(0) * cnt).sum() / groups
        return w, idx, keep, aux, z

    def moe_mlp(h, n):
        """h [B, T, C] of one micro batch -> (MLP output, balancing loss, z-loss)."""
        x = h.reshape(-1, C)
        w, idx, keep, aux, z = route(x, n)
        E = int(cfg["experts"])
        cnt = step_counts.setdefault(n, torch.zeros(E, dtype=torch.float64))
        y = torch.zeros_like(x)
        for e in range(E):
            coef = ((idx == e) & keep).to(x.dtype) * w
            cnt[e] += ((idx == e) & keep).sum().item()
            pe = n + f"mlp.experts.local_experts.{e}."
            y = y + coef.sum(-1, keepdim=True) * (act_fn(x @ params[pe + "linear_fc1.weight"].T) @
                                                   params[pe + "linear_fc2.weight"].T)
        ps = n + "mlp.shared_experts."
        if ps + "linear_fc1.weight" in params:
            sh = act_fn(x @ params[ps + "linear_fc1.weight"].T) @ params[ps + "linear_fc2.weight"].T
            if ps + "gate_weight" in params:
                sh = sh * torch.sigmoid(x @ params[ps + "gate_weight"].T)
            y = y + sh
        return y.view(h.shape), aux, z

    def loss_fn():
        """The step's loss: the LM loss over the whole batch plus each micro batch's MoE
        losses / micro batches; also the balancing and z losses over their coefficients,
        summed over the MoE layers and averaged over the micro batches."""
        per = tokens.shape[0] // micro
        global_counts.clear()
        total = torch.zeros((), dtype=torch.float64)
        aux_log = z_log = 0.0
        for m in range(micro):
            lm, aux, z = forward(tokens[m * per:(m + 1) * per])
            total = total + lm * per / tokens.shape[0] + (aux + z) / micro
            aux_log += aux.item() / max(cfg.get("aux_coeff", 0), 1e-300) / micro
            z_log += z.item() / max(cfg.get("z_coeff", 0), 1e-300) / micro
        return total, aux_log, z_log

    def forward(toks):
        inp, tgt = toks[:, :-1], toks[:, 1:]
        B = inp.shape[0]
        aux_sum = torch.zeros((), dtype=torch.float64)
        z_sum = torch.zeros((), dtype=torch.float64)
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
            if moe and (int(cfg["moe_layers"]) >> l) & 1:
                y, aux, z = moe_mlp(h, n)
                x = x + y
                aux_sum, z_sum = aux_sum + aux, z_sum + z
                continue
            if llama:
                act = torch.nn.functional.silu(linear(h, n + "mlp.fc1_gate")) * linear(h, n + "mlp.fc1_up")
            else:
                act = gelu(linear(h, n + "mlp.fc1"))
            x = x + linear(act, n + "mlp.fc2")
        x = norm(x, "final_layernorm")
        out_w = params.get("output_layer.weight", wte)
        logits = x @ out_w.T
        logits = logits[..., :V]  # padded vocabulary never counts
        return torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1)), aux_sum, z_sum

    ok = True
    ok_counts = []

    def rel(a, b):
        return (a - b).norm().item() / max(b.norm().item(), 1e-30)

    def check(what, ours, ref, tol=1e-5):
        nonlocal ok
        e = rel(ours.double(), ref.double())
        flag = "ok" if e <= tol else "MISMATCH"
        if e > tol:
            ok = False
        print(f"{flag:8s} {what:55s} rel err {e:.2e}")

    step_counts.clear()
    loss, aux_log, z_log = loss_fn()
    loss.backward()
    check("loss", step0["loss"].double(), loss.detach().double().reshape(1))
    if moe:
        if cfg["aux_coeff"] > 0:
            check("balancing loss / coeff", step0["moe_aux"].double(), torch.tensor([aux_log], dtype=torch.float64))
        if cfg["z_coeff"] > 0:
            check("z-loss / coeff", step0["moe_z"].double(), torch.tensor([z_log], dtype=torch.float64))
        for n, c in step_counts.items():
            ours = step0["counts." + n]
            same = torch.equal(ours.double(), c)
            print(f"{'ok' if same else 'MISMATCH':8s} tokens per expert {n}: {c.tolist()}")
            ok_counts.append(same)
    for name, prm in params.items():
        check(f"grad {name}", step0["grad." + name], prm.grad.to(step0["grad." + name].dtype))

    decay = [p for n, p in params.items() if p.dim() > 1]
    no_decay = [p for n, p in params.items() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(b1, b2), eps=adam_eps)
    losses = []
    for it in range(3):
        opt.zero_grad()
        step_counts.clear()
        l, _, _ = loss_fn()
        losses.append(l.item())
        l.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
        opt.step()
        for n, c in step_counts.items():  # aux-loss-free balancing, once per global batch
            if n + "mlp.router.expert_bias" in buffers:
                buffers[n + "mlp.router.expert_bias"] += cfg["bias_rate"] * torch.sign(c.mean() - c)
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
    for name, b in buffers.items():
        check(f"expert bias after 3 updates {name}", after[name], b, tol=1e-6)
        print(f"         {name}: {b.tolist()}")
    ok = ok and all(ok_counts)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
