"""What every kubegpu process does the same way: logfmt logging and reading the allocation key.

The scheduler, the extender, the CRI shim and the advertiser all log one greppable line per record with `pod=` and
`node=` fields, and the first three read the HMAC key that signs and verifies `kubegpu.io/allocation` from a file,
so the scheduler side and the node side must read it byte for byte alike.
"""

from __future__ import annotations

import logging
import sys
import time

__all__ = ["LogfmtFormatter", "configure_logging", "read_key"]


class LogfmtFormatter(logging.Formatter):
    """`ts=... level=... logger=... msg="..." pod=ns/name node=...`: one line per record, fields greppable."""

    FIELDS = ("pod", "node", "reason", "devices", "error")

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        parts = [f"ts={ts}", f"level={record.levelname.lower()}", f"logger={record.name}"]
        parts.append(f"msg={_quote(record.getMessage())}")
        for name in self.FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                parts.append(f"{name}={_quote(str(value))}")
        if record.exc_info:
            parts.append(f"exception={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


def _quote(text: str) -> str:
    if text and all(c not in text for c in ' "=\n'):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def read_key(path: str) -> bytes:
    """The HMAC key shared with the CRI shim: the file's bytes without a trailing newline; empty is refused."""
    try:
        with open(path, "rb") as handle:
            key = handle.read().rstrip(b"\r\n")
    except OSError as exc:
        raise SystemExit(f"kubegpu: cannot read the allocation key file {path}: {exc.strerror}") from None
    if not key:
        raise SystemExit(f"kubegpu: the allocation key file {path} is empty")
    return key
