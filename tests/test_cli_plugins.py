"""`kubegpu plugins list`, run as a user runs it, and the shape of what the kubegpu distribution installs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
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


# ------------------------------------------------------------------------------------------------------------
# `plugins new`, `plugins check` and a failing `plugins list`, as a plugin author runs them in a fresh venv
# ------------------------------------------------------------------------------------------------------------


def _fresh_venv(path: Path) -> Path:
    """A virtual environment that sees the running one's packages (kubegpu from this checkout and its
    dependencies) through a `.pth` file, so that only the new distributions are installed, offline."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    parent = sysconfig.get_paths()["purelib"]
    Path(purelib, "_kubegpu_parent.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    return python


def _in(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("KUBEGPU_", "PYTHON"))}
    return subprocess.run(
        [str(python), *args], cwd=cwd, env=environment, capture_output=True, text=True, timeout=300, check=False
    )


def _pip_install(python: Path, source: Path) -> None:
    command = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-input"]
    command += ["--disable-pip-version-check", "--quiet", "--no-build-isolation", str(source)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_plugins_new_writes_a_distribution_that_installs_passes_its_tests_and_plugins_check(tmp_path: Path) -> None:
    python = _fresh_venv(tmp_path / "venv")

    new = _in(python, "-m", "kubegpu", "plugins", "new", "acme", cwd=tmp_path)
    assert new.returncode == 0, new.stderr
    assert "wrote acme/pyproject.toml" in new.stdout
    _pip_install(python, tmp_path / "acme")

    tests = _in(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "acme", cwd=tmp_path)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "3 passed" in tests.stdout
    check = _in(python, "-m", "kubegpu", "plugins", "check", "acme", cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.startswith("ok   acme: scheduler and device side(s) conform")
    listed = _in(python, "-m", "kubegpu", "plugins", "list", "--json", cwd=tmp_path)
    rows = {row["name"]: row for row in json.loads(listed.stdout)["plugins"]}
    assert rows["acme"]["resources"] == ["acme.example.com/device"]

    # A copy whose node side sets an env variable it does not declare: `plugins check` names the rule.
    assert _in(python, "-m", "kubegpu", "plugins", "new", "broken", cwd=tmp_path).returncode == 0
    device = tmp_path / "broken" / "kubegpu_broken" / "device.py"
    device.write_text(
        device.read_text().replace(
            "\n\nplugin = ",
            "\n\n    def edit(self, allocation, edit, ids):\n        edit.envs['LD_LIBRARY_PATH'] = '/opt/broken'\n"
            "\n\nplugin = ",
        )
    )
    _pip_install(python, tmp_path / "broken")
    check = _in(python, "-m", "kubegpu", "plugins", "check", "broken", cwd=tmp_path)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "FAIL broken: edits-owned-only: container main: env LD_LIBRARY_PATH changed" in check.stdout

    # A distribution whose module cannot be imported: `plugins list` and `plugins check` exit 1 naming it.
    missing = tmp_path / "missing"
    (missing / "kubegpu_missing").mkdir(parents=True)
    (missing / "kubegpu_missing" / "__init__.py").write_text("import vendor_sdk_that_is_not_installed\n")
    (missing / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "kubegpu-missing"\nversion = "0.1.0"\n'
        '[project.entry-points."kubegpu.scheduler"]\nmissing = "kubegpu_missing"\n'
        "[tool.setuptools]\npackages = ['kubegpu_missing']\n"
    )
    _pip_install(python, missing)
    listed = _in(python, "-m", "kubegpu", "plugins", "list", cwd=tmp_path)
    assert listed.returncode == 1
    assert "FAILED plugin 'missing' (scheduler) failed at load: ModuleNotFoundError" in listed.stdout
    check = _in(python, "-m", "kubegpu", "plugins", "check", "missing", "acme", cwd=tmp_path)
    assert check.returncode == 1
    assert "FAIL missing: load:" in check.stdout and "ok   acme" in check.stdout


def test_plugins_new_refuses_a_name_that_cannot_be_a_package_and_an_occupied_directory(tmp_path: Path) -> None:
    bad = run_kubegpu("plugins", "new", "Acme_GPU", cwd=tmp_path)
    assert bad.returncode == 2
    assert "'Acme_GPU' cannot name a plugin" in bad.stderr

    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "notes.txt").write_text("mine")
    occupied = run_kubegpu("plugins", "new", "acme", cwd=tmp_path)
    assert occupied.returncode == 2
    assert "already exists" in occupied.stderr
    assert (tmp_path / "acme" / "notes.txt").read_text() == "mine"


def test_plugins_check_passes_for_the_built_in_plugins_and_fails_for_an_unknown_name(tmp_path: Path) -> None:
    result = run_kubegpu("plugins", "check", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in BUILT_INS:
        assert f"ok   {name}: scheduler and device side(s) conform" in result.stdout

    unknown = run_kubegpu("plugins", "check", "nonesuch", cwd=tmp_path)
    assert unknown.returncode == 1
    assert "FAIL nonesuch: load: no plugin of that name is installed" in unknown.stdout


def test_plain_plugins_list_prints_a_distributions_words_as_escaped_bounded_lines(tmp_path: Path) -> None:
    """A distribution whose entry-point name, version and resource hold terminal escapes, and one whose module fails
    to import with 100,000 characters of them: `kubegpu plugins list` printed them raw (a retitled, recoloured
    terminal, a forged line). Each is now one printable line of bounded length."""
    site = tmp_path / "site"
    package = site / "kubegpu_loud"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "from kubegpu.core.scheduler_hooks import hookimpl\n\n\n"
        "@hookimpl\ndef kubegpu_scheduler_resources():\n    return ['loud.example/\\x1b]0;pwned\\x07card']\n"
    )
    (package / "noisy.py").write_text("raise ImportError('\\x1b[31m' + 'A' * 100_000 + '\\nFAKE LINE')\n")
    dist_info = site / "kubegpu_loud-0.1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: kubegpu-loud\nVersion: 0.1.0\x1b[2J\n")
    (dist_info / "entry_points.txt").write_text(
        "[kubegpu.scheduler]\nloud\x1b[31m = kubegpu_loud\nnoisy = kubegpu_loud.noisy\n"
    )

    listed = run_kubegpu("plugins", "list", cwd=tmp_path, PYTHONPATH=str(site))

    assert listed.returncode == 1
    assert "FAILED plugin 'noisy' (scheduler) failed at load: ImportError: \\x1b[31mAAA" in listed.stdout
    assert "loud\\x1b[31m  [kubegpu-loud 0.1.0\\x1b[2J]" in listed.stdout
    assert "resources: loud.example/\\x1b]0;pwned\\x07card" in listed.stdout
    for text in (listed.stdout, listed.stderr):
        assert "\x1b" not in text and "\x07" not in text and "FAKE LINE\n" not in text
        assert max(map(len, text.splitlines())) < 1200
