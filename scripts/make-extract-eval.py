#!/usr/bin/python3
"""Writes the EVALUATION pages of `mtnlg data extract` into test/fixtures/warc-eval/.

The block classifier's thresholds and rules are tuned on the pages of
scripts/make-warc-fixtures.py (test/fixtures/warc/: a town-life sentence grammar in blog,
news, handbook and forum templates). These pages are for measuring only, and differ from
those in every part that could be fitted: the text is software documentation from another
grammar and vocabulary, the page templates are others (a Sphinx-like manual, a MediaWiki-
like wiki, a table-and-font project page of the early web, a Docusaurus-like single-page
app with a cookie dialog), and the articles hold the short-line structures that a
classifier tuned on long prose paragraphs drops:

  * runs of "Key: value" lines (Program:, Author:, Version:, Machines: ...);
  * bulleted and numbered lists of short steps; tables of options; definition lists;
  * short dialogue lines (a question-and-answer transcript);
  * a contact / mailing-list block of short lines;
  * an opening paragraph whose one sentence is repeated three times;
  * shell commands in <pre>.

26 English pages (24 UTF-8; one windows-1252 and one ISO-8859-1 page whose only non-ASCII
words sit in the repeated opening and in the key-value run / contact block), 4 German and
4 Spanish pages (one of them ISO-8859-1) that the language filter must drop. The known
main text of every page is in eval_truth.jsonl: the article's headings, prose, list
items, table cells, definition terms and descriptions, dialogue and contact lines and
code, and nothing of the page furniture (navigation, breadcrumbs, sidebars, tables of
contents, cookie dialogs, "edit this page", pagers, footers). For the legacy-charset
pages `nonascii_words` lists the words that must reach the text.

Deterministic: the same bytes on every run (seeded generator, gzip mtime 0, fixed dates
and record ids).

    /usr/bin/python3 scripts/make-extract-eval.py [OUT_DIR]
"""
import html as htmlmod
import json
import os
import random
import sys

from warc_writer import RecordIds, gz_member, warc_record

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "test", "fixtures",
                                                          "warc-eval")
rng = random.Random(4141)

# --- English software-documentation prose ----------------------------------------------------
TOOLS = ["quillsync", "tarnish", "ferrule", "mossdb", "lintel", "parcelbox", "driftwood", "cobble", "sextant",
         "hollyhock", "bramble", "kestrel", "pewter", "marlin", "tesselate", "gantry"]
THINGS = ["configuration file", "cache directory", "lock file", "index", "socket", "log file", "manifest",
          "plugin", "worker pool", "snapshot", "checksum", "remote", "profile", "build directory", "schema",
          "connection pool", "queue", "certificate", "mirror", "hook"]
ACTIONS = ["reads", "rewrites", "verifies", "rotates", "compresses", "locks", "replays", "prunes", "signs",
           "mounts", "watches", "rebuilds", "migrates", "uploads", "exports"]
QUALS = ["large", "remote", "shared", "encrypted", "read-only", "temporary", "nested", "stale", "default",
         "incremental", "corrupted", "versioned"]
WHENS = ["at start-up", "before every release", "once an hour", "when the daemon restarts",
         "after an upgrade", "on the first run", "whenever the network comes back", "at the end of each job"]
SENTS = [
    "By default {t} {a} the {th} {w}, so you rarely have to think about it.",
    "If the {q} {th} cannot be opened, {t} prints a warning and falls back to the {th2} instead of giving up.",
    "You can change this behaviour in the {th2}, but most installations never need to do so.",
    "The {th} is kept in a format that older versions of {t} can still read, which makes downgrades painless.",
    "Because {t} {a} the {th} {w}, a crash in the middle of a job leaves nothing half written behind.",
    "Note that a {q} {th} is treated exactly like a local one; the only difference is how long it takes.",
    "Administrators who run {t} on many machines usually keep one {th2} under version control and copy it around.",
    "There is no need to stop the service first: {t} {a} the {th} while it keeps answering requests.",
    "Each {th} carries a small header with its version and a checksum, and {t} refuses to use one that does not match.",
    "When you are unsure what {t} would do, run it with the dry-run option and read the plan it prints.",
    "Older releases stored the {th} next to the {th2}; since version 3 it lives in its own directory.",
    "In practice the {q} {th} is the part that takes longest, so that is where the progress bar spends its time.",
    "The documentation uses the word {th} for what some other tools call a {th2}, and the two are the same thing.",
    "Most problems that users report turn out to be a {q} {th}, and {t} can repair it on its own.",
]


def en_sentence(tool):
    s = rng.choice(SENTS).format(t=tool, a=rng.choice(ACTIONS), th=rng.choice(THINGS), th2=rng.choice(THINGS),
                                 q=rng.choice(QUALS), w=rng.choice(WHENS))
    return s[0].upper() + s[1:]


def en_paragraph(tool, k):
    return " ".join(en_sentence(tool) for _ in range(k))


# --- German and Spanish prose (pages the language filter drops) -------------------------------
GERMAN = [
    "Das Programm liest seine Einstellungen beim Start aus der Konfigurationsdatei im Benutzerverzeichnis.",
    "Wenn die Datei fehlt, werden die eingebauten Standardwerte verwendet und eine Warnung ausgegeben.",
    "Für große Verzeichnisse empfiehlt es sich, den Zwischenspeicher auf eine schnelle Festplatte zu legen.",
    "Alle Änderungen werden zuerst in eine temporäre Datei geschrieben und erst danach an ihren Platz verschoben.",
    "Wer mehrere Rechner verwaltet, sollte die Konfiguration in einem gemeinsamen Verzeichnis ablegen.",
    "Bei Problemen hilft es meistens, das Protokoll mit der ausführlichen Ausgabe noch einmal zu lesen.",
    "Die Entwickler freuen sich über Fehlerberichte, die beschreiben, wie sich das Problem wiederholen lässt.",
    "Seit der dritten Version kann das Werkzeug auch verschlüsselte Sicherungen auf entfernten Servern prüfen.",
]
SPANISH = [
    "El programa lee su configuración al arrancar desde el archivo que se encuentra en el directorio del usuario.",
    "Si el archivo no existe, se usan los valores predeterminados y se muestra una advertencia en la pantalla.",
    "Para directorios muy grandes conviene guardar la caché en un disco rápido y con suficiente espacio libre.",
    "Todos los cambios se escriben primero en un archivo temporal y solo después se mueven a su lugar definitivo.",
    "Quien administra varias máquinas debería guardar la configuración en un directorio compartido por todas.",
    "Cuando algo falla, casi siempre ayuda leer otra vez el registro con la salida detallada activada.",
    "Los desarrolladores agradecen los informes de errores que explican cómo repetir el problema paso a paso.",
    "Desde la tercera versión la herramienta también puede comprobar copias cifradas en servidores remotos.",
]


# --- article pieces: (html, text lines of the truth) -----------------------------------------
def esc(s):
    return htmlmod.escape(s, quote=False)


def p_prose(tool):
    t = en_paragraph(tool, rng.randint(3, 6))
    return f"<p>{esc(t)}</p>", [t]


def p_prose_link(tool):
    # a paragraph with an inline link (low link density)
    a, b = en_paragraph(tool, 2), en_paragraph(tool, 2)
    link = f"the {rng.choice(THINGS)} reference"
    return f'<p>{esc(a)} See <a href="/ref/{tool}.html">{link}</a> for every option. {esc(b)}</p>', \
        [f"{a} See {link} for every option. {b}"]


def kv_lines(tool, author="Dana Whitfield", extra=()):
    ver = f"{rng.randint(1, 4)}.{rng.randint(0, 12)}.{rng.randint(0, 9)}"
    lines = [f"Program: {tool}", f"Version: {ver}", f"Author: {author}",
             f"License: {rng.choice(['GPL-2.0-or-later', 'MIT', 'BSD-3-Clause', 'Apache-2.0'])}",
             f"Machines: {', '.join(rng.sample(['x86_64', 'i386', 'arm64', 'armhf', 'riscv64', 'ppc64el', 's390x'], 4))}",
             f"Requires: lib{rng.choice(['yaml', 'zstd', 'sqlite3', 'curl', 'ssl'])} {rng.randint(1, 3)}.{rng.randint(0, 9)} or later",
             f"Released: {rng.randint(1, 28)} {rng.choice(['March', 'June', 'October', 'January'])} {rng.randint(2004, 2023)}"]
    lines += list(extra)
    return lines


def p_kv(tool, author="Dana Whitfield", extra=()):
    lines = kv_lines(tool, author, extra)
    style = rng.randint(0, 2)
    if style == 0:  # one paragraph, <br> between the lines
        return "<p>" + "<br>\n".join(f"<b>{esc(k)}:</b>{esc(v)}" for k, v in (l.split(":", 1) for l in lines)) + "</p>", lines
    if style == 1:  # a div per line
        return "".join(f'<div class="field"><span class="k">{esc(l.split(":", 1)[0])}:</span>{esc(l.split(":", 1)[1])}</div>'
                       for l in lines), lines
    return "<p>" + "<br>".join(esc(l) for l in lines) + "</p>", lines


STEPS = ["Download the release tarball and its signature.", "Check the signature with gpg.",
         "Unpack it into a directory of your choice.", "Run the configure script.", "Build it with make.",
         "Run the test suite.", "Install it as root.", "Copy the example configuration.",
         "Start the service.", "Check the log for warnings.", "Remove the old cache.", "Restart the daemon."]


def p_list(tool):
    k = rng.randint(4, 7)
    items = rng.sample(STEPS, k)
    tag = rng.choice(["ul", "ol"])
    intro = f"To install {tool} from source:"
    return f"<p>{esc(intro)}</p><{tag}>" + "".join(f"<li>{esc(i)}</li>" for i in items) + f"</{tag}>", [intro] + items


OPTIONS = [("--verbose", "off", "Print each file as it is handled"), ("--jobs N", "2", "Number of workers"),
           ("--cache DIR", "~/.cache", "Where to keep the cache"), ("--dry-run", "off", "Show the plan only"),
           ("--timeout S", "30", "Seconds before a remote gives up"), ("--no-color", "off", "Plain output"),
           ("--config FILE", "none", "Read settings from FILE"), ("--retries N", "3", "Attempts per transfer")]


def p_table(tool):
    rows = rng.sample(OPTIONS, rng.randint(4, 6))
    head = ["Option", "Default", "Meaning"]
    h = "<table class=\"docutils\"><thead><tr>" + "".join(f"<th>{c}</th>" for c in head) + "</tr></thead><tbody>"
    h += "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows) + "</tbody></table>"
    return h, head + [c for r in rows for c in r]


def p_dl(tool):
    rows = rng.sample(OPTIONS, rng.randint(3, 5))
    h = "<dl>" + "".join(f"<dt><code>{esc(o)}</code></dt><dd>{esc(m)}.</dd>" for o, _, m in rows) + "</dl>"
    lines = []
    for o, _, m in rows:
        lines += [o, m + "."]
    return h, lines


DIALOGUE = [("Does it run on a Raspberry Pi?", "Yes, the arm64 build works fine."),
            ("Can I pause a transfer?", "Press Ctrl-Z, then resume it with fg."),
            ("Where is the log?", "In the cache directory, named after the job."),
            ("Is Windows supported?", "Only under WSL for now."),
            ("Why is the first run slow?", "It builds the index once."),
            ("How do I report a bug?", "Open a ticket and attach the log.")]


def p_dialogue(tool):
    pairs = rng.sample(DIALOGUE, rng.randint(3, 4))
    lines = []
    for q, a in pairs:
        lines += [f"Q: {q}", f"A: {a}"]
    style = rng.randint(0, 1)
    if style == 0:
        return "".join(f"<p>{esc(l)}</p>" for l in lines), lines
    return "<div class=\"faq\">" + "<br>".join(esc(l) for l in lines) + "</div>", lines


def contact_lines(tool, who="Dana Whitfield"):
    return [f"Mailing list: {tool}-users@lists.{tool}.org", f"Archive: https://lists.{tool}.org/{tool}-users/",
            f"IRC: #{tool} on irc.libera.chat", f"Bug reports: bugs@{tool}.org", f"Maintainer: {who}"]


def p_contact(tool, who="Dana Whitfield"):
    lines = contact_lines(tool, who)
    intro = "Questions and patches are welcome:"
    if rng.randint(0, 1):
        return f"<p>{esc(intro)}</p><address>" + "<br>".join(esc(l) for l in lines) + "</address>", [intro] + lines
    return f"<p>{esc(intro)}</p>" + "".join(f"<p>{esc(l)}</p>" for l in lines), [intro] + lines


def p_code(tool):
    cmds = [f"$ {tool} init --cache /var/cache/{tool}", f"$ {tool} check --jobs 4", f"$ {tool} sync --dry-run",
            f"$ sudo systemctl restart {tool}"]
    k = rng.sample(cmds, 3)
    return "<pre>" + esc("\n".join(k)) + "</pre>", k


def opening_repeated(tool, sentence=None):
    s = sentence or f"{tool.capitalize()} keeps your files in step."
    t = " ".join([s] * 3)
    return f"<p>{esc(t)}</p>", [t]


STRUCT = [p_kv, p_list, p_table, p_dl, p_dialogue, p_contact, p_code]


def article(tool, title, lead=None, kv=None, contact=None, headings=True):
    """([(html, truth lines)], features): an h1, an opening, prose paragraphs and 2-4 structures, with h2s."""
    parts, feats = [(f"<h1>{esc(title)}</h1>", [title])], []
    if lead is None and rng.random() < 0.3:
        lead = opening_repeated(tool)
        feats.append("repeated_opening")
    parts.append(lead if lead else p_prose(tool))
    structs = rng.sample(STRUCT, rng.randint(2, 4))
    if kv:
        structs = [s for s in structs if s is not p_kv]
        parts.append(kv)
        feats.append("kv")
    if contact:
        structs = [s for s in structs if s is not p_contact]
    feats += [s.__name__[2:] for s in structs]
    sections = ["Installation", "Usage", "Configuration", "Troubleshooting", "Getting help", "Options"]
    rng.shuffle(sections)
    for k, s in enumerate(structs):
        if headings:
            parts.append((f"<h2>{sections[k]}</h2>", [sections[k]]))
        parts.append(p_prose_link(tool) if rng.random() < 0.3 else p_prose(tool))
        parts.append(s(tool))
        if rng.random() < 0.5:
            parts.append(p_prose(tool))
    if contact:
        if headings:
            parts.append(("<h2>Contact</h2>", ["Contact"]))
        parts.append(contact)
        feats.append("contact")
    return parts, feats


# --- page templates (none of them is a tuning template) -------------------------------------
COOKIE = ('<div class="cc-window cc-banner cc-type-info" role="dialog" aria-label="cookieconsent">'
          '<span class="cc-message">This website uses cookies to make sure you get the best experience on our website. '
          '<a class="cc-link" href="/privacy">Learn more</a></span><div class="cc-compliance">'
          '<a class="cc-btn cc-dismiss">Got it!</a></div></div>')


def sections_html(parts, wrap_sections):
    """Sphinx nests a <section> per heading; the others keep the article flat."""
    if not wrap_sections:
        return "".join(h for h, _ in parts)
    out, open_ = [], 0
    for h, _ in parts:
        if h.startswith("<h1>"):
            out.append('<section id="top">' + h)
            open_ += 1
        elif h.startswith("<h2>"):
            if open_ > 1:
                out.append("</section>")
                open_ -= 1
            out.append(f'<section id="s{len(out)}">' + h)
            open_ += 1
        else:
            out.append(h)
    return "".join(out) + "</section>" * open_


def page_sphinx(title, parts, tool, charset="utf-8"):
    toc = "".join(f'<li class="toctree-l1"><a class="reference internal" href="{s.lower()}.html">{s}</a></li>'
                  for s in ["Introduction", "Installation", "Tutorial", "Configuration", "Command reference",
                            "Changelog"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="{charset}"><meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{esc(title)} &#8212; {tool} 3.2 documentation</title>
<link rel="stylesheet" type="text/css" href="_static/pygments.css"><link rel="stylesheet" href="_static/alabaster.css">
<script data-url_root="./" id="documentation_options" src="_static/documentation_options.js"></script>
<script src="_static/doctools.js"></script></head><body>
<div class="related" role="navigation" aria-label="related navigation"><h3>Navigation</h3><ul>
<li class="right" style="margin-right: 10px"><a href="genindex.html" title="General Index" accesskey="I">index</a></li>
<li class="right"><a href="next.html" accesskey="N">next</a> |</li><li class="right"><a href="prev.html" accesskey="P">previous</a> |</li>
<li class="nav-item nav-item-0"><a href="index.html">{tool} 3.2 documentation</a> &#187;</li></ul></div>
<div class="document"><div class="documentwrapper"><div class="bodywrapper"><div class="body" role="main">
{sections_html(parts, True)}
<div class="clearer"></div></div></div></div>
<div class="sphinxsidebar" role="navigation" aria-label="main navigation"><div class="sphinxsidebarwrapper">
<h3><a href="index.html">Table of Contents</a></h3><ul>{toc}</ul>
<h4>Previous topic</h4><p class="topless"><a href="prev.html" title="previous chapter">Introduction</a></p>
<div role="note" aria-label="source link"><h3>This Page</h3><ul class="this-page-menu"><li><a href="_sources/page.rst.txt" rel="nofollow">Show Source</a></li></ul></div>
<div id="searchbox" style="display: none" role="search"><h3 id="searchlabel">Quick search</h3><div class="searchformwrapper">
<form class="search" action="search.html" method="get"><input type="text" name="q"><input type="submit" value="Go"></form></div></div>
</div></div><div class="clearer"></div>
<div class="footer">&#169;2016-2024, the {tool} developers. | Powered by <a href="http://sphinx-doc.org/">Sphinx 5.3.0</a> &amp; <a href="https://github.com/bitprophet/alabaster">Alabaster 0.7.12</a> | <a href="_sources/page.rst.txt" rel="nofollow">Page source</a></div>
</body></html>"""


def page_wiki(title, parts, tool, charset="utf-8"):
    portal = lambda h, items: (f'<div class="portal" role="navigation"><h3>{h}</h3><div class="body"><ul>' +
                               "".join(f'<li><a href="/wiki/{i.replace(" ", "_")}">{i}</a></li>' for i in items) +
                               "</ul></div></div>")
    body = "".join(h for h, _ in parts[1:])
    toc_items = [t for h, ts in parts if h.startswith("<h2>") for t in ts]
    toc = ('<div id="toc" class="toc" role="navigation" aria-labelledby="mw-toc-heading"><div class="toctitle"><h2 id="mw-toc-heading">Contents</h2></div><ul>' +
           "".join(f'<li class="toclevel-1"><a href="#{t}"><span class="tocnumber">{k + 1}</span> <span class="toctext">{t}</span></a></li>'
                   for k, t in enumerate(toc_items)) + "</ul></div>")
    # the TOC goes after the opening paragraph, the edit links into the h2s
    first = body.find("<h2>")
    if first >= 0:
        body = body[:first] + toc + body[first:]
    body = body.replace("</h2>", '<span class="mw-editsection"><span class="mw-editsection-bracket">[</span><a href="?action=edit">edit</a><span class="mw-editsection-bracket">]</span></span></h2>')
    return f"""<!DOCTYPE html>
<html class="client-nojs" lang="en" dir="ltr"><head><meta charset="{charset}"><title>{esc(title)} - {tool.capitalize()} Wiki</title>
<script>document.documentElement.className="client-js";RLCONF={{"wgPageName":"{title.replace(" ", "_")}","wgNamespaceNumber":0}};</script>
<link rel="stylesheet" href="/load.php?modules=skins.vector.styles"></head>
<body class="mediawiki ltr sitedir-ltr skin-vector action-view"><div id="mw-page-base" class="noprint"></div><div id="mw-head-base" class="noprint"></div>
<div id="content" class="mw-body" role="main"><a id="top"></a>
<div id="siteNotice" class="mw-body-content"></div>
<h1 id="firstHeading" class="firstHeading">{esc(title)}</h1>
<div id="bodyContent" class="mw-body-content"><div id="siteSub" class="noprint">From {tool.capitalize()} Wiki</div>
<div id="contentSub"></div><div id="jump-to-nav"></div><a class="mw-jump-link" href="#mw-head">Jump to navigation</a>
<div id="mw-content-text" lang="en" dir="ltr" class="mw-content-ltr"><div class="mw-parser-output">{body}</div></div>
<div class="printfooter">Retrieved from "<a dir="ltr" href="https://wiki.{tool}.org/index.php?title={title.replace(" ", "_")}&amp;oldid=4821">https://wiki.{tool}.org/index.php?title={title.replace(" ", "_")}&amp;oldid=4821</a>"</div>
<div id="catlinks" class="catlinks" data-mw="interface"><div id="mw-normal-catlinks" class="mw-normal-catlinks"><a href="/wiki/Special:Categories" title="Special:Categories">Categories</a>: <ul><li><a href="/wiki/Category:Manuals">Manuals</a></li><li><a href="/wiki/Category:{tool}">{tool}</a></li></ul></div></div>
<div class="visualClear"></div></div></div>
<div id="mw-navigation"><h2>Navigation menu</h2><div id="mw-head"><div id="p-personal" role="navigation"><ul>
<li id="pt-login"><a href="/index.php?title=Special:UserLogin">Log in</a></li><li id="pt-createaccount"><a href="/index.php?title=Special:CreateAccount">Create account</a></li></ul></div>
<div id="left-navigation"><div id="p-namespaces" role="navigation" class="vectorTabs"><ul><li class="selected"><a href="#">Page</a></li><li><a href="/wiki/Talk:{title.replace(" ", "_")}">Discussion</a></li></ul></div></div>
<div id="right-navigation"><div id="p-views" role="navigation" class="vectorTabs"><ul><li class="selected"><a href="#">Read</a></li><li><a href="?action=edit">Edit</a></li><li><a href="?action=history">View history</a></li></ul></div>
<div id="p-search" role="search"><h3><label for="searchInput">Search</label></h3><form action="/index.php" id="searchform"><input type="search" name="search" placeholder="Search {tool.capitalize()} Wiki"></form></div></div></div>
<div id="mw-panel"><div id="p-logo" role="banner"><a class="mw-wiki-logo" href="/wiki/Main_Page" title="Visit the main page"></a></div>
{portal("Navigation", ["Main page", "Recent changes", "Random page", "Help about MediaWiki"])}
{portal("Tools", ["What links here", "Related changes", "Special pages", "Printable version", "Permanent link", "Page information"])}
</div></div>
<div id="footer" role="contentinfo"><ul id="footer-info"><li id="footer-info-lastmod"> This page was last edited on 4 May 2021, at 10:12.</li>
<li id="footer-info-copyright">Content is available under <a href="https://www.gnu.org/copyleft/fdl.html">GNU Free Documentation License 1.3 or later</a> unless otherwise noted.</li></ul>
<ul id="footer-places"><li><a href="/wiki/Project:Privacy_policy">Privacy policy</a></li><li><a href="/wiki/Project:About">About {tool.capitalize()} Wiki</a></li><li><a href="/wiki/Project:General_disclaimer">Disclaimers</a></li></ul>
<ul id="footer-icons" class="noprint"><li id="footer-poweredbyico"><a href="https://www.mediawiki.org/"><img src="/poweredby_mediawiki_88x31.png" alt="Powered by MediaWiki" width="88" height="31"></a></li></ul></div>
{COOKIE}
</body></html>"""


def page_legacy(title, parts, tool, charset="utf-8"):
    body = "".join(h for h, _ in parts)
    menu = "<br>\n".join(f'<a href="{m.lower().replace(" ", "")}.html">{m}</a>' for m in
                         ["Home", "News", "Download", "Documentation", "Screenshots", "Mailing lists", "FAQ", "Links"])
    return f"""<HTML><HEAD><TITLE>{esc(title)}</TITLE>
<META HTTP-EQUIV="Content-Type" CONTENT="text/html; charset={charset}">
<META NAME="keywords" CONTENT="{tool}, backup, sync, unix, free software"></HEAD>
<BODY BGCOLOR="#FFFFFF" TEXT="#000000" LINK="#0000CC" VLINK="#551A8B">
<TABLE WIDTH="100%" BORDER=0 CELLPADDING=4 CELLSPACING=0>
<TR><TD COLSPAN=2 BGCOLOR="#336699"><FONT FACE="Helvetica,Arial" COLOR="#FFFFFF" SIZE="+2"><B>{tool.capitalize()} Project</B></FONT></TD></TR>
<TR><TD WIDTH=150 VALIGN=TOP BGCOLOR="#EEEEEE"><FONT FACE="Helvetica,Arial" SIZE="-1">
{menu}<BR><BR>Hosted by <A HREF="http://forge.example.net/">ExampleForge</A><BR><IMG SRC="counter.gif" ALT="visitors"></FONT></TD>
<TD VALIGN=TOP><FONT FACE="Helvetica,Arial">
{body}
</FONT></TD></TR></TABLE>
<HR NOSHADE SIZE=1><CENTER><FONT SIZE="-1">Last modified: Tue Mar  4 12:00:00 2003 &middot; <A HREF="mailto:webmaster@{tool}.org">webmaster@{tool}.org</A> &middot; <A HREF="http://validator.w3.org/">Valid HTML 3.2</A></FONT></CENTER>
</BODY></HTML>"""


def page_spa(title, parts, tool, charset="utf-8"):
    side = "".join(f'<li class="theme-doc-sidebar-item-link menu__list-item"><a class="menu__link" href="/docs/{s.lower()}">{s}</a></li>'
                   for s in ["Introduction", "Installation", "Quick start", "Configuration", "CLI reference",
                             "Plugins", "FAQ", "Changelog"])
    h2s = [t for h, ts in parts if h.startswith("<h2>") for t in ts]
    toc = "".join(f'<li><a href="#{t.lower()}" class="table-of-contents__link toc-highlight">{t}</a></li>' for t in h2s)
    head, rest = parts[0][0], "".join(h for h, _ in parts[1:])
    return f"""<!doctype html>
<html lang="en" dir="ltr" class="docs-wrapper docs-doc-page"><head><meta charset="{charset}">
<meta name="generator" content="Docusaurus v2.4.1"><title data-rh="true">{esc(title)} | {tool.capitalize()}</title>
<link rel="stylesheet" href="/assets/css/styles.4f1c8e2a.css"><script src="/assets/js/runtime~main.9c1d.js" defer="defer"></script></head>
<body class="navigation-with-keyboard"><script>!function(){{var t=localStorage.getItem("theme");document.documentElement.setAttribute("data-theme",t||"light")}}()</script>
<div id="__docusaurus"><div role="region" aria-label="Skip to main content"><a class="skipToContent_fXgn" href="#__docusaurus_skipToContent_fallback">Skip to main content</a></div>
<nav aria-label="Main" class="navbar navbar--fixed-top"><div class="navbar__inner"><div class="navbar__items"><a class="navbar__brand" href="/"><b class="navbar__title text--truncate">{tool.capitalize()}</b></a>
<a class="navbar__item navbar__link" href="/docs/intro">Docs</a><a class="navbar__item navbar__link" href="/blog">Blog</a><a class="navbar__item navbar__link" href="/community">Community</a></div>
<div class="navbar__items navbar__items--right"><a href="https://github.com/{tool}/{tool}" class="navbar__item navbar__link">GitHub</a><div class="searchBox_ZlJk"><button type="button" class="DocSearch DocSearch-Button">Search</button></div></div></div></nav>
<div id="__docusaurus_skipToContent_fallback" class="main-wrapper mainWrapper_z2l0"><div class="docPage__5DB">
<aside class="theme-doc-sidebar-container docSidebarContainer_b6E3"><div class="sidebarViewport_Xe31"><div class="sidebar_njMd"><nav aria-label="Docs sidebar" class="menu thin-scrollbar menu_SIkG"><ul class="theme-doc-sidebar-menu menu__list">{side}</ul></nav></div></div></aside>
<main class="docMainContainer_gTbr"><div class="container padding-top--md padding-bottom--lg"><div class="row"><div class="col docItemCol_VOVn"><div class="docItemContainer_Djhp">
<article><nav class="theme-doc-breadcrumbs breadcrumbsContainer_Z_bl" aria-label="Breadcrumbs"><ul class="breadcrumbs"><li class="breadcrumbs__item"><a aria-label="Home page" class="breadcrumbs__link" href="/">Home</a></li><li class="breadcrumbs__item"><span class="breadcrumbs__link">Guides</span></li><li class="breadcrumbs__item breadcrumbs__item--active"><span class="breadcrumbs__link">{esc(title)}</span></li></ul></nav>
<div class="tocCollapsible_ETCw theme-doc-toc-mobile tocMobile_ITEo"><button type="button" class="clean-btn tocCollapsibleButton_TO0P">On this page</button></div>
<div class="theme-doc-markdown markdown"><header>{head}</header>{rest}</div>
<footer class="theme-doc-footer docusaurus-mt-lg"><div class="theme-doc-footer-edit-meta-row row"><div class="col"><a href="https://github.com/{tool}/{tool}/edit/main/docs/page.md" target="_blank" rel="noreferrer noopener" class="theme-edit-this-page">Edit this page</a></div>
<div class="col lastUpdated_vwxv"><span class="theme-last-updated">Last updated on <b><time datetime="2024-03-03T12:00:00.000Z">Mar 3, 2024</time></b> by <b>Dana Whitfield</b></span></div></div></footer></article>
<nav class="pagination-nav docusaurus-mt-lg" aria-label="Docs pages"><a class="pagination-nav__link pagination-nav__link--prev" href="/docs/installation"><div class="pagination-nav__sublabel">Previous</div><div class="pagination-nav__label">Installation</div></a><a class="pagination-nav__link pagination-nav__link--next" href="/docs/plugins"><div class="pagination-nav__sublabel">Next</div><div class="pagination-nav__label">Plugins</div></a></nav>
</div></div><div class="col col--3"><div class="tableOfContents_bqdL thin-scrollbar theme-doc-toc-desktop"><ul class="table-of-contents table-of-contents__left-border">{toc}</ul></div></div></div></div></main></div></div>
<footer class="footer footer--dark"><div class="container container-fluid"><div class="row footer__links"><div class="col footer__col"><div class="footer__title">Docs</div><ul class="footer__items clean-list"><li class="footer__item"><a class="footer__link-item" href="/docs/intro">Getting started</a></li><li class="footer__item"><a class="footer__link-item" href="/docs/cli">CLI reference</a></li></ul></div>
<div class="col footer__col"><div class="footer__title">Community</div><ul class="footer__items clean-list"><li class="footer__item"><a href="https://discord.example.com/{tool}" class="footer__link-item">Discord</a></li><li class="footer__item"><a href="https://forum.example.com/{tool}" class="footer__link-item">Forum</a></li></ul></div></div>
<div class="footer__bottom text--center"><div class="footer__copyright">Copyright &#169; 2024 The {tool.capitalize()} Authors. Built with Docusaurus.</div></div></div></footer></div>
{COOKIE}
</body></html>"""


TEMPLATES = [page_sphinx, page_wiki, page_legacy, page_spa]

# --- WARC ------------------------------------------------------------------------------------
rid = RecordIds("00000000-0000-4000-9000-")


def response(url, body, ctype):
    r = rid()
    payload = f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    return r, warc_record([("WARC-Type", "response"), ("WARC-Date", "2024-05-05T08:00:00Z"), ("WARC-Record-ID", r),
                           ("WARC-Target-URI", url), ("Content-Type", "application/http; msgtype=response")], payload)


def main():
    os.makedirs(OUT, exist_ok=True)
    members = [gz_member(warc_record([("WARC-Type", "warcinfo"), ("WARC-Date", "2024-05-05T08:00:00Z"),
                                      ("WARC-Record-ID", rid()), ("Content-Type", "application/warc-fields")],
                                     b"software: make-extract-eval.py\r\n"))]
    truth = []

    def add(url, html, ctype, enc, template, title, parts, language, features, nonascii=()):
        r, rec = response(url, html.encode(enc), ctype)
        members.append(gz_member(rec))
        text = "\n".join(t for _, ts in parts for t in ts)
        for w in nonascii:
            assert w in text, w
        truth.append({"warc_record_id": r, "url": url, "template": template, "title": title, "text": text,
                      "language": language, "charset": enc, "features": features,
                      "nonascii_words": list(nonascii)})

    # 24 English UTF-8 pages, six per template.
    for i in range(24):
        tool = TOOLS[i % len(TOOLS)]
        title = rng.choice([f"Installing {tool}", f"Configuring {tool}", f"The {tool} command",
                            f"{tool.capitalize()} administration guide", f"Upgrading {tool}", f"{tool.capitalize()} FAQ"])
        parts, feats = article(tool, title)
        tpl = TEMPLATES[i % 4]
        html = tpl(title, parts, tool)
        add(f"https://docs{i % 4}.example.org/{tool}/{i}", html, "text/html; charset=utf-8", "utf-8",
            tpl.__name__, title, parts, "en", feats)

    # Two English pages in legacy charsets, in the early-web template.
    tool = "tarnish"
    title = "Tarnish \u2014 metal-polish for your backups"
    lead = opening_repeated(tool, "\u201cTarnish\u201d is Zo\u00eb Br\u00fcckner\u2019s caf\u00e9-tested backup tool \u2014 na\u00efve about nothing.")
    parts, feats = article(tool, title, lead=lead)
    add("http://tarnish.example.net/", page_legacy(title, parts, tool, "windows-1252"), "text/html", "windows-1252",
        "page_legacy", title, parts, "en", ["repeated_opening", "windows-1252"] + feats,
        nonascii=["Zo\u00eb", "Br\u00fcckner\u2019s", "caf\u00e9", "na\u00efve", "\u201cTarnish\u201d"])
    tool = "ferrule"
    title = "Ferrule 2.4 release notes"
    kv = p_kv(tool, author="J\u00fcrgen M\u00fcller", extra=["Translations: Fran\u00e7ois Lef\u00e8vre, In\u00eas Ara\u00fajo"])
    contact = p_contact(tool, who="S\u00f8ren Kj\u00e6r")
    parts, feats = article(tool, title, kv=kv, contact=contact)
    add("http://ferrule.example.net/notes-2.4.html", page_legacy(title, parts, tool, "iso-8859-1"),
        "text/html; charset=ISO-8859-1", "iso-8859-1", "page_legacy", title, parts, "en", ["iso-8859-1"] + feats,
        nonascii=["J\u00fcrgen", "M\u00fcller", "Fran\u00e7ois", "Lef\u00e8vre", "In\u00eas", "Ara\u00fajo",
                  "S\u00f8ren", "Kj\u00e6r"])

    # German and Spanish pages: dropped by the language filter.
    for lang, sents, tpls in (("de", GERMAN, [page_sphinx, page_wiki, page_spa, page_legacy]),
                              ("es", SPANISH, [page_wiki, page_spa, page_sphinx, page_legacy])):
        for k in range(4):
            order = sents[k:] + sents[:k]
            title = {"de": ["Installation", "Konfiguration", "Fehlersuche", "Versionshinweise"],
                     "es": ["Instalación", "Configuración", "Solución de problemas", "Notas de la versión"]}[lang][k]
            parts = [(f"<h1>{esc(title)}</h1>", [title]),
                     (f"<p>{esc(' '.join(order[0:3]))}</p>", [" ".join(order[0:3])]),
                     ("<h2>" + ("Hinweise" if lang == "de" else "Notas") + "</h2>", ["Hinweise" if lang == "de" else "Notas"]),
                     (f"<p>{esc(' '.join(order[3:6]))}</p>", [" ".join(order[3:6])]),
                     (f"<p>{esc(' '.join(order[6:8]))}</p>", [" ".join(order[6:8])])]
            enc = "iso-8859-1" if (lang == "es" and k == 3) else "utf-8"
            tpl = tpls[k]
            html = tpl(title, parts, "quillsync", enc).replace('lang="en"', f'lang="{lang}"')
            add(f"https://{lang}.docs.example.org/quillsync/{k}", html,
                "text/html; charset=" + ("ISO-8859-1" if enc != "utf-8" else "utf-8"), enc, tpl.__name__, title, parts,
                lang, [])

    with open(os.path.join(OUT, "eval.warc.gz"), "wb") as f:
        f.write(b"".join(members))
    with open(os.path.join(OUT, "eval_truth.jsonl"), "w") as f:
        for t in truth:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
