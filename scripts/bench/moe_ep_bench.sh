#!/usr/bin/env bash
# Expert parallelism on the CPU (mpirun): where an MoE step's time goes when the experts
# are split over ranks. A Llama-family MoE (2 layers, hidden 256, 8 SwiGLU experts of width
# 512, top-2, balancing and z losses, sequence 256, micro batch 4, global batch 8 per data
# replica, mock tokens, fp32) trained at ep 1 (one process), ep 2 and ep 4 (ep over the
# data-parallel ranks, the same tokens per rank), and at ep 2 x etp 2. Per layout: the
# median step time, and per rank the share of the step spent moving routed rows (the
# permutations, the routing weights and the all-to-alls: --comm-report moe_dispatch_s)
# and the all-to-all part of it (moe_exchange_s, the wait for the other ranks included),
# rank 0's and the worst rank's. The one-process step against PyTorch is
# scripts/bench/moe_bench.sh.
#   usage: scripts/bench/moe_ep_bench.sh [BUILD_DIR] [STEPS]
#   env:   THREADS (the one-process run's OpenMP threads; default 2), LAYOUTS (default
#          "1:1:1 2:2:1 4:4:1 4:2:2", np:ep:etp).
# Ranks run one thread each; on a machine with fewer cores than ranks they take turns,
# so the step times there say little about speed-up: the shares say where time goes.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$repo/build}"
steps="${2:-6}"
threads="${THREADS:-2}"
layouts="${LAYOUTS:-1:1:1 2:2:1 4:4:1 4:2:2}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mpirun_sh="$repo/test/support/mpi/mpirun.sh"

run() {
  local np="$1" ep="$2" etp="$3" dir="$tmp/np$1-ep$2-etp$3" th=1
  [ "$np" = 1 ] && th="$threads"
  sh "$mpirun_sh" "$np" "$build/mtnlg" train "$repo/recipes/tiny-mock.yaml" --quiet --comm-report \
    --set model.num_layers=2 --set model.hidden_size=256 --set model.num_attention_heads=4 \
    --set model.num_query_groups=2 --set model.ffn_hidden_size=512 --set model.seq_length=256 \
    --set model.max_position_embeddings=256 --set model.vocab_size=512 --set model.make_vocab_size_divisible_by=8 \
    --set model.position_embedding_type=rope --set model.normalization=RMSNorm --set model.swiglu=true \
    --set model.untie_embeddings_and_output_weights=true --set model.add_bias_linear=false \
    --set model.hidden_dropout=0 --set model.attention_dropout=0 \
    --set model.num_experts=8 --set model.moe_router_topk=2 --set model.moe_ffn_hidden_size=512 \
    --set model.moe_aux_loss_coeff=1e-2 --set model.moe_z_loss_coeff=1e-3 \
    --set parallel.expert_model_parallel_size="$ep" --set parallel.expert_tensor_parallel_size="$etp" \
    --set training.micro_batch_size=4 --set training.global_batch_size="$((8 * np))" \
    --set training.train_iters="$steps" --set training.train_tokens=0 --set training.train_samples=0 \
    --set training.num_threads="$th" --set training.eval_interval=0 \
    --set logging.dir="$dir" --set logging.log_interval=1 --set logging.tensorboard=false \
    --set checkpoint.save= >"$dir.log" 2>&1 || { cat "$dir.log" >&2; exit 1; }
}

for l in $layouts; do
  IFS=: read -r np ep etp <<<"$l"
  run "$np" "$ep" "$etp"
done

/usr/bin/python3 - "$tmp" "$layouts" <<'PY'
import glob, json, os, statistics, sys
tmp, layouts = sys.argv[1], sys.argv[2].split()

def rows(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]

print("| ranks | ep | etp | step s (median) | dispatch / step, rank 0 | worst rank | all-to-all / step, rank 0 | worst rank | ep MB / step, rank 0 |")
print("|---|---|---|---|---|---|---|---|---|")
for l in layouts:
    np_, ep, etp = l.split(":")
    d = os.path.join(tmp, f"np{np_}-ep{ep}-etp{etp}")
    steps = {r["iteration"]: r["step_time_s"] for r in rows(os.path.join(d, "metrics.jsonl")) if "step_time_s" in r}
    later = sorted(i for i in steps if i > 1)  # the first step pays set-up
    step = statistics.median(steps[i] for i in later)
    shares, exch, mb = [], [], 0.0
    for f in sorted(glob.glob(os.path.join(d, "bytes_rank*.jsonl"))):
        rs = [r for r in rows(f) if r["iteration"] in later]
        shares.append(sum(r["moe_dispatch_s"] for r in rs) / sum(steps[r["iteration"]] for r in rs))
        exch.append(sum(r["moe_exchange_s"] for r in rs) / sum(steps[r["iteration"]] for r in rs))
        if f.endswith("bytes_rank0.jsonl"):
            mb = statistics.median(r["ep"] + r["etp"] for r in rs) / 1e6
    print(f"| {np_} | {ep} | {etp} | {step:.3f} | {shares[0]:.1%} | {max(shares):.1%} | {exch[0]:.1%} | {max(exch):.1%} | {mb:.2f} |")
PY
