#!/usr/bin/env python3
"""PyTorch peer of mtnlg's MoE train step on the CPU (scripts/bench/moe_bench.sh): the
Llama-family decoder of torch_gpt_step.py with every MLP replaced by routed SwiGLU
experts, as a practitioner writes it (Hugging Face Mixtral's sparse block): a linear
router, softmax top-k renormalised over the chosen k, each expert run on the rows routed
to it (index_select, then index_add_ of the weighted output), Megatron-Core's switch
balancing loss coeff * E / (k T^2) * sum_e P_e c_e and the router z-loss coeff *
mean(logsumexp^2) added to the LM loss per micro batch; AdamW with gradient clipping.

  torch_moe_step.py --layers L --hidden C --heads H --groups G --experts E --topk K
                    --expert-ffn F --seq T --micro-batch B --micro-batches M --vocab V
                    [--aux-coeff A] [--z-coeff Z] [--threads N] [--warmup W] [--iters I]

Prints one JSON line: the median step seconds of the --iters steps after --warmup (wall,
step_s, and this process's CPU seconds, step_cpu_s: on a loaded machine the CPU seconds
move far less), and the share of the step in the dispatch (the rows routed to each
expert gathered, weighted and scattered back, forward and backward) measured by the
autograd profiler over one extra step (dispatch_share).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt_step import Llama, LlamaBlock, causal_attention, make_adamw, rotate_half  # noqa: E402


class MoeMlp(torch.nn.Module):
    def __init__(self, C, E, K, F_, aux_coeff, z_coeff):
        super().__init__()
        self.E, self.K, self.aux_coeff, self.z_coeff = E, K, aux_coeff, z_coeff
        self.router = torch.nn.Linear(C, E, bias=False)
        self.gate = torch.nn.ModuleList(torch.nn.Linear(C, F_, bias=False) for _ in range(E))
        self.up = torch.nn.ModuleList(torch.nn.Linear(C, F_, bias=False) for _ in range(E))
        self.down = torch.nn.ModuleList(torch.nn.Linear(F_, C, bias=False) for _ in range(E))
        self.extra_loss = None

    def forward(self, x):
        B, T, C = x.shape
        h = x.reshape(-1, C)
        N = h.shape[0]
        logits = self.router(h)
        top_logits, idx = logits.topk(self.K, dim=-1)
        w = torch.softmax(top_logits, -1)  # Mixtral: softmax over the chosen k
        p = torch.softmax(logits, -1)
        counts = torch.zeros(self.E).index_add_(0, idx.reshape(-1), torch.ones(N * self.K))
        aux = self.aux_coeff * self.E / (self.K * N * N) * (p.sum(0) * counts).sum()
        z = self.z_coeff * torch.logsumexp(logits, -1).pow(2).mean()
        self.extra_loss = aux + z
        out = torch.zeros_like(h)
        for e in range(self.E):
            with torch.autograd.profiler.record_function("moe_dispatch"):
                tok, slot = (idx == e).nonzero(as_tuple=True)
                if tok.numel() == 0:
                    continue
                xe = h.index_select(0, tok)
                we = w[tok, slot].unsqueeze(1)
            ye = self.down[e](F.silu(self.gate[e](xe)) * self.up[e](xe)) * we
            with torch.autograd.profiler.record_function("moe_dispatch"):
                out = out.index_add(0, tok, ye)
        return out.view(B, T, C)


class MoeLlamaBlock(LlamaBlock):
    def __init__(self, C, H, G, T, E, K, F_, aux_coeff, z_coeff):
        super().__init__(C, H, G, 8, T, False)
        del self.gate, self.up, self.down
        self.moe = MoeMlp(C, E, K, F_, aux_coeff, z_coeff)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.ln1(x)
        q = self.q(h).view(B, T, self.H, self.D).transpose(1, 2)
        k = self.k(h).view(B, T, self.G, self.D).transpose(1, 2)
        v = self.v(h).view(B, T, self.G, self.D).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(self.H // self.G, 1)
        v = v.repeat_interleave(self.H // self.G, 1)
        a = causal_attention(q, k, v, self.mask)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, self.H * self.D))
        return x + self.moe(self.ln2(x))


def build(a):
    model = Llama(a.layers, a.hidden, a.heads, a.groups, 8, a.seq, a.vocab, 10000.0, False)
    model.blocks = torch.nn.ModuleList(
        MoeLlamaBlock(a.hidden, a.heads, a.groups, a.seq, a.experts, a.topk, a.expert_ffn, a.aux_coeff, a.z_coeff)
        for _ in range(a.layers)
    )
    return model


def step(model, opt, batches):
    """One optimizer step over the micro batches (the loss of each divided by their number)."""
    opt.zero_grad(set_to_none=True)
    for idx, tgt in batches:
        loss = model(idx, tgt)
        for b in model.blocks:
            loss = loss + b.moe.extra_loss
        (loss / len(batches)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def dispatch_share(model, opt, batches):
    """The share of one step's time in the dispatch: the moe_dispatch ranges of the forward
    (which rows go to an expert, their gather, their routing weights, the scatter-add of
    the outputs) and the backward nodes of those gathers and scatters, by the autograd
    profiler (which also slows the step it profiles a little; the share is what it shows)."""
    with torch.autograd.profiler.profile() as prof:
        t0 = time.perf_counter()
        step(model, opt, batches)
        total = time.perf_counter() - t0
    names = ("moe_dispatch", "IndexSelectBackward0", "IndexAddBackward0", "IndexBackward0")
    inside = sum(e.cpu_time_total for e in prof.function_events if e.name in names) / 1e6
    return inside / total if total > 0 else float("nan")


def main():
    ap = argparse.ArgumentParser(description="PyTorch MoE train-step peer (JSON line out)")
    for k in ("layers", "hidden", "heads", "groups", "experts", "topk", "expert-ffn", "seq", "micro-batch",
              "micro-batches", "vocab"):
        ap.add_argument(f"--{k}", type=int, required=True)
    ap.add_argument("--aux-coeff", type=float, default=1e-2)
    ap.add_argument("--z-coeff", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = build(a)
    opt, _ = make_adamw(model.parameters(), False)
    batches = [
        (torch.randint(0, a.vocab, (a.micro_batch, a.seq)), torch.randint(0, a.vocab, (a.micro_batch, a.seq)))
        for _ in range(a.micro_batches)
    ]
    times, cpu = [], []
    for i in range(a.warmup + a.iters):
        t0, c0 = time.perf_counter(), time.process_time()
        step(model, opt, batches)
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    print(json.dumps({"torch": torch.__version__, "threads": a.threads, "step_s": statistics.median(times),
                      "step_cpu_s": statistics.median(cpu), "steps_s": times,
                      "dispatch_share": dispatch_share(model, opt, batches)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
