"""`kubegpu plugins list`, run as a user runs it, and the shape of what the kubegpu distribution installs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import kubegpu

BUILT_INS = {
    "neuron": {"aws.amazon.com/neuron"},
    "intel-gas": {"gpu.intel.com/*"},
    "nvidia": {"nvidia.com/gpu"},
}


def run_kubegpu(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m kubegpu ARGS` in `cwd` (not the repository, so only installed modules are importable)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KUBEGPU_")}
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def plugins_json(cwd: Path, **env: str) -> dict[str, Any]:
    result = run_kubegpu("plugins", "list", "--json", cwd=cwd, **env)
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


@pytest.fixture(scope="module")
def listing(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return plugins_json(tmp_path_factory.mktemp("cwd"))


@pytest.mark.parametrize(("name", "resources"), BUILT_INS.items(), ids=list(BUILT_INS))
def test_plugins_list_json_shows_each_built_in_plugin_with_what_it_owns(
    listing: dict[str, Any], name: str, resources: set[str]
) -> None:
    rows = {row["name"]: row for row in listing["plugins"]}

    row = rows[name]
    assert row["distribution"] == "kubegpu"
    assert row["version"] == kubegpu.__version__
    assert resources <= set(row["resources"])
    assert "kubegpu_scheduler_resources" in row["hooks"]["scheduler"]
    assert "kubegpu_device_resources" in row["hooks"]["device"]


def test_plugins_list_json_reports_no_failures_for_the_built_ins(listing: dict[str, Any]) -> None:
    assert [f for f in listing["failures"] if f["name"] in BUILT_INS] == []


def test_plain_plugins_list_names_each_plugin_its_distribution_and_resources(tmp_path: Path) -> None:
    result = run_kubegpu("plugins", "list", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for name, resources in BUILT_INS.items():
        assert f"{name}  [kubegpu {kubegpu.__version__}]" in lines
        for resource in resources:
            assert resource in result.stdout


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"KUBEGPU_PLUGINS": "nvidia"}, ["nvidia"]),
        ({"KUBEGPU_PLUGINS": "neuron,intel-gas"}, ["intel-gas", "neuron"]),
        ({"KUBEGPU_DISABLE_PLUGIN_AUTOLOAD": "1"}, []),
    ],
    ids=["allow-one", "allow-two", "autoload-off"],
)
def test_plugins_list_honours_the_allowlist_and_the_autoload_switch(
    tmp_path: Path, env: dict[str, str], expected: list[str]
) -> None:
    document = plugins_json(tmp_path, **env)

    assert sorted(row["name"] for row in document["plugins"]) == expected


def test_no_top_level_core_plugins_scheduler_or_crishim_module_is_installed(tmp_path: Path) -> None:
    probe = (
        "import importlib.util, importlib.metadata, json\n"
        "names = ['core', 'plugins', 'scheduler', 'crishim']\n"
        "files = [str(f) for f in importlib.metadata.distribution('kubegpu').files or []]\n"
        "print(json.dumps({\n"
        "    'top': {n: importlib.util.find_spec(n) is not None for n in names},\n"
        "    'namespaced': {n: importlib.util.find_spec('kubegpu.' + n) is not None for n in names},\n"
        "    'files': [f for f in files if f.split('/')[0] in names],\n"
        "}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )

    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["top"] == dict.fromkeys(["core", "plugins", "scheduler", "crishim"], False)
    assert found["namespaced"] == dict.fromkeys(["core", "plugins", "scheduler", "crishim"], True)
    assert found["files"] == []
