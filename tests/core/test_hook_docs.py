"""Guard tests, after datasette's: every hook is documented (docstring and docs/hooks.md) and tested.

A plugin author reads `docs/hooks.md` and the spec docstrings; a hook added to a spec without both, or without
a test that calls it, fails here.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kubegpu.core import device_hooks, scheduler_hooks

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "hooks.md"
TESTS = ROOT / "tests"
SPECS = [scheduler_hooks, device_hooks]


def _hooks(module: ModuleType) -> list[tuple[str, Callable[..., Any], dict[str, Any]]]:
    """The module's hook specifications in definition order, with their pluggy options."""
    marker = f"{module.PROJECT}_spec"
    return [
        (name, value, getattr(value, marker))
        for name, value in vars(module).items()
        if callable(value) and hasattr(value, marker)
    ]


HOOKS = [hook for module in SPECS for hook in _hooks(module)]
HOOK_NAMES = [name for name, _, _ in HOOKS]


def _doc_sections() -> dict[str, str]:
    """`### <hook>` heading -> the text up to the next heading."""
    sections: dict[str, str] = {}
    current: str | None = None
    for line in DOCS.read_text().splitlines():
        if line.startswith("#"):
            current = line.removeprefix("###").strip() if line.startswith("### ") else None
            if current is not None:
                sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    return sections


def test_both_specs_define_hooks_with_their_prefix() -> None:
    assert {n.split("_")[1] for n in HOOK_NAMES} == {"scheduler", "device"}
    for module in SPECS:
        side = module.PROJECT.removeprefix("kubegpu.")
        assert all(name.startswith(f"kubegpu_{side}_") for name, _, _ in _hooks(module))
    assert "kubegpu_scheduler_fit" in HOOK_NAMES
    assert "kubegpu_device_edit_container" in HOOK_NAMES


@pytest.mark.parametrize(("name", "function", "options"), HOOKS, ids=HOOK_NAMES)
def test_every_hook_docstring_follows_the_template(
    name: str, function: Callable[..., Any], options: dict[str, Any]
) -> None:
    doc = inspect.getdoc(function) or ""
    summary = doc.splitlines()[0] if doc else ""

    assert summary.endswith("."), f"{name}: the docstring must open with a one-line summary"
    for section in ("Args:", "Returns:", "Called by:"):
        assert f"\n{section}\n" in doc, f"{name}: the docstring lacks a {section!r} section"
    for parameter in inspect.signature(function).parameters:
        assert f"{parameter}:" in doc.split("Returns:")[0], f"{name}: Args does not describe {parameter!r}"
    assert not options["firstresult"], f"{name}: kubegpu calls one plugin at a time; firstresult would mean nothing"
    called_by = " ".join(doc.split("Called by:")[1].split())
    dispatch = ("every plugin", "only")
    assert any(word in called_by for word in dispatch), f"{name}: 'Called by' must say which plugins are called"
    assert "Kubernetes:" in called_by or name.startswith("kubegpu_device_"), (
        f"{name}: 'Called by' must name the Kubernetes scheduling-framework extension point"
    )


@pytest.mark.parametrize(("name", "function", "options"), HOOKS, ids=HOOK_NAMES)
def test_every_hook_has_a_section_in_docs_hooks_md(
    name: str, function: Callable[..., Any], options: dict[str, Any]
) -> None:
    sections = _doc_sections()

    assert name in sections, f"docs/hooks.md has no '### {name}' heading"
    section = sections[name]
    assert f"def {name}(" in section, f"docs/hooks.md: the {name} section does not show its signature"
    for parameter in inspect.signature(function).parameters:
        assert f"{parameter}:" in section, f"docs/hooks.md: the {name} section does not describe {parameter!r}"
    for part in ("**Returns:**", "**Called by:**"):
        assert part in section, f"docs/hooks.md: the {name} section lacks {part}"


def test_docs_hooks_md_documents_no_hook_that_does_not_exist_and_keeps_the_spec_order() -> None:
    documented = [heading for heading in _doc_sections() if heading.startswith("kubegpu_")]

    assert documented == HOOK_NAMES


def _test_sources() -> dict[Path, str]:
    return {path: path.read_text() for path in sorted(TESTS.rglob("test_*.py")) if path != Path(__file__).resolve()}


@pytest.mark.parametrize("name", HOOK_NAMES)
def test_every_hook_is_exercised_by_a_test(name: str) -> None:
    pattern = re.compile(rf"\b{name}\b")

    users = [path.name for path, text in _test_sources().items() if pattern.search(text)]

    assert users, f"no test under tests/ calls {name}"
