#!/usr/bin/python3
"""Builds a WARC (gzip member per record) of real HTML that Debian ships, for the
language filter of `mtnlg data extract`:

  * English: HTML manuals under /usr/share/doc with real prose (at least 5 <p> and
    3,000 characters of text), and English man pages rendered by groff -Thtml;
  * other languages: man pages from /usr/share/man/<lang>/man1 rendered by groff -Thtml
    (de, fr, es, it, pl, pt, nl, sv, ...).

    debian_pages_warc.py OUT.warc.gz      (also writes OUT.warc.gz.json: the URLs by group)
"""
import glob
import gzip
import hashlib
import html
import io
import json
import os
import re
import subprocess
import sys


def member(data):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as g:
        g.write(data)
    return buf.getvalue()


def record(url, body, n):
    payload = b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\r\n" + body
    head = (f"WARC/1.1\r\nWARC-Type: response\r\nWARC-Date: 2024-03-03T12:00:00Z\r\n"
            f"WARC-Record-ID: <urn:uuid:debian-{n:08d}>\r\nWARC-Target-URI: {url}\r\n"
            f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(payload)}\r\n\r\n")
    return head.encode() + payload + b"\r\n\r\n"


def render_man(path):
    """groff's text rendering (groff-base has no html device) as HTML: section names
    become <h2>, blank-line separated paragraphs become <p>."""
    try:
        src = subprocess.run(["zcat", path], capture_output=True, timeout=20).stdout
        out = subprocess.run(["groff", "-Tutf8", "-mandoc", "-Kutf8", "-P-cbou", "-rLL=160n"], input=src,
                             capture_output=True, timeout=30)
    except Exception:
        return None
    if out.returncode != 0:
        return None
    text = out.stdout.decode("utf-8", "replace")
    parts, para = [], []
    for line in text.splitlines() + [""]:
        if not line.strip():
            if para:
                parts.append("<p>" + html.escape(" ".join(x.strip() for x in para)) + "</p>")
                para = []
        elif not line.startswith(" ") and line.strip().upper() == line.strip():
            parts.append("<h2>" + html.escape(line.strip()) + "</h2>")
        else:
            para.append(line)
    body = "\n".join(parts)
    if len(text.split()) < 300:
        return None
    name = os.path.basename(path)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{name}</title></head>"
            f"<body><h1>{name}</h1>{body}</body></html>").encode()


ENGLISH = set("the and of to a in is that for it with as be by this are or not on if from".split())


def mostly_english(page):
    words = re.sub(r"<[^>]+>", " ", page.decode("utf-8", "replace")).lower().split()
    return sum(w in ENGLISH for w in words) > 0.08 * max(1, len(words))


def main():
    out = sys.argv[1]
    seen, english, other, members = set(), [], [], []
    for path in sorted(glob.glob("/usr/share/doc/**/*.html", recursive=True)):
        if not os.path.isfile(path) or os.path.basename(path).startswith("API"):  # symbol indexes, not prose
            continue
        data = open(path, "rb").read()
        h = hashlib.sha1(data).hexdigest()
        if h in seen:
            continue
        prose = " ".join(re.findall(r"<p[ >].*?</p>", data.decode("utf-8", "replace"), re.S | re.I))
        prose = " ".join(re.sub(r"<[^>]+>", " ", prose).split())
        if data.lower().count(b"<p") < 5 or len(prose) < 3000:
            continue
        seen.add(h)
        english.append(("file://" + path, data))
        if len(english) >= 20:
            break
    for name in ["ls", "cp", "tar", "grep", "find", "bash", "gzip", "sed"]:
        for path in glob.glob(f"/usr/share/man/man1/{name}.1.gz"):
            html = render_man(path)
            if html:
                english.append(("man:" + path, html))
    for path in sorted(glob.glob("/usr/share/man/[a-z][a-z]/man1/*.1.gz")):
        lang = path.split("/")[4]
        if lang in ("ja", "ko", "zh") or sum(1 for u, _ in other if f"/{lang}/" in u) >= 3:
            continue
        html = render_man(path)
        # A translation that left most of the page in English is not an "other language" page.
        if html and not mostly_english(html):
            other.append(("man:" + path, html))
        if len(other) >= 24:
            break
    n = 0
    for url, body in english + other:
        n += 1
        members.append(member(record(url, body, n)))
    with open(out, "wb") as f:
        f.write(b"".join(members))
    with open(out + ".json", "w") as f:
        json.dump({"english": [u for u, _ in english], "other": [u for u, _ in other]}, f, indent=1)
    print(f"{len(english)} English pages, {len(other)} in other languages -> {out}")


if __name__ == "__main__":
    main()
