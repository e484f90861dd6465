#!/usr/bin/python3
"""Python's own str.capitalize() and str.strip(), the oracle for mtnlg's py_capitalize
and py_strip (data/eval/tasks.hpp). Prints JSON lines [input, capitalize(input),
strip(input)] for every code point cp below 0x20000 and in U+E0000..U+E0FFF (no
surrogates), each in the string cp + "a" + cp + "Σ" + cp (title of the first
character, lowercase and the final-sigma context of the others) and " \\u3000" + cp +
"x" + cp + "\\xa0" for strip, and for the hand-picked strings given as arguments."""
import json
import sys


def line(s, t):
    print(json.dumps([s, s.capitalize(), t, t.strip()], ensure_ascii=False))


for s in sys.argv[1:]:
    line(s, s)
for cp in list(range(0x20000)) + list(range(0xE0000, 0xE1000)):
    if 0xD800 <= cp <= 0xDFFF:
        continue
    c = chr(cp)
    line(c + "a" + c + "\u03a3" + c, " \u3000" + c + "x" + c + "\u00a0")
