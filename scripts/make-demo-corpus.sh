#!/usr/bin/env bash
# Builds a small real-text demo corpus from Debian packages and tokenizes it into
# Megatron .bin/.idx files, ready for data.blend:
#   OUT_DIR/fortunes_text_document.{bin,idx}  one document per fortune (package fortunes)
#   OUT_DIR/bible_text_document.{bin,idx}     one document per KJV chapter (bible-kjv)
#   OUT_DIR/licenses_text_document.{bin,idx}  one document per /usr/share/common-licenses file
# The JSONL sources are kept beside them (OUT_DIR/jsonl/).
# Usage: scripts/make-demo-corpus.sh OUT_DIR [MTNLG_BINARY]   (or MTNLG=path/to/mtnlg)
# Needs: scripts/install-deps.sh (fortunes, bible-kjv, python3) and npm for the GPT-2 vocab.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:?usage: make-demo-corpus.sh OUT_DIR [MTNLG_BINARY]}"
mtnlg="${2:-${MTNLG:-}}"
if [ -z "$mtnlg" ]; then
  for c in "$repo"/build*/mtnlg; do [ -x "$c" ] && mtnlg="$c" && break; done
fi
[ -n "$mtnlg" ] && [ -x "$mtnlg" ] || { echo "make-demo-corpus: mtnlg binary not found (pass it or set MTNLG)" >&2; exit 2; }
[ -d /usr/share/games/fortunes ] || { echo "make-demo-corpus: package 'fortunes' missing (scripts/install-deps.sh)" >&2; exit 2; }
command -v bible >/dev/null || { echo "make-demo-corpus: package 'bible-kjv' missing (scripts/install-deps.sh)" >&2; exit 2; }
py=/usr/bin/python3
[ -x "$py" ] || py=python3

vocab_dir="$("$repo/scripts/fetch-gpt2-vocab.sh")"
mkdir -p "$out/jsonl"

# Fortunes: files are separated by lines holding only '%'. Skip the .dat/.u8 indexes
# and the off/ directory.
"$py" - "$out/jsonl/fortunes.jsonl" <<'PY'
import glob, json, os, sys
docs = 0
with open(sys.argv[1] + ".tmp", "w", encoding="utf-8") as out:
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if path.endswith((".dat", ".u8")) or os.path.isdir(path) or os.path.islink(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for part in text.split("\n%\n"):
            part = part.strip("\n%")
            if part.strip():
                out.write(json.dumps({"text": part + "\n", "source": os.path.basename(path)}, ensure_ascii=False) + "\n")
                docs += 1
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print(f"fortunes: {docs} documents")
PY

# Bible: `bible -f` prints one verse per line, "Ge1:1 In the beginning ..."; one
# document per chapter.
bible -f 'Gen1:1-Rev22:21' 2>/dev/null | "$py" -c '
import json, re, sys
pat = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")
docs, cur, verses = 0, None, []
out = open(sys.argv[1] + ".tmp", "w", encoding="utf-8")
def flush():
    global docs
    if verses:
        out.write(json.dumps({"text": " ".join(verses) + "\n", "chapter": cur}) + "\n")
        docs += 1
for line in sys.stdin:
    m = pat.match(line.rstrip("\n"))
    if not m:
        continue
    key = m.group(1) + m.group(2)
    if key != cur:
        flush()
        cur, verses = key, []
    verses.append(m.group(4))
flush()
out.close()
import os; os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print(f"bible: {docs} documents")
' "$out/jsonl/bible.jsonl"

# Licenses: one document per file.
"$py" - "$out/jsonl/licenses.jsonl" <<'PY'
import glob, json, os, sys
docs = 0
with open(sys.argv[1] + ".tmp", "w", encoding="utf-8") as out:
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                out.write(json.dumps({"text": f.read(), "name": os.path.basename(path)}) + "\n")
                docs += 1
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print(f"licenses: {docs} documents")
PY

for src in fortunes bible licenses; do
  "$mtnlg" data preprocess --input "$out/jsonl/$src.jsonl" --output-prefix "$out/$src" \
    --vocab-file "$vocab_dir/vocab.json" --merge-file "$vocab_dir/merges.txt" --append-eod \
    --workers "${WORKERS:-2}" --no-progress
done
"$mtnlg" data inspect "$out/fortunes_text_document" "$out/bible_text_document" "$out/licenses_text_document"
