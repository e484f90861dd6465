#!/usr/bin/env python3
"""Checks what scripts/gpu/proof.sh left in its --out folder: every step reported with a
verdict, the count line, one "ab NAME B/A RATIO" line for each A/B switch of
scripts/bench/gpu_bench.py's SWITCHES, and one archive holding every step's log. Used by the CI test
gpu.proof-dry-run (a GPU-less machine, where every step must be reported as failed) and
usable after a real run.

    python3 scripts/gpu/check_proof.py OUT_DIR [--expect-fail]
"""
import sys
import tarfile
from pathlib import Path

STEPS = ["core", "core-large", "model", "parallel", "memcheck-core", "racecheck-attn", "memcheck-train",
         "train-proof", "nccl-watchdog", "ab", "bench"]
# The A/B switches: the list gpu_bench.py measures (one line each there, one line each here).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from gpu_bench import SWITCHES  # noqa: E402


def main():
    out = Path(sys.argv[1])
    expect_fail = "--expect-fail" in sys.argv[2:]
    summary = (out / "summary.txt").read_text().splitlines()
    problems = []
    verdicts = {}
    for line in summary:
        parts = line.split()
        if len(parts) >= 3 and parts[0] in STEPS and parts[1] in ("PASS", "FAIL") and parts[2] == "rc":
            verdicts[parts[0]] = parts[1]
    for s in STEPS:
        if s not in verdicts:
            problems.append(f"step {s} has no verdict line")
        elif expect_fail and verdicts[s] != "FAIL":
            problems.append(f"step {s} says {verdicts[s]} on a machine without a GPU")
    # Every switch has its line: "ab NAME B/A RATIO | ..." (RATIO a number, or n/a without a GPU).
    for name, (a, *_), (b, *_) in SWITCHES:
        lines = [l.split() for l in summary if l.startswith(f"ab {name} ")]
        if not lines:
            problems.append(f"no A/B line for the switch {name}")
        elif lines[0][2] != f"{b}/{a}" or not (lines[0][3] == "n/a" or lines[0][3].replace(".", "", 1).isdigit()):
            problems.append(f"A/B line for {name} is not 'ab {name} {b}/{a} RATIO': {' '.join(lines[0])!r}")
        elif expect_fail and lines[0][3] != "n/a":
            problems.append(f"A/B switch {name} has a ratio on a machine without a GPU")
    failed = sum(v == "FAIL" for v in verdicts.values())
    if f"{failed} of {len(STEPS)} steps failed" not in "\n".join(summary):
        problems.append(f"no line '{failed} of {len(STEPS)} steps failed'")
    archive = out / "logs.tar.xz"
    if not archive.exists():
        problems.append("no logs.tar.xz")
    else:
        names = set(Path(n).name for n in tarfile.open(archive).getnames())
        problems += [f"logs.tar.xz lacks {s}.log" for s in STEPS if f"{s}.log" not in names]
    for p in problems:
        print("check_proof:", p)
    print("check_proof:", "ok" if not problems else f"{len(problems)} problem(s)",
          f"({len(verdicts)} steps reported, {failed} failed)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
