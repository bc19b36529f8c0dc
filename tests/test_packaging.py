"""A plain (non-editable) install, as a new user gets it: one `kubegpu` namespace and working entry points."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    return next(out.glob("kubegpu-*.whl"))


@pytest.mark.slow
def test_the_wheel_installs_nothing_outside_the_kubegpu_namespace(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.startswith("kubegpu-")} == {"kubegpu"}
    for package in ("core", "plugins", "scheduler", "crishim"):
        assert f"kubegpu/{package}/__init__.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[kubegpu.scheduler]" in text and "[kubegpu.device]" in text and "[pytest11]" in text


@pytest.mark.slow
def test_a_fresh_virtualenv_lists_the_builtin_plugins(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # The dependencies come from the test environment (no network); kubegpu itself only from the wheel.
    deps = sysconfig.get_paths()["purelib"]
    (Path(purelib) / "deps.pth").write_text(deps + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            purelib,
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    result = subprocess.run(
        [
            python,
            "-I",
            "-c",
            "import kubegpu.cli as c, sys; sys.argv=['kubegpu','plugins','list','--json'];"
            "print(c.__file__, file=sys.stderr); raise SystemExit(c.main())",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.stderr.strip().startswith(purelib), "kubegpu must come from the fresh install"
    listing = {p["name"]: p for p in json.loads(result.stdout)["plugins"]}
    assert {"neuron", "intel-gas", "nvidia"} <= set(listing)
    assert listing["neuron"]["resources"] == [
        "aws.amazon.com/neuron",
        "aws.amazon.com/neurondevice",
        "aws.amazon.com/neuroncore",
    ]
    assert listing["intel-gas"]["resources"] == ["gpu.intel.com/*"]
    assert listing["nvidia"]["resources"][:4] == [
        "nvidia.com/gpu",
        "nvidia.com/gpucores",
        "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage",
    ]
    # and the MIG profiles of the A100 and H100 placement tables
    assert {"nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-7g.80gb"} <= set(
        listing["nvidia"]["resources"]
    )
    for module in ("core", "plugins", "scheduler", "crishim"):
        probe = subprocess.run([python, "-I", "-c", f"import {module}"], capture_output=True, cwd=tmp_path)
        assert probe.returncode != 0, f"a top-level module {module!r} is importable"
