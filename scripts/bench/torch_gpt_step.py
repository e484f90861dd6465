#!/usr/bin/env python3
"""PyTorch CPU reference for the train-step benchmark: the same GPT (pre-LN, learned
positions, tanh GELU, tied output layer) and AdamW, timing one optimizer step.
usage: torch_gpt_step.py LAYERS HIDDEN HEADS SEQ BATCH VOCAB STEPS THREADS
Prints one line: `torch step_s <median seconds>`."""
import math, statistics, sys, time
import torch

L, C, H, T, B, V, STEPS, THREADS = map(int, sys.argv[1:9])
torch.set_num_threads(THREADS)
torch.manual_seed(0)
MASK = ~torch.ones(T, T, dtype=torch.bool).tril()


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(C), torch.nn.LayerNorm(C)
        self.qkv, self.proj = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)
        self.fc1, self.fc2 = torch.nn.Linear(C, 4 * C), torch.nn.Linear(4 * C, C)

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).view(B, T, H, 3, C // H).unbind(3)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(C // H)  # Debian's torch 1.13 has no fused SDPA
        a = torch.softmax(s.masked_fill(MASK, float("-inf")), -1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(V, C), torch.nn.Embedding(T, C)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(L))
        self.lnf = torch.nn.LayerNorm(C)

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.T
        return torch.nn.functional.cross_entropy(logits.view(-1, V), tgt.view(-1))


m = GPT()
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
idx = torch.randint(0, 50257, (B, T))
tgt = torch.randint(0, 50257, (B, T))
times = []
for s in range(STEPS):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = m(idx, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    times.append(time.perf_counter() - t0)
print(f"torch step_s {statistics.median(times[1:]):.4f}")
