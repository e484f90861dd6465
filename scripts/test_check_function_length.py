#!/usr/bin/env python3
"""Checks scripts/check-function-length.py (the ctest scripts.check-function-length):

  1. on a made-up source with what trips a brace counter (braces in strings, characters,
     raw strings and comments, a preprocessor line, a constructor's brace initializers,
     member functions in a class body, a lambda held at namespace scope, a data table):
     each function is found with its name and its length, from its name's line to its
     closing brace;
  2. the limit: a function of 81 lines is reported and fails the check, one of 80 passes;
  3. the tree as it is passes (the exemption apart). About 2 s.

    usage: test_check_function_length.py     (exit 0 and "check-function-length: ok")"""
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "check-function-length.py"
spec = importlib.util.spec_from_file_location("check_function_length", SCRIPT)
cfl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cfl)


def body(n):
    """A function body of n lines in all (name line and closing brace included)."""
    return "\n".join(["  x += 1;"] * (n - 2))


SOURCE = r'''#include <string>
#define OPEN {
namespace a::b {
const char* brace() { return "}{"; }  // 1 line
char quote() { return '{'; }
const char* raw() {
  return R"x(} } {)x";
}
/* a comment { that opens
   a brace */
struct Widget : Base {
  Widget(int v) : v_{v}, w_(v) {
    // } in a comment
  }
  int get() const noexcept { return v_; }
  bool operator()(int x) const { return x == v_; }
  int v_, w_;
};
const int kTable[] = {
  1, 2, 3,
};
auto doubled = [](int x) {
  return 2 * x;
};
int Widget_free(int v) try {
  return v;
} catch (...) {
  return 0;
}
template <typename T>
T twice(T t) -> T {
  return t + t;
}
int long81() {
''' + body(81) + r'''
}
int long80() {
''' + body(80) + r'''
}
}  // namespace a::b
'''


def main():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "sample.cpp")
        with open(path, "w") as f:
            f.write(SOURCE)
        found = {name: (line, length) for line, name, length in cfl.functions(cfl.blank(SOURCE))}
        expect = {
            "brace": (4, 1),
            "quote": (5, 1),
            "raw": (6, 3),
            "Widget": (12, 3),
            "get": (15, 1),
            "operator()": (16, 1),
            "doubled": (22, 3),
            "twice": (31, 3),
        }
        for name, want in expect.items():
            assert found.get(name) == want, f"{name}: found {found.get(name)}, expected (line, length) {want}: {found}"
        assert "kTable" not in found, "a data table is not a function"
        assert found["long81"][1] == 81 and found["long80"][1] == 80, found
        r = subprocess.run([sys.executable, str(SCRIPT), path], capture_output=True, text=True)
        assert r.returncode == 1, r
        lines = r.stdout.strip().splitlines()
        assert len(lines) == 1 and lines[0].endswith(" long81 81"), r.stdout
        assert "1 function(s) over 80 lines" in r.stderr, r.stderr
        r = subprocess.run([sys.executable, str(SCRIPT), "--max", "81", path], capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout == "", r
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 0, f"the tree has functions over 80 lines:\n{r.stdout}{r.stderr}"
    print("check-function-length: ok")


if __name__ == "__main__":
    main()
