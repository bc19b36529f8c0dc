"""The lock the suite and the image install from says what pyproject.toml says, and every file in it has a hash.

`scripts/lock.sh` writes uv.lock and exports requirements/test.txt and requirements/runtime.txt from it; these tests
fail when pyproject.toml's dependencies change without a refresh, or when an exported file is edited by hand.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the lock carries tomli for 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(?:\s*;\s*(.+?))?\s*\\$")
REFRESH = "pyproject.toml and the lock disagree: run ./scripts/lock.sh and commit uv.lock and requirements/"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lock() -> dict:
    return tomllib.loads((ROOT / "uv.lock").read_text())


def _locked_versions() -> dict[str, set[str]]:
    versions: dict[str, set[str]] = {}
    for package in _lock()["package"]:
        versions.setdefault(canonicalize_name(package["name"]), set()).add(package["version"])
    return versions


def _pins(path: Path) -> list[tuple[str, str, int]]:
    """(name, version, hashes) for each pin of an exported requirements file."""
    lines = path.read_text().splitlines()
    pins = []
    for number, line in enumerate(lines):
        match = _PIN.match(line.strip())
        if match is None:
            continue
        hashes = 0
        for following in lines[number + 1 :]:
            if not following.strip().startswith("--hash=sha256:"):
                break
            hashes += 1
        pins.append((canonicalize_name(match.group(1)), match.group(2), hashes))
    return pins


def _declared() -> set[tuple[str, str, str]]:
    """(name, specifier, extra) of every dependency pyproject.toml declares, test and nvidia extras included."""
    project = _pyproject()["project"]
    declared = {(Requirement(text), "") for text in project["dependencies"]}
    for extra, texts in project["optional-dependencies"].items():
        declared |= {(Requirement(text), extra) for text in texts}
    return {(canonicalize_name(r.name), str(SpecifierSet(str(r.specifier))), extra) for r, extra in declared}


def test_the_lock_was_made_from_this_pyproject() -> None:
    (ours,) = (p for p in _lock()["package"] if p["name"] == "kubegpu")
    locked = set()
    for entry in ours["metadata"]["requires-dist"]:
        marker = entry.get("marker", "")
        extra = re.search(r"extra == '([^']+)'", marker)
        locked.add(
            (canonicalize_name(entry["name"]), str(SpecifierSet(entry.get("specifier", ""))), extra[1] if extra else "")
        )

    assert locked == _declared(), REFRESH
    groups = _pyproject()["dependency-groups"]
    for group, texts in groups.items():
        wanted = {(canonicalize_name(Requirement(t).name), str(Requirement(t).specifier)) for t in texts}
        have = {(canonicalize_name(e["name"]), e.get("specifier", "")) for e in ours["metadata"]["requires-dev"][group]}
        assert have == wanted, REFRESH


def test_every_pinned_file_has_a_hash_and_the_version_uv_lock_resolved() -> None:
    versions = _locked_versions()
    for name in ("test.txt", "runtime.txt"):
        pins = _pins(ROOT / "requirements" / name)
        assert len(pins) > 20, f"requirements/{name} pins {len(pins)} packages"
        for package, version, hashes in pins:
            assert version in versions.get(package, set()), (
                f"requirements/{name}: {package}=={version} is not in uv.lock"
            )
            assert hashes >= 1, f"requirements/{name}: {package} has no hash"


def test_the_test_lock_holds_every_declared_dependency_within_its_range() -> None:
    pins = {package: version for package, version, _ in _pins(ROOT / "requirements" / "test.txt")}
    runtime = {package for package, _, _ in _pins(ROOT / "requirements" / "runtime.txt")}
    for package, specifier, extra in _declared():
        if extra == "nvidia":  # real NVML only: the tests fake it
            continue
        assert package in pins, f"requirements/test.txt lacks {package}: {REFRESH}"
        assert SpecifierSet(specifier).contains(pins[package], prereleases=True), (package, pins[package], specifier)
        if not extra:
            assert package in runtime, f"requirements/runtime.txt lacks {package}: {REFRESH}"
