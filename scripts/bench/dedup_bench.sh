#!/usr/bin/env bash
# Dedup throughput and peak memory on synthetic corpora, for docs/PERFORMANCE.md
# ("Data curation"). Generates (once) a corpus per size with `mtnlg data
# synth-corpus` (4 sources, 15% near-duplicates, 150-400 words a document), then runs
#   /usr/bin/time -v mtnlg data dedup --input <4 sources> --output-dir OUT --workers W
# and prints one row per size: documents, input MB, wall seconds, documents/s,
# CPU seconds (user + system: less sensitive than wall time to other load on the box),
# peak RSS (MiB), removed documents.
#
# Usage: scripts/bench/dedup_bench.sh [BUILD_DIR] [WORK_DIR] [WORKERS] [SIZES...]
#   defaults: build /tmp/mtnlg-dedup-bench 2 "100000 300000 1000000"
# The 1M corpus needs ~2 GB of disk (plus ~2 GB for the deduplicated copy).
set -euo pipefail
BUILD=${1:-build}
WORK=${2:-/tmp/mtnlg-dedup-bench}
WORKERS=${3:-2}
shift $(( $# < 3 ? $# : 3 ))
SIZES=${*:-100000 300000 1000000}
MTNLG=$BUILD/mtnlg
[ -x "$MTNLG" ] || { echo "no $MTNLG (build the mtnlg target first)" >&2; exit 2; }
SOURCES="pile_cc books3 wikipedia stackexchange"

printf "%-9s %-9s %-8s %-11s %-7s %-13s %-8s\n" docs input_MB wall_s docs_per_s cpu_s peak_RSS_MiB removed
for n in $SIZES; do
  dir=$WORK/n$n
  if [ ! -f "$dir/corpus/synth.json" ]; then
    "$MTNLG" data synth-corpus --output-dir "$dir/corpus" --docs "$n" --sources 4 --seed 7 --no-progress >/dev/null
  fi
  inputs=""
  for s in $SOURCES; do inputs="$inputs $dir/corpus/$s.jsonl"; done
  rm -rf "$dir/out"
  # shellcheck disable=SC2086
  /usr/bin/time -v "$MTNLG" data dedup --input $inputs --output-dir "$dir/out" --workers "$WORKERS" --no-progress \
    >"$dir/dedup.log" 2>"$dir/time.txt"
  rss_kb=$(sed -n 's/.*Maximum resident set size (kbytes): \([0-9]*\).*/\1/p' "$dir/time.txt")
  user=$(sed -n 's/.*User time (seconds): \([0-9.]*\).*/\1/p' "$dir/time.txt")
  sys=$(sed -n 's/.*System time (seconds): \([0-9.]*\).*/\1/p' "$dir/time.txt")
  wall=$(sed -n 's/.*"total": \([0-9.e+-]*\).*/\1/p' "$dir/out/dedup_report.json" | tail -1)
  removed=$(sed -n 's/^    "removed": \([0-9]*\).*/\1/p' "$dir/out/dedup_report.json" | head -1)
  bytes=0
  for s in $SOURCES; do bytes=$(( bytes + $(stat -c %s "$dir/corpus/$s.jsonl") )); done
  awk -v n="$n" -v b="$bytes" -v w="$wall" -v r="$rss_kb" -v rm="$removed" -v u="$user" -v s="$sys" \
    'BEGIN { printf "%-9d %-9.0f %-8.2f %-11.0f %-7.1f %-13.0f %-8s\n", n, b/1e6, w, n/w, u+s, r/1024, rm }'
done
