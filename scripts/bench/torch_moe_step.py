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

The model (MoeLlama) is also gpu_bench.sh's Mixtral row on the GPU, through
torch_gpt_step.py --family llama --experts E --topk K (bf16 autocast, fused AdamW,
torch.compile, timed as that file times every row).

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
from torch_gpt_step import Llama, LlamaBlock, make_adamw  # noqa: E402


class MoeMlp(torch.nn.Module):
    def __init__(self, C, E, K, F_, aux_coeff, z_coeff):
        super().__init__()
        self.E, self.K, self.aux_coeff, self.z_coeff = E, K, aux_coeff, z_coeff
        self.router = torch.nn.Linear(C, E, bias=False)
        self.gate = torch.nn.ModuleList(torch.nn.Linear(C, F_, bias=False) for _ in range(E))
        self.up = torch.nn.ModuleList(torch.nn.Linear(C, F_, bias=False) for _ in range(E))
        self.down = torch.nn.ModuleList(torch.nn.Linear(F_, C, bias=False) for _ in range(E))

    def forward(self, x):
        """The experts' weighted sum for each row of x, and the router's losses (balancing,
        z) to add to the LM loss."""
        B, T, C = x.shape
        h = x.reshape(-1, C)
        N = h.shape[0]
        logits = self.router(h)
        top_logits, idx = logits.topk(self.K, dim=-1)
        w = torch.softmax(top_logits, -1)  # Mixtral: softmax over the chosen k
        p = torch.softmax(logits, -1)
        # fp32 counts and sums whatever autocast chose for p (bf16 holds integers to 256 only)
        ones = torch.ones(N * self.K, device=p.device)
        counts = torch.zeros(self.E, device=p.device).index_add_(0, idx.reshape(-1), ones)
        extra = self.aux_coeff * self.E / (self.K * N * N) * (p.float().sum(0) * counts).sum()
        if self.z_coeff:  # Mixtral's recipe has none: no logsumexp then
            extra = extra + self.z_coeff * torch.logsumexp(logits.float(), -1).pow(2).mean()
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
                out = out.index_add(0, tok, ye.to(out.dtype))  # autocast's bf16 into the residual's dtype
        return out.view(B, T, C), extra


class MoeLlamaBlock(LlamaBlock):
    """LlamaBlock's attention, then MoeMlp in place of its MLP; returns x and the router's losses."""

    def __init__(self, C, H, G, T, E, K, F_, aux_coeff, z_coeff, sdpa=False):
        super().__init__(C, H, G, 8, T, sdpa)
        del self.gate, self.up, self.down
        self.moe = MoeMlp(C, E, K, F_, aux_coeff, z_coeff)

    def forward(self, x, cos, sin):
        x = self.attend(x, cos, sin)
        y, extra = self.moe(self.ln2(x))
        return x + y, extra


class MoeLlama(Llama):
    """Llama with MoeLlamaBlock layers (Mixtral's form); the loss is the LM loss plus every
    layer's router losses."""

    def __init__(self, L, C, H, G, T, V, base, E, K, F_, aux_coeff, z_coeff, sdpa=False):
        super().__init__(L, C, H, G, 8, T, V, base, sdpa)
        self.blocks = torch.nn.ModuleList(MoeLlamaBlock(C, H, G, T, E, K, F_, aux_coeff, z_coeff, sdpa) for _ in range(L))

    def forward(self, idx, tgt):
        x, cos, sin = self.embed(idx)
        extra = 0.0
        for b in self.blocks:
            x, e = b(x, cos, sin)
            extra = extra + e
        return self.lm_loss(x, tgt) + extra


def build(a):
    return MoeLlama(a.layers, a.hidden, a.heads, a.groups, a.seq, a.vocab, 10000.0, a.experts, a.topk, a.expert_ffn,
                    a.aux_coeff, a.z_coeff)


def step(model, opt, batches):
    """One optimizer step over the micro batches (the loss of each divided by their number)."""
    opt.zero_grad(set_to_none=True)
    for idx, tgt in batches:
        (model(idx, tgt) / len(batches)).backward()
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
