#!/usr/bin/env python3
"""Checks gpu_bench.py's torch.compile budget without a GPU or a torch that compiles (the
ctest bench.gpu-bench-compile-budget):

  1. CompileBudget on a fake clock: fair shares of what is left, the last row gets all of
     it, per_run caps a share, a share under the floor is a skip;
  2. run() keeps what a timed-out run printed (torch_gpt_step.py's "first step" line);
  3. gpu_bench.py end to end with a stand-in Python that answers the torch probe with
     "torch.compile: yes" and plays torch_gpt_step.py (a 1 s "compilation", then steps):
     with enough budget every row gets a torch.compile number, the compilation is reported
     apart and the budget line is printed; with too little, every row says it was skipped
     and why; a stand-in that compiles past its share times out saying it was still
     compiling. About 15 s;
  4. the Llama row at its GPU size (llama_row): its mtnlg recipe, PyTorch options and
     FLOPs; with MTNLG_BIN, `mtnlg plan` of that recipe;
  5. the Mixtral row likewise (mixtral_row): its MoE keys, no CUDA graphs, Mixtral 8x7B's
     total and active parameters, Megatron-Core's MoE FLOPs; `mtnlg plan` with MTNLG_BIN.

    usage: test_gpu_bench_budget.py     (exit 0 and "gpu_bench compile budget: ok")"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gpu_bench  # noqa: E402

FAKE = r'''#!/usr/bin/env python3
# Stands in for a Python with torch 2 on a GPU: the probe, and torch_gpt_step.py's JSON line.
import json, os, sys, time
if sys.argv[1:2] == ["-c"]:
    print(json.dumps({"version": "2.99-fake", "compile": True, "gpu": None}))
    sys.exit(0)
args = dict(x.lstrip("-").split("=", 1) for x in sys.argv[2:] if "=" in x)
compile_s = float(os.environ.get("FAKE_COMPILE_S", "1"))
if "--compile" in sys.argv:
    time.sleep(compile_s)
print(f"torch_gpt_step: first step {compile_s:.1f} s (compilation)", file=sys.stderr, flush=True)
tokens = int(args["batch"]) * int(args["seq"])
print(json.dumps({"attention": "sdpa", "adamw": "fused", "compile": args.get("compile-backend"), "step_s": 0.01,
                  "tokens_per_s": tokens / 0.01, "first_step_s": compile_s, "warmup_s": compile_s + 0.02}))
'''


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def check(cond, what, errors):
    if not cond:
        errors.append(what)


def unit(errors):
    clk = Clock()
    cb = gpu_bench.CompileBudget(100, per_run=240, floor=20, clock=clk)
    cb.start()
    check(abs(cb.share(4) - 25) < 1e-9, f"share of 100 s over 4 rows: {cb.share(4)}", errors)
    clk.t += 10  # the first row used 10 of its 25 s: the rest is shared by the others
    check(abs(cb.share(3) - 30) < 1e-9, f"share of 90 s over 3 rows: {cb.share(3)}", errors)
    clk.t += 30
    check(abs(cb.share(1) - 60) < 1e-9, f"the last row gets all that is left: {cb.share(1)}", errors)
    clk.t += 45
    check(cb.share(1) < cb.floor, f"15 s left is under the floor: {cb.share(1)}", errors)
    cb3 = gpu_bench.CompileBudget(60, per_run=240, floor=20, clock=clk)
    cb3.start()
    check(abs(cb3.share(4) - 20) < 1e-9, f"a fair share under the floor is raised to it: {cb3.share(4)}", errors)
    cb2 = gpu_bench.CompileBudget(1000, per_run=240, clock=clk)
    cb2.start(50)  # start() may widen or narrow the allowance (what the other runs left)
    check(abs(cb2.share(1) - 50) < 1e-9, f"start(50): {cb2.share(1)}", errors)
    cb2.start(900)
    check(abs(cb2.share(1) - 240) < 1e-9, f"per_run caps a share: {cb2.share(1)}", errors)
    rows = [("GPT-2 124M", 12, 768), ("GPT-2 350M", 24, 1024), ("GPT-2 1.5B", 48, 1600), ("GPT 1.3B", 24, 2048)]
    order = [r[0] for r in gpu_bench.compile_order(rows)]
    check(order == ["GPT-2 124M", "GPT-2 350M", "GPT 1.3B", "GPT-2 1.5B"], f"compile order {order}", errors)
    rc, out, err = gpu_bench.run([sys.executable, "-c", "import sys, time; print('torch_gpt_step: first step 0.5 s "
                                  "(compilation)', file=sys.stderr, flush=True); time.sleep(30)"],
                                 gpu_bench.Budget(100, 100), seconds=5)
    check(rc == "timeout" and gpu_bench.FIRST_STEP.search(err), f"run() timeout kept its output: {rc} {err!r}", errors)


def gpu_shape(name):
    """A Llama-family row's shape at its GPU size, as gpu_bench.py's main() builds it."""
    row = next(r for r in gpu_bench.ROWS if r[0] == name)
    arch = gpu_bench.LLAMA[name]
    return (*row[1:6], arch["vocab"], arch)


def llama_row(errors):
    """The Llama row at its GPU size: the recipe gpu_bench.py writes for mtnlg (the family's
    keys, Llama 3 8B's layer), the PyTorch command's model options, the FLOPs per token it
    divides by (test/model/test_flops.cpp's hand count of Llama 3 8B, over 8192 tokens), and,
    with MTNLG_BIN set, `mtnlg plan` of that recipe on one H100: it loads, validates, has the
    parameters of 4 such layers + embedding + untied output, and fits in memory."""
    name = "Llama 3 8B x4 layers"
    shape = gpu_shape(name)
    arch = shape[6]
    recipe_and_plan(name, shape, ("num_query_groups: 8", "ffn_hidden_size: 14336", "position_embedding_type: rope",
                                   "rotary_base: 500000", "normalization: RMSNorm", "swiglu: true",
                                   "untie_embeddings_and_output_weights: true", "add_bias_linear: false", "num_layers: 4",
                                   "hidden_size: 4096", "num_attention_heads: 32", "seq_length: 8192", "vocab_size: 128256",
                                   "enable_cuda_graph: true"), errors)
    targs = gpu_bench.torch_model_args(shape)
    for x in ("--family=llama", "--groups=8", "--ffn=14336", "--rope-base=500000", "--vocab=128256", "--seq=8192"):
        check(x in targs, f"PyTorch's Llama row lacks {x}: {targs}", errors)
    per_token = gpu_bench.flops72(32, 4096, 8192, 128256, 32, arch)
    check(abs(per_token - 474422087516160 / 8192) < 1e-6 * per_token, f"Llama 3 8B FLOPs per token {per_token}", errors)
    check(gpu_bench.params(32, 4096, 8192, 128256, 32, arch) == 8030261248, "Llama 3 8B parameters", errors)


def recipe_and_plan(name, shape, keys, errors):
    """The recipe gpu_bench.py writes for a row on a GPU has `keys`; with MTNLG_BIN, `mtnlg
    plan` of it on one H100 loads it, counts gpu_bench.params(), says it fits, and its model
    FLOPs per token are gpu_bench.flops72()'s."""
    import argparse

    a = argparse.Namespace(device="cuda", precision="bf16", warmup=3, iters=10, threads=0, cuda_graph="on", peak_tflops=0)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "row.yaml"
        gpu_bench.mtnlg_recipe(path, shape, a, "flash", Path(d) / "run")
        text = path.read_text()
        for key in keys:
            check(key in text, f"{name} recipe lacks {key!r}", errors)
        mtnlg = os.environ.get("MTNLG_BIN")
        if not mtnlg:
            return
        p = subprocess.run([mtnlg, "plan", str(path), "--gpus", "1", "--gpu", "h100", "--software", "mtnlg", "--json"],
                           capture_output=True, text=True, timeout=60)
        check(p.returncode == 0, f"mtnlg plan of {name}: exit {p.returncode}: {p.stderr[-300:]}", errors)
        if p.returncode == 0:
            j = json.loads(p.stdout)
            L, C, H, T, B, V, arch = shape
            want = gpu_bench.params(L, C, T, V, H, arch)
            check(j["stages"][0]["params"] == want, f"{name} parameters {j['stages'][0]['params']} != {want}", errors)
            check(j["fits"], f"{name} does not fit one H100: {j.get('peak_memory_gib')} GiB", errors)
            # mtnlg's model FLOPs (model/flops.cpp, what its log line's MFU divides by) per token
            mtnlg_flops = j["model_tflops_per_gpu"] * 1e12 / j["tokens_per_s"]
            ours = gpu_bench.flops72(L, C, T, V, H, arch)
            check(abs(mtnlg_flops - ours) < 1e-9 * ours, f"{name} FLOPs per token: mtnlg {mtnlg_flops}, ours {ours}", errors)


def mixtral_row(errors):
    """The Mixtral row at its GPU size: its recipe's MoE keys and CUDA graphs off, the PyTorch
    options, Mixtral 8x7B's total and active parameters (test/model/test_flops.cpp's counts),
    FLOPs per token that are a dense model's whose SwiGLU is k experts wide (Megatron-Core's
    MoE term), and `mtnlg plan` with MTNLG_BIN."""
    name = "Mixtral 8x7B x2 layers"
    shape = gpu_shape(name)
    arch = shape[6]
    recipe_and_plan(name, shape, ("num_experts: 8", "moe_router_topk: 2", "moe_ffn_hidden_size: 14336",
                                  "moe_aux_loss_coeff: 0.01", "num_query_groups: 8", "rotary_base: 1e+06",
                                  "normalization: RMSNorm", "swiglu: true", "num_layers: 2", "seq_length: 4096",
                                  "vocab_size: 32000", "enable_cuda_graph: false", "attention_backend: flash"), errors)
    targs = gpu_bench.torch_model_args(shape)
    for x in ("--family=llama", "--groups=8", "--ffn=14336", "--rope-base=1e+06", "--vocab=32000", "--seq=4096",
              "--experts=8", "--topk=2", "--aux-coeff=0.01", "--z-coeff=0"):
        check(x in targs, f"PyTorch's Mixtral row lacks {x}: {targs}", errors)
    check(gpu_bench.params(32, 4096, 4096, 32000, 32, arch) == 46702792704, "Mixtral 8x7B parameters", errors)
    check(gpu_bench.params(32, 4096, 4096, 32000, 32, arch, active=True) == 12879925248, "Mixtral 8x7B active", errors)
    dense = {k: arch[k] for k in ("groups", "rope_base", "vocab")} | {"ffn": 2 * 14336}
    got, want = gpu_bench.flops72(2, 4096, 4096, 32000, 32, arch), gpu_bench.flops72(2, 4096, 4096, 32000, 32, dense)
    check(abs(got - want) < 1e-12 * want, f"Mixtral FLOPs per token {got} != the dense form's {want}", errors)


def bench(tmp, fake, extra, env_extra):
    out = tmp / f"out{len(list(tmp.iterdir()))}"
    cmd = [sys.executable, str(HERE / "gpu_bench.py"), "--mtnlg", "/bin/true", "--python", str(fake), "--tiny", "--cpu",
           "--systems", "torch.compile", "--out", str(out)] + extra
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env_extra}, timeout=300)
    res = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    return p, res


def end_to_end(errors):
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        fake = tmp / "fake-python"
        fake.write_text(FAKE)
        fake.chmod(0o755)
        models = [r[0] for r in gpu_bench.ROWS]
        # Enough budget: every row has a number, its compilation reported apart.
        p, res = bench(tmp, fake, ["--budget", "200", "--compile-budget", "120"], {"FAKE_COMPILE_S": "1"})
        check(p.returncode == 0, f"gpu_bench exit {p.returncode}: {p.stderr[-500:]}", errors)
        for m in models:
            v = res.get("rows", {}).get(m, {}).get("systems", {}).get("torch.compile", {})
            check("tokens_per_s" in v and v.get("compile_s") == 1.0, f"{m}: torch.compile {v}", errors)
        check("torch.compile: its own budget" in p.stdout, "no budget line in the output", errors)
        check("first step (compilation) 1.0 s" in p.stdout, "no compilation time in the note", errors)
        # Too little: each row says it was skipped and why, at once.
        p, res = bench(tmp, fake, ["--budget", "15", "--compile-budget", "15"], {"FAKE_COMPILE_S": "1"})
        for m in models:
            e = res.get("rows", {}).get(m, {}).get("systems", {}).get("torch.compile", {}).get("error", "")
            check(e.startswith("skipped (torch.compile's own budget"), f"{m}: expected a skip, got {e!r}", errors)
        check(f"| {models[0]} |" in p.stdout and "skipped (torch.compile's own budget" in p.stdout,
              "the table does not say the rows were skipped", errors)
        # Compiling past the share: a timeout that says it was still compiling (one row, 6 s).
        p, res = bench(tmp, fake, ["--rows", models[0], "--budget", "6", "--compile-budget", "6", "--compile-floor", "5"],
                       {"FAKE_COMPILE_S": "60"})
        e = res.get("rows", {}).get(models[0], {}).get("systems", {}).get("torch.compile", {}).get("error", "")
        check(e.startswith("timeout (own budget 6 s: still compiling)"), f"expected a compile timeout, got {e!r}", errors)


def main():
    errors = []
    unit(errors)
    llama_row(errors)
    mixtral_row(errors)
    end_to_end(errors)
    for e in errors:
        print("FAIL", e)
    print("gpu_bench compile budget: ok" if not errors else f"gpu_bench compile budget: {len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
