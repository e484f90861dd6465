#!/usr/bin/env bash
# Checks scripts/check-format.sh (the ctest scripts.check-format): with the repository's
# .clang-format, a file laid out as it says passes, one that is not (a line over 120
# columns, a misplaced brace) fails naming the file. About 1 s.
#   usage: scripts/test_check_format.sh     (exit 0 and "check-format: ok")
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cp "$repo/.clang-format" "$tmp/.clang-format"  # clang-format reads the one nearest the file
cat > "$tmp/good.cpp" <<'CPP'
namespace x {

int add(int a, int b) { return a + b; }

}  // namespace x
CPP
cat > "$tmp/bad.cpp" <<'CPP'
namespace x {
int add(int a, int b)
{
  return a + b + a + b + a + b + a + b + a + b + a + b + a + b + a + b + a + b + a + b + a + b + a + b + a + b + a + b;
}
}  // namespace x
CPP
"$repo/scripts/check-format.sh" "$tmp/good.cpp" >"$tmp/good.log" 2>&1 || { cat "$tmp/good.log"; echo "a formatted file failed"; exit 1; }
if "$repo/scripts/check-format.sh" "$tmp/good.cpp" "$tmp/bad.cpp" >"$tmp/bad.log" 2>&1; then
  cat "$tmp/bad.log"; echo "an unformatted file passed"; exit 1
fi
grep -q "bad.cpp" "$tmp/bad.log" || { cat "$tmp/bad.log"; echo "the failure does not name the file"; exit 1; }
if grep -q "good.cpp" "$tmp/bad.log"; then cat "$tmp/bad.log"; echo "the formatted file was named"; exit 1; fi
echo "check-format: ok"
