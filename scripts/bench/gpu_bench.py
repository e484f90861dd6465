#!/usr/bin/env python3
"""One table of training speed: mtnlg (each attention backend) against PyTorch eager (SDPA,
fused AdamW), torch.compile and llm.c, plus an attention micro-benchmark. Run through
scripts/bench/gpu_bench.sh, which finds the binaries; see there for the usage.

Every system trains the same GPT (pre-LN, learned positions, tanh GELU, tied output layer,
vocabulary 50257 padded to 50304, no dropout, AdamW with clipping) on random tokens, one
micro batch per step, bf16 with fp32 master weights. The Llama row is Llama 3 8B's layer
(hidden 4096, 32 query heads in 8 key/value groups, SwiGLU ffn 14336, rope base 500000,
RMSNorm, no biases) at 4 layers, sequence 8192, vocabulary 128256, untied output layer
(PyTorch: torch_gpt_step.py --family llama, Hugging Face's form; llm.c trains GPT-2 only);
the long-sequence row is the same layer at 2 layers and sequence 32768, one GPU (the long
context's attention against PyTorch's SDPA; the unfused forms, whose [B, H, T, T]
probabilities would not fit, are not run on it: UNFUSED_MAX_BYTES). The Mixtral row is
Mixtral 8x7B's layer (the Llama layer with 8 groups, rope base 1e6, every MLP 8 SwiGLU
experts of 14336, softmax top-2 renormalised, the switch balancing loss at 1e-2) at 2
layers, sequence 4096, vocabulary 32000 (PyTorch: torch_gpt_step.py --experts, Hugging
Face Mixtral's sparse block); mtnlg runs it with flash attention only and without CUDA
graphs (which it refuses with MoE layers). A row's tokens/s is
batch x sequence / the median step time of --iters steps after --warmup (mtnlg: its
metrics.jsonl; PyTorch: scripts/bench/torch_gpt_step.py; llm.c: its per-step "ms").

MFU, two conventions, both against the same peak (--peak-tflops):
  MFU72  Megatron's model FLOPs, 72 l h^2 (1 + s/(6h) + V/(12 l h)) per token, the one
         mtnlg logs: the attention scores and values are counted dense, s^2 per head, as
         if the causal mask skipped nothing (Megatron's and mtnlg's convention).
  MFU6N  llm.c's, 6 N + 6 l h s per token, N every parameter (tied embedding once, the
         position table included): the attention term is the causal half of the dense one.
  The Llama row's MFU72 is Megatron-Core's count with its GQA and SwiGLU terms (what mtnlg
  logs for the family, model/flops.hpp): 12 l h^2 ((1 + G/H + s/h) + 3F/(2h) + V/(2 l h)).
  The Mixtral row's is the same count with its MoE term, the k experts a token is routed
  to (F = k x the expert width; the router's GEMM is not counted), and its MFU6N counts
  the active parameters (the router, k experts a layer), as mtnlg's do.
"""
import argparse
import json
import os
import re
import signal
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VOCAB, VOCAB_PADDED = 50257, 50304

# The Mixtral row's micro batch: 2 layers of 8 experts are 3.2B parameters, whose fp32 weights,
# gradients and Adam moments (16 bytes each, PyTorch's too) take 51 GB of the 80 before any
# activation. `mtnlg plan` of the row's recipe on one H100 puts batch 2 at 62 GiB and 4 at 67
# (test_gpu_bench_budget.py checks that 2 fits); PyTorch eager keeps more per token (an fp32
# residual stream, each expert's gathered rows, autocast's bf16 copies of the weights), so
# batch 2 leaves it room where 4 would not.
MIXTRAL_BATCH = 2
# name, layers, hidden, heads, sequence, micro batch on an 80 GB GPU, llm.c model descriptor
# (None: llm.c has no such model)
ROWS = [
    ("GPT-2 124M", 12, 768, 12, 1024, 16, "d12"),
    ("Llama 3 8B x4 layers", 4, 4096, 32, 8192, 1, None),
    ("GPT-2 350M", 24, 1024, 16, 1024, 16, "d24"),
    ("GPT-2 1.5B", 48, 1600, 25, 1024, 4, "d48"),
    ("GPT 1.3B", 24, 2048, 16, 2048, 2, "gpt3:c2048"),
    ("Llama 3 8B x2 layers, 32K", 2, 4096, 32, 32768, 1, None),
    # last: a row the budget runs out on is skipped without taking the others' time
    ("Mixtral 8x7B x2 layers", 2, 4096, 32, 4096, MIXTRAL_BATCH, None),
]
# --tiny: the same rows at CPU-test shapes (layers, hidden, heads, sequence, batch); the
# 1.5B row keeps an odd head count, the 1.3B row twice the sequence.
TINY = {
    "GPT-2 124M": (2, 64, 4, 32, 2),
    "Llama 3 8B x4 layers": (2, 64, 4, 32, 2),
    "GPT-2 350M": (2, 96, 4, 32, 2),
    "GPT-2 1.5B": (2, 80, 5, 32, 2),
    "GPT 1.3B": (2, 64, 4, 64, 2),
    "Llama 3 8B x2 layers, 32K": (2, 64, 4, 256, 1),
    "Mixtral 8x7B x2 layers": (2, 64, 4, 32, 2),
}
TINY_VOCAB = 512
# The Llama rows' architecture (the GPT rows have none): key/value groups, the SwiGLU width,
# the rotary base, the real vocabulary (a multiple of 128: mtnlg pads nothing); --tiny puts
# LLAMA_TINY (2 groups, a small ffn and vocabulary) over them.
LLAMA = {"Llama 3 8B x4 layers": {"groups": 8, "ffn": 14336, "rope_base": 500000.0, "vocab": 128256},
         "Llama 3 8B x2 layers, 32K": {"groups": 8, "ffn": 14336, "rope_base": 500000.0, "vocab": 128256},
         # Mixtral: the keys of a Llama row, "ffn" each expert's width, plus the experts (--tiny keeps them)
         "Mixtral 8x7B x2 layers": {"groups": 8, "ffn": 14336, "rope_base": 1e6, "vocab": 32000, "experts": 8, "topk": 2,
                                    "aux_coeff": 1e-2}}
# The unfused attention keeps [B, H, T, T] probabilities (2 bytes each in bf16): a row where
# they alone pass this is not run in that form (nor in the attention micro-benchmark, whose
# binary runs both forms in one process).
UNFUSED_MAX_BYTES = 16 * 2**30


def unfused_bytes(shape):
    L, C, H, T, B = shape[:5]
    return 2 * B * H * T * T
LLAMA_TINY = {"groups": 2, "ffn": 96, "rope_base": 500000.0, "vocab": TINY_VOCAB}
# "mtnlg unfused (GELU kernel)": the same run with cuBLASLt's GELU epilogues off
# (MTNLG_GELU_EPILOGUE=0: the GEMM, then mtnlg's GELU and bias-gradient kernels), the A/B
# that says whether the fusion is worth having on this GPU.
SYSTEMS = ["mtnlg unfused", "mtnlg unfused (GELU kernel)", "mtnlg flash", "PyTorch eager", "torch.compile", "llm.c"]

# The switches measured as A/B pairs on one row (--ab; scripts/gpu/proof.sh runs them on the
# same machine as the rest of the proof and puts each ratio in its summary). A switch is one
# line: its name, then side A and side B, each (label, `--set` overrides of mtnlg train,
# environment); the ratio reported is B's tokens/s over A's. A later switch is one more
# line here; scripts/gpu/check_proof.py reads this list. The rows' mtnlg runs use CUDA graphs
# on a GPU (--cuda-graph on, the default); each switch's sides set what they compare.
SWITCHES = [
    # on CUDA the flash form is cuDNN's fused attention (docs/specs/cudnn-sdpa.md)
    ("attention", ("unfused", ["model.attention_backend=unfused"], {}), ("flash", ["model.attention_backend=flash"], {})),
    # cuBLASLt's GELU epilogues against the GEMM + mtnlg's GELU and bias-gradient kernels (bf16/fp16)
    ("gelu", ("epilogue", [], {}), ("kernel", [], {"MTNLG_GELU_EPILOGUE": "0"})),
    # each micro batch's forward and backward replayed from CUDA graphs against launched op by op
    ("cuda_graph", ("eager", ["training.enable_cuda_graph=false"], {}), ("graphs", ["training.enable_cuda_graph=true"], {})),
    # what bitwise reproducibility costs: cuDNN 9's attention backward (fp32 dQ accumulated by
    # atomic adds) against its deterministic algorithm (dP in a [b, h, s, s] workspace)
    ("determinism",
     ("accumulator", ["model.attention_backend=flash", "training.deterministic_mode=false"], {}),
     ("deterministic", ["model.attention_backend=flash", "training.deterministic_mode=true"], {})),
]
# Switches that exist on a GPU only: on the CPU (--cpu) their line says so instead of a ratio.
GPU_ONLY = {"cuda_graph": "a GPU feature (training.enable_cuda_graph)",
            "determinism": "a GPU feature (cuDNN's attention backward; the CPU's is deterministic either way)"}


def flops72(L, C, T, V, H=1, arch=None):
    """Model FLOPs per token: the 72-form, or for a Llama row Megatron-Core's count with
    grouped-query attention (G key/value heads of C/H) and SwiGLU (3 ffn matrices); an MoE
    row's MLP is the k experts a token goes through (model/flops.cpp's MoE term)."""
    if arch:
        G, F_ = arch["groups"], arch["ffn"] * (arch["topk"] if arch.get("experts") else 1)
        return 12.0 * L * C * C * ((1 + G / H + T / C) + 1.5 * F_ / C + V / (2.0 * L * C))
    return 72.0 * L * C * C * (1 + T / (6.0 * C) + V / (12.0 * L * C))


def params(L, C, T, V, H=1, arch=None, active=False):
    """The parameter count; `active`: an MoE row's that one token uses (the k experts it is
    routed to, not all E; mtnlg prints both)."""
    if arch:  # q, k, v, o without biases, gate, up, down, two RMSNorms; embedding, final norm, untied output
        D, G, F_ = C // H, arch["groups"], arch["ffn"]
        E = arch.get("experts", 0)
        mlp = 3 * C * F_ if not E else E * C + (arch["topk"] if active else E) * 3 * C * F_  # MoE: the router too
        return 2 * V * C + C + L * (C * (H + 2 * G) * D + H * D * C + mlp + 2 * C)
    return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def flops6n(L, C, T, V, H=1, arch=None):
    return 6.0 * params(L, C, T, V, H, arch, active=True) + 6.0 * L * C * T


class Budget:
    """A wall-clock allowance; each run gets what is left (at most per_run). `clock` is
    replaceable for the tests (scripts/bench/test_gpu_bench_budget.py)."""

    def __init__(self, total, per_run, clock=time.time):
        self.clock = clock
        self.end, self.per_run = clock() + total, per_run

    def left(self):
        return min(self.per_run, self.end - self.clock())


class CompileBudget:
    """torch.compile's own time, apart from the other systems' (whose runs cannot eat it):
    its rows run after every other run, smallest model first, and each row may use a fair
    share of what is left of this allowance (what is left / the rows still to run; the
    last row gets all of it), at least `floor` while that much is left, at most per_run.
    Compilation happens in the excluded warm-up
    (torch_gpt_step.py times it apart), so a row's allowance pays for its compilation and
    its timed steps. A row whose share is under `floor` seconds is skipped, saying so,
    instead of being started to time out."""

    def __init__(self, total, per_run, floor=20.0, clock=time.time):
        self.total, self.per_run, self.floor, self.clock = total, per_run, floor, clock
        self.end = None
        self.used = []  # (row, allowance s, seconds used, compile s or None, outcome)

    def start(self, total=None):
        """Begins the column: its clock runs from now, over `total` (default: the allowance)."""
        if total is not None:
            self.total = total
        self.end = self.clock() + self.total

    def left(self):
        return max(0.0, self.end - self.clock())

    def share(self, rows_left):
        """This row's allowance: its fair share, raised to the floor while that much is
        left (a small model's row, which runs first, is not starved by a large share
        count), at most per_run; under the floor only when less than that is left."""
        fair = self.left() / max(1, rows_left)
        return min(self.per_run, max(fair, min(self.floor, self.left())))

    def record(self, row, allowance, seconds, compile_s, outcome):
        self.used.append((row, allowance, seconds, compile_s, outcome))


def compile_order(rows):
    """torch.compile's rows, the cheapest to compile first (compilation grows with the
    layer count, then with the width): what runs out of budget is the largest model."""
    return sorted(rows, key=lambda r: (r[1], r[2]))


def run(cmd, budget, env=None, cwd=None, seconds=None):
    """(returncode or 'timeout' or 'skipped', stdout, stderr). `seconds`: this run's limit
    instead of what `budget` has left. A run that times out keeps what it printed."""
    t = budget.left() if seconds is None else seconds
    if t < 5:
        return "skipped", "", "time budget spent"
    # Its own process group, so that a timeout also ends its children (torch.compile's workers).
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=t)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return "timeout", out, (err or "") + f"\nover {t:.0f} s"


def failure(rc, out, err):
    """One table cell saying why a run has no number (no '|': it goes into a Markdown table)."""
    if rc in ("skipped", "timeout"):
        last = [l for l in err.strip().splitlines() if l.strip()]
        return f"{rc} ({last[-1] if last else ''})".replace("|", "/")
    tail = [l for l in (err + out).strip().splitlines() if l.strip()]
    return f"failed (exit {rc}: {tail[-1][:100] if tail else 'no output'})".replace("|", "/")


def median_of(xs):
    return statistics.median(xs) if xs else None


def llama_keys(arch):
    """The recipe lines that make a row's model a Llama (none for a GPT row), and an MoE
    row's MoE keys."""
    if not arch:
        return ""
    moe = "" if not arch.get("experts") else f"""  num_experts: {arch["experts"]}
  moe_router_topk: {arch["topk"]}
  moe_ffn_hidden_size: {arch["ffn"]}
  moe_router_load_balancing_type: aux_loss
  moe_aux_loss_coeff: {arch["aux_coeff"]:g}
"""
    return moe + f"""  num_query_groups: {arch["groups"]}
  ffn_hidden_size: {arch["ffn"]}
  position_embedding_type: rope
  rotary_base: {arch["rope_base"]:g}
  normalization: RMSNorm
  swiglu: true
  untie_embeddings_and_output_weights: true
  add_bias_linear: false
"""


def is_moe(shape):
    """Whether a row's model has MoE layers (mtnlg refuses CUDA graphs with them)."""
    return bool(shape[6] and shape[6].get("experts"))


def mtnlg_recipe(path, shape, a, backend, run_dir):
    L, C, H, T, B, V, arch = shape
    text = f"""# gpu_bench.py: mtnlg's side of one row, random tokens
model:
{llama_keys(arch)}
  num_layers: {L}
  hidden_size: {C}
  num_attention_heads: {H}
  seq_length: {T}
  max_position_embeddings: {T}
  vocab_size: {V}
  make_vocab_size_divisible_by: {128 if V == VOCAB else 8}
  hidden_dropout: 0.0
  attention_dropout: 0.0
  attention_backend: {backend}
training:
  device: {a.device}
  precision: {a.precision}
  micro_batch_size: {B}
  global_batch_size: {B}
  train_iters: {a.warmup + a.iters}
  num_threads: {a.threads}
  enable_cuda_graph: {"true" if a.device == "cuda" and a.cuda_graph == "on" and not is_moe(shape) else "false"}
optimizer:
  lr: 1.0e-4
  min_lr: 1.0e-5
  weight_decay: 0.1
  adam_beta1: 0.9
  adam_beta2: 0.95
  clip_grad: 1.0
data:
  mock: true
logging:
  dir: {run_dir}
  log_interval: 1
  tensorboard: false
  peak_tflops: {a.peak_tflops}
"""
    path.write_text(text)


def bench_mtnlg(a, shape, backend, out, budget, tag="", env=None, sets=(), name=None):
    # The family in the name: --tiny gives a GPT, a Llama and the Mixtral row one l x h x s.
    family = "-moe" if is_moe(shape) else "-llama" if shape[6] else ""
    run_dir = out / f"{name or 'mtnlg-' + backend}{tag}{family}-{shape[0]}x{shape[1]}x{shape[3]}"
    recipe = run_dir.with_suffix(".yaml")
    # mtnlg appends to a run directory's metrics.jsonl: an earlier run's steps would be read as this one's
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    mtnlg_recipe(recipe, shape, a, backend, run_dir)
    cmd = [a.mtnlg, "train", str(recipe), "--quiet"] + [x for kv in sets for x in ("--set", kv)]
    rc, o, e = run(cmd, budget, env=None if not env else {**os.environ, **env})
    (run_dir.parent / (run_dir.name + ".log")).write_text(o + e)
    if rc != 0:
        return {"error": failure(rc, o, e)}
    if not (run_dir / "metrics.jsonl").exists():
        return {"error": "failed (no metrics.jsonl)"}
    rows = [json.loads(l) for l in open(run_dir / "metrics.jsonl")]
    timed = [r for r in rows if r.get("iteration", 0) > a.warmup and "tokens_per_s" in r]
    if not timed:
        return {"error": "no timed iterations in metrics.jsonl"}
    got = {
        "tokens_per_s": median_of([r["tokens_per_s"] for r in timed]),
        "mfu72_logged": median_of([r["mfu"] for r in timed]),
        "step_s": median_of([r["step_time_s"] for r in timed]),
        "peak_memory_bytes": max(r.get("peak_memory_bytes", 0) for r in timed),
    }
    if "cuda_graph_replays" in rows[-1]:  # training.enable_cuda_graph: whether graphs ran, or why not
        got["cuda_graph_replays"] = rows[-1]["cuda_graph_replays"]
        refused = [l for l in (o + e).splitlines() if "CUDA graphs off" in l]
        if refused:
            got["cuda_graph_refused"] = refused[0].strip()[:200]
    return got


def torch_cmd(a):
    return [a.python, str(HERE / "torch_gpt_step.py"), "--device", a.device] + (["--bf16"] if a.precision == "bf16" else []) + (
        ["--threads", str(a.threads)] if a.threads else []
    )


FIRST_STEP = re.compile(r"^torch_gpt_step: first step ([\d.]+) s", re.M)


def torch_model_args(shape):
    """torch_gpt_step.py's model options for one row."""
    L, C, H, T, B, V, arch = shape
    # The padded vocabulary mtnlg computes with (make_vocab_size_divisible_by), tokens below the real one.
    Vp = VOCAB_PADDED if V == VOCAB else V
    args = [f"--layers={L}", f"--hidden={C}", f"--heads={H}", f"--seq={T}", f"--batch={B}", f"--vocab={Vp}",
            f"--valid-vocab={V}"]
    if arch:
        args += ["--family=llama", f"--groups={arch['groups']}", f"--ffn={arch['ffn']}", f"--rope-base={arch['rope_base']:g}"]
    if is_moe(shape):  # Mixtral's recipe: the balancing loss, no z-loss
        args += [f"--experts={arch['experts']}", f"--topk={arch['topk']}", f"--aux-coeff={arch['aux_coeff']:g}", "--z-coeff=0"]
    return args


def bench_torch(a, shape, compiled, budget, seconds=None):
    """One PyTorch run. `seconds`: its limit (torch.compile's share of its own budget)."""
    cmd = torch_cmd(a) + torch_model_args(shape)
    cmd += ["--sdpa", "--fused-adamw", f"--warmup={a.warmup}", f"--iters={a.iters}"]
    if compiled:
        if not a.torch["compile"]:
            return {"error": f"n/a: torch {a.torch['version']} has no torch.compile"}
        cmd += ["--compile", f"--compile-backend={a.compile_backend}"]
    rc, o, e = run(cmd, budget, seconds=seconds)
    lines = [l for l in o.splitlines() if l.startswith("{")]
    res = json.loads(lines[-1]) if lines else {}
    if rc == 3 and "error" in res:
        return {"error": "n/a: " + res["error"]}
    if rc != 0 or not res:
        v = {"error": failure(rc, o, e)}
        first = FIRST_STEP.search(e)  # the first step (the compilation) ended before the limit
        if compiled and rc == "timeout":
            v["compile_s"] = float(first.group(1)) if first else None
            v["error"] = (f"timeout (own budget {seconds:.0f} s: compiled in {first.group(1)} s, the steps did not finish)" if first
                          else f"timeout (own budget {seconds:.0f} s: still compiling)")
        return v
    notes = [res["attention"], "AdamW " + res["adamw"]]
    v = {"tokens_per_s": res["tokens_per_s"], "step_s": res["step_s"], "peak_memory_bytes": res.get("peak_memory_bytes", 0)}
    if compiled:
        v["compile_s"] = res.get("first_step_s")
        v["warmup_s"] = res.get("warmup_s")
        notes.append(f"compile backend {res.get('compile')}: first step (compilation) {res.get('first_step_s', 0):.1f} s, "
                     f"warm-up {res['warmup_s']:.0f} s, both excluded")
    v["note"] = "; ".join(notes)
    return v


def llmc_tokens(path, n):
    """A token shard in llm.c's format: 256 int32 header (magic 20240520, version 1, count), uint16 tokens."""
    import random
    import struct

    rnd = random.Random(0)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *(rnd.randrange(VOCAB) for _ in range(n))))


def bench_llmc(a, shape, descriptor, out, budget):
    if descriptor is None:
        return {"error": "not run (llm.c trains GPT-2 only)"}
    if not a.llmc:
        return {"error": "not run (set LLMC_BIN to a train_gpt2cu)"}
    if a.tiny:
        return {"error": "not run (--tiny: llm.c has no tiny CPU mode)"}
    L, C, H, T, B, V, _ = shape
    shard = out / f"llmc-tokens-{B}x{T}.bin"
    if not shard.exists():
        llmc_tokens(shard, (a.warmup + a.iters + 4) * B * T + 1)
    steps = a.warmup + a.iters
    cmd = [a.llmc, "-i", str(shard), "-j", str(shard), "-e", descriptor, "-b", str(B), "-t", str(T), "-d", str(B * T),
           "-x", str(steps), "-v", "1000000", "-m", "1", "-s", "0", "-h", "0", "-n", "0", "-y", "0", "-r", "0",
           "-z", "0", "-u", "0", "-l", "1e-4", "-c", "0.1"] + a.llmc_flags.split()
    rc, o, e = run(cmd, budget, cwd=str(out))
    (out / f"llmc-{descriptor.replace(':', '_')}.log").write_text(o + e)
    if rc != 0:
        return {"error": failure(rc, o, e)}
    ms = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"step\s+(\d+)/\d+ \|.*?\|\s*([\d.]+) ms \|", o)}
    timed = [v for k, v in ms.items() if k > a.warmup]
    if not timed:
        return {"error": "no step lines in llm.c's output"}
    step = statistics.median(timed) / 1e3
    return {"tokens_per_s": B * T / step, "step_s": step, "note": f"-e {descriptor} -r 0"}


def run_ab(a, shapes, out):
    """--ab: every switch of SWITCHES on the first selected row, mtnlg only (no torch needed).
    Rounds alternate the order (A B, then B A, ...) and go over all the switches before the
    next round, so that drift on the machine cancels and a budget that runs out still
    leaves each switch a round. One line per switch, "ab NAME B/A RATIO | ...", and
    results-ab.json; the exit status is the number of switches without a ratio (a GPU_ONLY
    switch on the CPU is not run and not counted)."""
    budget = Budget(a.budget, a.per_run)
    name = next(iter(shapes))
    shape = shapes[name]
    got = {sw[0]: {sw[1][0]: [], sw[2][0]: []} for sw in SWITCHES}
    errs = {sw[0]: {} for sw in SWITCHES}
    for r in range(a.ab_rounds):
        for sw_name, side_a, side_b in SWITCHES:
            if a.device != "cuda" and sw_name in GPU_ONLY:
                continue
            for label, sets, env in ((side_a, side_b) if r % 2 == 0 else (side_b, side_a)):
                v = bench_mtnlg(a, shape, "unfused", out, budget, f"-r{r + 1}", env, sets, f"ab-{sw_name}-{label}")
                if "tokens_per_s" in v:
                    got[sw_name][label].append(v["tokens_per_s"])
                else:
                    errs[sw_name][label] = v["error"]
    results, missing = {"row": name, "shape": shape, "rounds": a.ab_rounds, "warmup": a.warmup, "iters": a.iters,
                        "switches": {}}, 0
    L, C, H, T, B, V, _ = shape
    for sw_name, side_a, side_b in SWITCHES:
        la, lb = side_a[0], side_b[0]
        if a.device != "cuda" and sw_name in GPU_ONLY:
            print(f"ab {sw_name:<12} {lb + '/' + la:<18} {'n/a':>6} | not run on the CPU: {GPU_ONLY[sw_name]}", flush=True)
            results["switches"][sw_name] = {"a": la, "b": lb, "ratio": None, "errors": {}, "skipped": GPU_ONLY[sw_name]}
            continue
        ta, tb = median_of(got[sw_name][la]), median_of(got[sw_name][lb])
        ratio = tb / ta if ta and tb else None
        results["switches"][sw_name] = {"a": la, "b": lb, la: got[sw_name][la], lb: got[sw_name][lb], "ratio": ratio,
                                        "errors": errs[sw_name]}
        sides = "; ".join(f"{lab} {fmt(t)} tok/s" if t else f"{lab}: {errs[sw_name].get(lab, 'no run')}"
                          for lab, t in ((la, ta), (lb, tb)))
        rounds = f"{len(got[sw_name][la])}+{len(got[sw_name][lb])} runs"
        print(f"ab {sw_name:<12} {lb + '/' + la:<18} {f'{ratio:.3f}' if ratio else 'n/a':>6} | {sides} "
              f"({name}: {L}x{C}, s {T}, batch {B}; {rounds}, median of {a.iters} steps after {a.warmup}, order alternated)",
              flush=True)
        missing += ratio is None
    (out / "results-ab.json").write_text(json.dumps(results, indent=1))
    return missing


PROBE = """import json, torch
print(json.dumps({"version": torch.__version__, "compile": hasattr(torch, "compile"),
                  "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))"""


def fmt(x, digits=0):
    return "-" if x is None else f"{x:,.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mtnlg", required=True)
    ap.add_argument("--attn-bench", default="", help="mtnlg's attn_bench binary (empty: no mtnlg attention timing)")
    ap.add_argument("--python", default=sys.executable, help="the Python with torch for the PyTorch side")
    ap.add_argument("--llmc", default="", help="a prebuilt llm.c train_gpt2cu (empty: the column says not run)")
    ap.add_argument("--llmc-flags", default="", help="extra train_gpt2cu options")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes, few iterations (the CI smoke test)")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (mtnlg's CPU build, torch on the CPU)")
    ap.add_argument("--rows", default="", help="comma-separated row names to run (default: all)")
    ap.add_argument("--systems", default="", help="comma-separated systems to run (default: all): " + ", ".join(SYSTEMS + ["attention"]))
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--iters", type=int)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: the library default)")
    ap.add_argument("--precision", choices=["bf16", "fp32"])
    ap.add_argument("--cuda-graph", choices=["on", "off"], default="on",
                    help="mtnlg's rows on a GPU with training.enable_cuda_graph (default on; the A/B measures both)")
    ap.add_argument("--peak-tflops", type=float, default=0, help="the MFU peak (default: the GPU's dense bf16 peak)")
    ap.add_argument("--compile-backend", default="")
    ap.add_argument("--budget", type=float, default=540, help="seconds for the whole run; later runs are skipped")
    ap.add_argument("--compile-budget", type=float, default=None,
                    help="seconds of --budget kept for torch.compile's rows (default 40%%); the other runs share the "
                         "rest, and what they leave unused goes to torch.compile too")
    ap.add_argument("--compile-floor", type=float, default=20,
                    help="seconds below which a torch.compile row is skipped rather than started")
    ap.add_argument("--per-run", type=float, default=240, help="seconds at most for one run")
    ap.add_argument("--ab", action="store_true",
                    help="instead of the table: each switch of SWITCHES as an A/B pair on the first --rows row (mtnlg only)")
    ap.add_argument("--ab-rounds", type=int, default=2, help="--ab: runs per side of each switch, the order alternated")
    ap.add_argument("--out", default="gpu-bench-out", help="folder for recipes, run dirs, logs and results.json")
    a = ap.parse_args()
    a.device = "cpu" if a.cpu else "cuda"
    a.warmup = a.warmup if a.warmup is not None else (1 if a.tiny else 3)
    a.iters = a.iters if a.iters is not None else (3 if a.tiny else 10)
    # On the CPU, Debian's torch runs bf16 autocast on a slow path; the smoke test is fp32 on both sides.
    a.precision = a.precision or ("fp32" if a.cpu else "bf16")
    # inductor on the CPU compiles C++ for minutes; the tiny mode only checks the column runs.
    a.compile_backend = a.compile_backend or ("eager" if a.tiny else "inductor")
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    unknown = [x for x in a.rows.split(",") if a.rows and x not in [r[0] for r in ROWS]] + [
        x for x in a.systems.split(",") if a.systems and x not in SYSTEMS + ["attention"]]
    if unknown:
        sys.exit(f"gpu_bench: unknown row or system {unknown}: rows {[r[0] for r in ROWS]}, systems {SYSTEMS + ['attention']}")
    rows = [r for r in ROWS if not a.rows or r[0] in a.rows.split(",")]
    shapes = {}
    for name, L, C, H, T, B, desc in rows:
        if a.tiny:
            L, C, H, T, B = TINY[name]
        arch = ({**LLAMA[name], **LLAMA_TINY} if a.tiny else LLAMA[name]) if name in LLAMA else None
        shapes[name] = (L, C, H, T, B, arch["vocab"] if arch else TINY_VOCAB if a.tiny else VOCAB, arch)
    chosen = a.systems.split(",") if a.systems else SYSTEMS + ["attention"]
    # torch.compile's own budget (CompileBudget): the other runs cannot spend it.
    compile_total = 0.0
    if "torch.compile" in chosen:
        compile_total = min(a.budget, 0.4 * a.budget if a.compile_budget is None else a.compile_budget)
    if a.ab:  # mtnlg alone: no torch; the trainer's own peak on a GPU (its log line's MFU is not used)
        a.peak_tflops = a.peak_tflops if a.peak_tflops > 0 else (1.0 if a.cpu else 0)
        return run_ab(a, shapes, out)
    budget = Budget(a.budget - compile_total, a.per_run)
    compile_budget = CompileBudget(compile_total, a.per_run, a.compile_floor)
    overall_end = time.time() + a.budget

    probe = subprocess.run([a.python, "-c", PROBE], capture_output=True, text=True)
    if probe.returncode != 0:
        sys.exit(f"gpu_bench: {a.python} cannot import torch: {probe.stderr.strip()[-300:]}")
    a.torch = json.loads(probe.stdout)
    device_name, peak_what = "cpu", "--peak-tflops"
    if not a.cpu:
        device_name = a.torch["gpu"] or sys.exit("gpu_bench: torch sees no CUDA device (--cpu for the CPU smoke test)")
    if a.peak_tflops <= 0:
        n = device_name.lower()
        if a.cpu:
            a.peak_tflops, peak_what = 1.0, "nominal: a CPU smoke test, its MFU columns mean nothing"
        elif ("h100" in n or "h200" in n) and "pcie" not in n and "nvl" not in n:
            a.peak_tflops, peak_what = 989.0, "H100/H200 SXM dense bf16 peak, data sheet"
        elif "a100" in n and "pcie" not in n:
            a.peak_tflops, peak_what = 312.0, "A100 SXM dense bf16 peak, data sheet"
        else:
            sys.exit(f"gpu_bench: no known peak for {device_name}: pass --peak-tflops (PEAK_TFLOPS=)")

    t_start = time.time()
    results = {"device": device_name, "torch": a.torch["version"], "peak_tflops": a.peak_tflops, "peak": peak_what, "precision": a.precision,
               "warmup": a.warmup, "iters": a.iters, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": {}, "attention": []}

    # Attention micro-benchmark first: seconds, and the shapes of the rows below.
    att_shapes = ([(s[4], s[3], s[2], s[1] // s[2]) for s in shapes.values() if unfused_bytes(s) <= UNFUSED_MAX_BYTES]
                  if "attention" in chosen else [])
    torch_att = []
    if att_shapes:
        spec = ";".join(",".join(map(str, sh)) for sh in att_shapes)
        rc, o, e = run(torch_cmd(a) + ["--attention", spec, f"--warmup={a.warmup}", f"--iters={max(a.iters, 10)}"], budget)
        torch_att = [json.loads(l) for l in o.splitlines() if l.startswith("{")]
        if rc != 0:
            print(f"gpu_bench: PyTorch attention benchmark: {failure(rc, o, e)}", file=sys.stderr)
    for i, (B, T, H, D) in enumerate(att_shapes):
        entry = {"shape": (B, T, H, D), "torch": torch_att[i] if i < len(torch_att) else None, "mtnlg": {}}
        if a.attn_bench:
            dt = "bf16" if a.precision == "bf16" and not a.cpu else "f32"  # the CPU op is f32 only
            env = dict(os.environ, OMP_NUM_THREADS=str(a.threads)) if a.threads else None
            rc, o2, e2 = run([a.attn_bench, str(B), str(T), str(H), str(D), str(a.warmup), str(max(a.iters, 10)), a.device, dt],
                             budget, env=env)
            for l in o2.splitlines():
                if l.startswith("{"):
                    r = json.loads(l)
                    entry["mtnlg"][r["backend"]] = r
            if rc != 0:
                entry["error"] = failure(rc, o2, e2)
        results["attention"].append(entry)

    runners = {
        "mtnlg unfused": lambda shape, desc: bench_mtnlg(a, shape, "unfused", out, budget),
        "mtnlg unfused (GELU kernel)": lambda shape, desc: bench_mtnlg(a, shape, "unfused", out, budget, "-gelukernel",
                                                                      {"MTNLG_GELU_EPILOGUE": "0"}),
        "mtnlg flash": lambda shape, desc: bench_mtnlg(a, shape, "flash", out, budget),
        "PyTorch eager": lambda shape, desc: bench_torch(a, shape, False, budget),
        "llm.c": lambda shape, desc: bench_llmc(a, shape, desc, out, budget),
    }
    others = ["mtnlg unfused", "mtnlg unfused (GELU kernel)", "mtnlg flash", "PyTorch eager", "llm.c"]

    def row_entry(name):
        L, C, H, T, B, V, arch = shapes[name]
        Vp = VOCAB_PADDED if V == VOCAB else V
        shape = {"layers": L, "hidden": C, "heads": H, "seq": T, "batch": B, "vocab": Vp}
        if arch:
            shape["llama"] = {k: arch[k] for k in ("groups", "ffn", "rope_base", "experts", "topk") if k in arch}
        return results["rows"].setdefault(name, {"shape": shape, "systems": {}})

    def put(name, k, v):
        L, C, H, T, B, V, arch = shapes[name]
        Vp = VOCAB_PADDED if V == VOCAB else V
        if "tokens_per_s" in v:
            v["mfu72"] = v["tokens_per_s"] * flops72(L, C, T, Vp, H, arch) / (a.peak_tflops * 1e12)
            v["mfu6n"] = v["tokens_per_s"] * flops6n(L, C, T, Vp, H, arch) / (a.peak_tflops * 1e12)
        row_entry(name)["systems"][k] = v

    for name, *_rest, desc in rows:
        row_entry(name)
        for k in others:
            if k.startswith("mtnlg unfused") and unfused_bytes(shapes[name]) > UNFUSED_MAX_BYTES:
                put(name, k, {"error": f"n/a: [B, H, T, T] probabilities of {unfused_bytes(shapes[name]) / 2**30:.0f} GiB"})
                continue
            if k.startswith("mtnlg unfused") and is_moe(shapes[name]):  # the MoE row's time goes to one mtnlg form
                put(name, k, {"error": "n/a: the MoE row runs mtnlg flash only"})
                continue
            put(name, k, runners[k](shapes[name], desc) if k in chosen else {"error": "not selected (--systems)"})
        print(f"gpu_bench: {name}: {', '.join(others)} done ({time.time() - t_start:.0f} s)", file=sys.stderr, flush=True)

    # torch.compile last, on its own budget (CompileBudget): what the other runs left of
    # the whole budget, at least --compile-budget; smallest model first, each row a fair
    # share of what is left. Rerun the column alone with --systems torch.compile.
    compile_rows = compile_order([(name, *shapes[name]) for name, *_ in rows])
    compile_budget.start(max(compile_total, overall_end - time.time()) if "torch.compile" in chosen else 0.0)
    for i, (name, *shape) in enumerate(compile_rows):
        if "torch.compile" not in chosen:
            put(name, "torch.compile", {"error": "not selected (--systems)"})
            continue
        if not a.torch["compile"]:
            put(name, "torch.compile", {"error": f"n/a: torch {a.torch['version']} has no torch.compile"})
            continue
        share, t0 = compile_budget.share(len(compile_rows) - i), time.time()
        if share < compile_budget.floor:
            v = {"error": f"skipped (torch.compile's own budget: {compile_budget.left():.0f} s left of "
                          f"{compile_budget.total:.0f} s, under the {compile_budget.floor:.0f} s a row needs at least)"}
        else:
            v = bench_torch(a, tuple(shape), True, budget, seconds=share)
        outcome = "timed" if "tokens_per_s" in v else v["error"].split(" ")[0]
        compile_budget.record(name, share, time.time() - t0, v.get("compile_s"), outcome)
        put(name, "torch.compile", v)
        print(f"gpu_bench: {name}: torch.compile {outcome} ({share:.0f} s allowed, {time.time() - t0:.0f} s used; "
              f"{time.time() - t_start:.0f} s)", file=sys.stderr, flush=True)
    results["compile_budget"] = {"reserved_s": compile_total, "total_s": compile_budget.total,
                                 "rows": [{"row": r, "allowed_s": al, "used_s": u, "compile_s": c, "outcome": o}
                                          for r, al, u, c, o in compile_budget.used]}

    results["elapsed_s"] = time.time() - t_start
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print_tables(results, a)


def print_tables(res, a):
    print(f"gpu_bench {res['date']} | {res['device']} | torch {res['torch']} | {res['precision']} | median of {res['iters']} steps after "
          f"{res['warmup']} warm-up | peak {res['peak_tflops']:g} TFLOP/s ({res['peak']})")
    print("MFU72: 72*l*h^2*(1+s/(6h)+V/(12*l*h)) per token, attention counted dense (no causal halving; Megatron's and "
          "mtnlg's log line; the Llama rows: Megatron-Core's count with GQA and SwiGLU, as mtnlg logs it; the Mixtral row: "
          "the same with the k routed experts' MLP). MFU6N: llm.c's 6*N + 6*l*h*s per token (the causal half; "
          "N the active parameters of an MoE row).")
    print("ratios: this row's tokens/s over the best PyTorch row (eager, compile) and over llm.c's.")
    print()
    print("| model | shape (l, h, heads, s, batch) | system | tokens/s | MFU72 | MFU6N | vs PyTorch | vs llm.c | note |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    for name, row in res["rows"].items():
        s = row["shape"]
        shape = f"{s['layers']}, {s['hidden']}, {s['heads']}, {s['seq']}, {s['batch']}"
        if "llama" in s:
            ll = s["llama"]
            mlp = f"{ll['experts']} SwiGLU experts of {ll['ffn']} top-{ll['topk']}" if "experts" in ll else f"SwiGLU {ll['ffn']}"
            shape += f"; {ll['groups']} kv groups, {mlp}, vocab {s['vocab']}"
        sy = row["systems"]
        torch_best = max((sy[k].get("tokens_per_s") or 0 for k in ("PyTorch eager", "torch.compile")), default=0) or None
        llmc = sy["llm.c"].get("tokens_per_s")
        for k in SYSTEMS:
            v = sy[k]
            if "tokens_per_s" not in v:
                print(f"| {name} | {shape} | {k} | {v['error']} | - | - | - | - | |")
                continue
            vs_t = vs_l = "-"
            if k.startswith("mtnlg"):
                vs_t = f"{v['tokens_per_s'] / torch_best:.2f}" if torch_best else "n/a"
                vs_l = f"{v['tokens_per_s'] / llmc:.2f}" if llmc else "n/a"
            note = [v["note"]] if v.get("note") else []
            if "mfu72_logged" in v:
                note.insert(0, f"logged MFU {100 * v['mfu72_logged']:.2f}%")
            if v.get("peak_memory_bytes") and a.device == "cuda":
                note.append(f"peak {v['peak_memory_bytes'] / 2**30:.1f} GiB")
            if "cuda_graph_replays" in v:
                note.append(f"CUDA graphs: {v['cuda_graph_replays']} launches"
                            + (f" ({v['cuda_graph_refused']})" if v.get("cuda_graph_refused") else ""))
            note = "; ".join(note)
            print(f"| {name} | {shape} | {k} | {fmt(v['tokens_per_s'])} | {100 * v['mfu72']:.2f}% | {100 * v['mfu6n']:.2f}% | "
                  f"{vs_t} | {vs_l} | {note} |")
    cb = res.get("compile_budget")
    if cb and cb["rows"]:
        print()
        used = "; ".join(f"{r['row']}: {r['allowed_s']:.0f} s allowed, {r['used_s']:.0f} s used"
                         + (f" (compilation {r['compile_s']:.1f} s)" if r.get("compile_s") else "")
                         + ("" if r["outcome"] == "timed" else f", {r['outcome']}") for r in cb["rows"])
        print(f"torch.compile: its own budget, {cb['total_s']:.0f} s ({cb['reserved_s']:.0f} s reserved by --compile-budget, "
              f"the rest left by the other runs), smallest model first, each row a fair share of what was left; "
              f"compilation is in the excluded warm-up. {used}.")
    print()
    print("Attention alone, causal, the gradient into the packed qkv: forward + backward ms (forward ms), medians;")
    print("the ratio is mtnlg's faster form over PyTorch, forward + backward.")
    print()
    print("| shape (B, T, heads, head dim) | mtnlg unfused | mtnlg flash | PyTorch | PyTorch kernel | mtnlg best / PyTorch |")
    print("|---|---:|---:|---:|---|---:|")
    miss = "not run (no attn_bench binary)" if not a.attn_bench else "failed"

    def both(r):
        return f"{r['fwd_bwd_ms']:.3f} ({r['fwd_ms']:.3f})" if r else None

    for e in res["attention"]:
        t, m = e["torch"], e["mtnlg"]
        fb = [m[k]["fwd_bwd_ms"] for k in ("unfused", "flash") if k in m]
        ratio = f"{min(fb) / t['fwd_bwd_ms']:.2f}" if fb and t else "n/a"
        print(f"| {', '.join(map(str, e['shape']))} | {both(m.get('unfused')) or e.get('error', miss)} | "
              f"{both(m.get('flash')) or e.get('error', miss)} | {both(t) or 'failed'} | {t['backend'] if t else '-'} | {ratio} |")
    print()
    print(f"gpu_bench: {res['elapsed_s']:.0f} s; recipes, logs and results.json in {Path(a.out).resolve()}")


if __name__ == "__main__":
    sys.exit(main())
