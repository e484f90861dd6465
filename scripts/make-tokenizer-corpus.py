#!/usr/bin/env python3
"""Writes the tokenizer test corpus: documents mixing the text a tokenizer meets, made
deterministically (a fixed seed, sorted file lists) from files on a Debian machine.

Usage: make-tokenizer-corpus.py OUT [--mb 6] [--jsonl OUT.jsonl]
  OUT    documents, each a little-endian u32 byte length and the bytes (any bytes: the
         corpus holds invalid UTF-8 on purpose)
  --jsonl  also the same documents as JSONL {"text": ...} for `mtnlg data preprocess`,
         each with its invalid UTF-8 repaired (U+FFFD per maximal ill-formed subpart, as
         every JSON writer must: JSON text is Unicode)

Sources (each document strings several together):
  English prose: fortunes (/usr/share/games/fortunes) and the KJV bible (`bible`)
  code: C++ headers (/usr/include/c++), Python's standard library, this repository
  German, Chinese, Japanese: message catalogs of installed programs
  (/usr/share/locale/{de,zh_CN,zh_TW,ja}/LC_MESSAGES/*.mo)
  made up: emoji (ZWJ sequences, skin tones, flags), other 4-byte characters (math
  letters, CJK extension B), digit runs, whitespace runs (tabs, CR LF, NBSP, U+3000,
  U+0085, U+2028), combining and compatibility characters (NFC/NFKC), contractions in
  any case, long runs of one class, invalid UTF-8 (stray bytes, truncated sequences,
  surrogates, overlongs), and special tokens of GPT-2, Llama 2/3 and Qwen written inside
  the text.
"""
import argparse
import glob
import gettext
import json
import os
import random
import struct
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path, limit=200_000):
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return b""


def english():
    out = []
    for p in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if os.path.isfile(p) and not p.endswith(".dat") and not p.endswith(".u8"):
            out += [x.strip() for x in read(p, 10**7).split(b"\n%\n") if x.strip()]
    try:
        bible = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, timeout=120).stdout
        out += [l.split(b" ", 1)[-1] for l in bible.split(b"\n") if l.strip()]
    except (OSError, subprocess.SubprocessError):
        pass
    if not out:
        out = [b"The quick brown fox jumps over the lazy dog. It's what we'll do, isn't it?"]
    return out


def code():
    files = sorted(glob.glob("/usr/include/c++/*/bits/*.h"))[:80]
    files += sorted(glob.glob("/usr/lib/python3*/json/*.py")) + sorted(glob.glob("/usr/lib/python3*/email/*.py"))[:20]
    files += sorted(glob.glob(os.path.join(REPO, "data", "*.cpp")))
    out = [read(f, 60_000) for f in files]
    return [c for c in out if c] or [b"int main() {\n\treturn 0;\n}\n"]


def catalogs():
    langs = {}
    for lang in ["de", "zh_CN", "zh_TW", "ja"]:
        msgs = []
        for mo in sorted(glob.glob(f"/usr/share/locale/{lang}/LC_MESSAGES/*.mo"))[:40]:
            try:
                with open(mo, "rb") as f:
                    cat = gettext.GNUTranslations(f)._catalog
            except Exception:
                continue
            for k in sorted(cat, key=lambda x: str(x)):
                v = cat[k]
                if isinstance(v, str) and v.strip():
                    msgs.append(v.encode("utf-8"))
        langs[lang] = msgs
    return langs


def made_up(rng):
    def cps(lo, hi, n):
        return "".join(chr(rng.randint(lo, hi)) for _ in range(n))

    kinds = [
        lambda: "".join(rng.choice(["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇩🇪", "🇯🇵", "❤️", "🏳️‍🌈", "🤖", "🧑🏿‍💻", "✨"]) for _ in range(rng.randint(1, 12))),
        lambda: cps(0x1D400, 0x1D7FF, rng.randint(1, 20)) + " " + cps(0x20000, 0x2A6DF, rng.randint(1, 20)),
        lambda: cps(0x1F300, 0x1FAFF, rng.randint(1, 30)),
        lambda: "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40))),
        lambda: "v" + ".".join(str(rng.randint(0, 999)) for _ in range(3)) + " 3.14159 -42 1,000,000 0x7fff 1e-9 ²³½ ١٢٣ ४५६",
        lambda: "".join(rng.choice([" ", "  ", "\t", "\n", "\r\n", "\n\n\n", "\u00a0", "\u3000", "\u0085", "\u2028", "\u2029", "\u200b", "\ufeff", "\x0b", "\x0c"]) for _ in range(rng.randint(1, 30))),
        lambda: rng.choice(["e\u0301", "a\u0308", "\u1100\u1161\u11a8", "ﬁ", "①", "ｆｕｌｌｗｉｄｔｈ", "Å", "Ω", "ǅ", "ẛ\u0323", "カ\u3099", "ﾊﾟ"]) * rng.randint(1, 5),
        lambda: rng.choice(["It'S", "DON'T", "we'LL", "you'Re", "I'M", "she'D", "they'VE", "'ſ", "'s's", "''s", "'", "it’s"]) + " ",
        lambda: rng.choice(["a", " ", "-", "=", "\n", "ab1", "日本", "🙂"]) * rng.randint(60, 3000),
        lambda: "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(rng.randint(100, 2000))),
        lambda: "Grüße aus Köln: Straße, Maß, Fußgängerübergänge; ÄÖÜ äöü ß ẞ.",
        lambda: rng.choice(["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>user<|end_header_id|>",
                            "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<s>", "</s>", "<unk>", "<|endoftext", "<|im_start",
                            " <|endoftext|> ", "x<|endoftext|>y", "<|endoftext|><|endoftext|>", "<<|im_end|>>", "<tool_call>"]),
    ]
    return rng.choice(kinds)().encode("utf-8")


def invalid(rng):
    return rng.choice([b"\xff", b"\xfe\xff", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\xc0\xaf",
                       b"\xe0\x80\x80", b"\xf4\x90\x80\x80", b"\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xc3(", b"a\xc2"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--mb", type=float, default=6.0)
    ap.add_argument("--jsonl")
    a = ap.parse_args()
    rng = random.Random(20240549)
    en, src, cat = english(), code(), catalogs()
    foreign = [m for lang in sorted(cat) for m in cat[lang]]
    if not foreign:
        foreign = ["Grüße. 日本語のテキストです。中文文本。".encode("utf-8")]
    target = int(a.mb * 1e6)
    docs, total = [], 0
    while total < target:
        parts = []
        size = rng.choice([0, 50, 400, 2000, 8000, 30000])
        n = 0
        while n < size:
            k = rng.random()
            if k < 0.30:
                p = rng.choice(en)
            elif k < 0.45:
                c = rng.choice(src)
                i = rng.randint(0, max(0, len(c) - 3000))
                p = c[i:i + rng.randint(200, 3000)]
            elif k < 0.70:
                p = rng.choice(foreign)
            elif k < 0.97:
                p = made_up(rng)
            else:
                p = invalid(rng)
            parts.append(p)
            parts.append(rng.choice([b" ", b"\n", b"\n\n", b"", b" ", b"  "]))
            n += len(p)
        d = b"".join(parts)
        docs.append(d)
        total += len(d)
    with open(a.out, "wb") as f:
        for d in docs:
            f.write(struct.pack("<I", len(d)))
            f.write(d)
    if a.jsonl:
        with open(a.jsonl, "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d.decode("utf-8", errors="replace")}, ensure_ascii=False) + "\n")
    print(f"{len(docs)} documents, {total} bytes")


if __name__ == "__main__":
    main()
