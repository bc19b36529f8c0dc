"""`benchmarks/gpu_share_check.py` runs only where a GPU is lent; its kubegpu half runs here on a made-up NVML (the
plugin's real discovery path), so that a change to the node side, the engine or the shim's editor that would break
the check on a GPU machine breaks this test first: the advertised Node, the two 30 % shares each written MPS's limits
(the second's spec trying 100 %), the third share refused, and each container's environment as the CUDA processes
get it, mount paths read from the host."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from .test_nvidia_device import MIB, FakeGpu, fake_nvml

CHECK = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_share_check.py"
H200 = FakeGpu(name="NVIDIA H200", memory=143771 * MIB)


def _check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_share_check", CHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_checks_shares_are_placed_refused_and_edited_as_on_the_gpu_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    check = _check()
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([H200]))
    monkeypatch.setenv("KUBEGPU_NVIDIA_SHARE_LIMITS", "mps")
    monkeypatch.setenv("KUBEGPU_MPS_PIPE_DIRECTORY", str(tmp_path / "pipe"))
    monkeypatch.setenv("KUBEGPU_MPS_LOG_DIRECTORY", str(tmp_path / "log"))

    node, edited, refusal = check.place_and_edit()

    allocatable = node["status"]["allocatable"]
    assert (allocatable["nvidia.com/gpu"], allocatable["nvidia.com/gpucores"]) == ("10", "100")
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert refusal == "0/1 nodes are available: 1 Insufficient nvidia.com/gpucores."
    for name in ("share-a", "share-b"):  # share-b's spec sets 100 % and a huge memory limit: the shim's win
        env = check.container_env(edited[name])
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30", name
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={143771 * 30 // 100}M", name
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "pipe"), name  # the host's, where the daemon runs
        assert env["CUDA_MPS_LOG_DIRECTORY"] == str(tmp_path / "log"), name
        assert edited[name]["shares"]["main"]["nvidia.com/gpucores"] == {"0": 30}, name
