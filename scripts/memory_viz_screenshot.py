#!/usr/bin/env python3
"""Screenshot of PyTorch's memory_viz rendering an allocator snapshot, offline, in headless Chromium.

    python scripts/memory_viz_screenshot.py SNAPSHOT.pickle OUT.png --memory-viz-js MemoryViz.js --d3 d3.v5.min.js

`python -m torch.cuda._memory_viz trace_plot` writes an HTML page that imports MemoryViz.js from a
CDN, which imports d3 v5 from another; neither is in the torch wheel, and these machines have no
network. So the page is rewritten to load both from local copies: MemoryViz.js (PyTorch's
torch/utils/viz/MemoryViz.js, from a PyTorch source checkout) and a d3 v5 UMD bundle (e.g.
mpld3/js/d3.v5.min.js from `pip download mpld3`). Neither is committed here. The page is served
on 127.0.0.1 (module scripts do not load from file://) and captured with `chromium --headless
--screenshot`. Exit 2 when an input is missing, 3 when Chromium fails."""
import argparse
import functools
import http.server
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot")
    parser.add_argument("png")
    parser.add_argument("--memory-viz-js", required=True, help="PyTorch's torch/utils/viz/MemoryViz.js")
    parser.add_argument("--d3", required=True, help="a d3 v5 UMD bundle (d3.v5.min.js)")
    parser.add_argument("--view", default="Active Memory Timeline",
                        help="memory_viz view: 'Active Memory Timeline', 'Allocator State History', "
                             "'Active Cached Segment Timeline'")
    parser.add_argument("--size", default="1400,900")
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser") or "chromium")
    args = parser.parse_args()
    for path in (args.snapshot, args.memory_viz_js, args.d3):
        if not Path(path).is_file():
            print(f"memory_viz_screenshot: no such file: {path}", file=sys.stderr)
            return 2

    from torch.cuda import _memory_viz  # the page PyTorch itself generates

    with open(args.snapshot, "rb") as f:
        snapshot = pickle.load(f)
    page = _memory_viz._format_viz(snapshot, args.view, None)
    page = re.sub(r'from "https://[^"]*MemoryViz\.js"', 'from "./MemoryViz.js"', page)
    page = page.replace("<head>", '<head>\n<script src="./d3.v5.min.js"></script>', 1)
    # MemoryViz.js imports d3 and four d3 modules from a CDN; the UMD bundle has them all on window.d3.
    viz = Path(args.memory_viz_js).read_text()
    viz = re.sub(r'import \* as (\w+) from "https://[^"]*d3@5";', r"const \1 = window.d3;", viz)
    viz = re.sub(r'import \{([^}]*)\} from "https://[^"]*d3-\w+@\d+";', r"const {\1} = window.d3;", viz)
    if "https://" in "".join(line for line in viz.splitlines() if line.startswith("import")):
        print("memory_viz_screenshot: MemoryViz.js imports something this script does not know", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "snapshot.html").write_text(page)
        (root / "MemoryViz.js").write_text(viz)
        shutil.copy(args.d3, root / "d3.v5.min.js")
        class Quiet(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

        handler = functools.partial(Quiet, directory=folder)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/snapshot.html"
        png = Path(args.png).resolve()
        command = [args.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                   f"--window-size={args.size}", "--virtual-time-budget=8000", f"--screenshot={png}", url]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        server.shutdown()
    if result.returncode != 0 or not png.is_file():
        print(f"memory_viz_screenshot: chromium failed ({result.returncode}):\n{result.stderr[-2000:]}", file=sys.stderr)
        return 3
    print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
