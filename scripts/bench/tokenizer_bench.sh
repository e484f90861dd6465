#!/usr/bin/env bash
# Data pipeline benchmarks (numbers for docs/PERFORMANCE.md, "Data pipeline"):
#   1. tokenizer throughput, single thread: mtnlg vs js-tiktoken and tiktoken (node) on the
#      same documents in one run, with ratios; ids are checked equal via token counts
#   2. `mtnlg data preprocess` wall time with --workers 1 and 2 (outputs must be identical)
#   3. GPT sample-index build for a synthetic 2M-document, 1B-token dataset (sparse .bin)
# Usage: scripts/bench/tokenizer_bench.sh BUILD_DIR [--skip-index]
#   BUILD_DIR holds mtnlg and data/libmtnlg_data.a (cmake ... && ninja mtnlg test_data)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:?usage: tokenizer_bench.sh BUILD_DIR}" && pwd)"
skip_index="${2:-}"
py=/usr/bin/python3
tools="$("$repo/scripts/setup-npm-tools.sh" | tail -n 1)"
vocab="$("$repo/scripts/fetch-gpt2-vocab.sh")"
work="$build/bench-data"
mkdir -p "$work"

echo "== building data_bench (CMake target)"
cmake --build "$build" --target data_bench mtnlg >/dev/null
data_bench="$build/bench/data_bench"

echo "== corpus (scripts/make-demo-corpus.sh)"
"$repo/scripts/make-demo-corpus.sh" "$work/corpus" "$build/mtnlg" >/dev/null
cat "$work/corpus/jsonl/"{fortunes,bible,licenses}.jsonl >"$work/docs.jsonl"

echo "== tokenizer throughput (single thread, 3 passes each)"
"$data_bench" tokenize "$vocab/vocab.json" "$vocab/merges.txt" "$work/docs.jsonl" 3 >"$work/tok_mtnlg.jsonl"
NODE_PATH="$tools/node_modules" node "$repo/scripts/bench/tiktoken_bench.js" "$work/docs.jsonl" 3 >"$work/tok_node.jsonl"
"$py" - "$work/tok_mtnlg.jsonl" "$work/tok_node.jsonl" <<'PY'
import json, sys
rows = {}
for l in open(sys.argv[1]):
    r = json.loads(l); r["tokenizer"] = "mtnlg"; rows.setdefault("mtnlg", []).append(r)
for l in open(sys.argv[2]):
    r = json.loads(l); rows.setdefault(r["tokenizer"], []).append(r)
tok = {k: v[0]["tokens"] for k, v in rows.items()}
assert len(set(tok.values())) == 1, f"token counts differ: {tok}"
mb = rows["mtnlg"][0]["bytes"] / 1e6
print(f"corpus: {mb:.1f} MB, {rows['mtnlg'][0]['tokens']} tokens (same count from all three)")
best = {k: min(r["seconds"] for r in v) for k, v in rows.items()}
first = {k: v[0]["seconds"] for k, v in rows.items()}
print("| tokenizer | first pass MB/s | best pass MB/s | best Mtokens/s | mtnlg speedup (best) |")
print("|---|---|---|---|---|")
for k in ["mtnlg", "tiktoken", "js-tiktoken"]:
    print(f"| {k} | {mb/first[k]:.1f} | {mb/best[k]:.1f} | {rows[k][0]['tokens']/best[k]/1e6:.2f} | {best[k]/best['mtnlg']:.2f}x |")
PY

echo "== preprocess scaling (docs.jsonl x4)"
for i in 1 2 3 4; do cat "$work/docs.jsonl"; done >"$work/docs4.jsonl"
ls -la "$work/docs4.jsonl" | awk '{printf "input: %.1f MB\n", $5/1e6}'
for w in 1 2; do
  t0=$(date +%s.%N)
  "$build/mtnlg" data preprocess --input "$work/docs4.jsonl" --output-prefix "$work/pre_w$w" \
    --vocab-file "$vocab/vocab.json" --merge-file "$vocab/merges.txt" --append-eod --workers $w --no-progress | tail -n 1
  t1=$(date +%s.%N)
  echo "workers $w: $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}') s wall"
done
cmp "$work/pre_w1_text_document.bin" "$work/pre_w2_text_document.bin"
cmp "$work/pre_w1_text_document.idx" "$work/pre_w2_text_document.idx"
echo "outputs identical"

if [ "$skip_index" != "--skip-index" ]; then
  echo "== index build: synthetic 2M documents, 1B tokens, seq 2048"
  mkdir -p "$work/synthetic"
  for e in 1 3; do
    "$data_bench" index "$work/synthetic" 2000000 1000000000 2048 $e
  done
  rm -f "$work/synthetic"/synthetic_text_document.*
fi
