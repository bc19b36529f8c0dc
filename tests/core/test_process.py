"""The allocation key file, as an operator creates it: anyone holding the key can sign an allocation that every
node's CRI shim obeys, so a guessable key, the example's placeholder, or a file that is not a small regular file
stops the process with a one-line reason that says how to create a good key.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kubegpu.core.process import MAX_KEY_FILE_BYTES, MIN_KEY_BYTES, read_key

PACKAGE = Path(__file__).resolve().parents[2]

GOOD = b"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="  # `head -c 32 /dev/urandom | base64` looks like this
SECRET_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "deploy" / "scheduler" / "secret.yaml"


def _key_file(tmp_path: Path, content: bytes, mode: int = 0o600) -> str:
    path = tmp_path / "allocation.key"
    path.write_bytes(content)
    path.chmod(mode)
    return str(path)


@pytest.mark.parametrize(
    ("content", "key"),
    [(GOOD, GOOD), (GOOD + b"\n", GOOD), (GOOD + b"\r\n", GOOD), (b"k" * MIN_KEY_BYTES, b"k" * MIN_KEY_BYTES)],
    ids=["base64", "trailing-newline", "trailing-crlf", "exactly-32-bytes"],
)
def test_a_good_key_is_read_without_its_trailing_newline(tmp_path: Path, content: bytes, key: bytes) -> None:
    assert read_key(_key_file(tmp_path, content)) == key


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "is empty"),
        (b"\n", "is empty"),
        (b"x", "is 1 bytes; at least 32 are needed"),
        (b"k" * (MIN_KEY_BYTES - 1) + b"\n", "is 31 bytes; at least 32 are needed"),
        (b" " * 40 + b"\n", "holds only blanks"),
        (b"\t \x0b\x0c" * 10, "holds only blanks"),
        (b"REPLACE-WITH-RANDOM-BYTES\n", "holds the placeholder REPLACE-WITH-RANDOM-BYTES"),
        (b"k" * (MAX_KEY_FILE_BYTES + 1), f"is larger than {MAX_KEY_FILE_BYTES} bytes"),
    ],
    ids=["empty", "only-a-newline", "one-byte", "31-bytes", "spaces", "whitespace", "placeholder", "over-64-KiB"],
)
def test_a_weak_key_is_refused_saying_how_to_make_one(tmp_path: Path, content: bytes, reason: str) -> None:
    path = _key_file(tmp_path, content)

    with pytest.raises(SystemExit) as caught:
        read_key(path)

    message = str(caught.value.code)
    assert message.startswith("kubegpu: the allocation key") and reason in message and "\n" not in message
    if "bytes;" in reason or "blanks" in reason or "placeholder" in reason or "empty" in reason:
        assert "head -c 32 /dev/urandom | base64" in message


def test_the_placeholder_refused_is_the_one_the_example_secret_ships() -> None:
    assert "key: REPLACE-WITH-RANDOM-BYTES" in SECRET_EXAMPLE.read_text()


def test_a_missing_file_or_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"cannot read the allocation key file .*: No such file"):
        read_key(str(tmp_path / "missing"))
    with pytest.raises(SystemExit, match=r"is not a regular file|Is a directory"):
        read_key(str(tmp_path))


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_a_device_or_a_fifo_is_refused_at_once_rather_than_read_forever(tmp_path: Path, kind: str) -> None:
    path = "/dev/zero"
    if kind == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    # In a child, so that reading /dev/zero without end (or waiting on a FIFO's writer) fails the test, not the run.
    code = f"from kubegpu.core.process import read_key; read_key({path!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)

    assert done.returncode == 1
    assert f"the allocation key file {path} is not a regular file" in done.stderr


FOREIGN_GROUP = next(g for g in range(54321, 60000) if g != os.getegid() and g not in os.getgroups())


@pytest.mark.parametrize(
    ("mode", "foreign_group", "warned"),
    [
        (0o600, False, False),
        (0o400, False, False),
        (0o440, False, False),  # a Secret mounted with the pod's fsGroup: only this pod's processes have the group
        (0o640, True, True),
        (0o644, False, True),
    ],
    ids=["owner-rw", "owner-r", "own-group", "foreign-group", "world"],
)
def test_a_key_others_may_read_is_used_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int, foreign_group: bool, warned: bool
) -> None:
    path = _key_file(tmp_path, GOOD, mode)
    if foreign_group:
        os.chown(path, -1, FOREIGN_GROUP)  # the tests run as root (real components need it)

    with caplog.at_level(logging.WARNING, logger="kubegpu"):
        assert read_key(path) == GOOD

    warnings = [r.getMessage() for r in caplog.records if r.name == "kubegpu" and r.levelno == logging.WARNING]
    assert bool(warnings) == warned
    if warned:
        assert f"mode {mode:o}" in warnings[0] and "chmod 600" in warnings[0] and "fsGroup" in warnings[0]


# A raw key: `head -c 32 /dev/urandom > FILE`. Its first 31 bytes here include bytes no text key has.
RAW_PREFIX = bytes([0x00, 0xFF, 0x0A, 0x0D, 0x80, 0x20]) + bytes(range(0xC0, 0xC0 + 25))


@pytest.mark.parametrize("last", range(256), ids=lambda b: f"0x{b:02x}")
def test_a_raw_random_key_is_read_whole_whatever_its_last_byte(tmp_path: Path, last: int) -> None:
    key = RAW_PREFIX + bytes([last])
    assert len(key) == MIN_KEY_BYTES
    assert read_key(_key_file(tmp_path, key)) == key


@pytest.mark.parametrize("last", range(0x20, 0x7F), ids=lambda b: f"0x{b:02x}")
@pytest.mark.parametrize("line_end", [b"", b"\n", b"\r\n"], ids=["no-newline", "newline", "crlf"])
def test_a_text_key_is_read_without_its_line_end_whatever_its_last_character(
    tmp_path: Path, last: int, line_end: bytes
) -> None:
    key = GOOD[:-1] + bytes([last])
    assert read_key(_key_file(tmp_path, key + line_end)) == key


def test_every_process_that_signs_or_verifies_reads_the_key_with_read_key() -> None:
    """The scheduler side (scheduler, extender, top) and the node side (shim, device plugin) read one format."""
    readers = []
    for path in sorted(PACKAGE.glob("*/*.py")):
        if ".venv" in path.parts or "tests" in path.parts or "build" in path.parts:
            continue
        text = path.read_text()
        if "args.allocation_key_file" in text:
            readers.append(path.relative_to(PACKAGE).as_posix())
            assert "read_key(args.allocation_key_file)" in text, path
            assert "open(args.allocation_key_file" not in text and "Path(args.allocation_key_file)" not in text, path
    assert {"scheduler/custom.py", "scheduler/extender.py", "crishim/shim.py", "crishim/deviceplugin.py"} <= set(
        readers
    )
