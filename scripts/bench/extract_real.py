#!/usr/bin/python3
"""`mtnlg data extract` on real web pages, beside readability-lxml and Readability.js.

    extract_real.py prepare --out DIR [--trafilatura CHECKOUT] [--dragnet CHECKOUT] [--gn1 CHECKOUT]
                            [--parts tune,heldout] [--limit N] [--strip-scripts]
        Builds the page sets from checkouts made beforehand (nothing is downloaded):
          traf     adbar/trafilatura's evaluation pages (tests/evaldata.json with the files
                   under tests/eval/ and tests/cache/; Apache-2.0): per page, segments the
                   main text must hold ("with") and segments it must not ("without").
                   The pages whose file is named by a 32-hex-digit id are left out (their
                   origin is not stated, and another public benchmark's pages may be
                   among them).
          dragnet  the Dragnet pages (seomoz/dragnet_data, AGPLv3; as unpacked in
                   j-szulc/html-cleaning-dataset-merged: dragnet_data/input/N.html with
                   dragnet_data/GoldStandard/N.txt, or seomoz's own HTML/ and Corrected/):
                   the hand-cleaned article text (what follows the comment marker cut).
          gn1      L3S-GN1 (Kohlschuetter et al., boilerpipe, WSDM 2010; 621 news articles
                   from Google News, 2008), as mirrored in j-szulc/html-cleaning-dataset-merged
                   (page-signal-master/input/ID.html with the annotated page under
                   GoldStandard/ID.txt) or as published (original/ and annotated/): the text
                   labelled headline, full text or supplemental (x-nc-sel1 to 3, the labels
                   the web-content-extraction-benchmark scores against). No tuning part: all
                   621 pages are `heldout`, a set no rule was written against.
        Each set is split by a hash of the file name into `tune` (rules are tuned on it) and
        `heldout` (scored only), and written as DIR/SET-PART.warc.gz (one HTTP 200
        text/html response per page, the page's bytes as they are) and
        DIR/SET-PART_truth.jsonl, pages in the order of the hash. --limit keeps the first N
        pages of each part; --strip-scripts empties <script> and <style> elements (what
        no extractor here reads: the committed test subset is half the size).
    extract_real.py score --dir DIR [--part heldout] [--sets traf,dragnet]
                          [--ours SET=JSONL ...] [--mtnlg build/mtnlg] [--peers lxml,js]
                          [--min-f1 SET=F ...] [--per-page] [--npm DIR]
                          [--peer-cache DIR]
        Runs `mtnlg data extract --languages all` on each set (or reads --ours) and the
        peers on the same bytes, and prints one table: per set, the metric, precision,
        recall, F1, pages without output, and each peer's F1 with mtnlg's ratio to it.
        traf: trafilatura's own measure (pooled over pages: a "with" segment found is a
        true positive, a "without" segment found a false positive, both after whitespace
        is collapsed; F1 = 2tp / (2tp + fp + fn)), the measure of its published table.
        dragnet, gn1: 4-gram shingle F1 per page (lower-cased \\w+ tokens, multiset overlap of
        4-token shingles; a text under 4 tokens is one shingle), averaged over pages.
        Exits 1 when mtnlg's F1 on a set is under its --min-f1.

Readability.js: @mozilla/readability with linkedom, from --npm DIR (node_modules/ there;
default $MTNLG_NPM_TOOLS_DIR or ~/.cache/mtnlg/npm-tools); skipped with a note when absent.
"""
import argparse
import collections
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile

WORD = re.compile(r"\w+", re.UNICODE)
HEX_NAME = re.compile(r"[0-9a-f]{32}\.html")
SCRIPT = re.compile(rb"(<(script|style)\b[^>]*>).*?(</\2\s*>)", re.I | re.S)


def part_of(name):
    """'tune' or 'heldout': the low bit of the first byte of sha256(file name)."""
    return "heldout" if hashlib.sha256(name.encode()).digest()[0] & 1 else "tune"


def warc_record(n, url, body):
    block = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n" + body
    head = (f"WARC/1.1\r\nWARC-Type: response\r\nWARC-Record-ID: <urn:real:{n}>\r\n"
            f"WARC-Target-URI: {url}\r\nWARC-Date: 2024-01-01T00:00:00Z\r\n"
            f"Content-Length: {len(block)}\r\n\r\n").encode()
    return head + block + b"\r\n\r\n"


def traf_pages(root):
    with open(os.path.join(root, "tests", "evaldata.json"), encoding="utf-8") as f:
        data = json.load(f)
    for url in sorted(data):
        item = data[url]
        name = item["file"]
        if HEX_NAME.fullmatch(name):
            continue
        for sub in ("cache", "eval"):
            path = os.path.join(root, "tests", sub, name)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    yield name, url, f.read(), {"with": item["with"], "without": item["without"]}
                break


def mirror_pairs(base):
    """(name, page, truth) paths of j-szulc/html-cleaning-dataset-merged's layout: input/N.html
    with GoldStandard/N.txt."""
    return [(n, os.path.join(base, "input", n), os.path.join(base, "GoldStandard", n[:-5] + ".txt"))
            for n in os.listdir(os.path.join(base, "input")) if n.endswith(".html")]


def read_pairs(pairs):
    """(name, page bytes, truth bytes) of each (name, page, truth) whose truth file exists,
    by name."""
    for name, html, gold in sorted(pairs):
        if not os.path.isfile(gold):
            continue
        with open(html, "rb") as f:
            body = f.read()
        with open(gold, "rb") as f:
            yield name, body, f.read()


def dragnet_pages(root):
    base = os.path.join(root, "dragnet_data")
    if os.path.isdir(os.path.join(base, "input")):
        pairs = mirror_pairs(base)
    else:
        pairs = [(n, os.path.join(root, "HTML", n), os.path.join(root, "Corrected", n + ".corrected.txt"))
                 for n in os.listdir(os.path.join(root, "HTML")) if n.endswith(".html")]
    for name, body, raw in read_pairs(pairs):  # raw: UTF-8, a few files UTF-16 with a byte-order mark
        text = raw.decode("utf-16" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-8-sig", "replace")
        text = text.split("!@#$", 1)[0]
        if body.startswith(b"URL"):  # seomoz's files open with the page's URL on a line
            body = body.split(b"\n", 1)[-1]
        stem = re.sub(r"[^a-z0-9]+", "-", name[:-5].lower())
        yield name, f"http://dragnet-{stem}.invalid/page.html", body, {"text": text}


GN1_WANTED = re.compile(r"\bx-nc-sel[123]\b")
GN1_LABEL = re.compile(r"\bx-nc-sel[0-9]\b")
GN1_BLOCKS = {"address", "article", "aside", "blockquote", "br", "dd", "div", "dl", "dt", "figcaption",
              "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "li", "main", "nav",
              "ol", "p", "pre", "section", "table", "td", "th", "tr", "ul"}


def gn1_truth(annotated):
    """The text of an L3S-GN1 annotated page under the labels x-nc-sel1-3 (headline, full text,
    supplemental: what the web-content-extraction-benchmark takes as its truth); each text node
    counts for the nearest element that carries a label."""
    from lxml import html as lxml_html
    root = lxml_html.fromstring(decode(annotated))
    out = []

    def walk(el, keep):
        if not isinstance(el.tag, str) or el.tag in ("script", "style", "head", "title"):
            return
        m = GN1_LABEL.search(el.get("class") or "")
        if m:
            keep = bool(GN1_WANTED.search(m.group(0)))
        if el.tag in GN1_BLOCKS:
            out.append("\n")
        if keep and el.text:
            out.append(el.text)
        for child in el:
            walk(child, keep)
            if keep and child.tail:
                out.append(child.tail)
        if el.tag in GN1_BLOCKS:
            out.append("\n")

    walk(root, False)
    return re.sub(r"[ \t\r\f\v]*\n\s*", "\n", "".join(out)).strip()


def gn1_pages(root):
    base = os.path.join(root, "page-signal-master")
    if os.path.isdir(os.path.join(base, "input")):  # as in j-szulc/html-cleaning-dataset-merged
        pairs = mirror_pairs(base)
    else:  # L3S-GN1 as published: original/ and annotated/
        pairs = [(n, os.path.join(root, "original", n), os.path.join(root, "annotated", n))
                 for n in os.listdir(os.path.join(root, "original")) if n.endswith(".html")]
    for name, body, raw in read_pairs(pairs):
        text = gn1_truth(raw)
        yield name, f"http://gn1-{name[:-5].lower()}.invalid/page.html", body, {"text": text}


def prepare(a):
    os.makedirs(a.out, exist_ok=True)
    sources = {"traf": (a.trafilatura, traf_pages), "dragnet": (a.dragnet, dragnet_pages),
               "gn1": (a.gn1, gn1_pages)}
    for set_name, (root, pages) in sources.items():
        if not root:
            continue
        parts = ["heldout"] if set_name == "gn1" else a.parts.split(",")
        out = {p: (io.BytesIO(), []) for p in parts}
        chosen = sorted(pages(root), key=lambda page: hashlib.sha256(page[0].encode()).digest())
        taken = collections.Counter()
        for n, (name, url, body, truth) in enumerate(chosen, 1):
            part = "heldout" if set_name == "gn1" else part_of(name)  # gn1: no tuning part
            if part not in out or (a.limit and taken[part] >= a.limit):
                continue
            taken[part] += 1
            if a.strip_scripts:
                body = SCRIPT.sub(rb"\1\3", body)
            warc, rows = out[part]
            warc.write(warc_record(n, url, body))
            rows.append(dict(truth, warc_record_id=f"<urn:real:{n}>", url=url, file=name))
        for part, (warc, rows) in out.items():
            stem = os.path.join(a.out, f"{set_name}-{part}")
            with gzip.GzipFile(stem + ".warc.gz", "wb", compresslevel=9, mtime=0) as f:  # the same bytes each run
                f.write(warc.getvalue())
            with open(stem + "_truth.jsonl", "w", encoding="utf-8") as f:
                for r in rows:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
            print(f"{set_name}-{part}: {len(rows)} pages, {os.path.getsize(stem + '.warc.gz')} bytes")
    return 0


def read_warc(path):
    """(record id, url, body) of every response record."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    pos = 0
    while True:
        start = data.find(b"WARC/1.", pos)
        if start < 0:
            return
        head_end = data.index(b"\r\n\r\n", start)
        headers = {}
        for line in data[start:head_end].split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            headers[k.strip().lower().decode()] = v.strip().decode("utf-8", "replace")
        n = int(headers["content-length"])
        block = data[head_end + 4: head_end + 4 + n]
        pos = head_end + 4 + n
        yield headers["warc-record-id"], headers["warc-target-uri"], block.partition(b"\r\n\r\n")[2]


def decode(body):
    """The page as a string for the peers that take one: BOM, <meta> charset, UTF-8, cp1252."""
    if body.startswith(b"\xef\xbb\xbf"):
        return body[3:].decode("utf-8", "replace")
    m = re.search(rb"<meta[^>]+charset=[\"']?([A-Za-z0-9_.:-]+)", body[:4096], re.I)
    if m:
        try:
            return body.decode(m.group(1).decode(), "replace")
        except LookupError:
            pass
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return body.decode("cp1252", "replace")


BLOCK_END = re.compile(r"(</(p|div|h[1-6]|li|tr|td|th|pre|blockquote|section|article|ul|ol|dl|dd|dt|table|"
                       r"figure|figcaption|header|footer)\s*>|<br\s*/?>)", re.I)

JS_PEER = r"""
const { Readability } = require("@mozilla/readability");
const { parseHTML } = require("linkedom");
const rl = require("readline").createInterface({ input: process.stdin, crlfDelay: Infinity });
const END = /(<\/(p|div|h[1-6]|li|tr|td|th|pre|blockquote|section|article|ul|ol|dl|dd|dt|table|figure|figcaption|header|footer)\s*>|<br\s*\/?>)/gi;
rl.on("line", (line) => {
  const page = JSON.parse(line);
  let text = "";
  try {
    const { document } = parseHTML(page.html);
    const art = new Readability(document).parse();
    if (art && art.content) text = parseHTML("<html><body>" + art.content.replace(END, "$&\n") + "</body></html>").document.body.textContent;
  } catch (e) { text = ""; }
  process.stdout.write(JSON.stringify({ id: page.id, text }) + "\n");
});
"""


def lxml_texts(pages):
    from lxml import html as lxml_html
    from readability import Document
    out = {}
    for rid, _, body in pages:
        try:
            summary = Document(body).summary(html_partial=True)
            out[rid] = lxml_html.fromstring(BLOCK_END.sub(r"\1\n", summary)).text_content()
        except Exception:  # readability raises on pages it finds empty
            out[rid] = ""
    return out


def js_texts(pages, npm):
    modules = os.path.join(npm, "node_modules")
    if not os.path.isdir(os.path.join(modules, "@mozilla", "readability")):
        print(f"note: Readability.js skipped (no @mozilla/readability under {modules})", file=sys.stderr)
        return None
    feed = "".join(json.dumps({"id": rid, "url": url, "html": decode(body)}) + "\n" for rid, url, body in pages)
    env = dict(os.environ, NODE_PATH=modules)
    r = subprocess.run(["node", "-e", JS_PEER], input=feed.encode(), capture_output=True, env=env, check=True)
    return {d["id"]: d["text"] for d in map(json.loads, r.stdout.decode().split("\n")[:-1])}


def mtnlg_texts(binary, warc):
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([binary, "data", "extract", "--no-progress", "--skip-bad-records", "--languages", "all",
                        "--input", warc, "--output", tmp], check=True, stdout=subprocess.DEVNULL)
        stem = os.path.basename(warc).split(".")[0]
        with open(os.path.join(tmp, stem + ".jsonl"), encoding="utf-8") as f:
            return {d["warc_record_id"]: d["text"] for d in map(json.loads, f)}


def norm(text):
    return re.sub(r"\s+", " ", text).strip()


def segment_counts(got, truth):
    """(tp, fp, fn): trafilatura's measure on one page."""
    g = norm(got)
    tp = sum(norm(w) in g for w in truth["with"]) if g else 0
    fp = sum(norm(w) in g for w in truth["without"]) if g else 0
    return tp, fp, len(truth["with"]) - tp


def shingles(text, n=4):
    toks = [w.lower() for w in WORD.findall(text)]
    if len(toks) < n:
        return collections.Counter([tuple(toks)] if toks else [])
    return collections.Counter(tuple(toks[i:i + n]) for i in range(len(toks) - n + 1))


def shingle_prf(got, want):
    g, w = shingles(got), shingles(want)
    if not w:
        return (1.0, 1.0, 1.0) if not g else (0.0, 1.0, 0.0)
    overlap = sum((g & w).values())
    if not overlap:
        return 0.0, 0.0, 0.0
    p, r = overlap / sum(g.values()), overlap / sum(w.values())
    return p, r, 2 * p * r / (p + r)


def set_score(kind, texts, truth, per_page=None):
    """(precision, recall, F1, pages without output) of one extractor on one set."""
    empty = sum(1 for rid in truth if not WORD.search(texts.get(rid, "")))
    if kind == "traf":
        tp = fp = fn = 0
        for rid, t in truth.items():
            a, b, c = segment_counts(texts.get(rid, ""), t)
            tp, fp, fn = tp + a, fp + b, fn + c
            if per_page is not None and (b or c):
                per_page.append(f"{t['file']}: {c} of {len(t['with'])} missing, {b} unwanted")
        p, r = tp / (tp + fp) if tp + fp else 0.0, tp / (tp + fn) if tp + fn else 0.0
        return p, r, (2 * tp / (2 * tp + fp + fn) if tp else 0.0), empty
    sums = [0.0, 0.0, 0.0]
    for rid, t in truth.items():
        s = shingle_prf(texts.get(rid, ""), t["text"])
        sums = [x + y for x, y in zip(sums, s)]
        if per_page is not None and s[2] < 0.9:
            per_page.append(f"{t['file']}: P {s[0]:.3f} R {s[1]:.3f} F1 {s[2]:.3f}")
    n = max(len(truth), 1)
    return sums[0] / n, sums[1] / n, sums[2] / n, empty


def score(a):
    ours = dict(x.split("=", 1) for x in a.ours)
    floors = {k: float(v) for k, v in (x.split("=", 1) for x in a.min_f1)}
    peers = [p for p in a.peers.split(",") if p]
    print(f"{'set':<16} {'pages':>5} {'measure':<16} | {'mtnlg P':>7} {'R':>6} {'F1':>6} {'empty':>5}"
          + "".join(f" | {p + ' F1':>10} {'empty':>5} {'ratio':>6}" for p in peers))
    failed = False
    for s in a.sets.split(","):
        stem = os.path.join(a.dir, f"{s}-{a.part}")
        with open(stem + "_truth.jsonl", encoding="utf-8") as f:
            truth = {t["warc_record_id"]: t for t in map(json.loads, f)}
        pages = [p for p in read_warc(stem + ".warc.gz") if p[0] in truth]
        texts = {"mtnlg": (lambda: json_texts(ours[s])) if s in ours else (lambda: mtnlg_texts(a.mtnlg, stem + ".warc.gz"))}
        texts["lxml"] = cached(a.peer_cache, f"{s}-{a.part}-lxml", lambda: lxml_texts(pages))
        texts["js"] = cached(a.peer_cache, f"{s}-{a.part}-js", lambda: js_texts(pages, a.npm))
        kind = "traf" if s.startswith("traf") else "shingle"
        notes = [] if a.per_page else None
        p, r, f1, empty = set_score(kind, texts["mtnlg"](), truth, notes)
        row = f"{s + '-' + a.part:<16} {len(truth):>5} {'segments' if kind == 'traf' else '4-gram shingles':<16} | {p:>7.3f} {r:>6.3f} {f1:>6.3f} {empty:>5}"
        for peer in peers:
            got = texts[peer]()
            if got is None:
                row += f" | {'-':>10} {'-':>5} {'-':>6}"
                continue
            _, _, pf1, pempty = set_score(kind, got, truth)
            row += f" | {pf1:>10.3f} {pempty:>5} {f1 / pf1 if pf1 else 0:>5.3f}x"
        print(row, flush=True)
        for line in notes or []:
            print("  " + line)
        if f1 < floors.get(s, 0.0):
            print(f"FAIL: mtnlg F1 {f1:.3f} on {s}-{a.part} is under {floors[s]}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


def cached(folder, name, run):
    """run, its result kept as FOLDER/NAME.json (a peer's output does not change between runs)."""
    def get():
        path = os.path.join(folder, name + ".json") if folder else None
        if path and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        got = run()
        if path and got is not None:
            os.makedirs(folder, exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(got, f)
        return got
    return get


def json_texts(path):
    with open(path, encoding="utf-8") as f:
        return {d["warc_record_id"]: d["text"] for d in map(json.loads, f)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", required=True)
    p.add_argument("--trafilatura")
    p.add_argument("--dragnet")
    p.add_argument("--gn1")
    p.add_argument("--strip-scripts", action="store_true")
    p.add_argument("--parts", default="tune,heldout")
    p.add_argument("--limit", type=int, default=0, help="at most this many pages a part (the lowest hashes)")
    s = sub.add_parser("score")
    s.add_argument("--dir", required=True)
    s.add_argument("--part", default="heldout")
    s.add_argument("--sets", default="traf,dragnet")
    s.add_argument("--ours", action="append", default=[], metavar="SET=JSONL")
    s.add_argument("--mtnlg", default="build/mtnlg")
    s.add_argument("--peers", default="lxml,js")
    s.add_argument("--min-f1", action="append", default=[], metavar="SET=F")
    s.add_argument("--per-page", action="store_true")
    s.add_argument("--peer-cache", metavar="DIR", help="keep the peers' texts here and reuse them")
    s.add_argument("--npm", default=os.environ.get("MTNLG_NPM_TOOLS_DIR",
                                                   os.path.expanduser("~/.cache/mtnlg/npm-tools")))
    a = ap.parse_args()
    try:
        return prepare(a) if a.cmd == "prepare" else score(a)
    except (OSError, ValueError, KeyError, subprocess.CalledProcessError) as e:
        print(f"extract_real: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
