"""What the tests of HAMi-core's region directories share: waiting for the sweeper (`limits._Sweeper`), which removes
what is set aside (`.gone-*`) in a thread of its own."""

from __future__ import annotations

import time
from pathlib import Path


def swept(hami: Path, timeout: float = 10.0) -> list[str]:
    """The names in `<hami>/containers` once nothing set aside is left there: the sweeper has removed it all. Fails
    naming what is left after `timeout` seconds."""
    parent = hami / "containers"
    deadline = time.monotonic() + timeout
    while True:
        names = sorted(p.name for p in parent.iterdir()) if parent.exists() else []
        aside = [name for name in names if name.startswith(".gone-")]
        if not aside:
            return names
        assert time.monotonic() < deadline, f"what was set aside is still there after {timeout} s: {aside}"
        time.sleep(0.02)
