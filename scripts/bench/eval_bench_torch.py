#!/usr/bin/env python3
"""PyTorch reference for scripts/bench/eval_bench.sh: scores the same request shapes
as an `mtnlg eval` run (read from its --log-samples file: per choice the model-input
length and the number of scored tokens) with a GPT of the given shape and random
weights, sorted longest first and right-padded into batches of the same size, fp32,
log_softmax over the 50257 real ids at the scored positions. Prints requests/s.
Usage: eval_bench_torch.py SAMPLES.jsonl LAYERS HIDDEN HEADS BATCH THREADS"""
import json, math, sys, time
import torch


def main(samples, L, C, H, B, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    shapes = []
    for line in open(samples):
        for n, m in json.loads(line)["window_tokens"]:
            shapes.append((n, m))
    shapes.sort(key=lambda s: -s[0])
    V, Vp, D, F = 50257, 50304, C // H, 4 * C
    g = lambda *s: torch.randn(*s) * 0.02
    wte, wpe = g(Vp, C), g(2048, C)
    layers = [dict(ln1=(torch.ones(C), torch.zeros(C)), qkv=(g(3 * C, C), torch.zeros(3 * C)),
                   proj=(g(C, C), torch.zeros(C)), ln2=(torch.ones(C), torch.zeros(C)),
                   fc1=(g(F, C), torch.zeros(F)), fc2=(g(C, F), torch.zeros(C))) for _ in range(L)]
    lin = torch.nn.functional.linear
    ln = torch.nn.functional.layer_norm

    def forward(tok):
        Bn, T = tok.shape
        x = wte[tok] + wpe[:T]
        for p in layers:
            h = ln(x, (C,), *p["ln1"])
            qkv = lin(h, *p["qkv"]).view(Bn, T, H, 3, D)
            q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) \
                if hasattr(torch.nn.functional, "scaled_dot_product_attention") else \
                torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(
                    ~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")), -1) @ v
            x = x + lin(a.transpose(1, 2).reshape(Bn, T, C), *p["proj"])
            h = ln(x, (C,), *p["ln2"])
            x = x + lin(torch.nn.functional.gelu(lin(h, *p["fc1"]), approximate="tanh"), *p["fc2"])
        return ln(x, (C,), torch.ones(C), torch.zeros(C))

    t0 = time.time()
    with torch.no_grad():
        for b in range(0, len(shapes), B):
            batch = shapes[b:b + B]
            T = batch[0][0]
            tok = torch.randint(0, V, (len(batch), T))
            h = forward(tok)
            rows = torch.cat([h[i, n - m:n] for i, (n, m) in enumerate(batch)])
            lp = torch.log_softmax((rows @ wte.T)[:, :V], -1)
            _ = lp.max(-1)
    dt = time.time() - t0
    print(f"torch: {len(shapes)} requests in {dt:.2f} s ({len(shapes) / dt:.2f} requests/s)")


if __name__ == "__main__":
    a = sys.argv
    main(a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]), int(a[6]))
