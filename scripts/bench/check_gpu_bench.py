#!/usr/bin/env python3
"""Checks the output of scripts/bench/gpu_bench.sh --tiny --cpu (the ctest bench.gpu-bench-tiny):
every model row has every system; mtnlg (both backends) and PyTorch eager have numeric
tokens/s and MFUs, the mtnlg rows a numeric ratio to PyTorch (the MoE row runs mtnlg flash
only: its unfused systems say n/a); torch.compile is numeric or
says why not (n/a); llm.c says "not run"; the attention table has one row per model with
numbers ("fwd+bwd (fwd)" ms) for mtnlg's two forms and PyTorch. No timing thresholds.
  usage: check_gpu_bench.py OUTPUT.txt    (exit 0 and "gpu_bench table: ok" when it holds)
         check_gpu_bench.py --ab OUTPUT.txt   (gpu_bench.sh --ab: a line "ab NAME B/A RATIO | ..."
                                              with a number for every switch of gpu_bench.SWITCHES; on
                                              the CPU a GPU_ONLY switch's line says it was not run)"""
import re
import sys

MODELS = ["GPT-2 124M", "Llama 3 8B x4 layers", "GPT-2 350M", "GPT-2 1.5B", "GPT 1.3B", "Llama 3 8B x2 layers, 32K",
          "Mixtral 8x7B x2 layers"]
MOE = {"Mixtral 8x7B x2 layers"}
SYSTEMS = ["mtnlg unfused", "mtnlg unfused (GELU kernel)", "mtnlg flash", "PyTorch eager", "torch.compile", "llm.c"]
NUM = re.compile(r"^[\d,]+(\.\d+)?%?$")
PAIR = re.compile(r"^\d+\.\d+ \(\d+\.\d+\)$")  # "fwd+bwd (fwd)" milliseconds


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def verdict(what, errors):
    """Prints each problem and the one line the ctest matches; the exit status."""
    for e in errors:
        print("FAIL", e)
    print(f"{what}: ok" if not errors else f"{what}: {len(errors)} problem(s)")
    return 1 if errors else 0


def check_ab(path):
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_bench import GPU_ONLY, SWITCHES

    lines = open(path).read().splitlines()
    errors = []
    for name, (a, *_), (b, *_) in SWITCHES:
        got = [l.split() for l in lines if l.startswith(f"ab {name} ")]
        if not got:
            errors.append(f"no line for the switch {name}")
        elif name in GPU_ONLY and got[0][3] == "n/a" and "not run on the CPU" in " ".join(got[0]):
            continue  # --cpu: a switch of the GPU's own says so
        elif got[0][2] != f"{b}/{a}" or not NUM.match(got[0][3]):
            errors.append(f"switch {name}: expected 'ab {name} {b}/{a} RATIO', got {' '.join(got[0])!r}")
    return verdict("gpu_bench ab", errors)


def main():
    if sys.argv[1] == "--ab":
        return check_ab(sys.argv[2])
    text = open(sys.argv[1]).read()
    errors = []
    rows = {}
    att = []
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("| model") or line.startswith("| shape"):
            continue
        c = cells(line)
        if len(c) == 9:
            rows[(c[0], c[2])] = c
        elif len(c) == 6:
            att.append(c)
    for m in MODELS:
        for s in SYSTEMS:
            c = rows.get((m, s))
            if c is None:
                errors.append(f"missing row: {m} / {s}")
                continue
            tok, mfu72, mfu6n, vs_t = c[3], c[4], c[5], c[6]
            if m in MOE and s.startswith("mtnlg unfused"):
                if not tok.startswith("n/a"):
                    errors.append(f"{m} / {s}: the MoE row runs mtnlg flash only, expected n/a: {tok!r}")
                continue
            if s.startswith("mtnlg") or s == "PyTorch eager":
                for what, v in (("tokens/s", tok), ("MFU72", mfu72), ("MFU6N", mfu6n)):
                    if not NUM.match(v):
                        errors.append(f"{m} / {s}: {what} is not a number: {v!r}")
                if s.startswith("mtnlg") and not NUM.match(vs_t):
                    errors.append(f"{m} / {s}: ratio to PyTorch is not a number: {vs_t!r}")
            elif s == "torch.compile":
                if not (NUM.match(tok) or tok.startswith("n/a")):
                    errors.append(f"{m} / {s}: neither a number nor n/a: {tok!r}")
            elif not tok.startswith("not run"):
                errors.append(f"{m} / llm.c: expected 'not run' without LLMC_BIN: {tok!r}")
    if len(att) != len(MODELS):
        errors.append(f"attention table: {len(att)} rows, expected {len(MODELS)}")
    for c in att:
        for what, v in (("mtnlg unfused", c[1]), ("mtnlg flash", c[2]), ("PyTorch", c[3]), ("ratio", c[5])):
            if not (NUM.match(v) or (what != "ratio" and PAIR.match(v))):
                errors.append(f"attention {c[0]}: {what} is not a number: {v!r}")
    return verdict("gpu_bench table", errors)


if __name__ == "__main__":
    sys.exit(main())
