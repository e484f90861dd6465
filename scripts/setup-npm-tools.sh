#!/usr/bin/env bash
# Installs the npm tools the data tests and benchmarks compare against:
#   js-tiktoken (pure JS, the tokenizer oracle) and tiktoken (WASM, speed reference).
# Installed once into a cache dir (default ${XDG_CACHE_HOME:-~/.cache}/mtnlg/npm-tools,
# override with MTNLG_NPM_TOOLS_DIR); later calls return at once. Also fetches the
# GPT-2 vocab (scripts/fetch-gpt2-vocab.sh). The last line of stdout is the tools
# directory (its node_modules/ holds the packages); exit 1 when npm is unavailable.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${MTNLG_NPM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mtnlg/npm-tools}"
pkgs=(js-tiktoken@1.0.21 tiktoken@1.0.22)
"$repo/scripts/fetch-gpt2-vocab.sh" >/dev/null
if [ -f "$dir/node_modules/js-tiktoken/package.json" ] && [ -f "$dir/node_modules/tiktoken/package.json" ]; then
  echo "$dir"
  exit 0
fi
command -v npm >/dev/null || { echo "setup-npm-tools: npm not found (apt-get install npm)" >&2; exit 1; }
command -v node >/dev/null || { echo "setup-npm-tools: node not found (apt-get install nodejs)" >&2; exit 1; }
mkdir -p "$dir"
# A lock so parallel test processes do not install into the same dir at once.
exec 9>"$dir/.lock"
flock 9
if [ ! -f "$dir/node_modules/tiktoken/package.json" ] || [ ! -f "$dir/node_modules/js-tiktoken/package.json" ]; then
  [ -f "$dir/package.json" ] || echo '{"name":"mtnlg-npm-tools","private":true}' >"$dir/package.json"
  if ! npm install --silent --no-audit --no-fund --prefix "$dir" "${pkgs[@]}" >"$dir/npm.log" 2>&1; then
    echo "setup-npm-tools: npm install ${pkgs[*]} failed (registry unreachable?); see $dir/npm.log" >&2
    exit 1
  fi
fi
echo "$dir"
