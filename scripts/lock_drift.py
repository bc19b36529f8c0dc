"""What differs between this environment and a lock file: run by `scripts/test.sh --latest` after it installs the
newest versions pyproject.toml's ranges admit, so the run says which updates it is testing.

    python scripts/lock_drift.py requirements/test.txt

Prints one line per package whose installed version is not the locked one (or that only one side has), then a count.
It never fails: the suite that follows is the judge.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


def locked(path: Path) -> dict[str, str]:
    """Name -> version of the pins in a requirements file that apply to this interpreter and platform."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        match = _PIN.match(line.strip())
        if match is None:
            continue
        name, version, marker = match.groups()
        if marker is None or Marker(marker).evaluate():
            pins[canonicalize_name(name)] = version
    return pins


def installed() -> dict[str, str]:
    return {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: lock_drift.py REQUIREMENTS_FILE", file=sys.stderr)
        return 2
    pins, present = locked(Path(argv[0])), installed()
    present.pop("kubegpu", None)
    present.pop("pip", None)  # the venv's own installer, outside the lock
    changed = 0
    for name in sorted(pins.keys() | present.keys()):
        was, now = pins.get(name), present.get(name)
        if was != now:
            changed += 1
            print(f"   {name}: locked {was or '(absent)'}, testing {now or '(absent)'}")
    print(f"== {changed} of {len(pins)} locked packages differ from {argv[0]}" if changed else "== same as the lock")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
