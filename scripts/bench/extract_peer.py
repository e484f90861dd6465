#!/usr/bin/python3
"""The peer of `mtnlg data extract`: readability-lxml (Debian python3-readability).

    extract_peer.py quality --warc W --truth T --ours OURS.jsonl [--min-f1 0.9]
                            [--allow-below-peer] [--per-page]
        Main-text token F1 against the known text of every English page of the truth
        file, for mtnlg's output (OURS.jsonl, matched by warc_record_id) and for
        readability on the same HTML; prints a table per template and overall (with
        --per-page also a line per page), and checks that mtnlg kept every English page,
        dropped every other one and kept the truth's `nonascii_words` (when it lists
        any). Exits 1 when a check fails or mtnlg's mean F1 is under --min-f1 or (unless
        --allow-below-peer) under readability's.
    extract_peer.py web --warc W --truth T --ours ALL.jsonl [--ours-en EN.jsonl]
                        [--min-f1 0.95] [--min-template-f1 0.90] [--comments] [--per-page] [--no-peer]
        The web page sets of scripts/make-extract-web.py: F1 on EVERY page (all languages;
        OURS from `--languages all`), per template and overall, beside readability's; a
        page whose gold text is empty (a listing page without an intro) scores 1 when
        nothing is extracted and 0 otherwise. With --ours-en (`--languages en` on the same
        WARC): every kept page must be English. --comments scores against
        `text_with_comments` (what --keep-comments gives); --no-peer skips readability (the
        test's way: mtnlg's bounds need only the standard library). Exits 1 when a bound or
        a check fails.
    extract_peer.py speed --warc W [--repeat N]
        Pages/s of readability (parse + main-content + text) on the response records of W,
        one core; prints one JSON line.

Token F1: words are lower-cased runs of letters and digits; precision and recall count
the multiset overlap of the extracted and the known words.
"""
import argparse
import collections
import gzip
import json
import re
import sys
import time

WORD = re.compile(r"\w+", re.UNICODE)


def read_warc(path):
    """(record id, HTTP body bytes) of every response record with status 200."""
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
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
            headers[k.strip().lower()] = v.strip()
        n = int(headers[b"content-length"])
        block = data[head_end + 4: head_end + 4 + n]
        pos = head_end + 4 + n
        if headers.get(b"warc-type") != b"response":
            continue
        hdr, _, body = block.partition(b"\r\n\r\n")
        if b" 200 " not in hdr.split(b"\r\n")[0] + b" " or b"text/html" not in hdr.lower():
            continue
        yield headers[b"warc-record-id"].decode(), body


def readability_text(body):
    from lxml import html as lxml_html  # imported here: `web --no-peer` needs neither
    from readability import Document
    doc = Document(body)
    summary = doc.summary(html_partial=True)
    return lxml_html.fromstring(summary).text_content()


def f1(got, want):
    g = collections.Counter(w.lower() for w in WORD.findall(got))
    w = collections.Counter(x.lower() for x in WORD.findall(want))
    overlap = sum((g & w).values())
    if overlap == 0:
        return 0.0, 0.0, 0.0
    p = overlap / sum(g.values())
    r = overlap / sum(w.values())
    return p, r, 2 * p * r / (p + r)


def quality(a):
    truth, others = {}, set()
    with open(a.truth) as f:
        for line in f:
            t = json.loads(line)
            if t.get("language", "en") == "en":
                truth[t["warc_record_id"]] = t
            else:
                others.add(t["warc_record_id"])
    ours = {}
    with open(a.ours) as f:
        for line in f:
            d = json.loads(line)
            ours[d["warc_record_id"]] = d["text"]
    problems = []
    problems += [f"English page dropped: {truth[r]['url']}" for r in truth if r not in ours]
    problems += [f"page in another language kept: {r}" for r in others if r in ours]
    for r, t in truth.items():
        for w in t.get("nonascii_words", []):
            if w not in ours.get(r, ""):
                problems.append(f"{t['url']}: '{w}' missing from the text")
    rows = collections.defaultdict(lambda: {"n": 0, "ours": [0.0, 0.0, 0.0], "peer": [0.0, 0.0, 0.0]})
    for rid, body in read_warc(a.warc):
        if rid not in truth:
            continue
        t = truth[rid]
        page = {}
        for key, got in (("ours", ours.get(rid, "")), ("peer", readability_text(body))):
            s = f1(got, t["text"])
            page[key] = s
            for row in (rows[t["template"]], rows["all"]):
                row[key] = [x + y for x, y in zip(row[key], s)]
        rows[t["template"]]["n"] += 1
        rows["all"]["n"] += 1
        if a.per_page:
            o, p = page["ours"], page["peer"]
            print(f"page {t['url']:<48} mtnlg P {o[0]:.3f} R {o[1]:.3f} F1 {o[2]:.3f} | readability F1 {p[2]:.3f}")
    print(f"{'template':<12} {'pages':>5} | {'mtnlg P':>7} {'R':>6} {'F1':>6} | {'readability P':>13} {'R':>6} {'F1':>6}")
    for name in sorted(k for k in rows if k != "all") + ["all"]:
        r = rows[name]
        n = r["n"]
        o = [x / n for x in r["ours"]]
        p = [x / n for x in r["peer"]]
        print(f"{name:<12} {n:>5} | {o[0]:>7.3f} {o[1]:>6.3f} {o[2]:>6.3f} | {p[0]:>13.3f} {p[1]:>6.3f} {p[2]:>6.3f}")
    n = rows["all"]["n"]
    ours_f1 = rows["all"]["ours"][2] / n
    peer_f1 = rows["all"]["peer"][2] / n
    print(json.dumps({"pages": n, "mtnlg_f1": round(ours_f1, 4), "readability_f1": round(peer_f1, 4),
                      "english_kept": sum(r in ours for r in truth), "english": len(truth),
                      "others_kept": sum(r in ours for r in others), "others": len(others)}))
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    if n == 0 or ours_f1 < a.min_f1 or (ours_f1 < peer_f1 and not a.allow_below_peer):
        floor = "" if a.allow_below_peer else f" and >= readability's {peer_f1:.3f}"
        print(f"FAIL: mtnlg F1 {ours_f1:.3f} (needs >= {a.min_f1}{floor})", file=sys.stderr)
        return 1
    return 1 if problems else 0


def score(got, want):
    if not WORD.search(want):
        return (1.0, 1.0, 1.0) if not WORD.search(got) else (0.0, 0.0, 0.0)
    return f1(got, want)


def web(a):
    truth = {}
    with open(a.truth) as f:
        for line in f:
            t = json.loads(line)
            truth[t["warc_record_id"]] = t
    ours = {}
    with open(a.ours) as f:
        for line in f:
            d = json.loads(line)
            ours[d["warc_record_id"]] = d["text"]
    problems = []
    if a.ours_en:
        with open(a.ours_en) as f:
            for line in f:
                d = json.loads(line)
                t = truth.get(d["warc_record_id"])
                if t and t["language"] != "en":
                    problems.append(f"{t['url']} ({t['language']}, cookie banner in {t['cookie_language']}) kept as English")
    key = "text_with_comments" if a.comments else "text"
    rows = collections.defaultdict(lambda: {"n": 0, "ours": [0.0, 0.0, 0.0], "peer": [0.0, 0.0, 0.0]})
    for rid, body in read_warc(a.warc):
        if rid not in truth:
            continue
        t = truth[rid]
        try:
            peer = "" if a.no_peer else readability_text(body)
        except Exception:  # readability raises on documents it finds empty
            peer = ""
        page = {}
        for k, got in (("ours", ours.get(rid, "")), ("peer", peer)):
            s = score(got, t[key])
            page[k] = s
            for row in (rows[t["template"]], rows["lang:" + t["language"]], rows["all"]):
                row[k] = [x + y for x, y in zip(row[k], s)]
        for row in (rows[t["template"]], rows["lang:" + t["language"]], rows["all"]):
            row["n"] += 1
        if a.per_page:
            o, p = page["ours"], page["peer"]
            print(f"page {t['url']:<52} {t['language']} mtnlg P {o[0]:.3f} R {o[1]:.3f} F1 {o[2]:.3f} | readability F1 {p[2]:.3f}")
    print(f"{'template':<12} {'pages':>5} | {'mtnlg P':>7} {'R':>6} {'F1':>6} | {'readability P':>13} {'R':>6} {'F1':>6}")
    names = sorted(k for k in rows if k != "all" and not k.startswith("lang:"))
    names += sorted(k for k in rows if k.startswith("lang:")) + ["all"]
    result = {}
    for name in names:
        r = rows[name]
        n = r["n"]
        o = [x / n for x in r["ours"]]
        p = [x / n for x in r["peer"]]
        result[name] = (o[2], p[2])
        print(f"{name:<12} {n:>5} | {o[0]:>7.3f} {o[1]:>6.3f} {o[2]:>6.3f} | {p[0]:>13.3f} {p[1]:>6.3f} {p[2]:>6.3f}")
    n = rows["all"]["n"]
    ours_f1, peer_f1 = result["all"]
    print(json.dumps({"pages": n, "mtnlg_f1": round(ours_f1, 4), "readability_f1": round(peer_f1, 4),
                      "min_template_f1": round(min(result[k][0] for k in result if k != "all" and not k.startswith("lang:")), 4)}))
    if n == 0 or ours_f1 < a.min_f1:
        problems.append(f"mtnlg F1 {ours_f1:.3f} overall (needs >= {a.min_f1})")
    for k, (o, _) in result.items():
        if k != "all" and not k.startswith("lang:") and o < a.min_template_f1:
            problems.append(f"mtnlg F1 {o:.3f} on template {k} (needs >= {a.min_template_f1})")
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    return 1 if problems else 0


def speed(a):
    pages = [body for _, body in read_warc(a.warc)]
    t0 = time.perf_counter()
    chars = 0
    for _ in range(a.repeat):
        for body in pages:
            try:
                chars += len(readability_text(body))
            except Exception:  # readability raises on empty documents
                pass
    dt = time.perf_counter() - t0
    n = len(pages) * a.repeat
    print(json.dumps({"pages": n, "seconds": round(dt, 3), "pages_per_s": round(n / dt, 1), "chars": chars}))
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--warc", required=True)
    q.add_argument("--truth", required=True)
    q.add_argument("--ours", required=True)
    q.add_argument("--min-f1", type=float, default=0.9)
    q.add_argument("--allow-below-peer", action="store_true")
    q.add_argument("--per-page", action="store_true")
    w = sub.add_parser("web")
    w.add_argument("--warc", required=True)
    w.add_argument("--truth", required=True)
    w.add_argument("--ours", required=True)
    w.add_argument("--ours-en")
    w.add_argument("--min-f1", type=float, default=0.95)
    w.add_argument("--min-template-f1", type=float, default=0.90)
    w.add_argument("--comments", action="store_true")
    w.add_argument("--per-page", action="store_true")
    w.add_argument("--no-peer", action="store_true", help="skip readability (its columns read 0)")
    s = sub.add_parser("speed")
    s.add_argument("--warc", required=True)
    s.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    return {"quality": quality, "web": web, "speed": speed}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
