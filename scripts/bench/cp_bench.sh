#!/usr/bin/env bash
# Context parallelism on the CPU (mpirun): a small GPT at sequence 8192 (2 layers, hidden
# 64, 4 heads of 16, vocabulary 256, mock tokens, micro batch 1, global batch 2, fp32)
# trained at cp 1, 2 and 4 (p2p ring; CP_COMM=a2a|all_gather for another), and the same
# model's step in PyTorch (Debian's python3-torch, the attention written out, one process)
# in the same run. Per cp: the median step time, each rank's peak of activation bytes (the
# allocator's accounting: every tensor the forward allocates, --memory-report) and of saved
# activations, and each rank's own attention work per step (its thread's CPU seconds inside
# the cp attention less those blocked in the exchange, --comm-report) with the spread
# between the busiest and the idlest rank: the load-balanced split promises equal work.
#   usage: scripts/bench/cp_bench.sh [BUILD_DIR] [STEPS]
#   env:   SEQ (default 8192), CP_COMM (default p2p), THREADS (OpenMP threads of the cp1 run
#          and of PyTorch; default 2: the machine's cores), PEER=0 skips PyTorch.
# cp ranks run one thread each; on a machine with fewer cores than ranks they take turns,
# so the step times there say nothing about speed-up: the memory and the balance do.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$repo/build}"
steps="${2:-3}"
seq="${SEQ:-8192}"
comm="${CP_COMM:-p2p}"
threads="${THREADS:-2}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mpirun_sh="$repo/test/support/mpi/mpirun.sh"

run_cp() {
  local cp="$1" dir="$tmp/cp$1" th=1
  [ "$cp" = 1 ] && th="$threads"
  sh "$mpirun_sh" "$cp" "$build/mtnlg" train "$repo/recipes/tiny-mock.yaml" --quiet --memory-report --comm-report \
    --set model.num_layers=2 --set model.hidden_size=64 --set model.num_attention_heads=4 \
    --set model.ffn_hidden_size=256 --set model.seq_length="$seq" --set model.max_position_embeddings="$seq" \
    --set model.vocab_size=256 --set model.make_vocab_size_divisible_by=8 \
    --set model.hidden_dropout=0 --set model.attention_dropout=0 \
    --set training.micro_batch_size=1 --set training.global_batch_size=2 \
    --set training.train_iters="$steps" --set training.train_tokens=0 --set training.train_samples=0 \
    --set training.num_threads="$th" --set training.eval_interval=0 \
    --set parallel.context_parallel_size="$cp" --set parallel.cp_comm_type="$comm" \
    --set logging.dir="$dir" --set logging.log_interval=1 --set logging.tensorboard=false \
    --set checkpoint.save= >"$tmp/cp$cp.log" 2>&1 || { cat "$tmp/cp$cp.log" >&2; exit 1; }
}

for cp in 1 2 4; do run_cp "$cp"; done
peer=""
if [ "${PEER:-1}" != 0 ]; then
  # one micro batch of the global batch's 2 samples: the same tokens a step as mtnlg's
  peer="$(/usr/bin/python3 "$repo/scripts/bench/torch_gpt_step.py" 2 64 4 "$seq" 2 256 "$((steps + 1))" "$threads" |
    awk '/^torch step_s/ {print $3}')"
fi

/usr/bin/python3 - "$tmp" "$steps" "$seq" "$comm" "$peer" <<'EOF'
import glob, json, os, statistics, sys
tmp, steps, seq, comm, peer = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]

def rows(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]

def last(path):
    return rows(path)[-1]

res = {}
for cp in (1, 2, 4):
    d = os.path.join(tmp, f"cp{cp}")
    m = [r for r in rows(os.path.join(d, "metrics.jsonl")) if "grad_norm" in r]
    times = [r["step_time_s"] for r in m[1:]] or [m[0]["step_time_s"]]
    mem = [last(p) for p in sorted(glob.glob(os.path.join(d, "memory_rank*.jsonl")))]
    comm_rows = [rows(p)[1:] or rows(p) for p in sorted(glob.glob(os.path.join(d, "bytes_rank*.jsonl")))]
    own = [statistics.median(r["cp_attention_cpu_s"] - r["cp_wait_cpu_s"] for r in rs) for rs in comm_rows]
    res[cp] = {
        "step": statistics.median(times),
        "act": max(r["activations_peak"] for r in mem),
        "saved": max(r["saved_activations_peak"] for r in mem),
        "own": own,
        "cp_bytes": max(statistics.median(r["cp"] for r in rs) for rs in comm_rows),
        "loss": m[-1]["loss"],
    }
base = res[1]
print(f"context parallelism, GPT 2 x 64 (4 heads), seq {seq}, micro batch 1 x 2, fp32, {comm}; {steps} steps")
print("| cp | step (s) | peak activation bytes / rank | vs cp1 | saved activations / rank | vs cp1 | "
      "attention work / rank (CPU s: min, max) | spread | cp bytes sent / rank | last loss |")
print("|---|---|---|---|---|---|---|---|---|---|")
for cp, r in res.items():
    own = r["own"]
    spread = (max(own) / min(own) - 1) if cp > 1 and min(own) > 0 else 0.0
    work = f"{min(own):.3f}, {max(own):.3f}" if cp > 1 else "-"
    print(f"| {cp} | {r['step']:.3f} | {r['act'] / 2**20:.1f} MiB | {r['act'] / base['act']:.3f} | "
          f"{r['saved'] / 2**20:.1f} MiB | {r['saved'] / base['saved']:.3f} | {work} | "
          f"{100 * spread:.1f}% | {r['cp_bytes'] / 2**20:.1f} MiB | {r['loss']:.6f} |")
if peer:
    t = float(peer)
    print(f"\nPyTorch (one process, the 2 samples as one batch, attention written out): step {t:.3f} s; "
          f"mtnlg cp1 / PyTorch = {base['step'] / t:.2f}")
EOF
