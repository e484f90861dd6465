#!/usr/bin/env bash
# What the NCCL watchdog costs per rank as the world grows (parallel/liveness.hpp): the
# tiny GPT on the emulated NCCL under mpirun at 4, 8 and 16 ranks, each rank printing its
# watchdog's own counts when it stops (MTNLG_WATCHDOG_STATS=1: filesystem calls made by
# the watchdog's checks, messages sent and received over the liveness service), and, as
# an outside measure, strace on rank 1 counting its stat-family, open and utime calls on
# the run directory's flight_recorder/ (where a watchdog that polls peers' files would
# make them). The per-rank figures must be flat in the world size; rank 0's service
# receives about one message per rank per second.
#   usage: scripts/bench/watchdog_scale_bench.sh [BINARY] [ITERS]
#   env:   SIZES (default "4 8 16")
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
binary="${1:-$repo/build/mtnlg-emu}"
iters="${2:-6}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mtnlg-wdscale.XXXXXX")
[ "${KEEP:-0}" = 1 ] && echo "kept $tmp" >&2 || trap 'rm -rf "$tmp"' EXIT
cd "$repo"
export MTNLG_COLLECTIVE_TIMEOUT=600 MTNLG_WATCHDOG_STATS=1 OMP_NUM_THREADS=1
have_strace=0
command -v strace >/dev/null && have_strace=1
# Rank 1 runs under strace (counting only); the others run plainly.
cat >"$tmp/rank.sh" <<EOF
#!/usr/bin/env bash
if [ "\${OMPI_COMM_WORLD_RANK:-}" = 1 ] && [ $have_strace = 1 ]; then
  exec strace -f -qq -o "$tmp/strace-\$MTNLG_BENCH_NP.txt" -e trace=newfstatat,stat,lstat,statx,utimensat,openat "\$@"
fi
exec "\$@"
EOF
chmod +x "$tmp/rank.sh"
printf '| ranks | layout | run s | watchdog fs calls/s per rank | msgs sent/s per rank | msgs received/s per rank | rank 0 service received/s | rank 1 calls/s on flight_recorder/ (strace) |\n'
printf '|---:|---|---:|---:|---:|---:|---:|---:|\n'
for np in ${SIZES:-4 8 16}; do
  case $np in
    4) layout=(--set parallel.tensor_model_parallel_size=2) name="tp2 dp2" ;;
    8) layout=(--set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2) name="tp2 pp2 dp2" ;;
    16) layout=(--set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2) name="tp2 pp2 dp4" ;;
    *) layout=() name="dp$np" ;;
  esac
  log="$tmp/run-$np.log"
  MTNLG_BENCH_NP=$np MTNLG_EMU_DEVICES=$np "$repo/test/support/mpi/mpirun.sh" "$np" "$tmp/rank.sh" "$binary" train \
    recipes/tiny-mock.yaml --quiet --set training.device=cuda --set training.train_iters="$iters" \
    --set logging.dir="$tmp/dir-$np" "${layout[@]}" >"$log" 2>&1 || { echo "np $np failed:"; tail -5 "$log"; exit 1; }
  python3 - "$log" "$tmp/strace-$np.txt" "$np" "$name" <<'EOF'
import re, sys
log, strace_file, np, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = [tuple(map(float, m)) for m in re.findall(
    r"watchdog stats: rank \d+: ([\d.]+) s, (\d+) filesystem calls, (\d+) messages sent, (\d+) received", open(log).read())]
service = re.search(r"service (\d+) received", open(log).read())
secs = max(r[0] for r in rows)
per = lambda i: max(r[i] / r[0] for r in rows)  # the worst rank
strace_calls = "n/a"
try:
    strace_calls = f"{sum('flight_recorder/' in l for l in open(strace_file)) / secs:.2f}"
except OSError:
    pass
print(f"| {np} | {name} | {secs:.1f} | {per(1):.2f} | {per(2):.2f} | {per(3):.2f} | "
      f"{int(service.group(1)) / secs if service else 0:.1f} | {strace_calls} |")
assert len(rows) == np, f"{len(rows)} of {np} ranks printed their stats"
EOF
done
