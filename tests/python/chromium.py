"""Headless Chromium driven over the DevTools protocol through a pipe (--remote-debugging-pipe):
no websocket library, no Playwright browser download, only the system chromium and the standard
library. What the site and Perfetto tests need: open a page, collect console errors, uncaught
exceptions and failed loads, evaluate JavaScript (awaiting promises), take a screenshot.

    with Chromium.start() as browser:        # pytest.skip(reason) when no chromium can start
        page = browser.new_page()
        page.goto("file:///tmp/site/index.html")
        assert page.errors == []
        title = page.evaluate("document.title")
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class ChromiumUnavailable(RuntimeError):
    """No Chromium on this machine, or it would not start: the reason, for a visible skip."""


class ProtocolError(RuntimeError):
    pass


def find_chromium():
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Chromium:
    def __init__(self, process, commands, responses, profile):
        self._process = process
        self._commands = commands   # our end of the browser's fd 3 (it reads commands)
        self._responses = responses  # our end of its fd 4 (it writes answers and events)
        self._profile = profile
        self._buffer = b""
        self._next_id = 0
        self._events = []

    @classmethod
    def start(cls, extra_args=(), timeout=30.0):
        binary = os.environ.get("HARNESS_CHROMIUM") or find_chromium()
        if not binary:
            raise ChromiumUnavailable("no chromium on PATH (Debian: apt-get install chromium; scripts/setup.sh installs it)")
        profile = tempfile.mkdtemp(prefix="harness-chromium-")
        to_browser_read, to_browser_write = os.pipe()
        from_browser_read, from_browser_write = os.pipe()

        def wire_pipes():  # in the child: the protocol's fds are 3 (commands in) and 4 (answers out)
            # Copied out of the way first: either end may itself be fd 3 or 4.
            commands_in, answers_out = os.dup(to_browser_read), os.dup(from_browser_write)
            os.dup2(commands_in, 3)
            os.dup2(answers_out, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        args = [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
                f"--user-data-dir={profile}", *extra_args, "about:blank"]
        try:
            process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       preexec_fn=wire_pipes, close_fds=False)
        except OSError as error:
            shutil.rmtree(profile, ignore_errors=True)
            raise ChromiumUnavailable(f"{binary} cannot start: {error}") from None
        finally:
            os.close(to_browser_read)
            os.close(from_browser_write)
        browser = cls(process, to_browser_write, from_browser_read, profile)
        try:
            browser.call("Browser.getVersion", timeout=timeout)
        except (ProtocolError, OSError) as error:
            stderr = browser._stop()
            raise ChromiumUnavailable(f"{binary} started but does not answer the DevTools protocol ({error}); "
                                      f"stderr: {stderr[-2000:]}") from None
        return browser

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stop()

    def _stop(self):
        stderr = ""
        if self._process.poll() is None:
            try:
                self.call("Browser.close", timeout=5)
            except (ProtocolError, OSError):
                pass
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        try:
            stderr = self._process.stderr.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            pass
        for fd in (self._commands, self._responses):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)
        return stderr

    # --- the protocol --------------------------------------------------------------------------
    def _send(self, message):
        data = json.dumps(message).encode() + b"\0"
        while data:
            written = os.write(self._commands, data)
            data = data[written:]

    def _read_message(self, deadline):
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProtocolError("timed out waiting for Chromium")
            ready, _, _ = select.select([self._responses], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self._responses, 1 << 20)
            if not chunk:
                raise ProtocolError(f"Chromium closed the pipe (exit {self._process.poll()})")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def call(self, method, params=None, session=None, timeout=30.0):
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self._send(message)
        deadline = time.monotonic() + timeout
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise ProtocolError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            if "method" in answer:
                self._events.append(answer)

    def wait_event(self, method, session=None, timeout=30.0, predicate=None):
        deadline = time.monotonic() + timeout
        while True:
            for index, event in enumerate(self._events):
                if event["method"] == method and (session is None or event.get("sessionId") == session) and \
                        (predicate is None or predicate(event["params"])):
                    return self._events.pop(index)["params"]
            self._events.append(self._read_message(deadline))

    def drain(self, session):
        """Events of a session received so far (removed from the queue)."""
        mine = [e for e in self._events if e.get("sessionId") == session]
        self._events = [e for e in self._events if e.get("sessionId") != session]
        return mine

    def new_page(self, width=1280, height=900):
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, target, session)
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.call(domain, session=session)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
        return page


class Page:
    def __init__(self, browser, target, session):
        self.browser = browser
        self.target = target
        self.session = session
        self.errors = []    # console errors, uncaught exceptions, failed loads of this page
        self.dialogs = []   # alert/confirm/prompt opened by the page (accepted at once)

    def _collect(self):
        for event in self.browser.drain(self.session):
            method, params = event["method"], event["params"]
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                text = details.get("exception", {}).get("description") or details.get("text", "")
                self.errors.append(f"uncaught: {text} ({details.get('url', '')}:{details.get('lineNumber', '')})")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                self.errors.append(f"console.{params['type']}: {text}")
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                entry = params["entry"]
                self.errors.append(f"{entry.get('source', 'log')}: {entry.get('text', '')} {entry.get('url', '')}".strip())
            elif method == "Page.javascriptDialogOpening":
                self.dialogs.append(params.get("message", ""))
                self.browser.call("Page.handleJavaScriptDialog", {"accept": True}, session=self.session)

    def goto(self, url, timeout=60.0):
        self.browser.drain(self.session)
        self.errors = []
        result = self.browser.call("Page.navigate", {"url": url}, session=self.session, timeout=timeout)
        if result.get("errorText"):
            self.errors.append(f"navigation: {result['errorText']} ({url})")
            return
        self.browser.wait_event("Page.loadEventFired", session=self.session, timeout=timeout)
        self._collect()

    def evaluate(self, expression, timeout=60.0):
        result = self.browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                                   session=self.session, timeout=timeout)
        self._collect()
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise ProtocolError(f"evaluate: {details.get('exception', {}).get('description') or details.get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression, timeout=60.0, interval=0.25):
        """Evaluates `expression` until it is truthy; returns its value, or raises after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:.0f} s for: {expression}")
            time.sleep(interval)

    def screenshot(self, path, full_page=True):
        params = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
            size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}
        data = self.browser.call("Page.captureScreenshot", params, session=self.session)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
