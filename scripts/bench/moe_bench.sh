#!/usr/bin/env bash
# MoE train-step benchmark (CPU, fp32): mtnlg against PyTorch (Debian's python3-torch,
# scripts/bench/torch_moe_step.py: the same Llama-family decoder with routed SwiGLU
# experts, softmax top-2 renormalised, the switch balancing loss and the z-loss, AdamW with
# clipping) in the same run, for two shapes:
#   tiny: recipes/tiny-moe.yaml as it is (4 layers, hidden 128, 8 experts of width 128,
#         top-2, micro batch 4 x 2, sequence 128, vocabulary padded to 50304: the output
#         layer is most of the step);
#   big:  the same with hidden 256, 8 query heads in 4 groups, 16 experts of width 512 and
#         a 4096-token vocabulary: the experts are most of the step.
# Mock tokens on both sides. Each round runs mtnlg (STEPS steps; the median step after the
# first) and the peer (1 warm-up, STEPS-1 timed) one after the other; ROUNDS rounds give
# the spread. Two clocks: wall seconds per step, and CPU seconds per step (the process's
# user + sys; for mtnlg the run's CPU less that of a 1-step run, over the STEPS-1 extra
# steps), which a machine shared with other jobs moves less. The table prints the
# medians, every round and the ratios. The peer runs with the OpenBLAS kernels mtnlg runs
# with (OPENBLAS_CORETYPE = the core `mtnlg --version --verbose` names), so both sides'
# GEMMs are the same code. PROFILE=1 (default) also records one mtnlg run per shape with
# `perf record` and prints the share of its samples in the MoE dispatch
# (ops::moe_dispatch_plan, moe_permute, moe_unpermute, moe_weight_rows_*: the loops that
# are mtnlg's own, not BLAS), over the whole run and scaled to a step (the run's CPU
# seconds over STEPS times the median CPU seconds of a step); the peer's dispatch share is
# its autograd profiler's (gathers, routing weights, scatter-adds, forward and backward).
#   usage: scripts/bench/moe_bench.sh [BUILD_DIR] [STEPS]
#   env:   THREADS (default 1: on a shared machine one thread's CPU seconds are the work,
#          not spinning), ROUNDS (default 3), SHAPES (default "tiny big"), PROFILE (1|0)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$repo/build}"
steps="${2:-6}"
threads="${THREADS:-1}"
rounds="${ROUNDS:-3}"
shapes="${SHAPES:-tiny big}"
profile="${PROFILE:-1}"
py=/usr/bin/python3
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
core="$("$build/mtnlg" --version --verbose 2>&1 | sed -n 's/^CPU matmul: OpenBLAS \([A-Za-z0-9]*\).*/\1/p' | head -1)"
peer_env=()
if [ -n "$core" ]; then peer_env=(env OPENBLAS_CORETYPE="$core"); fi

shape_sets() {  # mtnlg --set flags of a shape
  case "$1" in
    tiny) echo "" ;;
    big)
      echo "--set model.hidden_size=256 --set model.num_attention_heads=8 --set model.num_query_groups=4" \
        "--set model.num_experts=16 --set model.moe_ffn_hidden_size=512 --set model.vocab_size=4096"
      ;;
    *) echo "moe_bench.sh: SHAPES: unknown shape $1 (tiny, big)" >&2; exit 2 ;;
  esac
}
torch_args() {  # the peer's shape
  case "$1" in
    tiny) echo "--layers 4 --hidden 128 --heads 4 --groups 2 --experts 8 --topk 2 --expert-ffn 128 --vocab 50304" ;;
    big) echo "--layers 4 --hidden 256 --heads 8 --groups 4 --experts 16 --topk 2 --expert-ffn 512 --vocab 4096" ;;
  esac
}

mtnlg_run() {  # shape steps dir [prefix...]: runs mtnlg, prints the run's CPU seconds
  local shape="$1" n="$2" dir="$3"
  shift 3
  # shellcheck disable=SC2046
  "$py" -c "
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f'{r.ru_utime + r.ru_stime:.3f}')" "$@" "$build/mtnlg" train "$repo/recipes/tiny-moe.yaml" --quiet \
    --set data.mock=true --set training.train_tokens=0 --set training.train_iters="$n" \
    --set optimizer.lr_warmup_tokens=1024 --set logging.log_interval=1 --set logging.tensorboard=false \
    --set training.num_threads="$threads" --set logging.dir="$dir" --set checkpoint.save="$dir/ckpt" \
    --set checkpoint.save_interval=0 $(shape_sets "$shape")
}
median_step() {  # metrics.jsonl -> median step_time_s after the first step
  "$py" -c "
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if 'step_time_s' in l]
print(f\"{statistics.median(r['step_time_s'] for r in rows[1:]):.4f}\")" "$1"
}

declare -A res
for shape in $shapes; do
  for r in $(seq "$rounds"); do
    one=$(mtnlg_run "$shape" 1 "$tmp/$shape-one-$r")
    all=$(mtnlg_run "$shape" "$steps" "$tmp/$shape-$r")
    res[$shape,m_wall]+="$(median_step "$tmp/$shape-$r/metrics.jsonl") "
    res[$shape,m_cpu]+="$("$py" -c "print(f'{($all - $one) / ($steps - 1):.4f}')") "
    # shellcheck disable=SC2046
    peer=$("${peer_env[@]}" "$py" "$repo/scripts/bench/torch_moe_step.py" $(torch_args "$shape") --seq 128 --micro-batch 4 \
      --micro-batches 2 --threads "$threads" --warmup 1 --iters "$((steps - 1))" 2>/dev/null)
    res[$shape,t_wall]+="$(echo "$peer" | "$py" -c "import json, sys; print(f\"{json.load(sys.stdin)['step_s']:.4f}\")") "
    res[$shape,t_cpu]+="$(echo "$peer" | "$py" -c "import json, sys; print(f\"{json.load(sys.stdin)['step_cpu_s']:.4f}\")") "
    res[$shape,t_disp]="$(echo "$peer" | "$py" -c "import json, sys; print(f\"{json.load(sys.stdin)['dispatch_share']:.3f}\")")"
  done
  res[$shape,m_disp]="-"
  if [ "$profile" = 1 ] && command -v perf >/dev/null; then
    cpu=$(mtnlg_run "$shape" "$steps" "$tmp/$shape-perf" perf record -q -F 499 -o "$tmp/$shape.perf" --)
    perf report -i "$tmp/$shape.perf" --no-children --sort sym --stdio 2>/dev/null >"$tmp/$shape.txt" || true
    res[$shape,m_disp]=$("$py" -c "
import re, statistics, sys
disp = 0.0
for line in open(sys.argv[1]):
    m = re.match(r'\s*([0-9.]+)%\s+\S+\s+(.*)', line)
    if m and re.search(r'ops::(moe_dispatch_plan|moe_permute|moe_unpermute|moe_weight_rows)', m.group(2)):
        disp += float(m.group(1)) / 100
step = statistics.median(float(x) for x in sys.argv[2].split())
print(f'{disp:.3f} of the run, {disp * float(sys.argv[3]) / (int(sys.argv[4]) * step):.3f} of a step')" \
      "$tmp/$shape.txt" "${res[$shape,m_cpu]}" "$cpu" "$steps")
  fi
done

med() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "MoE train step, fp32, $threads thread(s), $steps steps a run, $rounds rounds; PyTorch $("$py" -c 'import torch; print(torch.__version__)'), OpenBLAS core ${core:-(library default)} on both sides"
printf '%-6s %-6s %10s %10s   %s\n' shape side "wall (s)" "CPU (s)" "rounds: wall | CPU"
for shape in $shapes; do
  printf '%-6s %-6s %10s %10s   %s| %s\n' "$shape" mtnlg "$(med "${res[$shape,m_wall]}")" "$(med "${res[$shape,m_cpu]}")" \
    "${res[$shape,m_wall]}" "${res[$shape,m_cpu]}"
  printf '%-6s %-6s %10s %10s   %s| %s\n' "$shape" torch "$(med "${res[$shape,t_wall]}")" "$(med "${res[$shape,t_cpu]}")" \
    "${res[$shape,t_wall]}" "${res[$shape,t_cpu]}"
  "$py" -c "import sys; a = [float(x) for x in sys.argv[2:]]
print(f\"{sys.argv[1]:<6} {'ratio':<6} {a[0] / a[1]:10.2f} {a[2] / a[3]:10.2f}   mtnlg / PyTorch\")" \
    "$shape" "$(med "${res[$shape,m_wall]}")" "$(med "${res[$shape,t_wall]}")" "$(med "${res[$shape,m_cpu]}")" \
    "$(med "${res[$shape,t_cpu]}")"
  echo "$shape   dispatch share: mtnlg ${res[$shape,m_disp]} (perf); PyTorch ${res[$shape,t_disp]} of a step (profiler)"
done
