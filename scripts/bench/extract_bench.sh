#!/usr/bin/env bash
# `mtnlg data extract` against readability-lxml (python3-readability), one core each, in
# the same run. The input is the generated fixture pages.warc.gz (36 HTML pages with status 200, of
# four templates, 32 English) concatenated REPEAT times into one .warc.gz (gzip members
# concatenate into a valid file). mtnlg's time covers the whole command: gzip, WARC and
# HTTP parsing, charset, HTML5 parsing, the block classifier, CLD2 and writing JSONL;
# readability's covers only HTML -> main text (lxml parse + Document.summary + text),
# on bodies already in memory, so the ratio is conservative for mtnlg.
#
#   scripts/bench/extract_bench.sh [BUILD_DIR] [REPEAT] [WARC]
# Prints a table; the numbers in docs/PERFORMANCE.md come from this script. WARC (a
# .warc.gz of one gzip member per record) replaces the fixture, e.g. the real Debian HTML
# that `test/data/extract/debian_pages_warc.py OUT.warc.gz` gathers; the page count is then the
# `pages` of mtnlg's report (HTML responses with status 200).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$repo/build}"
repeat="${2:-50}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fixture="${3:-$repo/test/fixtures/warc/pages.warc.gz}"
for _ in $(seq "$repeat"); do cat "$fixture"; done > "$tmp/bench.warc.gz"
bytes=$(stat -c %s "$tmp/bench.warc.gz")

t0=$(date +%s.%N)
taskset -c 0 "$build/mtnlg" data extract --input "$tmp/bench.warc.gz" --output "$tmp/out" --no-progress --languages all > "$tmp/ours.log"
t1=$(date +%s.%N)
ours_s=$(echo "$t1 - $t0" | bc -l)
# HTML responses with status 200 (for the fixture 36 a copy; the 404 and the PNG are read too)
pages=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["totals"]["pages"])' "$tmp/out/extract_report.json")
rss=$( { /usr/bin/time -f "%M" taskset -c 0 "$build/mtnlg" data extract --input "$tmp/bench.warc.gz" --output "$tmp/out2" --no-progress --languages all > /dev/null; } 2>&1 | tail -1)
peer=$(taskset -c 0 /usr/bin/python3 "$repo/scripts/bench/extract_peer.py" speed --warc "$fixture" --repeat "$repeat")
peer_s=$(echo "$peer" | python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])')
peer_pages=$(echo "$peer" | python3 -c 'import json,sys; print(json.load(sys.stdin)["pages"])')
python3 - "$pages" "$ours_s" "$peer_pages" "$peer_s" "$bytes" "$rss" <<'PY'
import sys
pages, ours_s, peer_pages, peer_s, nbytes, rss = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
o, p = pages / ours_s, peer_pages / peer_s
print(f"input: {pages} HTML pages, {nbytes / 1e6:.2f} MB gzip (one core each)")
print(f"{'extractor':<34} {'pages':>7} {'seconds':>8} {'pages/s':>9} {'max RSS':>9}")
print(f"{'mtnlg data extract (whole cmd)':<34} {pages:>7} {ours_s:>8.2f} {o:>9.0f} {rss / 1024:>7.1f}MB")
print(f"{'readability-lxml (HTML->text)':<34} {peer_pages:>7} {peer_s:>8.2f} {p:>9.0f} {'':>9}")
print(f"ratio mtnlg / readability: {o / p:.1f}x")
PY
