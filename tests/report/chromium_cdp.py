"""A minimal headless-Chromium driver over the DevTools protocol, for the report's browser test.

Uses the system `/usr/bin/chromium` (never a downloaded browser) and `websocket-client`. It records
console errors, uncaught exceptions and every network request the page makes, so a test can assert the
report is error-free and self-contained.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
    "--window-size=1400,1600",
]


def available() -> bool:
    return Path(CHROMIUM).is_file() and shutil.which(CHROMIUM) is not None


class Chromium:
    """One headless browser with one page; use as a context manager."""

    def __init__(self, workdir: Path, timeout: float = 30.0) -> None:
        import websocket

        self.timeout = timeout
        self.profile = workdir / "chromium-profile"
        self.profile.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "chromium.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, so close() ends its renderers too
        )
        try:
            port = self._wait_port()
            page_ws = self._page_ws(port)
            self.ws = websocket.create_connection(page_ws, timeout=timeout, suppress_origin=True)
        except BaseException:
            self.close()
            raise
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        for domain in ("Runtime", "Log", "Page", "Network"):
            self.call(f"{domain}.enable")

    def _wait_port(self) -> int:
        # With --remote-debugging-port=0 Chromium picks a free port and writes it to DevToolsActivePort.
        marker = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}; see {self.log_path}")
            if marker.is_file():
                lines = marker.read_text().split()
                if lines:
                    return int(lines[0])
            time.sleep(0.05)
        raise TimeoutError(f"chromium did not open its DevTools port in {self.timeout}s; see {self.log_path}")

    def _page_ws(self, port: int) -> str:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                targets = json.load(r)
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
            time.sleep(0.05)
        raise TimeoutError("chromium has no page target")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)
        raise TimeoutError(f"no answer to {method} in {self.timeout}s")

    def wait_event(self, method: str) -> dict[str, Any]:
        for e in self.events:
            if e["method"] == method:
                return e
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            if "method" in msg:
                self.events.append(msg)
                if msg["method"] == method:
                    return msg
        raise TimeoutError(f"no {method} event in {self.timeout}s")

    def open(self, path: Path) -> None:
        self.events.clear()
        self.call("Page.navigate", url=path.resolve().as_uri())
        self.wait_event("Page.loadEventFired")

    def eval(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"page threw on {expression!r}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click at the centre of the first element matching `selector`."""
        box = self.eval(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView({{block: 'center'}});"
            " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def type_into(self, selector: str, text: str) -> None:
        """Focus an input, clear it, and type `text` as keyboard input (fires real `input` events)."""
        self.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.focus(); e.select(); }})()")
        self.call("Input.insertText", text=text)

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries seen so far."""
        # Drain anything already sent.
        self.call("Runtime.evaluate", expression="0")
        out = []
        for e in self.events:
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append("exception: " + str(d.get("exception", {}).get("description") or d.get("text")))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append("log: " + p["entry"].get("text", ""))
        return out

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]

    def screenshot(self, path: Path) -> Path:
        r = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(r["data"]))
        return path

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            try:
                ws.close()
            except Exception:
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_report(browser: Chromium, report: Path, screenshot: Path | None = None) -> dict[str, Any]:
    """The checks any report must pass, for synthetic and real run directories alike.

    Opens `report`; asserts every plot has drawn data marks, the search narrows the group list to one
    prompt, a click on a group opens its samples, no console error, no network request. Leaves the search
    empty again. Returns what it saw: {"plots": [...], "groups": n, "screenshot": path or None}.
    """
    browser.open(report)
    plots = browser.eval(
        """Array.from(document.querySelectorAll('figure.plot')).map(f => {
             const svg = f.querySelector('svg');
             const marks = svg ? Array.from(svg.querySelectorAll('.data')) : [];
             const drawn = marks.filter(m => { const b = m.getBBox(); return b.width > 0 || b.height > 0; });
             return [f.dataset.plot, marks.length, drawn.length, svg ? svg.getBoundingClientRect().width : 0];
           })"""
    )
    assert plots, "the report has no plots"
    for name, marks, drawn, width in plots:
        assert marks > 0 and drawn == marks and width > 100, f"plot {name}: {drawn}/{marks} marks drawn, width {width}"

    items = browser.eval(
        "Array.from(document.querySelectorAll('#groups .group-item')).map(e => [e.dataset.groupId, e.dataset.step])"
    )
    if items:
        prompt_id = browser.eval("JSON.parse(document.getElementById('rollout-data').textContent).groups.slice(-1)[0].prompt_id")
        browser.type_into("#search", prompt_id)
        shown = browser.eval("Array.from(document.querySelectorAll('#groups .group-item .gp')).map(e => e.textContent)")
        assert 0 < len(shown) <= len(items), f"search for {prompt_id!r} shows {len(shown)} of {len(items)} groups"
        assert all(prompt_id.lower() in s.lower() for s in shown), f"search for {prompt_id!r} kept other prompts"
        browser.click("#groups .group-item:last-child")
        opened = browser.eval(
            "(() => { const v = document.getElementById('group-view'); const last = document.querySelector('#groups .group-item:last-child');"
            " return [v.dataset.groupId, last.dataset.groupId, v.querySelectorAll('.sample').length,"
            " v.querySelectorAll('.sample .reward').length, v.querySelectorAll('.sample .advantage').length,"
            " v.querySelectorAll('.sample .badge').length]; })()"
        )
        assert opened[0] == opened[1], f"clicked group {opened[1]} but the view shows {opened[0]}"
        assert opened[2] > 0 and opened[2] == opened[3] == opened[4] == opened[5], f"group view incomplete: {opened}"
        browser.type_into("#search", "")
        assert browser.eval("document.querySelectorAll('#groups .group-item').length") == len(items)
    shot = browser.screenshot(screenshot) if screenshot is not None else None
    errors = browser.errors()
    assert errors == [], f"errors in the page: {errors}"
    external = [u for u in browser.requests() if not u.startswith(("file:", "data:", "about:"))]
    assert external == [], f"the report fetched {external}"
    return {"plots": [p[0] for p in plots], "groups": len(items), "screenshot": shot}
