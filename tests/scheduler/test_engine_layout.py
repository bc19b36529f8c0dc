"""The engine's parts stay small enough to read, and each is named where a newcomer looks for it.

Issue #21's promise: no module of `kubegpu.scheduler.engine` above about 500 lines, every one a layer of the
import-linter contract that keeps the parts layered (`pyproject.toml`) and a row of docs/framework.md's table of parts.
A part that grows past the limit is split along what it owns, as `gangs` was (placement, `gangpreempt`,
`gangdomains`).
"""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the lock's Python is 3.11+
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "scheduler" / "engine"
MAX_LINES = 500


def oversized(engine: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """The engine's modules longer than `limit` lines, with their lengths."""
    lengths = {path.name: len(path.read_text().splitlines()) for path in sorted(engine.glob("*.py"))}
    return {name: lines for name, lines in lengths.items() if lines > limit}


def parts(engine: Path) -> set[str]:
    return {path.stem for path in engine.glob("*.py") if path.stem != "__init__"}


def test_no_module_of_the_engine_is_longer_than_500_lines() -> None:
    assert oversized(ENGINE) == {}, f"split these along what they own: {oversized(ENGINE)}"


def test_every_part_of_the_engine_is_a_layer_of_the_import_contract() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layered,) = [c for c in contracts if c.get("containers") == ["kubegpu.scheduler.engine"]]
    assert set(layered["layers"]) == parts(ENGINE)


def test_every_part_of_the_engine_has_a_row_in_the_framework_doc() -> None:
    doc = (ROOT / "docs" / "framework.md").read_text()
    missing = sorted(part for part in parts(ENGINE) if f"| `{part}.py` |" not in doc)
    assert missing == []
