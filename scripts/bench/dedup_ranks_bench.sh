#!/usr/bin/env bash
# `mtnlg data dedup` across ranks, for docs/PERFORMANCE.md ("Data curation") and
# docs/CURATION.md. Generates (once) a corpus per size with `mtnlg data synth-corpus`
# (4 sources, 15% planted near-duplicates, 150-400 words a document), then runs dedup
#   - with 1 rank (plain process, --workers THREADS), and
#   - under test/support/mpi/mpirun.sh with 2 ranks (--workers THREADS/2 each: the same cores),
#   - and, with BUDGET set, with 2 ranks and --memory-per-rank BUDGET,
# each rank wrapped in /usr/bin/time -v for its peak RSS. One row per run: documents,
# ranks, wall seconds (the report's total), documents/s, peak RSS of the largest rank
# (MiB), that peak as a ratio of the same size's 1-rank run (the peer in this run),
# CPU seconds summed over the ranks (user + system: less sensitive than wall time to
# other load on the machine),
# spilled key runs / bytes, and pairwise precision / recall of the duplicate groups against
# the planted clusters (truth_dedup.jsonl).
#
# Usage: scripts/bench/dedup_ranks_bench.sh [BUILD_DIR] [WORK_DIR] [THREADS] [SIZES...]
#   defaults: build /tmp/mtnlg-dedup-ranks 2 "1000000"
#   environment: BUDGET=2G adds a budgeted 2-rank run; RANKS="1 2" picks the runs.
# Disk: ~2 GB per 1M documents for the corpus, as much again for the outputs.
set -euo pipefail
BUILD=${1:-build}
WORK=${2:-/tmp/mtnlg-dedup-ranks}
THREADS=${3:-2}
shift $(( $# < 3 ? $# : 3 ))
SIZES=${*:-1000000}
RANKS=${RANKS:-1 2}
BUDGET=${BUDGET:-}
MTNLG=$(cd "$(dirname "$BUILD/mtnlg")" && pwd)/mtnlg
MPIRUN=$(cd "$(dirname "$0")/../.." && pwd)/test/support/mpi/mpirun.sh
[ -x "$MTNLG" ] || { echo "no $MTNLG (build the mtnlg target first)" >&2; exit 2; }
SOURCES="pile_cc books3 wikipedia stackexchange"

# Pairwise precision and recall of dedup_clusters.jsonl against the planted clusters.
score() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
from collections import Counter
truth, clusters = sys.argv[1], sys.argv[2]
cl = {}
sizes = Counter()
with open(truth) as f:
    for l in f:
        t = json.loads(l)
        cl[(t["source"], t["line"])] = t["cluster"]
        sizes[t["cluster"]] += 1
truth_pairs = sum(n * (n - 1) // 2 for n in sizes.values())
pred = tp = 0
with open(clusters) as f:
    for l in f:
        c = json.loads(l)
        m = [cl[(c["kept"]["source"], c["kept"]["line"])]] + [cl[(x["source"], x["line"])] for x in c["removed"]]
        cnt = Counter(m)
        pred += len(m) * (len(m) - 1) // 2
        tp += sum(n * (n - 1) // 2 for n in cnt.values())
print(f"{tp / max(pred, 1):.4f} {tp / max(truth_pairs, 1):.4f}")
EOF
}

printf "%-9s %-6s %-8s %-8s %-11s %-7s %-13s %-10s %-12s %-9s %-7s\n" \
  docs ranks budget wall_s docs_per_s cpu_s peak_RSS_MiB rss_ratio spilled precision recall
for n in $SIZES; do
  dir=$WORK/n$n
  if [ ! -f "$dir/corpus/synth.json" ]; then
    "$MTNLG" data synth-corpus --output-dir "$dir/corpus" --docs "$n" --sources 4 --seed 7 --no-progress >/dev/null
  fi
  inputs=""
  for s in $SOURCES; do inputs="$inputs $dir/corpus/$s.jsonl"; done
  base_rss=""
  runs=""
  for r in $RANKS; do runs="$runs $r:"; done
  [ -n "$BUDGET" ] && runs="$runs 2:$BUDGET"
  for run in $runs; do
    np=${run%%:*}
    budget=${run#*:}
    out=$dir/out-$np-${budget:-none}
    rm -rf "$out" "$dir"/time.*
    extra=""
    [ -n "$budget" ] && extra="--memory-per-rank $budget"
    workers=$(( THREADS / np > 0 ? THREADS / np : 1 ))
    # shellcheck disable=SC2086
    if [ "$np" = 1 ]; then
      /usr/bin/time -v -o "$dir/time.0" "$MTNLG" data dedup --input $inputs --output-dir "$out" --clusters \
        --workers "$workers" --no-progress $extra >"$dir/dedup-$np.log" 2>&1
    else
      sh "$MPIRUN" "$np" sh -c '/usr/bin/time -v -o "$0.${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}" "$@"' "$dir/time" \
        "$MTNLG" data dedup --input $inputs --output-dir "$out" --clusters --workers "$workers" --no-progress $extra \
        >"$dir/dedup-$np.log" 2>&1
    fi
    rss_kb=0
    cpu=0
    for t in "$dir"/time.*; do
      k=$(sed -n 's/.*Maximum resident set size (kbytes): \([0-9]*\).*/\1/p' "$t")
      [ "$k" -gt "$rss_kb" ] && rss_kb=$k
      u=$(sed -n 's/.*User time (seconds): \([0-9.]*\).*/\1/p' "$t")
      s=$(sed -n 's/.*System time (seconds): \([0-9.]*\).*/\1/p' "$t")
      cpu=$(awk -v a="$cpu" -v b="$u" -v c="$s" 'BEGIN { print a + b + c }')
    done
    [ -z "$base_rss" ] && base_rss=$rss_kb
    wall=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['timing_s']['total'])" "$out/dedup_report.json")
    spilled=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['run']; print('%d/%.0fMiB' % (r['key_runs_spilled'], r['key_bytes_spilled'] / 1048576))" "$out/dedup_report.json")
    read -r prec rec < <(score "$dir/corpus/truth_dedup.jsonl" "$out/dedup_clusters.jsonl")
    awk -v n="$n" -v np="$np" -v b="${budget:--}" -v w="$wall" -v r="$rss_kb" -v br="$base_rss" -v sp="$spilled" \
      -v p="$prec" -v rc="$rec" -v c="$cpu" \
      'BEGIN { printf "%-9d %-6d %-8s %-8.1f %-11.0f %-7.1f %-13.0f %-10.2f %-12s %-9s %-7s\n", n, np, b, w, n/w, c, r/1024, r/br, sp, p, rc }'
    if [ "$out" != "$dir/out-1-none" ] && [ -d "$dir/out-1-none" ]; then
      for s in $SOURCES; do cmp -s "$dir/out-1-none/$s.jsonl" "$out/$s.jsonl" || echo "  $s.jsonl differs from the 1-rank run!"; done
    fi
  done
done
