"""What every kubegpu process does the same way: logfmt logging, reading the allocation key, and durations on the
command line (`parse_interval`).

The scheduler, the extender, the CRI shim and the advertiser all log one greppable line per record with `pod=` and
`node=` fields, each value one line of at most `MAX_TEXT_CHARS` characters with its control characters escaped
(`safe_text`: a tenant's text can neither forge a line nor fill the log; a traceback may take `MAX_TRACEBACK_CHARS`).
The scheduler side (scheduler, extender, `kubegpu top`) and the node side (CRI shim, device plugin) read the HMAC key
that signs and verifies `kubegpu.io/allocation` from a file with `read_key`, so both read it byte for byte alike;
during a rotation, the keys of `--allocation-verify-key-file` (`add_verify_key_argument`, `read_verify_keys`) verify
too and never sign.

The key file's format (`key_from_file`): a file that is one line of text, printable ASCII (0x20-0x7e) followed by
nothing but CR and LF bytes, holds that text as the key, line end dropped (`head -c 32 /dev/urandom | base64 > FILE`,
or a Secret made `--from-literal`); any other file holds its bytes, all of them, as the key (`head -c 32
/dev/urandom > FILE`, whose last byte is a newline's once in 128). A raw key loses bytes to this rule only when it
ends in CR or LF and all its other bytes are printable: about once in 10^15 random 32-byte keys, and then every
process reads the same shorter key (refused when under 32 bytes).

Whoever holds the key can sign an allocation that any node's shim obeys, so a key that is easy to guess is refused:
fewer than `MIN_KEY_BYTES` (32) bytes, a blank one, or the placeholder of the shipped `secret.yaml`. The file is
read without trusting it either: a regular file of at most `MAX_KEY_FILE_BYTES` (64 KiB), opened without blocking
on a FIFO, so `/dev/zero` or a pipe is refused rather than read forever; a file that group or others may read is
accepted with a warning.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import stat
import sys
import time

from kubegpu.core.text import MAX_TEXT_CHARS, safe_text

__all__ = [
    "MAX_KEY_FILE_BYTES",
    "MIN_KEY_BYTES",
    "LogfmtFormatter",
    "add_verify_key_argument",
    "configure_logging",
    "key_from_file",
    "parse_interval",
    "read_key",
    "read_verify_keys",
]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_TEXT_KEY = re.compile(rb"([\x20-\x7e]+)[\r\n]*")

MIN_KEY_BYTES = 32
MAX_KEY_FILE_BYTES = 64 * 1024
MAX_VERIFY_KEYS = 4  # `--allocation-verify-key-file` given at most so often: each costs an HMAC per allocation read
MAX_TRACEBACK_CHARS = 16 * MAX_TEXT_CHARS
PLACEHOLDER_KEY = b"REPLACE-WITH-RANDOM-BYTES"  # examples/deploy/scheduler/secret.yaml, until replaced
_HOW_TO_CREATE = "create one from random bytes, e.g. `head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE`"


class LogfmtFormatter(logging.Formatter):
    """`ts=... level=... logger=... msg="..." pod=ns/name node=...`: one line per record, fields greppable."""

    FIELDS = ("pod", "node", "reason", "devices", "passed", "failed", "error")

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        parts = [f"ts={ts}", f"level={record.levelname.lower()}", f"logger={record.name}"]
        parts.append(f"msg={_quote(record.getMessage())}")
        for name in self.FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                parts.append(f"{name}={_quote(str(value))}")
        if record.exc_info:
            parts.append(f"exception={_quote(self.formatException(record.exc_info), MAX_TRACEBACK_CHARS)}")
        return " ".join(parts)


def _quote(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """A logfmt value: bare when it holds nothing to quote, else in quotes with `\\` and `\"` escaped; control
    characters escaped (`\\n`, `\\r`, `\\x1b`) and the length bounded either way (`safe_text`)."""
    body = safe_text(text, limit, also='\\"')
    if body == text and text and " " not in text and "=" not in text:
        return text
    return f'"{body}"'


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def key_from_file(data: bytes) -> bytes:
    """The key a key file's bytes hold: one line of printable ASCII without its line end, else all the bytes."""
    text = _TEXT_KEY.fullmatch(data)
    if text is not None:
        return text.group(1)
    return b"" if not data.strip(b"\r\n") else data


def read_key(path: str, what: str = "the allocation key file") -> bytes:
    """The HMAC key shared by the scheduler side and the node side, in the format `key_from_file` reads.

    Exits (`SystemExit` with a one-line reason naming the file as `what`) unless the file is a regular file of at
    most `MAX_KEY_FILE_BYTES` holding at least `MIN_KEY_BYTES` that are neither blank nor the shipped placeholder.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(descriptor, "rb") as handle:
            status = os.fstat(handle.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise SystemExit(f"kubegpu: {what} {path} is not a regular file; {_HOW_TO_CREATE}")
            data = handle.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise SystemExit(f"kubegpu: cannot read {what} {path}: {exc.strerror}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise SystemExit(f"kubegpu: {what} {path} is larger than {MAX_KEY_FILE_BYTES} bytes")
    key = key_from_file(data)
    if not key:
        raise SystemExit(f"kubegpu: {what} {path} is empty; {_HOW_TO_CREATE}")
    if not key.strip():
        raise SystemExit(f"kubegpu: {what} {path} holds only blanks; {_HOW_TO_CREATE}")
    if key.strip() == PLACEHOLDER_KEY:
        raise SystemExit(
            f"kubegpu: {what} {path} holds the placeholder {PLACEHOLDER_KEY.decode()} of the "
            f"example Secret; {_HOW_TO_CREATE}"
        )
    if len(key) < MIN_KEY_BYTES:
        raise SystemExit(
            f"kubegpu: {what.removesuffix(' file')} in {path} is {len(key)} bytes; at least {MIN_KEY_BYTES} are "
            f"needed: {_HOW_TO_CREATE}"
        )
    if _readable_by_others(status):
        logging.getLogger("kubegpu").warning(
            "%s %s may be read by users outside this process's groups (mode %o); `chmod 600` "
            "it, or mount its Secret with defaultMode 0440 and the pod's securityContext.fsGroup",
            what,
            path,
            stat.S_IMODE(status.st_mode),
        )
    return key


def add_verify_key_argument(parser: argparse.ArgumentParser) -> None:
    """`--allocation-verify-key-file`, as every process that reads allocations takes it."""
    parser.add_argument(
        "--allocation-verify-key-file",
        metavar="PATH",
        action="append",
        default=[],
        help="another HMAC key whose signatures are accepted, never used to sign (repeatable, at most "
        f"{MAX_VERIFY_KEYS}): the key being rotated in or out (docs/security.md, 'The allocation key')",
    )


def read_verify_keys(paths: list[str], key: bytes | None = None) -> tuple[bytes, ...]:
    """The keys of `--allocation-verify-key-file`, each read as `read_key` reads it; one given twice is kept once.

    Exits with a one-line reason past `MAX_VERIFY_KEYS` files, and for a file holding `key` (the process's own,
    `--allocation-key-file`): both flags naming one key (the Secret's new entry named twice, or written with the old
    key's bytes) accept no other key, and a process rolled so in step 2 or 3 of a rotation reads every running pod's
    allocation as forged (security T178) while the operator believes it accepts both."""
    if len(paths) > MAX_VERIFY_KEYS:
        raise SystemExit(
            f"kubegpu: --allocation-verify-key-file given {len(paths)} times; at most {MAX_VERIFY_KEYS} keys are "
            "accepted besides --allocation-key-file (a rotation needs one)"
        )
    keys: list[bytes] = []
    for path in paths:
        found = read_key(path, "the allocation verify key file")
        if found == key:
            raise SystemExit(
                f"kubegpu: the allocation verify key file {path} holds the same key as --allocation-key-file, so no "
                "other key would be accepted; name the key being rotated in or out (docs/security.md, 'Rotating the "
                "key'), or drop --allocation-verify-key-file"
            )
        if found not in keys:
            keys.append(found)
    return tuple(keys)


def _readable_by_others(status: os.stat_result) -> bool:
    """World-readable, or group-readable by a group this process is not in. A Secret mounted with the pod's
    `fsGroup` is group-readable by design: only that pod's processes carry the group."""
    if status.st_mode & 0o007:
        return True
    return bool(status.st_mode & 0o070) and status.st_gid not in {os.getegid(), *os.getgroups()}


def parse_interval(text: str) -> float:
    """A duration as Kubernetes tools write it: `20s`, `1m`, `500ms`, `1m30s`, `1h`; a bare number is seconds."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        parts = _DURATION.findall(value)
        if not parts or "".join(n + u for n, u in parts) != value:
            raise argparse.ArgumentTypeError(f"{text!r} is not a duration (examples: 20s, 1m, 500ms, 1m30s)") from None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the interval must be longer than zero")
    return seconds
