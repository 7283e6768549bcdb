#!/usr/bin/env python3
"""Screenshot of PyTorch's memory_viz rendering an allocator snapshot, offline, in headless Chromium.

    python dev/memory_viz_screenshot.py SNAPSHOT.pickle OUT.png --memory-viz-js MemoryViz.js --d3 d3.v5.min.js

`python -m torch.cuda._memory_viz trace_plot` writes an HTML page that imports MemoryViz.js from a
CDN, which imports d3 v5 from another; neither is in the torch wheel, and these machines have no
network. So the page (torch's own, from `_memory_viz._format_viz`) is rewritten to load both from
local copies, which are not committed here (`--fetch-help` says where to get them):

  MemoryViz.js   PyTorch's torch/utils/viz/MemoryViz.js, from a PyTorch source checkout or
                 https://raw.githubusercontent.com/pytorch/pytorch/main/torch/utils/viz/MemoryViz.js
                 (the file torch's page imports; it exports add_local_files(files, view)).
  d3.v5.min.js   a d3 v5 UMD bundle, e.g. from mpld3's wheel:
                 pip download --no-deps mpld3 -d /tmp/mpld3 && unzip /tmp/mpld3/mpld3-*.whl 'mpld3/js/*'
                 -> mpld3/js/d3.v5.min.js (d3 v5.7.0), or https://d3js.org/d3.v5.min.js

The page is served on 127.0.0.1 (module scripts do not load from file://) and captured with
`chromium --headless --screenshot`. A small script injected into the page reports uncaught errors,
failed loads and whether anything was drawn back to that server. Exit 0 with the PNG path printed;
2 when an input is missing; 3 when Chromium fails or the page shows an error (the PNG, if any, is
kept for a look)."""
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

FETCH_HELP = __doc__[__doc__.index("  MemoryViz.js"):__doc__.index("\nThe page is served")]

# Runs before d3 and MemoryViz.js: posts uncaught errors, failed loads (the module graph included)
# and, a second after load, whether any SVG shape was drawn, to the server below. Synchronous XHR,
# so the report lands before headless Chromium takes the screenshot and exits.
REPORTER = r"""<script>
(function () {
  function report(kind, text) {
    try { var x = new XMLHttpRequest(); x.open('POST', '/__' + kind, false); x.send(String(text)); } catch (e) {}
  }
  window.addEventListener('error', function (e) {
    if (e.target && e.target !== window) {
      var t = e.target;
      report('error', 'failed to load ' + (t.src || t.href || ('<' + t.tagName.toLowerCase() + '> (or one of its imports)')));
    } else {
      report('error', (e.error && e.error.stack) || e.message);
    }
  }, true);
  window.addEventListener('unhandledrejection', function (e) {
    report('error', 'unhandled rejection: ' + ((e.reason && e.reason.stack) || e.reason));
  });
  window.addEventListener('load', function () {
    setTimeout(function () {
      var n = document.querySelectorAll('svg polygon, svg rect').length;
      if (n > 0) report('ok', n + ' SVG shapes');
      else report('error', 'nothing drawn: no SVG shapes on the page');
    }, 1000);
  });
})();
</script>"""


class FetchHelp(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(FETCH_HELP)
        parser.exit(0)


def fail(code, message):
    print(f"memory_viz_screenshot: {message}", file=sys.stderr)
    return code


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot")
    parser.add_argument("png")
    parser.add_argument("--memory-viz-js", required=True, help="PyTorch's torch/utils/viz/MemoryViz.js")
    parser.add_argument("--d3", required=True, help="a d3 v5 UMD bundle (d3.v5.min.js)")
    parser.add_argument("--fetch-help", action=FetchHelp, help="say where to get MemoryViz.js and d3.v5.min.js, and exit")
    parser.add_argument("--view", default="Active Memory Timeline",
                        help="memory_viz view: 'Active Memory Timeline', 'Allocator State History', "
                             "'Active Cached Segment Timeline'")
    parser.add_argument("--size", default="1400,900", help="window size W,H")
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser") or "chromium")
    args = parser.parse_args()
    for path in (args.snapshot, args.memory_viz_js, args.d3):
        if not Path(path).is_file():
            return fail(2, f"no such file: {path} (--fetch-help says where to get MemoryViz.js and d3)")

    from torch.cuda import _memory_viz  # the page PyTorch itself generates

    with open(args.snapshot, "rb") as f:
        snapshot = pickle.load(f)
    # _format_viz re-pickles with pickle's default protocol; MemoryViz.js's unpickler reads 2 to 4
    # (Python 3.14 defaults to 5: the page would then report "Unhandled version 5", exit 3).
    page = _memory_viz._format_viz(snapshot, args.view, None)
    page, n = re.subn(r'from "https://[^"]*MemoryViz\.js"', 'from "./MemoryViz.js"', page)
    if n != 1 or "<head>" not in page:
        return fail(2, "torch's memory_viz page no longer looks like <head> + an import of MemoryViz.js")
    page = page.replace("<head>", f'<head>\n{REPORTER}\n<script src="./d3.v5.min.js"></script>', 1)
    # MemoryViz.js imports d3 and four d3 modules from a CDN; the UMD bundle has them all on window.d3
    # (d3.event stays live: the bundle defines it as a getter).
    viz = Path(args.memory_viz_js).read_text()
    if "export function add_local_files" not in viz:
        return fail(2, f"{args.memory_viz_js} does not export add_local_files: not PyTorch's MemoryViz.js?")
    viz = re.sub(r'import \* as (\w+) from "https://[^"]*d3@5";', r"const \1 = window.d3;", viz)
    viz = re.sub(r'import \{([^}]*)\} from "https://[^"]*d3-\w+@\d+";', r"const {\1} = window.d3;", viz)
    if re.search(r"^\s*import\b.*https?://", viz, re.M):
        return fail(2, "MemoryViz.js imports something this script does not know")

    reports = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode("utf-8", "replace")
            reports.append((self.path.lstrip("/_"), body))
            self.send_response(204)
            self.end_headers()

    png = Path(args.png).resolve()
    png.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "snapshot.html").write_text(page)
        (root / "MemoryViz.js").write_text(viz)
        shutil.copy(args.d3, root / "d3.v5.min.js")
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=folder))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/snapshot.html"
        command = [args.chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                   "--no-first-run", "--enable-logging=stderr", "--v=0", f"--window-size={args.size}",
                   "--virtual-time-budget=10000", f"--screenshot={png}", url]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=120)
            returncode, stderr = result.returncode, result.stderr
        except (OSError, subprocess.TimeoutExpired) as e:
            returncode, stderr = None, str(e)
        finally:
            server.shutdown()
            server.server_close()
    console = "\n".join(line for line in stderr.splitlines() if "CONSOLE" in line)
    if returncode != 0 or not png.is_file():
        return fail(3, f"chromium failed ({returncode}), no screenshot:\n{stderr[-2000:]}")
    errors = [text for kind, text in reports if kind != "ok"]
    if errors or not reports:
        why = "\n".join(errors) if errors else "the page never reported back (did it load?)"
        return fail(3, f"the page shows an error (screenshot kept at {png}):\n{why}"
                       + (f"\nconsole:\n{console[-2000:]}" if console else ""))
    print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
