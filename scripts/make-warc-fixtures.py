#!/usr/bin/python3
"""Writes the WARC test fixtures of `mtnlg data extract` into test/fixtures/warc/.

Everything here is generated (no network, no copied pages): English main texts from a
seeded sentence grammar, wrapped in four boilerplate page templates (menus, link lists,
sidebars, cookie banners, newsletter boxes, footers); short German and French pages;
charset cases (Latin-1, Windows-1252, Shift-JIS, undeclared Latin-1, UTF-8 with BOM);
a WET file; malformed files (truncated block, missing Content-Length, gzip member cut
short, corrupt gzip member, oversize record, unknown encoding, bad HTTP); and 16 more English
pages in the same templates whose articles hold short-line structures (key-value runs,
lists, tables, definition lists, dialogue, a contact block, a repeated-sentence opening).
The known main text of every page is in pages_truth.jsonl / charsets_truth.jsonl /
structured_truth.jsonl. These are the pages the block classifier is tuned on; it is
measured on the separate pages of scripts/make-extract-eval.py. Deterministic: the
same bytes on every run (gzip mtime 0, fixed dates and record ids).

    /usr/bin/python3 scripts/make-warc-fixtures.py [OUT_DIR]
"""
import gzip
import io
import json
import os
import random
import sys
import zlib

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "test", "fixtures", "warc")
rng = random.Random(28)

NOUNS = ["river", "village", "engineer", "library", "harvest", "museum", "teacher", "bridge", "garden", "council",
         "market", "painter", "railway", "harbour", "orchard", "student", "festival", "workshop", "archive", "valley",
         "kitchen", "factory", "island", "forest", "lantern", "journey", "neighbour", "recipe", "machine", "season"]
ADJS = ["quiet", "old", "busy", "narrow", "bright", "careful", "famous", "small", "patient", "modern", "simple",
        "generous", "steady", "curious", "practical", "remote", "crowded", "gentle", "useful", "ordinary"]
VERBS = ["opened", "repaired", "visited", "described", "changed", "measured", "rebuilt", "studied", "painted",
         "crossed", "planned", "recorded", "explained", "followed", "collected", "welcomed", "protected", "shared"]
PLACES = ["in the spring", "after the long winter", "before the first train", "at the end of the street",
          "during the summer fair", "on the north side of the town", "for most of the year", "by the old mill"]
TEMPLATES = [
    "The {a} {n} was {v} by the {n2} {p}, and nobody in the {n3} was surprised by it.",
    "When the {n} {v} the {n2}, it was clear that the {a} {n3} would have to wait a little longer.",
    "Most of the people who {v} the {n} {p} said that it was more {a} than they had expected.",
    "It is not easy to explain why the {n2} is so {a}, but there are a few reasons that most of us agree on.",
    "A {a} {n} can be found near the {n2}, where it has been {v} by each new {n3} since then.",
    "They {v} the {n} with the help of a {a} {n2}, which made the work much easier for all of them.",
    "If you ask the {n3} about the {n}, he will tell you that it was {v} {p} and that it is still {a}.",
    "There were many {n}s in the {n2}, and each of them had been {v} by someone from the {a} {n3}.",
    "Over the years the {n} has become one of the most {a} places in the {n2}, and it is easy to see why.",
    "We {v} the {a} {n} twice, once {p} and once when the {n2} was nearly empty.",
]


def sentence():
    t = rng.choice(TEMPLATES)
    s = t.format(a=rng.choice(ADJS), n=rng.choice(NOUNS), n2=rng.choice(NOUNS), n3=rng.choice(NOUNS),
                 v=rng.choice(VERBS), p=rng.choice(PLACES))
    return s[0].upper() + s[1:]


def paragraph(k):
    return " ".join(sentence() for _ in range(k))


GERMAN = [
    "Die kleine Stadt am Fluss hat im letzten Jahr eine neue Bibliothek bekommen, und die meisten Leute sind sehr zufrieden damit.",
    "Jeden Morgen gehen die Kinder über die alte Brücke zur Schule, während die Händler auf dem Markt ihre Stände aufbauen.",
    "Im Sommer kommen viele Besucher, weil das Museum eine Ausstellung über die Geschichte der Eisenbahn zeigt.",
    "Der Gemeinderat hat beschlossen, dass der Garten hinter dem Rathaus für alle Bürger geöffnet werden soll.",
    "Wer die Gegend kennenlernen möchte, sollte einen ganzen Tag einplanen und mit dem Fahrrad durch das Tal fahren.",
]
FRENCH = [
    "Le petit village au bord de la rivière a ouvert une nouvelle bibliothèque, et les habitants en sont très contents.",
    "Chaque matin, les enfants traversent le vieux pont pour aller à l'école pendant que les marchands installent leurs étals.",
    "En été, beaucoup de visiteurs viennent parce que le musée présente une exposition sur l'histoire du chemin de fer.",
    "Le conseil municipal a décidé que le jardin derrière la mairie serait ouvert à tous les habitants.",
    "Pour bien connaître la région, il faut prévoir une journée entière et traverser la vallée à vélo.",
]

MENU = ["Home", "News", "Sport", "Culture", "Travel", "Opinion", "About us", "Contact"]


def links(items, cls=None):
    c = f' class="{cls}"' if cls else ""
    return f"<ul{c}>" + "".join(f'<li><a href="/{x.lower().replace(" ", "-")}">{x}</a></li>' for x in items) + "</ul>"


def related():
    return [f"{rng.choice(ADJS).capitalize()} {rng.choice(NOUNS)} {rng.choice(['reopens', 'wins award', 'in pictures', 'explained'])}"
            for _ in range(6)]


def page_blog(title, paras, raw=None):
    body = raw if raw is not None else "".join(f"<p>{p}</p>" for p in paras)
    return f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title} | The Town Blog</title>
<style>body{{font-family:serif}}</style><script>var track = 1;</script></head><body>
<div class="cookie-banner">We use cookies to give you the best experience on our website. By continuing to browse the site you are agreeing to our use of cookies. <a href="/privacy">Learn more</a> <button>Accept</button></div>
<header><a href="/" class="logo">The Town Blog</a><nav>{links(MENU)}</nav></header>
<main><article><h1>{title}</h1><p class="byline">Posted by <a href="/author/kim">Kim</a> on 3 March 2024</p>
{body}</article>
<aside class="sidebar"><h3>Popular posts</h3>{links(related())}</aside></main>
<div class="newsletter"><h3>Newsletter</h3><p>Subscribe to our newsletter to get the latest stories delivered to your inbox every week, free of charge.</p><form><input type="email"><button>Subscribe</button></form></div>
<footer><p>&copy; 2024 The Town Blog. All rights reserved.</p>{links(["Privacy policy", "Terms of use", "Cookie settings"])}</footer>
</body></html>"""


def page_news(title, paras, raw=None):
    # Layout by anonymous classes: the classifier must rely on text statistics alone.
    body = raw if raw is not None else "".join(f'<div class="t7">{p}</div>' for p in paras)
    return f"""<html><head><title>{title}</title></head><body>
<div class="a1"><a href="/">Daily Courier</a> | {' | '.join(f'<a href="/s/{m}">{m}</a>' for m in MENU)}</div>
<div class="a2"><span>Breaking:</span> <a href="/live">Live updates from the council meeting</a></div>
<div class="c3"><h2>{title}</h2><div class="m4">By our reporter. Updated 10:42</div>{body}
<div class="s5">Share this article: <a href="#">Facebook</a> <a href="#">Twitter</a> <a href="#">Email</a></div></div>
<div class="r6"><b>Related stories</b><br>{'<br>'.join(f'<a href="/r/{i}">{r}</a>' for i, r in enumerate(related()))}</div>
<div class="f8">Daily Courier Ltd, 12 Market Street. Registered in England. <a href="/jobs">Jobs</a> <a href="/ads">Advertise</a></div>
</body></html>"""


def page_docs(title, paras, raw=None):
    body = raw if raw is not None else "".join(f"<p>{p}</p>" for p in paras)
    toc = links([f"Chapter {i}" for i in range(1, 9)], "toc")
    return f"""<!DOCTYPE html><html><head><title>{title} - Handbook</title></head><body>
<div id="breadcrumb"><a href="/">Handbook</a> &raquo; <a href="/guides">Guides</a> &raquo; {title}</div>
<table width="100%"><tr><td valign="top" width="20%">{toc}</td><td valign="top">
<h1>{title}</h1>{body}
<p><a href="/prev">&laquo; Previous</a> | <a href="/next">Next &raquo;</a></p></td></tr></table>
<div id="footer">Handbook version 2.4. Generated from the project sources. Found a mistake? <a href="/bugs">Report it</a>.</div>
</body></html>"""


def page_forum(title, paras, raw=None):
    body = raw if raw is not None else "".join(f"<p>{p}</p>" for p in paras)
    return f"""<html><head><title>{title} - Community forum</title></head><body>
<div id="top"><a href="/login">Log in</a> <a href="/register">Register</a> <a href="/search">Search</a> <a href="/faq">FAQ</a></div>
<div id="cmp-box">This site stores small files on your device. You can change which ones we keep at any time in the settings.</div>
<h2>{title}</h2><div class="post">{body}</div>
<div class="pager">Pages: <a href="?p=1">1</a> <a href="?p=2">2</a> <a href="?p=3">3</a> <a href="?p=4">Next</a></div>
<div class="legal">Powered by a forum engine. Times are UTC. Contact the moderators.</div>
</body></html>"""


TEMPLATES_PAGE = [page_blog, page_news, page_docs, page_forum]


def warc_record(headers, block, version="WARC/1.1"):
    h = version + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + f"Content-Length: {len(block)}\r\n\r\n"
    return h.encode() + block + b"\r\n\r\n"


_rid = [0]


def rid():
    _rid[0] += 1
    return f"<urn:uuid:00000000-0000-4000-8000-{_rid[0]:012d}>"


def http(body, ctype="text/html; charset=utf-8", status="200 OK", extra=""):
    return (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{extra}Content-Length: {len(body)}\r\n\r\n").encode() + body


def response(url, payload, version="WARC/1.1", record_id=None):
    record_id = record_id or rid()
    return record_id, warc_record([("WARC-Type", "response"), ("WARC-Date", "2024-03-03T12:00:00Z"),
                                   ("WARC-Record-ID", record_id), ("WARC-Target-URI", url),
                                   ("Content-Type", "application/http; msgtype=response")], payload, version)


def warcinfo():
    return warc_record([("WARC-Type", "warcinfo"), ("WARC-Date", "2024-03-03T12:00:00Z"), ("WARC-Record-ID", rid()),
                        ("Content-Type", "application/warc-fields")], b"software: make-warc-fixtures.py\r\n")


def gz_member(data):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as g:
        g.write(data)
    return buf.getvalue()


def write(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


# --- structured.warc.gz: articles with short-line structures, in the same four templates ---
# (the tuning pages for keeping short blocks inside the main content; the evaluation pages
# of scripts/make-extract-eval.py are other templates and other text)
def structure(kind, para_tag):
    """(html, truth lines) of one structure of a town-life article."""
    if kind == "kv":
        lines = [f"Opening hours: {rng.randint(7, 10)}:00 to {rng.randint(16, 20)}:00", f"Address: {rng.randint(1, 90)} {rng.choice(['Market', 'Mill', 'Station', 'Church'])} Street",
                 f"Admission: {rng.choice(['free', '2 pounds', '5 pounds for adults'])}", f"Phone: 01{rng.randint(100, 999)} {rng.randint(100000, 999999)}",
                 f"Parking: {rng.choice(['none', 'behind the hall', 'on the square'])}", f"Season: {rng.choice(['April to October', 'all year', 'summer only'])}"]
        return "<p>" + "<br>".join(lines) + "</p>", lines
    if kind == "list":
        items = rng.sample(["Take the bus to the harbour.", "Walk past the old mill.", "Cross the bridge.", "Turn left at the bakery.",
                            "Follow the signs to the museum.", "Ring the bell at the gate.", "Wait by the fountain."], rng.randint(4, 6))
        intro = "How to get there:"
        return f"<{para_tag}>{intro}</{para_tag}><ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>", [intro] + items
    if kind == "table":
        rows = [[d, f"{rng.randint(7, 10)}:00", f"{rng.randint(16, 20)}:00"] for d in rng.sample(["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"], 4)]
        head = ["Day", "Opens", "Closes"]
        return ("<table><tr>" + "".join(f"<th>{c}</th>" for c in head) + "</tr>" +
                "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows) + "</table>"), head + [c for r in rows for c in r]
    if kind == "dl":
        terms = rng.sample([("Orchard", "A garden of fruit trees."), ("Mill", "A building where grain is ground."), ("Harbour", "A sheltered place for boats."),
                            ("Council", "The people who run the town."), ("Lantern", "A lamp with a case.")], 3)
        return "<dl>" + "".join(f"<dt>{t}</dt><dd>{d}</dd>" for t, d in terms) + "</dl>", [x for td in terms for x in td]
    if kind == "dialogue":
        pairs = rng.sample([("Kim: Why did you stay?", "Sam: Because of the garden."), ("Kim: Was it hard?", "Sam: Only in winter."),
                            ("Kim: Who helped you?", "Sam: The neighbours did."), ("Kim: Would you do it again?", "Sam: Every year.")], 3)
        lines = [x for pq in pairs for x in pq]
        return "".join(f"<{para_tag}>{l}</{para_tag}>" for l in lines), lines
    if kind == "contact":
        lines = ["Write to us:", f"Email: {rng.choice(NOUNS)}@town.test", f"Phone: 01{rng.randint(100, 999)} {rng.randint(100000, 999999)}", "Post: The Town Hall, Market Square"]
        return "".join(f"<{para_tag}>{l}</{para_tag}>" for l in lines), lines
    s = sentence()
    t = " ".join([s] * 3)
    return f"<{para_tag}>{t}</{para_tag}>", [t]


def structured_pages():
    members, truth = [], []
    kinds = ["kv", "list", "table", "dl", "dialogue", "contact"]
    for i in range(16):
        tpl = TEMPLATES_PAGE[i % 4]
        tag = "div" if tpl is page_news else "p"
        title = f"The {rng.choice(ADJS)} {rng.choice(NOUNS)}"
        # Structures at the article's edges (first after the title, last before the
        # footer) and next to each other, not only between two long paragraphs.
        ks = rng.sample(kinds, rng.randint(3, 4))
        parts = [structure("repeated", tag)] if i % 3 == 0 else []
        if i % 2 == 0:
            parts.append(structure(ks.pop(), tag))
        for k in ks[:-1]:
            p = paragraph(rng.randint(3, 5))
            parts.append((f"<{tag}>{p}</{tag}>", [p]))
            parts.append(structure(k, tag))
            if rng.random() < 0.5:
                parts.append(structure(rng.choice(kinds), tag))
        p = paragraph(rng.randint(2, 4))
        parts.append((f"<{tag}>{p}</{tag}>", [p]))
        if i % 4 != 3:
            parts.append(structure(ks[-1], tag))
        html = tpl(title, None, raw="".join(h for h, _ in parts))
        url = f"http://structured{i % 4}.test/page/{i}"
        r, rec = response(url, http(html.encode("utf-8")))
        members.append(gz_member(rec))
        truth.append({"warc_record_id": r, "url": url, "template": tpl.__name__, "title": title,
                      "text": "\n".join(t for _, ts in parts for t in ts), "language": "en"})
    write("structured.warc.gz", b"".join(members))
    with open(os.path.join(OUT, "structured_truth.jsonl"), "w") as f:
        for t in truth:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    # --- pages.warc.gz: templated English pages + German/French + non-HTML, one member per record.
    members, truth = [gz_member(warcinfo())], []
    for i in range(32):
        title = f"The {rng.choice(ADJS)} {rng.choice(NOUNS)}"
        paras = [paragraph(rng.randint(3, 6)) for _ in range(rng.randint(3, 7))]
        html = TEMPLATES_PAGE[i % 4](title, paras)
        url = f"http://example{i % 4}.test/page/{i}"
        members.append(gz_member(warc_record([("WARC-Type", "request"), ("WARC-Record-ID", rid()),
                                              ("WARC-Date", "2024-03-03T12:00:00Z"), ("WARC-Target-URI", url)],
                                             f"GET /page/{i} HTTP/1.1\r\nHost: example.test\r\n\r\n".encode())))
        r, rec = response(url, http(html.encode("utf-8")))
        members.append(gz_member(rec))
        truth.append({"warc_record_id": r, "url": url, "template": TEMPLATES_PAGE[i % 4].__name__,
                      "title": title, "text": "\n".join(paras), "language": "en"})
    for lang, sents in (("de", GERMAN), ("fr", FRENCH)):
        for k in range(2):
            paras = [" ".join(sents[(k + j) % 5] for j in range(3)), " ".join(sents[(k + j + 2) % 5] for j in range(3))]
            html = page_blog("Seite" if lang == "de" else "Page", paras)
            url = f"http://{lang}.example.test/{k}"
            r, rec = response(url, http(html.encode("utf-8")))
            members.append(gz_member(rec))
            truth.append({"warc_record_id": r, "url": url, "template": "page_blog", "title": "", "text": "\n".join(paras),
                          "language": lang})
    members.append(gz_member(response("http://example.test/missing", http(b"<html>Not found</html>", status="404 Not Found"))[1]))
    members.append(gz_member(response("http://example.test/logo.png", http(b"\x89PNG\r\n\x1a\n" + bytes(64), ctype="image/png"))[1]))
    members.append(gz_member(warc_record([("WARC-Type", "metadata"), ("WARC-Record-ID", rid()),
                                          ("WARC-Date", "2024-03-03T12:00:00Z"), ("Content-Type", "application/warc-fields")],
                                         b"fetchTimeMs: 120\r\n")))
    write("pages.warc.gz", b"".join(members))
    with open(os.path.join(OUT, "pages_truth.jsonl"), "w") as f:
        for t in truth:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")

    # --- charsets.warc (plain, WARC/1.0): the text of each page and how its charset is found.
    cases = []
    latin = ("The caf\u00e9 on the corner serves cr\u00e8me br\u00fbl\u00e9e and a na\u00efve but charming "
             "fa\u00e7ade greets the visitors who come to the little town for the summer festival every year. "
             "Nobody who has eaten there would call the place fancy, but the owner is proud of it all the same.")
    cp1252 = ("\u201cIt was the best of the seasons,\u201d she said \u2014 and the tickets cost only \u20ac12 each, "
              "which is why so many of the families in the valley came back to the fair again and again. "
              "The \u2018old\u2019 programme was printed on the back of the ticket \u2026 as it had been for years.")
    sjis = "\u3053\u306e\u753a\u306e\u56f3\u66f8\u9928\u306f\u53bb\u5e74\u65b0\u3057\u304f\u306a\u308a\u307e\u3057\u305f\u3002" * 8 + \
           "\u591a\u304f\u306e\u4eba\u304c\u6bce\u65e5\u672c\u3092\u8aad\u307f\u306b\u6765\u307e\u3059\u3002" * 8
    undeclared = ("Le caf\u00e9 du coin et la cr\u00e8me br\u00fbl\u00e9e: the guide describes them in English, and "
                  "the na\u00efve tourist who reads it will find the d\u00e9j\u00e0 vu of every small town caf\u00e9 "
                  "in the region, where the owner greets each visitor with the same old joke about the weather.")
    bom = ("A page that starts with a byte order mark is still read as UTF-8, and the mark itself never reaches the text of the document. "
           "A reader that forgot to remove it would leave three strange bytes at the very start of the first line.")

    def doc(text, meta=""):
        return f"<html><head>{meta}<title>t</title></head><body><p>{text}</p></body></html>"

    recs = [warcinfo()]
    specs = [
        ("latin1-http", latin, "iso-8859-1", "text/html; charset=ISO-8859-1", "", "http"),
        ("cp1252-meta", cp1252, "cp1252", "text/html", '<meta http-equiv="Content-Type" content="text/html; charset=windows-1252">', "meta"),
        ("sjis-http", sjis, "shift_jis", "text/html; charset=Shift_JIS", "", "http"),
        ("sjis-meta5", sjis, "shift_jis", "text/html", '<meta charset="shift_jis">', "meta"),
        ("latin1-undeclared", undeclared, "iso-8859-1", "text/html", "", "detected"),
        ("utf8-bom", bom, "utf-8-sig", "text/html", "", "bom"),
    ]
    for name, text, enc, ctype, meta, source in specs:
        body = doc(text, meta).encode(enc)
        r, rec = response(f"http://charset.test/{name}", http(body, ctype=ctype), version="WARC/1.0")
        recs.append(rec)
        cases.append({"warc_record_id": r, "case": name, "text": text, "charset_source": source})
    write("charsets.warc", b"".join(recs))
    with open(os.path.join(OUT, "charsets_truth.jsonl"), "w") as f:
        for c in cases:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")

    # --- a WET file: conversion records pass through; the language filter applies.
    wet = [warcinfo()]
    for k, text in enumerate([paragraph(4), " ".join(GERMAN), paragraph(5)]):
        wet.append(warc_record([("WARC-Type", "conversion"), ("WARC-Target-URI", f"http://wet.test/{k}"),
                                ("WARC-Date", "2024-03-03T12:00:00Z"), ("WARC-Record-ID", rid()),
                                ("WARC-Refers-To", rid()), ("Content-Type", "text/plain")], text.encode()))
    write("sample.warc.wet.gz", b"".join(gz_member(r) for r in wet))

    # --- malformed inputs (each: what is wrong, and where).
    good = lambda k: response(f"http://bad.test/{k}", http(doc(paragraph(3)).encode()))[1]
    # Block cut short: the file ends 100 bytes into record 3's block.
    r3 = good(3)
    write("bad-truncated.warc", good(1) + good(2) + r3[: len(r3) - 104])
    # Record 2 has no Content-Length.
    r2 = good(2).replace(b"Content-Length", b"Content-Lenght", 1)
    write("bad-header.warc", good(1) + r2 + good(3))
    # The last gzip member is cut short.
    m3 = gz_member(good(3))
    write("bad-cut.warc.gz", gz_member(good(1)) + gz_member(good(2)) + m3[: len(m3) // 2])
    # A corrupt member (bytes flipped inside the deflate data) between good ones.
    m2 = bytearray(gz_member(good(2)))
    for k in range(20, 60):
        m2[k] ^= 0x5A
    write("bad-corrupt.warc.gz", gz_member(good(1)) + bytes(m2) + gz_member(good(3)))
    # A record over the cap given in the test (--max-record-bytes 4096): an 8 KiB block.
    big = response("http://bad.test/big", http(doc(paragraph(120)).encode()))[1]
    assert len(big) > 8192
    write("bad-oversize.warc", good(1) + big + good(3))
    # An unknown encoding label; a block that is not an HTTP response.
    enc = response("http://bad.test/enc", http(doc(paragraph(3)).encode(), ctype="text/html; charset=x-no-such-charset"))[1]
    write("bad-encoding.warc", good(1) + enc + good(3))
    nohttp = response("http://bad.test/nohttp", b"<html>not a response</html>")[1]
    write("bad-http.warc", good(1) + nohttp + good(3))
    # Everything at once, each bad record between good ones (for --skip-bad-records counts):
    # gzip members: good, bad header, good, unknown encoding, good, bad http, good, oversize,
    # good, corrupt member, good, cut-short member at the end.
    mixed = [good(10), good(11).replace(b"WARC-Type: response", b"WARC-Type response", 1), good(12), enc, good(13),
             nohttp, good(14), big, good(15)]
    m = [gz_member(x) for x in mixed]
    m.append(bytes(m2))
    m.append(gz_member(good(16)))
    m.append(m3[: len(m3) // 2])
    write("bad-mixed.warc.gz", b"".join(m))

    # Last, so that the files above stay the same bytes: the structured tuning pages.
    structured_pages()


if __name__ == "__main__":
    main()
