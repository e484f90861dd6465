#!/usr/bin/env bash
# README command 1: the CPU demo. Installs the Debian packages (as root), builds mtnlg,
# turns two real English corpora shipped by Debian (fortune cookies, the King James
# Bible) into Megatron .bin/.idx files with GPT-2's tokenizer, and trains
# recipes/cpu-demo.yaml on them. The log line per iteration shows the loss falling;
# the run directory is runs/cpu-demo (metrics.jsonl, recipe.resolved.yaml).
#   usage: scripts/demo.sh [--set section.key=value ...]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
if [ "$(id -u)" = 0 ]; then scripts/install-deps.sh; else scripts/install-deps.sh || exit 1; fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j 2 --target mtnlg
if [ ! -s demo-data/fortunes_text_document.idx ] || [ ! -s demo-data/bible_text_document.idx ]; then
  scripts/make-demo-corpus.sh demo-data build/mtnlg
fi
build/mtnlg data inspect demo-data/fortunes_text_document demo-data/bible_text_document || true
# Idle OpenMP threads sleep instead of spinning: on a 2-core box where anything else
# runs, spinning threads steal the cores the working ones need (docs/PERFORMANCE.md).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
exec build/mtnlg train recipes/cpu-demo.yaml "$@"
