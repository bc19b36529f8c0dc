"""Headless Chromium for tests and benchmarks, driven over the Chrome DevTools Protocol.

The browser is Debian's `chromium` (scripts/test.sh installs it; `KUBEGPU_CHROMIUM` names another binary). It runs
with a fresh profile, no network features and a DevTools port chosen by itself; the page's websocket is spoken with
`websocket-client`. Console errors, uncaught exceptions and JavaScript dialogs (an injected `alert`) are recorded as
they arrive, dialogs are dismissed so the page never blocks.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websocket

__all__ = ["Chromium", "ChromiumMissing", "find_chromium"]

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
]


class ChromiumMissing(RuntimeError):
    """No Chromium binary: the message says how to install one."""


def find_chromium() -> str:
    configured = os.environ.get("KUBEGPU_CHROMIUM")
    for candidate in ([configured] if configured else []) + ["chromium", "chromium-browser", "google-chrome"]:
        found = shutil.which(candidate)
        if found:
            return found
    raise ChromiumMissing(
        "no Chromium found: install Debian's chromium and chromium-driver (scripts/test.sh does: "
        "apt-get install -y chromium chromium-driver) or set KUBEGPU_CHROMIUM to a Chromium binary"
    )


class Chromium:
    def __init__(self, width: int = 1400, height: int = 1000, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = Path(tempfile.mkdtemp(prefix="kubegpu-chromium-"))
        self.log = (self.profile / "chromium.log").open("wb")
        self.process = subprocess.Popen(
            [
                find_chromium(),
                *FLAGS,
                f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.events: list[dict[str, Any]] = []
        self.ids = itertools.count(1)
        try:
            self.socket = websocket.create_connection(self._page_socket(), timeout=timeout, suppress_origin=True)
            for domain in ("Page", "Runtime", "Log"):
                self.send(f"{domain}.enable")
            self.send(
                "Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False
            )
        except BaseException:
            self.close()
            raise

    def _page_socket(self) -> str:
        deadline = time.monotonic() + self.timeout
        port_file = self.profile / "DevToolsActivePort"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.process.returncode}: {self._log_tail()}")
            if port_file.exists() and port_file.read_text().strip():
                port = port_file.read_text().split()[0]
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
                    targets = json.load(response)
                pages = [t for t in targets if t.get("type") == "page"]
                if pages:
                    return str(pages[0]["webSocketDebuggerUrl"])
            time.sleep(0.05)
        raise RuntimeError(f"chromium did not open its DevTools port in {self.timeout:.0f}s: {self._log_tail()}")

    def _log_tail(self) -> str:
        self.log.flush()
        return (self.profile / "chromium.log").read_text(errors="replace")[-2000:]

    # -- the protocol -------------------------------------------------------------------------------------------

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self.ids)
        self.socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = self._receive()
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    def _receive(self) -> dict[str, Any]:
        message: dict[str, Any] = json.loads(self.socket.recv())
        if "method" in message:
            self.events.append(message)
            if message["method"] == "Page.javascriptDialogOpening":
                # Answer without waiting for our own reply: the page is blocked until the dialog closes.
                self.socket.send(
                    json.dumps(
                        {"id": next(self.ids), "method": "Page.handleJavaScriptDialog", "params": {"accept": False}}
                    )
                )
        return message

    def wait_event(self, method: str, since: int = 0) -> dict[str, Any]:
        for event in self.events[since:]:
            if event["method"] == method:
                return event
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            message = self._receive()
            if message.get("method") == method:
                return message
        raise TimeoutError(f"no {method} within {self.timeout:.0f}s")

    # -- what a test does ---------------------------------------------------------------------------------------

    def open(self, url: str) -> float:
        """Load `url`; the seconds from the navigation until the load event and the first frame drawn after it."""
        mark = len(self.events)
        started = time.perf_counter()
        self.send("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired", mark)
        self.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))")
        return time.perf_counter() - started

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def hover(self, x: float, y: float) -> None:
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def errors(self, since: int = 0) -> list[str]:
        """Console errors, uncaught exceptions and failed loads seen since event number `since`."""
        found = []
        for event in self.events[since:]:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails'].get('text')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(f"console.{params['type']}: {[a.get('value') for a in params.get('args', [])]}")
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(f"log: {params['entry'].get('text')}")
        return found

    def dialogs(self, since: int = 0) -> list[str]:
        """The messages of JavaScript dialogs (alert, confirm, prompt) opened since event number `since`."""
        return [
            e["params"].get("message", "") for e in self.events[since:] if e["method"] == "Page.javascriptDialogOpening"
        ]

    def close(self) -> None:
        socket = getattr(self, "socket", None)
        if socket is not None:
            socket.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
