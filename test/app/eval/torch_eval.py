#!/usr/bin/env python3
"""Outside oracle for `mtnlg eval` scoring (run by test/app/test_eval_oracle.cpp).

DIR holds model.safetensors (the tiny GPT's weights, mtnlg parameter names) and
requests.json: per document its task, gold index and, per choice, the context and
continuation token ids before windowing plus mtnlg's log-likelihood and is_greedy.
This script windows each request the harness way ((ctx+cont)[-(L+1):][:-1], score the
last len(cont) positions), runs the GPT in PyTorch (written from the model's
definition: pre-LN blocks, per-head [q|k|v], tanh GELU, tied head, padded vocabulary
excluded from the softmax), and checks |ll - ours| <= 1e-4, identical is_greedy, and
identical per-task accuracy (argmax of the lls; ties to the lowest index).
Exit 0 and print PASS when everything matches.
"""
import json, math, struct, sys
import numpy as np
import torch


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        b, en = e["data_offsets"]
        arr = np.frombuffer(data[8 + n + b:8 + n + en], dtype=np.float32).reshape(e["shape"])
        out[name] = torch.from_numpy(arr.copy()).double()
    return out, meta


def main(d):
    P, meta = read_safetensors(f"{d}/model.safetensors")
    L, C, H, V = (int(meta[k]) for k in ("layers", "hidden", "heads", "vocab"))
    eps = float(meta["eps"])
    D = C // H
    spec = json.load(open(f"{d}/requests.json"))
    max_len = spec["max_length"]

    def gelu(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    def logits_of(tokens):
        T = len(tokens)
        t = torch.tensor(tokens, dtype=torch.long)
        x = P["embedding.word_embeddings.weight"][t] + P["embedding.position_embeddings.weight"][:T]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        ln = torch.nn.functional.layer_norm
        for l in range(L):
            p = lambda n: P[f"layers.{l}.{n}"]
            h = ln(x, (C,), p("input_layernorm.weight"), p("input_layernorm.bias"), eps)
            qkv = (h @ p("attention.qkv.weight").T + p("attention.qkv.bias")).view(T, H, 3, D)
            q, k, v = (qkv[:, :, i].transpose(0, 1) for i in range(3))
            s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
            s = s.masked_fill(~mask, float("-inf"))
            a = (torch.softmax(s, -1) @ v).transpose(0, 1).reshape(T, C)
            x = x + a @ p("attention.proj.weight").T + p("attention.proj.bias")
            h = ln(x, (C,), p("post_attention_layernorm.weight"), p("post_attention_layernorm.bias"), eps)
            x = x + gelu(h @ p("mlp.fc1.weight").T + p("mlp.fc1.bias")) @ p("mlp.fc2.weight").T + p("mlp.fc2.bias")
        x = ln(x, (C,), P["final_layernorm.weight"], P["final_layernorm.bias"], eps)
        return (x @ P["embedding.word_embeddings.weight"].T)[:, :V]  # real vocabulary only

    ok = True
    worst = 0.0
    n_req = 0
    correct = {}
    for doc in spec["docs"]:
        lls = []
        for r in doc["requests"]:
            ctx, cont = r["context"], r["continuation"]
            assert 1 <= len(cont) <= max_len
            inp = (ctx + cont)[-(max_len + 1):][:-1]
            lp = torch.log_softmax(logits_of(inp), -1)[len(inp) - len(cont):]
            tgt = torch.tensor(cont)
            ll = lp[torch.arange(len(cont)), tgt].sum().item()
            greedy = bool((lp.argmax(-1) == tgt).all())
            err = abs(ll - r["ll"])
            worst = max(worst, err)
            n_req += 1
            if err > 1e-4 or greedy != r["is_greedy"]:
                ok = False
                print(f"MISMATCH {doc['task']} doc {doc['doc_id']}: ll {ll:.6f} vs ours {r['ll']:.6f}, "
                      f"greedy {greedy} vs {r['is_greedy']}")
            lls.append(ll)
        task = doc["task"]
        if doc["kind"] == "lambada":
            hit = 1.0 if greedy else 0.0
        else:
            hit = 1.0 if int(np.argmax(np.array(lls))) == doc["gold"] else 0.0
        correct.setdefault(task, []).append(hit)
    for task, hits in correct.items():
        acc = sum(hits) / len(hits)
        ours = spec["acc"][task]
        flag = "ok" if acc == ours else "MISMATCH"
        if acc != ours:
            ok = False
        print(f"{flag:8s} {task:15s} acc torch {acc:.6f} ours {ours:.6f}")
    print(f"{n_req} requests, worst |ll diff| {worst:.2e}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
