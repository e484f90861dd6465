#!/usr/bin/env python3
"""Measure the GEMM-efficiency curve and the fused-attention rates of one GPU for the planner.

Writes a JSON file (format "mtnlg-gpu-bench/1") that `mtnlg plan --calibrate FILE` turns into a
GPU profile (docs/PLANNER.md "GEMM curve and attention rates", docs/GPU.md):

    python3 scripts/bench/gpu_gemm_attn.py --out h100-bench.json            # on the GPU machine
    build/mtnlg plan --calibrate h100-bench.json --gpu h100-80g --profile-out h100.json
    build/mtnlg plan RECIPE --gpu-profile h100.json --software megatron-core

What it measures (bf16, CUDA events, median of --reps after --warmup runs):
  gemm       C[M,N] = A[M,K] B[K,N] (torch.matmul) over square sizes 512..16384, the linear layers
             of GPT shapes (hidden 2048..18432, tensor parallel 1..8, 4096 and 16384 tokens: QKV,
             projection, fc1, fc2 and their data- and weight-gradient shapes) and skinny shapes;
  attention  torch.nn.functional.scaled_dot_product_attention, causal, forward and forward+backward,
             head dim 64/128, sequence 512..16384, with the cuDNN backend when this torch has it
             (what Transformer Engine calls), else FlashAttention; the backend is recorded.
Seconds only: the planner's fit derives the rates (the attention FLOPs it counts are the causal
half, 4 s^2 d heads / 2 forward and 2.5x that backward).

Needs torch with CUDA. Nothing here is run by the test suite.
"""
import argparse
import json
import math
import statistics
import sys
import time


def timed(fn, warmup, reps):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def gemm_shapes(quick):
    shapes = set()
    for n in ([1024, 4096, 8192] if quick else [512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384]):
        shapes.add((n, n, n))
    hiddens = [2048, 8192] if quick else [2048, 4096, 6144, 8192, 12288, 18432]
    for h in hiddens:
        for t in ([1, 8] if quick else [1, 2, 4, 8]):
            for T in ([4096] if quick else [4096, 16384]):
                f = 4 * h
                for (m, n, k) in [(T, 3 * h // t, h), (T, h, h // t), (T, f // t, h), (T, h, f // t)]:
                    shapes.add((m, n, k))  # forward
                    shapes.add((m, k, n))  # data gradient
                    shapes.add((k, n, m))  # weight gradient (K = tokens)
    for k in ([1024, 8192] if quick else [256, 1024, 4096, 16384]):  # skinny
        for n in ([128, 1024] if quick else [64, 128, 256, 512, 1024]):
            shapes.add((4096, n, k))
    return sorted(shapes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="a few shapes only (a smoke test of the script)")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_gemm_attn.py: no CUDA device")
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    result = {
        "format": "mtnlg-gpu-bench/1",
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "dtype": "bf16",
        "gemm": [],
        "attention": [],
    }
    t0 = time.time()
    for (m, n, k) in gemm_shapes(args.quick):
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        s = timed(lambda: torch.matmul(a, b), args.warmup, args.reps)
        result["gemm"].append({"m": m, "n": n, "k": k, "batch": 1, "seconds": s})
        print(f"gemm {m:6d} x {n:6d} x {k:6d}: {2 * m * n * k / s / 1e12:7.1f} TFLOP/s", flush=True)
        del a, b

    import torch.nn.functional as F

    backend = "default"
    ctx = None
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for name, be in (("cudnn", getattr(SDPBackend, "CUDNN_ATTENTION", None)), ("flash", SDPBackend.FLASH_ATTENTION)):
            if be is None:
                continue
            try:
                q = torch.randn(1, 8, 512, 128, device=dev, dtype=torch.bfloat16)
                with sdpa_kernel([be]):
                    F.scaled_dot_product_attention(q, q, q, is_causal=True)
                backend, ctx = name, (lambda be=be: sdpa_kernel([be]))
                break
            except Exception:  # this backend is not available on this build / GPU
                continue
    except ImportError:
        pass
    result["attention_backend"] = backend
    tokens = 16384
    for d in [64, 128]:
        for s in ([1024, 4096] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]):
            heads = 2048 // d
            batch = max(1, tokens // s)
            q = torch.randn(batch, heads, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn_like(q, requires_grad=True)
            v = torch.randn_like(q, requires_grad=True)
            g = torch.randn_like(q)

            def fwd():
                if ctx is None:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
                with ctx():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fwd_bwd():
                o = fwd()
                o.backward(g)

            with torch.no_grad():
                tf = timed(fwd, args.warmup, args.reps)
            tfb = timed(fwd_bwd, args.warmup, args.reps)
            tb = max(tfb - tf, 1e-9)
            work = 4.0 * s * s * d * heads * batch / 2  # causal half
            result["attention"].append(
                {"batch": batch, "heads": heads, "seq": s, "head_dim": d, "causal": True, "fwd_seconds": tf, "bwd_seconds": tb}
            )
            print(
                f"attention d{d} s{s:6d} b{batch:3d} h{heads}: fwd {work / tf / 1e12:6.1f}, bwd {2.5 * work / tb / 1e12:6.1f} TFLOP/s ({backend})",
                flush=True,
            )
            del q, k, v, g
    result["elapsed_s"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out} ({len(result['gemm'])} GEMMs, {len(result['attention'])} attention shapes)")


if __name__ == "__main__":
    main()
