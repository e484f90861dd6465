#!/usr/bin/env bash
# Generation speed on the CPU: `mtnlg generate --greedy` with a random-weight model of
# RECIPE's shape (default GPT-2 124M: 12 layers, hidden 768, vocabulary padded to 50304),
# a short prompt, NEW_TOKENS decode steps through the KV cache. Reports the decode
# rate from the binary's `--timing` line (the steps after the first token; random
# initialisation and the prompt's prefill are not in it) twice: tokens per second of
# wall time, and tokens per CPU second of the process (all threads), which moves far
# less when other jobs load the machine.
#   usage: scripts/bench/generate_bench.sh [BUILD_DIR] [NEW_TOKENS] [RECIPE]
#   env:   THREADS (default 2); BASELINE=OTHER_BINARY_OR_BUILD_DIR: also time that mtnlg
#          (it must know --timing), alternating with this one ROUNDS times (default 3),
#          and print the tokens/s ratio this / baseline; SET="k=v ..." recipe overrides.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$repo/build}"
new="${2:-128}"
recipe="${3:-$repo/recipes/gpt2-124m.yaml}"
threads="${THREADS:-2}"
export OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads"
sets=()
for kv in ${SET:-}; do sets+=(--set "$kv"); done
bin_of() { if [ -d "$1" ]; then echo "$1/mtnlg"; else echo "$1"; fi; }
prompt="The quick brown fox jumps over the lazy dog. Once upon a time, in a land far away,"

# "WALL CPU": decode tokens/s and tokens per CPU second of one run.
rate() {
  "$(bin_of "$1")" generate --random-init "$recipe" "${sets[@]}" --prompt "$prompt" --greedy \
    --max-new-tokens "$new" --no-echo --timing \
    --vocab-file "$repo/third_party/gpt2/vocab.json" --merge-file "$repo/third_party/gpt2/merges.txt" 2>&1 >/dev/null |
    sed -nE 's/.*\(([0-9.]+) tokens\/s\).*\(([0-9.]+) tokens per CPU second\).*/\1 \2/p'
}
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

label="$(basename "$recipe") ${SET:-}, greedy, $new new tokens, $threads threads"
if [ -n "${BASELINE:-}" ]; then
  rounds="${ROUNDS:-3}"
  ow=() oc=() bw=() bc=()
  for r in $(seq "$rounds"); do  # alternate, so drift of the machine hits both alike
    read -r w c <<<"$(rate "$build")"
    ow+=("$w") oc+=("$c")
    read -r w c <<<"$(rate "$BASELINE")"
    bw+=("$w") bc+=("$c")
  done
  echo "$label"
  printf '%-44s %10s %14s   %s\n' "" "tokens/s" "tokens/CPU-s" "rounds (tokens/s; tokens/CPU-s)"
  printf '%-44s %10s %14s   %s\n' "mtnlg $(bin_of "$build")" "$(med "${ow[@]}")" "$(med "${oc[@]}")" "${ow[*]}; ${oc[*]}"
  printf '%-44s %10s %14s   %s\n' "mtnlg $(bin_of "$BASELINE")" "$(med "${bw[@]}")" "$(med "${bc[@]}")" "${bw[*]}; ${bc[*]}"
  /usr/bin/python3 -c "print(f\"{'this / baseline (medians)':44s} {$(med "${ow[@]}")/$(med "${bw[@]}"):10.3f} {$(med "${oc[@]}")/$(med "${bc[@]}"):14.3f}\")"
  exit 0
fi
echo "$label"
printf '%-44s %10s %14s\n' "" "tokens/s" "tokens/CPU-s"
read -r w c <<<"$(rate "$build")"
printf '%-44s %10s %14s\n' "mtnlg $(bin_of "$build")" "$w" "$c"
