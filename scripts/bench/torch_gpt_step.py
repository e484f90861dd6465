#!/usr/bin/env python3
"""PyTorch peer of mtnlg's train step: the same GPT (pre-LN, learned positions, tanh GELU,
tied output layer), or the same Llama-family model (--family llama), and AdamW with
gradient clipping, timing whole optimizer steps.

  torch_gpt_step.py LAYERS HIDDEN HEADS SEQ BATCH VOCAB STEPS THREADS
      scripts/bench/train_step_bench.sh's CPU reference: fp32, the attention written out
      (Debian's torch 1.13 has no fused SDPA), default AdamW. Prints one line
      `torch step_s <median seconds>` (the first step excluded).

  torch_gpt_step.py --attention "B,T,H,D;..." [--device cuda|cpu] [--bf16] [--warmup N] [--iters N]
      causal attention alone (forward, forward + backward) on mtnlg's packed qkv layout:
      FlashAttention through scaled_dot_product_attention on CUDA; one JSON line a shape.

  torch_gpt_step.py --layers L --hidden C --heads H --seq T --batch B --vocab V
                    [--family gpt|llama [--groups G] [--ffn F] [--rope-base B]
                     [--experts E --topk K [--aux-coeff A] [--z-coeff Z]]]
                    [--device cuda|cpu] [--bf16] [--sdpa] [--fused-adamw] [--compile]
                    [--warmup N] [--iters N] [--threads N]
      scripts/bench/gpu_bench.sh's peer, as a practitioner writes it: the vocabulary padded to
      a multiple of 64 (--vocab, as mtnlg pads it; an odd 50257-wide output layer leaves its
      GEMMs unaligned) with tokens drawn below --valid-vocab. --bf16 is autocast over fp32 weights (mtnlg's bf16
      also keeps fp32 master weights), --sdpa scaled_dot_product_attention(is_causal=True),
      --fused-adamw AdamW(fused=True), --compile torch.compile of the model. Prints one JSON
      line: median step seconds of the --iters steps after --warmup, tokens/s, the parameter
      count, the first step's seconds apart (first_step_s: under --compile, the compilation;
      also said on stderr as soon as it is done), the whole warm-up's, and what actually ran (a feature this torch lacks falls back, and says so).
      --family llama: Hugging Face Llama's layer (RMSNorm, rotate-half RoPE, grouped-query
      attention with --groups key/value heads repeated to the query heads, SwiGLU of --ffn,
      no biases) and an untied output layer; also the CPU peer of train_step_bench.sh MODEL=llama.
      --experts E --topk K: every MLP E routed SwiGLU experts of --ffn, K per token (Mixtral's
      layer: torch_moe_step.py's MoeLlama, Hugging Face Mixtral's sparse block), the switch
      balancing loss times --aux-coeff and the router z-loss times --z-coeff added to the loss.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def causal_attention(q, k, v, mask):
    """q, k, v [B, H, T, D]; mask None: scaled_dot_product_attention, else the explicit
    form with mask [>=T, >=T] True above the diagonal."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(mask[:T, :T], float("-inf")), -1) @ v


class Block(torch.nn.Module):
    def __init__(self, C, H, T, sdpa):
        super().__init__()
        self.H, self.sdpa = H, sdpa
        self.ln1, self.ln2 = torch.nn.LayerNorm(C), torch.nn.LayerNorm(C)
        self.qkv, self.proj = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)
        self.fc1, self.fc2 = torch.nn.Linear(C, 4 * C), torch.nn.Linear(4 * C, C)
        if not sdpa:
            self.register_buffer("mask", ~torch.ones(T, T, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, self.H, 3, C // self.H).unbind(3)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        a = causal_attention(q, k, v, None if self.sdpa else self.mask)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    def __init__(self, L, C, H, T, V, sdpa=False):
        super().__init__()
        self.V = V
        self.wte, self.wpe = torch.nn.Embedding(V, C), torch.nn.Embedding(T, C)
        self.blocks = torch.nn.ModuleList(Block(C, H, T, sdpa) for _ in range(L))
        self.lnf = torch.nn.LayerNorm(C)

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.T
        # As a plain training loop writes it: under autocast the loss's log-softmax runs in
        # fp32 by itself; an explicit .float() would add a B x T x V fp32 copy and its gradient.
        return F.cross_entropy(logits.view(-1, self.V), tgt.view(-1))


class RMSNorm(torch.nn.Module):
    """x * rsqrt(mean(x^2) + eps) * w (torch < 2.4 has no torch.nn.RMSNorm)."""

    def __init__(self, C, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, torch.nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


class LlamaBlock(torch.nn.Module):
    """Hugging Face Llama's decoder layer as a practitioner writes it: RMSNorm, q/k/v without
    biases (G key/value heads, each shared by H/G query heads), rotate-half RoPE, SwiGLU."""

    def __init__(self, C, H, G, F_, T, sdpa):
        super().__init__()
        self.H, self.G, self.D, self.sdpa = H, G, C // H, sdpa
        self.ln1, self.ln2 = RMSNorm(C), RMSNorm(C)
        self.q = torch.nn.Linear(C, H * self.D, bias=False)
        self.k = torch.nn.Linear(C, G * self.D, bias=False)
        self.v = torch.nn.Linear(C, G * self.D, bias=False)
        self.o = torch.nn.Linear(H * self.D, C, bias=False)
        self.gate, self.up = torch.nn.Linear(C, F_, bias=False), torch.nn.Linear(C, F_, bias=False)
        self.down = torch.nn.Linear(F_, C, bias=False)
        if not sdpa:
            self.register_buffer("mask", ~torch.ones(T, T, dtype=torch.bool).tril(), persistent=False)

    def attend(self, x, cos, sin):
        """x plus the attention of its normed rows (the first residual branch)."""
        B, T, C = x.shape
        h = self.ln1(x)
        q = self.q(h).view(B, T, self.H, self.D).transpose(1, 2)
        k = self.k(h).view(B, T, self.G, self.D).transpose(1, 2)
        v = self.v(h).view(B, T, self.G, self.D).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(self.H // self.G, 1)
        v = v.repeat_interleave(self.H // self.G, 1)
        a = causal_attention(q, k, v, None if self.sdpa else self.mask)
        return x + self.o(a.transpose(1, 2).reshape(B, T, self.H * self.D))

    def forward(self, x, cos, sin):
        x = self.attend(x, cos, sin)
        h = self.ln2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(torch.nn.Module):
    def __init__(self, L, C, H, G, F_, T, V, base, sdpa=False):
        super().__init__()
        self.V = V
        self.wte = torch.nn.Embedding(V, C)
        self.blocks = torch.nn.ModuleList(LlamaBlock(C, H, G, F_, T, sdpa) for _ in range(L))
        self.lnf = RMSNorm(C)
        self.head = torch.nn.Linear(C, V, bias=False)  # untied
        D = C // H
        inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
        ang = torch.cat((ang, ang), -1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def embed(self, idx):
        """The token embeddings and the rotary tables at their length and dtype."""
        T = idx.shape[1]
        x = self.wte(idx)
        return x, self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)

    def lm_loss(self, x, tgt):
        logits = self.head(self.lnf(x))
        return F.cross_entropy(logits.view(-1, self.V), tgt.view(-1))

    def forward(self, idx, tgt):
        x, cos, sin = self.embed(idx)
        for b in self.blocks:
            x = b(x, cos, sin)
        return self.lm_loss(x, tgt)


def make_adamw(params, fused):
    """AdamW as mtnlg's recipes set it; fused when asked and this torch/device has it."""
    kw = dict(lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    if fused:
        try:
            return torch.optim.AdamW(params, fused=True, **kw), "fused"
        except TypeError:  # torch < 2.0
            return torch.optim.AdamW(params, **kw), "default (no fused AdamW in this torch)"
        except (RuntimeError, ValueError):  # no fused kernel for this device
            return torch.optim.AdamW(params, **kw), "default (fused AdamW unsupported on this device)"
    return torch.optim.AdamW(params, **kw), "default"


def run_steps(model, opt, idx, tgt, steps, sync, autocast):
    """Times `steps` optimizer steps (none is allowed); returns each step's seconds and the
    last loss (None without a step)."""
    times, loss = [], None
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
    return times, None if loss is None else float(loss)


def flash_only():
    """A context that restricts scaled_dot_product_attention to FlashAttention, and its name."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return (lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])), "flash SDPA"
    except ImportError:  # torch 2.0-2.2
        ctx = lambda: torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False)  # noqa: E731
        return ctx, "flash SDPA"


def attention_bench(shapes, dev, dtype, warmup, iters):
    """Causal attention alone, forward and forward + backward, on mtnlg's packed layout
    qkv[B, T, H, 3, D] (the gradient flows into qkv, as in the model). One JSON line a shape."""
    import contextlib

    sdpa = hasattr(F, "scaled_dot_product_attention")
    ctx, name = flash_only() if sdpa and dev.type == "cuda" else (contextlib.nullcontext, "SDPA (default backend)")
    if not sdpa:
        name = "explicit (no SDPA in this torch)"
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for B, T, H, D in shapes:
        qkv = (torch.rand(B, T, H, 3, D, device=dev) * 2 - 1).to(dtype).requires_grad_()
        dout = (torch.rand(B, H, T, D, device=dev) * 2 - 1).to(dtype)
        mask = None if sdpa else ~torch.ones(T, T, dtype=torch.bool, device=dev).tril()

        def fwd():
            q, k, v = qkv.unbind(3)
            with ctx():
                return causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)

        def fwd_bwd():
            qkv.grad = None
            fwd().backward(dout)

        res = {}
        for key, fn in (("fwd_ms", fwd), ("fwd_bwd_ms", fwd_bwd)):
            times = []
            for i in range(warmup + iters):
                sync()
                t0 = time.perf_counter()
                if key == "fwd_ms":
                    with torch.no_grad():
                        fn()
                else:
                    fn()
                sync()
                if i >= warmup:
                    times.append((time.perf_counter() - t0) * 1e3)
            res[key] = statistics.median(times)
        print(json.dumps({"backend": name, "B": B, "T": T, "H": H, "D": D, "torch": torch.__version__, **res}), flush=True)


def legacy_main(argv):
    L, C, H, T, B, V, STEPS, THREADS = map(int, argv[:8])
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    m = GPT(L, C, H, T, V)
    opt, _ = make_adamw(m.parameters(), False)
    idx = torch.randint(0, min(V, 50257), (B, T))
    tgt = torch.randint(0, min(V, 50257), (B, T))
    times, _ = run_steps(m, opt, idx, tgt, STEPS, lambda: None, torch.enable_grad)
    print(f"torch step_s {statistics.median(times[1:]):.4f}")


def main():
    ap = argparse.ArgumentParser(description="PyTorch GPT train-step peer (JSON line out)")
    for k in ("layers", "hidden", "heads", "seq", "batch", "vocab"):
        ap.add_argument(f"--{k}", type=int)
    ap.add_argument("--attention", metavar="B,T,H,D[;B,T,H,D...]", help="time causal attention alone at these shapes")
    ap.add_argument("--valid-vocab", type=int, default=0, help="tokens are drawn below this (default: --vocab)")
    ap.add_argument("--family", choices=("gpt", "llama"), default="gpt",
                    help="llama: RMSNorm, rotate-half RoPE, --groups key/value heads, SwiGLU --ffn, untied, no biases")
    ap.add_argument("--groups", type=int, default=0, help="llama: key/value heads (default: --heads)")
    ap.add_argument("--ffn", type=int, default=0, help="llama: width of each of gate and up (default 4h*2/3 rounded down to 64)")
    ap.add_argument("--rope-base", type=float, default=10000.0, help="llama: rotary base")
    ap.add_argument("--experts", type=int, default=0, help="llama: routed SwiGLU experts of --ffn per MLP (0: dense)")
    ap.add_argument("--topk", type=int, default=2, help="llama with --experts: experts per token")
    ap.add_argument("--aux-coeff", type=float, default=1e-2, help="llama with --experts: the balancing loss's coefficient")
    ap.add_argument("--z-coeff", type=float, default=0.0, help="llama with --experts: the router z-loss's (0: none)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--sdpa", action="store_true")
    ap.add_argument("--fused-adamw", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--compile-backend", default="inductor")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    if a.attention:
        shapes = [tuple(int(x) for x in sh.split(",")) for sh in a.attention.split(";")]
        attention_bench(shapes, dev, torch.bfloat16 if a.bf16 else torch.float32, a.warmup, a.iters)
        return 0
    missing = [k for k in ("layers", "hidden", "heads", "seq", "batch", "vocab") if getattr(a, k) is None]
    if missing:
        ap.error("missing --" + ", --".join(missing))
    ran = {"torch": torch.__version__, "device": a.device}
    if a.compile and not hasattr(torch, "compile"):
        print(json.dumps({**ran, "error": f"torch {torch.__version__} has no torch.compile"}))
        return 3
    sdpa = a.sdpa and hasattr(F, "scaled_dot_product_attention")
    ran["attention"] = "sdpa" if sdpa else "explicit" + (" (no SDPA in this torch)" if a.sdpa else "")
    torch.manual_seed(0)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    if a.family == "llama":
        groups = a.groups if a.groups > 0 else a.heads
        ffn = a.ffn if a.ffn > 0 else 4 * a.hidden * 2 // 3 // 64 * 64
        ran["family"] = f"llama (groups {groups}, ffn {ffn}, rope base {a.rope_base:g}, untied, no biases)"
        build = lambda: Llama(a.layers, a.hidden, a.heads, groups, ffn, a.seq, a.vocab, a.rope_base, sdpa)  # noqa: E731
        if a.experts > 0:
            from torch_moe_step import MoeLlama  # it imports this file's classes

            ran["family"] += f", {a.experts} experts top-{a.topk}"
            build = lambda: MoeLlama(a.layers, a.hidden, a.heads, groups, a.seq, a.vocab, a.rope_base, a.experts,  # noqa: E731
                                     a.topk, ffn, a.aux_coeff, a.z_coeff, sdpa)
    else:
        build = lambda: GPT(a.layers, a.hidden, a.heads, a.seq, a.vocab, sdpa)  # noqa: E731
    try:  # initialise on the device (torch >= 2.0): a 1.5B model's CPU initialisation takes a while
        with dev:
            model = build()
    except (AttributeError, TypeError):  # torch.device is no context manager in torch 1.x
        model = build().to(dev)
    opt, ran["adamw"] = make_adamw(model.parameters(), a.fused_adamw)
    step_model = model
    if a.compile:
        step_model = torch.compile(model, backend=a.compile_backend)
        ran["compile"] = a.compile_backend
    if a.bf16:
        autocast = lambda: torch.autocast(device_type=dev.type, dtype=torch.bfloat16)  # noqa: E731
        ran["precision"] = "bf16 autocast, fp32 weights"
    else:
        autocast = torch.enable_grad
        ran["precision"] = "fp32"
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    valid = a.valid_vocab if a.valid_vocab > 0 else a.vocab
    ran["vocab"] = f"{a.vocab} ({valid} used)"
    idx = torch.randint(0, valid, (a.batch, a.seq), device=dev)
    tgt = torch.randint(0, valid, (a.batch, a.seq), device=dev)
    # The first step apart: under --compile it is where torch.compile traces and compiles
    # (forward at the first call, backward at the first backward). Said on stderr at once,
    # so that a caller that stops this run at its time limit knows whether it got past it.
    # Under --compile the first step is always a warm-up step, whatever --warmup says.
    n_first = 1 if a.compile or a.warmup > 0 else 0
    t0 = time.perf_counter()
    run_steps(step_model, opt, idx, tgt, n_first, sync, autocast)
    first_s = time.perf_counter() - t0
    print(f"torch_gpt_step: first step {first_s:.1f} s" + (" (compilation)" if a.compile else ""), file=sys.stderr, flush=True)
    run_steps(step_model, opt, idx, tgt, max(0, a.warmup - n_first), sync, autocast)
    warm_s = time.perf_counter() - t0
    times, loss = run_steps(step_model, opt, idx, tgt, a.iters, sync, autocast)
    step = statistics.median(times)
    out = {
        **ran,
        "step_s": step,
        "tokens_per_s": a.batch * a.seq / step,
        "params": sum(p.numel() for p in model.parameters()),
        "first_step_s": first_s,
        "warmup_s": warm_s,
        "loss": loss,
        "steps_s": times,
    }
    if dev.type == "cuda":
        out["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 9 and not sys.argv[1].startswith("-"):
        legacy_main(sys.argv[1:])
    else:
        sys.exit(main())
