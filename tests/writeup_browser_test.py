#!/usr/bin/env python3
"""The writeup's HTML in a real browser: `harness writeup --html` on the demo db, a screenshot by
headless Chromium, and the PNG decoded (zlib only) and inspected: the page is not blank and the
plots' series colours are on it. Exit 77 (CTest: skipped) with the reason when Chromium is absent.

usage: writeup_browser_test.py HARNESS_BINARY DB OUT_DIR
"""
import os
import shutil
import struct
import subprocess
import sys
import zlib

SKIP = 77
# Palette colours of the first series (svg_plot.cpp): blue fused, red dense in the anchor sweep.
PLOT_COLOURS = {"#1f77b4": (0x1F, 0x77, 0xB4), "#d62728": (0xD6, 0x27, 0x28)}


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def decode_png(path):
    """Returns (width, height, rows) with rows as lists of (r, g, b) tuples; 8-bit RGB or RGBA only."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG")
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = header
    if depth != 8 or colour_type not in (2, 6) or interlace:
        raise ValueError(f"{path}: PNG depth {depth} colour type {colour_type} interlace {interlace} not handled")
    channels = 3 if colour_type == 2 else 4
    stride = width * channels
    raw = zlib.decompress(b"".join(idat))
    rows, previous = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if kind == 1:
            for i in range(channels, stride):
                line[i] = (line[i] + line[i - channels]) & 0xFF
        elif kind == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, previous))
        elif kind == 3:
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                line[i] = (line[i] + ((left + previous[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                a = line[i - channels] if i >= channels else 0
                b = previous[i]
                c = previous[i - channels] if i >= channels else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append([tuple(line[x * channels:x * channels + 3]) for x in range(width)])
        previous = line
    return width, height, rows


def near(pixel, colour, tolerance=24):
    return all(abs(p - c) <= tolerance for p, c in zip(pixel, colour))


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    harness, db, out_dir = sys.argv[1:]
    chromium = find_chromium()
    if not chromium:
        print("SKIPPED: no chromium on PATH (Debian: apt-get install chromium; scripts/setup.sh installs it)")
        return SKIP
    os.makedirs(out_dir, exist_ok=True)
    report = os.path.join(out_dir, "anchor_scaling.md")
    written = subprocess.run([harness, "writeup", "anchor_scaling", "--db", db, "-o", report, "--html"],
                             capture_output=True, text=True, timeout=60)
    print(written.stdout, written.stderr)
    if written.returncode != 0:
        print(f"FAIL: harness writeup exited {written.returncode}")
        return 1
    html = os.path.join(out_dir, "anchor_scaling.html")
    shot = os.path.join(out_dir, "anchor_scaling.png")
    if os.path.exists(shot):
        os.remove(shot)
    # Half scale keeps the PNG small enough to decode in pure Python in about a second, while the
    # plots (2 px lines, 8 px markers) still leave hundreds of pixels of each colour.
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--force-device-scale-factor=0.5", "--window-size=1000,5200", f"--screenshot={shot}",
               "file://" + os.path.abspath(html)]
    browser = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if not os.path.exists(shot):
        print(browser.stdout, browser.stderr)
        print(f"FAIL: chromium wrote no screenshot (exit {browser.returncode})")
        return 1
    width, height, rows = decode_png(shot)
    pixels = [p for row in rows for p in row]
    white = sum(1 for p in pixels if p[0] > 245 and p[1] > 245 and p[2] > 245)
    dark = sum(1 for p in pixels if max(p) < 80)  # text
    counts = {name: sum(1 for p in pixels if near(p, colour)) for name, colour in PLOT_COLOURS.items()}
    print(f"screenshot {shot}: {width}x{height}, {white / len(pixels):.1%} white, {dark} dark (text) pixels, "
          f"plot colours {counts}")
    problems = []
    if white > 0.995 * len(pixels):
        problems.append("the page is blank")
    if dark < 2000:
        problems.append(f"hardly any text ({dark} dark pixels)")
    for name, count in counts.items():
        if count < 50:
            problems.append(f"plot colour {name} on only {count} pixels")
    for problem in problems:
        print("FAIL:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
