#!/usr/bin/python3
"""Render an HTML or SVG file in headless Chromium and check the screenshot is not blank.

Shared by the tests that produce visual output (`mtnlg report` HTML, `mtnlg plan --svg`).
The PNG is decoded here with zlib/struct only (no Pillow), so the check runs on any
Debian box with the `chromium` package (scripts/install-deps.sh installs it).

Usage:
    render-check.py INPUT.(html|svg) [--png OUT.png] [--window-size 1200,2000]
                    [--min-colours 8] [--min-ink 0.0005]

Prints one line: "render-check: OUT.png WxH, N distinct colours, P% non-white pixels".
Exit status: 0 rendered and not blank; 1 blank or unreadable screenshot; 2 usage;
77 chromium is not installed (the automake "skipped" code, so callers can skip).
"""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode_png(path):
    """Returns (width, height, channels, rows) with rows a list of bytes objects."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    pos, idat, header = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    if header is None:
        raise ValueError("no IHDR chunk")
    width, height, depth, colour_type, _, _, interlace = header
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(colour_type)
    if depth != 8 or channels is None or interlace != 0:
        raise ValueError(f"unsupported PNG (depth {depth}, colour type {colour_type}, interlace {interlace})")
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        ftype = raw[start]
        line = bytearray(raw[start + 1:start + 1 + stride])
        if ftype == 1:  # Sub
            for i in range(channels, stride):
                line[i] = (line[i] + line[i - channels]) & 0xFF
        elif ftype == 2:  # Up
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif ftype == 3:  # Average
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:  # Paeth
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                upleft = prev[i - channels] if i >= channels else 0
                line[i] = (line[i] + paeth(left, prev[i], upleft)) & 0xFF
        elif ftype != 0:
            raise ValueError(f"bad filter type {ftype} in row {y}")
        rows.append(bytes(line))
        prev = line
    return width, height, channels, rows


def pixel_stats(width, height, channels, rows):
    colours, ink = set(), 0
    for row in rows:
        for x in range(0, width * channels, channels):
            px = row[x:x + min(channels, 3)]
            colours.add(px)
            if any(v < 245 for v in px):
                ink += 1
    return len(colours), ink / float(width * height)


def main():
    ap = argparse.ArgumentParser(description="Render HTML/SVG in headless Chromium; fail if the screenshot is blank")
    ap.add_argument("input", help="HTML or SVG file to render")
    ap.add_argument("--png", help="where to write the screenshot (default: a temporary file)")
    ap.add_argument("--window-size", default="1200,2000", help="W,H in CSS pixels")
    ap.add_argument("--min-colours", type=int, default=8, help="fewest distinct colours a non-blank page has")
    ap.add_argument("--min-ink", type=float, default=0.0005, help="smallest fraction of non-white pixels")
    ap.add_argument("--timeout", type=float, default=120, help="seconds to wait for Chromium")
    args = ap.parse_args()
    if not os.path.isfile(args.input):
        print(f"render-check: {args.input}: no such file", file=sys.stderr)
        return 2
    chromium = find_chromium()
    if chromium is None:
        print("render-check: chromium not installed (Debian package `chromium`), skipped")
        return 77
    # A private profile directory: two renders at once (parallel tests) must not share one.
    profile = tempfile.mkdtemp(prefix="render-check-")
    png = args.png or os.path.join(profile, "out.png")
    try:
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--no-first-run", "--user-data-dir=" + profile, "--screenshot=" + os.path.abspath(png),
               "--window-size=" + args.window_size, "file://" + os.path.abspath(args.input)]
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"render-check: chromium did not finish within {args.timeout:g} s", file=sys.stderr)
            return 1
        if not os.path.isfile(png):
            print("render-check: chromium wrote no screenshot:\n" + proc.stdout.decode(errors="replace"),
                  file=sys.stderr)
            return 1
        try:
            w, h, ch, rows = decode_png(png)
        except (ValueError, zlib.error, struct.error) as e:
            print(f"render-check: {png}: {e}", file=sys.stderr)
            return 1
        colours, ink = pixel_stats(w, h, ch, rows)
        print(f"render-check: {png if args.png else 'screenshot'} {w}x{h}, {colours} distinct colours, "
              f"{100 * ink:.2f}% non-white pixels")
        if colours < args.min_colours or ink < args.min_ink:
            print(f"render-check: blank render (need >= {args.min_colours} colours and >= "
                  f"{100 * args.min_ink:.2f}% non-white)", file=sys.stderr)
            return 1
        return 0
    finally:
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
