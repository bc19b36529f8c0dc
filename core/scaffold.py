"""`kubegpu plugins new NAME`: a ready plugin distribution written from the template shipped in the package.

The template (`kubegpu/core/templates/plugin`) is a working whole-device plugin built on the kit: a pyproject with
both entry points, `__init__.py` with the names both sides share, `scheduler.py` (`WholeDevicePlugin`), `device.py`
(`DeviceFilesPlugin`) and tests that run kubegpu's conformance suite, the scheduler-side driver, the advertiser on a
fake host, the in-process simulator and the CRI shim's editor. Its files carry a few upper-case tokens (`PLUGIN_NAME`,
`PACKAGE_NAME`, ...) replaced here; nothing else is generated, so the template reads as the code it becomes.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["NAME_PATTERN", "ScaffoldError", "new_plugin", "tokens"]

NAME_PATTERN = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
TEMPLATE = "templates/plugin"
SUFFIX = ".tmpl"


class ScaffoldError(ValueError):
    """The name or the target directory cannot be used; the message says why."""


def tokens(name: str) -> dict[str, str]:
    """The template's tokens for a plugin name (`acme-fpga` -> package `kubegpu_acme_fpga`, class `AcmeFpga`, ...)."""
    if not NAME_PATTERN.fullmatch(name) or len(name) > 40:
        raise ScaffoldError(
            f"{name!r} cannot name a plugin: use lower-case letters, digits and single dashes, starting with a letter"
        )
    stem = name.replace("-", "")
    return {
        "PACKAGE_NAME": f"kubegpu_{name.replace('-', '_')}",
        "DIST_NAME": f"kubegpu-{name}",
        "CLASS_NAME": "".join(part.capitalize() for part in name.split("-")),
        "RESOURCE_NAME": f"{stem}.example.com/device",
        "ENV_NAME": f"{stem.upper()}_VISIBLE_DEVICES",
        "PLUGIN_STEM": stem,
        "PLUGIN_NAME": name,
    }


def _render(text: str, values: dict[str, str]) -> str:
    for token, value in values.items():  # PLUGIN_NAME last: PLUGIN_STEM shares its prefix
        text = text.replace(token, value)
    return text


def _walk(node: Any, relative: Path) -> list[tuple[Path, Any]]:
    found = []
    for child in sorted(node.iterdir(), key=lambda c: c.name):
        if child.is_dir():
            found += _walk(child, relative / child.name)
        elif child.name.endswith(SUFFIX):
            found.append((relative / child.name.removesuffix(SUFFIX), child))
    return found


def new_plugin(name: str, target: Path) -> list[Path]:
    """Write the distribution for plugin `name` into `target` (which must not exist, or be empty); the files
    written, relative to `target`."""
    values = tokens(name)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ScaffoldError(f"{target} already exists and is not an empty directory; choose another place")
    written = []
    for relative, source in _walk(resources.files("kubegpu.core").joinpath(TEMPLATE), Path()):
        parts = [values["PACKAGE_NAME"] if part == "package" else _render(part, values) for part in relative.parts]
        path = target.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_render(source.read_text(), values))
        written.append(path.relative_to(target))
    return written
