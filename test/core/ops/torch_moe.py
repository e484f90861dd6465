#!/usr/bin/env python3
"""Outside oracle for mtnlg's MoE ops (run by test/core/ops/test_moe_torch_oracle.cpp).

Reads each DIR/moe-*.safetensors (one case: the block's weights and input, mtnlg's loss,
routing and gradients, the case's form in the metadata; parsed by hand: 8-byte header length, JSON header, raw little-endian data),
rebuilds one MoE MLP block in PyTorch (float64, autograd) from Megatron-Core's formulas,
not from mtnlg's code:

  router     logits = x W^T; z-loss = coeff * mean(logsumexp(logits)^2)
  top-k      softmax: top-k of the logits, softmax over those k; pre-softmax: top-k of
             softmax(logits); sigmoid: top-k of sigmoid(logits) + expert_bias, weights the
             chosen sigmoids / (their sum + 1e-20); then x scaling factor. Group-limited:
             each group scored by the sum of its top (k / group_topk), the group_topk best
             kept, the others masked to -inf before the top-k.
  aux loss   switch load balancing: coeff * E / (k T^2) * sum_e (sum_t p_te) c_e with p the
             softmax (or normalised sigmoid) over all experts and c the counts of its own
             top-k; seq_aux_loss: Megatron-Core's [S, B*E] reshape, T = S, divided by B.
  experts    per expert: act(x W1^T) * prob, then W2 (SwiGLU [gate; up] or tanh GELU),
             scattered back with index_add.
  shared     act(x Ws1^T) Ws2^T * sigmoid(x wg^T).

loss = sum(out * R) + aux + z. Metric: per tensor ||ours - torch|| / ||torch|| <= 1e-5 and
the same expert choices; loss, aux and z relative 1e-5. Prints each case's worst numbers
and "PASS: N cases" when every case matches (exit 0), else FAIL (exit 1).
"""
import glob, json, struct, sys
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
    for name, e in header.items():
        b, en = e["data_offsets"]
        arr = np.frombuffer(data[8 + n + b:8 + n + en], dtype=DT[e["dtype"]]).reshape(e["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out, meta


def topk_(scores, k, num_groups, group_topk):
    """torch.topk, or Megatron-Core's group_limited_topk."""
    if not group_topk:
        return torch.topk(scores, k=k, dim=-1)
    t, e = scores.shape
    group_scores = scores.view(t, num_groups, -1).topk(k // group_topk, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=group_topk, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(t, num_groups, e // num_groups).reshape(t, -1)
    return torch.topk(scores.masked_fill(~score_mask.bool(), float("-inf")), k=k, dim=-1)


def sinkhorn(cost, tol=0.0001):
    """Megatron-Core's sinkhorn (moe_utils.py), in the logits' dtype."""
    cost = torch.exp(cost)
    d0 = torch.ones(cost.size(0), dtype=cost.dtype)
    d1 = torch.ones(cost.size(1), dtype=cost.dtype)
    eps = 0.00000001
    error = 1e9
    d1_old = d1
    while error > tol:
        d0 = (1 / d0.size(0)) * 1 / (torch.sum(d1 * cost, 1) + eps)
        d1 = (1 / d1.size(0)) * 1 / (torch.sum(d0.unsqueeze(1) * cost, 0) + eps)
        error = torch.mean(torch.abs(d1_old - d1))
        d1_old = d1
    return d1 * cost * d0.unsqueeze(1)


def route(logits, bias, m):
    k, ng, gk = int(m["topk"]), int(m["num_groups"]), int(m["group_topk"])
    if m.get("sinkhorn") == "1":  # Megatron-Core's sinkhorn_load_balancing in training
        with torch.no_grad():
            _, idx = torch.topk(sinkhorn(logits.detach()), k=k, dim=1)
        act = torch.sigmoid(logits) if k == 1 else torch.softmax(logits, dim=-1)
        return torch.gather(act, 1, idx), idx
    if m["score"] == "softmax":
        if m["pre_softmax"] == "1":
            probs, idx = topk_(torch.softmax(logits, dim=-1), k, ng, gk)
        else:
            sel, idx = topk_(logits, k, ng, gk)
            probs = torch.softmax(sel, dim=-1)
    else:
        scores = torch.sigmoid(logits)
        if m["expert_bias"] == "1":
            _, idx = topk_(scores + bias, k, ng, gk)
            sel = torch.gather(scores, 1, idx)
        else:
            sel, idx = topk_(scores, k, ng, gk)
        probs = sel / (sel.sum(dim=-1, keepdim=True) + 1e-20) if k > 1 else sel
    sf = float(m["scaling_factor"])
    return (probs * sf if sf else probs), idx


def switch_loss(probs, tokens_per_expert, total_tokens, k, num_experts, coeff):
    return torch.sum(probs.sum(dim=0) * tokens_per_expert) * (num_experts * coeff / (k * total_tokens * total_tokens))


def aux_loss(logits, m):
    k, coeff = int(m["topk"]), float(m["aux_coeff"])
    t, e = logits.shape
    if m["score"] == "softmax":
        scores = torch.softmax(logits, dim=-1)
    else:
        s = torch.sigmoid(logits)
        scores = s / (s.sum(dim=-1, keepdim=True) + 1e-20)
    _, top = torch.topk(scores, k=k, dim=1)
    routing_map = torch.zeros_like(logits).scatter(1, top, 1)
    if m["seq_aux"] != "1":
        return switch_loss(scores, routing_map.sum(dim=0), t, k, e, coeff)
    b, s = int(m["B"]), int(m["S"])
    # Megatron-Core's tokens are [S, B]; mtnlg's rows are (sample, position).
    to_sb = lambda v: v.view(b, s, e).transpose(0, 1).reshape(s, b * e)
    return switch_loss(to_sb(scores), to_sb(routing_map).sum(dim=0), s, k, e, coeff) / b


def act(h, gelu):
    if gelu:
        return torch.nn.functional.gelu(h, approximate="tanh")
    gate, up = h.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def block(w, m):
    x = w["x"]
    logits = x @ w["router.weight"].T
    z = float(m["z_coeff"]) * torch.logsumexp(logits, dim=-1).square().mean()
    probs, idx = route(logits, w["router.expert_bias"], m)
    aux = aux_loss(logits, m) if m.get("sinkhorn") != "1" else torch.zeros((), dtype=logits.dtype)
    gelu = m["gelu"] == "1"
    y = torch.zeros_like(x)
    for e in range(w["w1"].shape[0]):
        tok, slot = torch.nonzero(idx == e, as_tuple=True)
        h = act(x[tok] @ w["w1"][e].T, gelu) * probs[tok, slot].unsqueeze(-1)
        y = y.index_add(0, tok, h @ w["w2"][e].T)
    shared = act(x @ w["shared.w1"].T, gelu) @ w["shared.w2"].T
    out = y + shared * torch.sigmoid(x @ w["shared.gate"].T)
    return (out * w["R"]).sum() + aux + z, aux, z, idx


def check(path):
    t, m = read_safetensors(path)
    print(m["name"])
    names = ["x", "router.weight", "w1", "w2", "shared.w1", "shared.w2", "shared.gate"]
    w = {n: t[n].double().requires_grad_(n in names) for n in names + ["router.expert_bias", "R"]}
    loss, aux, z, idx = block(w, m)
    loss.backward()
    ok = True
    ours = t["losses"].tolist()
    for name, mine, ref in (("loss", ours[0], loss.item()), ("aux", ours[1], aux.item()), ("z", ours[2], z.item())):
        rel = abs(mine - ref) / max(abs(ref), 1e-30)
        print(f"{name:>18}: ours {mine:.10g} torch {ref:.10g} rel {rel:.2e}")
        ok &= rel <= 1e-5
    same = torch.equal(idx.sort(dim=-1)[0].int(), t["idx"].sort(dim=-1)[0].int())
    print(f"{'routing':>18}: {'same experts' if same else 'DIFFERENT experts'}")
    ok &= same
    for n in names:
        g, mine = w[n].grad, t["grad." + n].double()
        rel = (mine - g).norm().item() / max(g.norm().item(), 1e-30)
        print(f"{'d ' + n:>18}: rel {rel:.2e} max abs {(mine - g).abs().max().item():.2e}")
        ok &= rel <= 1e-5
    return ok


def main():
    paths = sorted(glob.glob(sys.argv[1] + "/moe-*.safetensors"))
    ok = bool(paths)
    for p in paths:
        ok &= check(p)
    print(f"PASS: {len(paths)} cases" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
