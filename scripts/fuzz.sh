#!/usr/bin/env bash
# Fuzzes the safetensors/checkpoint reader with libFuzzer (Debian's clang + its
# compiler-rt: `apt-get install clang libclang-rt-14-dev`), growing test/core/fuzz/corpus/,
# then minimises it (-merge=1 on edge coverage) so the replayed corpus stays small.
#   usage: scripts/fuzz.sh [SECONDS]   (default 60)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
secs="${1:-60}"
out="$repo/build-fuzz"
mkdir -p "$out"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -I"$repo" \
  "$repo/test/core/fuzz/fuzz_safetensors.cpp" "$repo/core/safetensors.cpp" "$repo/core/tensor.cpp" "$repo/core/mem_account.cpp" \
  "$repo/core/atomic_file.cpp" \
  -lfmt -o "$out/fuzz_safetensors"
mkdir -p "$repo/test/core/fuzz/corpus"
"$out/fuzz_safetensors" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=1024 "$repo/test/core/fuzz/corpus"
# Keep only inputs that add edge coverage (-use_counters=0: hit-count buckets would keep
# nearly every file); the unit test replays whatever is left.
min="$out/corpus-min"
rm -rf "$min" && mkdir -p "$min"
"$out/fuzz_safetensors" -merge=1 -use_counters=0 -max_len=4096 -rss_limit_mb=1024 "$min" "$repo/test/core/fuzz/corpus"
rm -rf "$repo/test/core/fuzz/corpus" && mv "$min" "$repo/test/core/fuzz/corpus"
echo "corpus: $(ls "$repo/test/core/fuzz/corpus" | wc -l) files"
