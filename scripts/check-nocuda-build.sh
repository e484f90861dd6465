#!/usr/bin/env bash
# The build without CUDA (-DMTNLG_CUDA=OFF: what a machine without nvcc gets) compiles
# warning-free: configures BUILD_DIR with MTNLG_WERROR=ON (-Werror for mtnlg's own code
# only) and compiles, with the user build's flags, every translation unit whose text
# depends on the CUDA switch: the sources that contain MTNLG_HAVE_CUDA / MTNLG_HAVE_NCCL,
# or include (through mtnlg's own headers) a file that does. Every other unit is the same
# text as in the CUDA build that scripts/test.sh builds. Called by scripts/test.sh
# (MTNLG_CHECK_NOCUDA=0 skips it); MTNLG_CHECK_NOCUDA=all compiles and links the whole
# CUDA-off tree instead (the slow, complete check).
#   usage: scripts/check-nocuda-build.sh [BUILD_DIR]   (default: build-nocuda)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$repo/build-nocuda}"
jobs="${MTNLG_BUILD_JOBS:-2}"
cd "$repo"
start=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMTNLG_CUDA=OFF -DMTNLG_WERROR=ON | tail -n 1
if [ "${MTNLG_CHECK_NOCUDA:-1}" = all ]; then
  cmake --build "$build" -j "$jobs"
  echo "check-nocuda-build: the whole CUDA-off tree built warning-free in $(($(date +%s) - start)) s"
  exit 0
fi
mapfile -t objects < <(python3 - "$repo" "$build/compile_commands.json" <<'EOF'
import json, os, re, sys
repo, db = sys.argv[1], sys.argv[2]
marker = re.compile(r"\bMTNLG_HAVE_(CUDA|NCCL)\b")
include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
texts, edges = {}, {}
def text(path):
    if path not in texts:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                texts[path] = f.read()
        except OSError:
            texts[path] = ""
    return texts[path]
def includes(path):  # mtnlg's own headers that `path` includes
    if path not in edges:
        edges[path] = []
        for name in include.findall(text(path)):
            for base in (repo, os.path.dirname(path)):
                p = os.path.normpath(os.path.join(base, name))
                if p.startswith(repo + os.sep) and os.path.isfile(p):
                    edges[path].append(p)
                    break
    return edges[path]
def depends(src):  # src or a header it reaches mentions the switch
    seen, todo = {src}, [src]
    while todo:
        path = todo.pop()
        if marker.search(text(path)):
            return True
        for p in includes(path):
            if p not in seen:
                seen.add(p)
                todo.append(p)
    return False
for e in json.load(open(db)):
    src = os.path.normpath(e["file"])
    if src.startswith(repo + os.sep) and depends(src):
        out = e.get("output") or re.search(r"-o (\S+)", e["command"]).group(1)
        print(out)
EOF
)
echo "check-nocuda-build: ${#objects[@]} translation units depend on the CUDA switch; compiling them with -Werror"
ninja -C "$build" -j "$jobs" "${objects[@]}"
echo "check-nocuda-build: warning-free in $(($(date +%s) - start)) s"
