"""`kubegpu crishim` between a CRI client playing the kubelet and a real containerd with runc.

The story of a node: the scheduler (the real engine with the example FPGA plugin, signing with the cluster key)
gives a pod two of the node's four cards; the kubelet runs the pod's sandbox with the pod's annotations, creates and
starts its container through the shim, and inside the running container exactly those two cards exist, with the
plugin's env; a card a vendor device plugin had slipped into the request is gone. Allocations that were tampered
with, copied from another pod, made for another node or never signed are refused with FAILED_PRECONDITION naming
the check, and no container is created. So are allocations the codec chokes on, and a stale allocation (rolled
back, then put back by the pod's owner) whose device the scheduler has since given to a live pod: the shim reads the
allocation from containerd's own record of the sandbox, and no device goes to two live pods. A container that sets
`NVIDIA_VISIBLE_DEVICES=all` without an allocation runs without it. Two shares of one GPU (the real engine with the
nvidia plugin, a HAMi-style node) each run with the GPU's device node and their own HAMi-core limits, whatever limit
the tenant wrote in the spec or its image carries (HAMi-core's and MPS's variables in its `ENV`, an `/overrideEnv` and
shared regions in its layers, a volume at `/tmp` with another region); a share the node cannot enforce is refused
and the shim keeps serving. Everything
else passes through as containerd answers it, including while containerd restarts. The last test runs the real
`kubegpu crishim` command: a private socket, the same result, and a clean exit on SIGTERM.

The device files are character devices made with mknod under a temporary dev root (`--dev-root`), so nothing on the
host is touched. Every pod uses the host network: no CNI is needed.
"""

from __future__ import annotations

import importlib
import secrets
import shutil
import stat
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2

from kubegpu.core.annotations import ALLOCATION_KEY, DEVICES_KEY, decode_allocation, encode_allocation, encode_devices
from kubegpu.core.manifests import pod_request
from kubegpu.core.models import NodeDevices
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, pod_manifest
from kubegpu.crishim.shim import ContainerEditor, RunningShim, start_shim
from kubegpu.plugins.neuron import device as neuron_device
from kubegpu.plugins.nvidia import device as nvidia_device
from kubegpu.plugins.nvidia import scheduler as nvidia_scheduler
from kubegpu.plugins.nvidia.limits import HAMI_DIR_ENV, MODE_ENV, MPS_LOG_ENV, MPS_PIPE_ENV
from kubegpu.scheduler.engine import Engine

from .containerd import (
    Containerd,
    Cri,
    container_config,
    derived_image,
    fpga_plugin_path,
    host_network_sandbox,
    image_tar,
    make_char_devices,
    running_containerd,
    start_shim_process,
    wait_until,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fpga"
FPGA = "example.com/fpga"
NODE = "node-a"
CARDS = ["fpga0", "fpga1", "fpga2", "fpga3"]
GPU_FILES = ["nvidia0", "nvidiactl"]


@pytest.fixture(scope="module")
def fpga() -> tuple[ModuleType, ModuleType]:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLE))
        return importlib.import_module("kubegpu_fpga.scheduler"), importlib.import_module("kubegpu_fpga.device")


@pytest.fixture(scope="module")
def containerd() -> Iterator[Containerd]:
    with running_containerd() as runtime:
        yield runtime


@pytest.fixture(scope="module")
def node_dir() -> Iterator[Path]:
    """A short per-module directory: the dev root with four cards, the key file and the shim's socket."""
    directory = Path(tempfile.mkdtemp(prefix="kubegpu-node-"))
    make_char_devices(directory / "dev", [*CARDS, *GPU_FILES])
    (directory / "allocation.key").write_text(secrets.token_hex(32) + "\n")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def key(node_dir: Path) -> bytes:
    return (node_dir / "allocation.key").read_bytes().rstrip(b"\n")


@pytest.fixture(scope="module")
def shim(
    containerd: Containerd, node_dir: Path, key: bytes, fpga: tuple[ModuleType, ModuleType]
) -> Iterator[RunningShim]:
    plugins = make_plugin_manager(
        "device",
        plugins=[("fpga", fpga[1]), ("nvidia", nvidia_device), ("neuron", neuron_device)],
        autoload=False,
    )
    # No API server: the shim knows only what containerd and the request tell it, as the shipped systemd unit runs.
    editor = ContainerEditor(plugins, node=NODE, key=key, dev_root=node_dir / "dev")
    running = start_shim(f"unix://{node_dir / 'cri.sock'}", containerd.endpoint, editor, workers=8)
    yield running
    running.stop(1)


@pytest.fixture(scope="module")
def kubelet(shim: RunningShim) -> Iterator[Cri]:
    client = Cri(f"unix://{shim.socket}")
    yield client
    client.close()


@pytest.fixture(scope="module")
def direct(containerd: Containerd) -> Iterator[Cri]:
    client = Cri(containerd.endpoint)
    yield client
    client.close()


class Scheduler:
    """The real engine with the FPGA plugin, placing pods on this node and signing their allocations."""

    def __init__(self, fpga_scheduler: ModuleType, key: bytes, node: str = NODE) -> None:
        plugins = make_plugin_manager("scheduler", plugins=[("fpga", fpga_scheduler)], autoload=False)
        self.engine = Engine(plugins, signing_key=key)
        self.engine.add_node(make_node(node, labels={"example.com/fpga.count": "4"}, allocatable={FPGA: 4}))

    def place(self, name: str, cards: int, uid: str | None = None) -> tuple[str, dict[str, str]]:
        """Schedule a pod asking for `cards` cards in container `main`: its UID and the annotations written on it."""
        uid = uid or f"uid-{name}-{secrets.token_hex(4)}"
        manifest = pod_manifest(name, {"main": {FPGA: cards}})
        manifest["metadata"]["uid"] = uid
        decision = self.engine.schedule(pod_request(manifest)[0])
        assert decision.scheduled, decision.reason
        return uid, dict(decision.annotations)


@pytest.fixture
def scheduler(fpga: tuple[ModuleType, ModuleType], key: bytes) -> Scheduler:
    return Scheduler(fpga[0], key)


def _cards_in(cri: Cri, container_id: str) -> list[str]:
    return sorted(name for name in cri.exec(container_id, "ls", "/dev").split() if name.startswith("fpga"))


def _env(cri: Cri, container_id: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in cri.exec(container_id, "env").splitlines() if "=" in line)


def test_a_container_sees_exactly_its_allocated_cards(
    kubelet: Cri, scheduler: Scheduler, node_dir: Path, tmp_path: Path
) -> None:
    scheduler.place("someone-else", 1)  # takes fpga0
    uid, annotations = scheduler.place("trainer", 2)
    assert decode_allocation(annotations[ALLOCATION_KEY]).device_ids("main", FPGA) == ["fpga1", "fpga2"]

    sandbox = host_network_sandbox("trainer", uid, annotations=annotations, log_directory=tmp_path)
    sandbox_id = kubelet.run_pod(sandbox)
    try:
        # A vendor device plugin handed this container fpga0, which belongs to another pod.
        config = container_config("main", devices=[(str(node_dir / "dev" / "fpga0"), "/dev/fpga0")])
        container_id = kubelet.create(sandbox_id, config, sandbox)
        kubelet.start(container_id)

        assert _cards_in(kubelet, container_id) == ["fpga1", "fpga2"]
        env = _env(kubelet, container_id)
        assert env["FPGA_VISIBLE_DEVICES"] == "fpga1,fpga2"
        assert "FPGA_BITSTREAM" not in env  # the node has no bitstream loaded
        # They are the host's device nodes (character devices 1,3 under the dev root), not empty files.
        assert (
            kubelet.exec(container_id, "stat", "-c", "%F %t,%T", "/dev/fpga1").strip() == "character special file 1,3"
        )
    finally:
        kubelet.remove_pod(sandbox_id)


def _gpu_scheduler(key: bytes) -> Engine:
    """The real engine with the nvidia plugin and one GPU of 16 GiB offered as HAMi's device plugin offers it."""
    plugins = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia_scheduler)], autoload=False)
    engine = Engine(plugins, signing_key=key)
    labels = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "16384"}
    allocatable = {"nvidia.com/gpu": 10, "nvidia.com/gpucores": 100, "nvidia.com/gpumem": 16384}
    engine.add_node(make_node(NODE, labels=labels, allocatable=allocatable))
    return engine


def _place_share(engine: Engine, name: str, cores: int, mib: int) -> tuple[str, dict[str, str]]:
    uid = f"uid-{name}-{secrets.token_hex(4)}"
    manifest = pod_manifest(
        name, {"main": {"nvidia.com/gpu": 1, "nvidia.com/gpucores": cores, "nvidia.com/gpumem": mib}}
    )
    manifest["metadata"]["uid"] = uid
    decision = engine.schedule(pod_request(manifest)[0])
    assert decision.scheduled, decision.reason
    return uid, dict(decision.annotations)


@pytest.fixture
def hami_core(node_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The node runs HAMi-core: its library directory as an operator installs it (the library itself is a stand-in:
    no GPU here, and busybox is static, so nothing is preloaded)."""
    directory = node_dir / "vgpu"
    (directory / "vgpulock").mkdir(parents=True, exist_ok=True)
    (directory / "libvgpu.so").write_bytes(b"")
    (directory / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    monkeypatch.setenv(MODE_ENV, "hami-core")
    monkeypatch.setenv(HAMI_DIR_ENV, str(directory))
    return directory


def test_two_shares_of_one_gpu_each_run_with_the_gpu_and_their_own_limits(
    kubelet: Cri, key: bytes, hami_core: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _gpu_scheduler(key)
    shares = {"notebook": (30, 4096), "inference": (60, 8192)}
    placed = {name: _place_share(engine, name, cores, mib) for name, (cores, mib) in shares.items()}
    for _, written in placed.values():
        record = decode_allocation(written[ALLOCATION_KEY])
        assert record.containers["main"]["nvidia.com/gpu"] == ["0"]  # both on the node's one GPU

    seen: dict[str, dict[str, str]] = {}
    sandboxes = []
    try:
        for name, (uid, written) in placed.items():
            sandbox = host_network_sandbox(name, uid, annotations=written, log_directory=tmp_path)
            sandbox_id = kubelet.run_pod(sandbox)
            sandboxes.append(sandbox_id)
            # the tenant asks for the whole GPU's compute and memory in the spec, and to switch HAMi-core off
            greedy = {
                "CUDA_DEVICE_SM_LIMIT": "100",
                "CUDA_DEVICE_SM_LIMIT_0": "100",  # HAMi-core reads the per-GPU limit first
                "CUDA_DEVICE_MEMORY_LIMIT_0": "16384m",
                "CUDA_DISABLE_CONTROL": "1",
                "CUDA_TASK_PRIORITY": "0",  # would hang the other share's kernels while this one's run
            }
            container_id = kubelet.create(sandbox_id, container_config("main", envs=greedy), sandbox)
            kubelet.start(container_id)
            seen[name] = _env(kubelet, container_id)
            assert sorted(n for n in kubelet.exec(container_id, "ls", "/dev").split() if n.startswith("nvidia")) == [
                "nvidia0",
                "nvidiactl",
            ]
            assert kubelet.exec(container_id, "cat", "/etc/ld.so.preload").strip() == "/usr/local/vgpu/libvgpu.so"
            assert kubelet.exec(container_id, "ls", "/usr/local/vgpu").split() == ["cache", "libvgpu.so"]

        for name, (cores, mib) in shares.items():
            limits = {k: v for k, v in seen[name].items() if k.startswith(("CUDA_", "NVIDIA_"))}
            assert limits == {
                "NVIDIA_VISIBLE_DEVICES": "0",
                "CUDA_DEVICE_SM_LIMIT": str(cores),
                "CUDA_DEVICE_SM_LIMIT_0": str(cores),
                "CUDA_DEVICE_MEMORY_LIMIT_0": f"{mib}m",
                "CUDA_OVERSUBSCRIBE": "false",
                "CUDA_TASK_PRIORITY": "1",
                "CUDA_REDIRECT": "/usr/local/vgpu/libvgpu.so",
                "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/cache/cudevshr.cache",
            }, name

        # the same allocation on a node that enforces no shares: refused, saying how to configure the node
        monkeypatch.delenv(MODE_ENV)
        uid, written = _place_share(engine, "late", 10, 1024)
        sandbox = host_network_sandbox("late", uid, annotations=written, log_directory=tmp_path)
        sandbox_id = kubelet.run_pod(sandbox)
        sandboxes.append(sandbox_id)
        with pytest.raises(grpc.RpcError) as refused:
            kubelet.create(sandbox_id, container_config("main"), sandbox)
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "this node enforces no GPU shares: set KUBEGPU_NVIDIA_SHARE_LIMITS" in str(refused.value.details())
        assert kubelet.containers(sandbox_id) == []
        # ...and the shim keeps serving: the running shares still answer
        assert kubelet.exec(container_id, "true") == ""
    finally:
        for sandbox_id in sandboxes:
            kubelet.remove_pod(sandbox_id)


def test_a_share_container_never_sees_a_tenant_file_hami_core_would_read_its_limits_from(
    kubelet: Cri, key: bytes, hami_core: Path, node_dir: Path, tmp_path: Path
) -> None:
    """HAMi-core sets each `NAME=value` line of `/overrideEnv` over the environment before it reads its limits. A
    tenant's volume (a ConfigMap) mounted there, its path spelled `//overrideEnv` as the pod spec allows: containerd
    mounts it at `/overrideEnv`, and before, the shim, comparing the written path, let it through."""
    engine = _gpu_scheduler(key)
    uid, written = _place_share(engine, "notebook", 30, 4096)
    override = node_dir / "tenant-configmap"
    override.write_text("CUDA_DEVICE_SM_LIMIT=100\nCUDA_DEVICE_MEMORY_LIMIT_0=16384m\n")
    sandbox = host_network_sandbox("notebook", uid, annotations=written, log_directory=tmp_path)
    sandbox_id = kubelet.run_pod(sandbox)
    try:
        config = container_config("main")
        for spelled in ("//overrideEnv", "/tmp/../tmp/cudevshr.cache"):
            config.mounts.append(api_pb2.Mount(host_path=str(override), container_path=spelled, readonly=True))
        container_id = kubelet.create(sandbox_id, config, sandbox)
        kubelet.start(container_id)
        assert kubelet.exec(container_id, "cat", "/overrideEnv") == ""  # the node's empty one, not the tenant's
        assert "cudevshr.cache" not in kubelet.exec(container_id, "ls", "/tmp").split()
        assert _env(kubelet, container_id)["CUDA_DEVICE_SM_LIMIT"] == "30"
    finally:
        kubelet.remove_pod(sandbox_id)


GREEDY_IMAGE = "docker.io/tenant/greedy:1"
# What an image built for a HAMi setup (or by a tenant who read HAMi-core's README) may carry in its config's ENV.
GREEDY_ENV = {
    "CUDA_DEVICE_SM_LIMIT_0": "100",  # HAMi-core reads the per-GPU name before CUDA_DEVICE_SM_LIMIT
    "CUDA_DEVICE_MEMORY_LIMIT": "80g",
    "GPU_CORE_UTILIZATION_POLICY": "disable",
    "CUDA_OVERSUBSCRIBE": "true",
    "CUDA_TASK_PRIORITY": "0",
    "CUDA_REDIRECT": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/mine.cache",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=81920M",
    "CUDA_MPS_PIPE_DIRECTORY": "/tmp/my-own-mps",
    "CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING": "1",
}
GREEDY_FILES = {  # and in its layers: files HAMi-core reads
    "overrideEnv": b"CUDA_DEVICE_SM_LIMIT=100\nCUDA_DEVICE_MEMORY_LIMIT_0=81920m\n",
    "tmp/cudevshr.cache": b"a shared region with the limits the tenant likes",
    "usr/local/vgpu/cache/cudevshr.cache": b"a shared region with the limits the tenant likes",
}
HAMI_READS = (
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_DEVICE_MEMORY_LIMIT",
    "GPU_CORE_UTILIZATION_POLICY",
    "CUDA_OVERSUBSCRIBE",
    "CUDA_TASK_PRIORITY",
    "CUDA_REDIRECT",
)


@pytest.fixture(scope="module")
def greedy_image(containerd: Containerd, node_dir: Path) -> str:
    containerd.import_image(
        derived_image(image_tar(), node_dir / "greedy.tar", GREEDY_IMAGE, env=GREEDY_ENV, files=GREEDY_FILES)
    )
    return GREEDY_IMAGE


def test_a_share_holds_whatever_the_image_sets_and_whatever_the_tenant_mounts_at_tmp(
    kubelet: Cri, key: bytes, hami_core: Path, node_dir: Path, tmp_path: Path, greedy_image: str
) -> None:
    """The runtime merges the image's ENV under the container config's: a variable the config names wins, any other
    stays. The shim wrote the bare `CUDA_DEVICE_SM_LIMIT`, so the image's `CUDA_DEVICE_SM_LIMIT_0=100` (which
    HAMi-core reads first) lifted the share's compute limit, and HAMi-core's switches and shared region stayed as
    the image set them (T133); the image's `/overrideEnv` reached HAMi-core, and with no
    `CUDA_DEVICE_MEMORY_SHARED_CACHE` of the node's, HAMi-core took its limits from the region at `/tmp/cudevshr.cache`,
    which the image or a tenant's emptyDir at `/tmp` (filled by an init container) provides (T134). The process
    inside must see the share's values, an empty `/overrideEnv`, and an empty region directory of the node's, at
    every creation of the container."""
    (hami_core / "vgpulock" / "node-lock").write_text("")
    tenant_tmp = node_dir / "tenant-tmp"
    tenant_tmp.mkdir(exist_ok=True)
    (tenant_tmp / "cudevshr.cache").write_bytes(b"a shared region an init container wrote")
    engine = _gpu_scheduler(key)
    uid, written = _place_share(engine, "greedy", 30, 4096)
    sandbox = host_network_sandbox("greedy", uid, annotations=written, log_directory=tmp_path)
    sandbox_id = kubelet.run_pod(sandbox)
    try:
        for attempt in range(2):  # the container, then the kubelet's restart of it
            config = container_config("main", attempt=attempt)
            config.image.image = greedy_image
            config.mounts.append(api_pb2.Mount(host_path=str(tenant_tmp), container_path="/tmp"))
            container_id = kubelet.create(sandbox_id, config, sandbox)
            kubelet.start(container_id)
            env = _env(kubelet, container_id)
            assert {k: v for k, v in env.items() if k.startswith(HAMI_READS)} == {
                "CUDA_DEVICE_SM_LIMIT": "30",
                "CUDA_DEVICE_SM_LIMIT_0": "30",
                "CUDA_DEVICE_MEMORY_LIMIT": "80g",  # the image's: read only for a GPU without its own limit
                "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
                "GPU_CORE_UTILIZATION_POLICY": "default",
                "CUDA_OVERSUBSCRIBE": "false",
                "CUDA_TASK_PRIORITY": "1",
                "CUDA_REDIRECT": "/usr/local/vgpu/libvgpu.so",
            }, attempt
            region = env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
            assert region == "/usr/local/vgpu/cache/cudevshr.cache", attempt
            assert kubelet.exec(container_id, "ls", "-A", "/usr/local/vgpu/cache") == "", attempt
            assert kubelet.exec(container_id, "cat", "/overrideEnv") == "", attempt
            assert kubelet.exec(container_id, "ls", "/tmp/vgpulock").split() == ["node-lock"]  # the node's
            assert "cudevshr.cache" in kubelet.exec(container_id, "ls", "/tmp").split()  # the tenant's /tmp stays
            # the container's code writes its region (HAMi-core does, and so may the tenant's own code)...
            kubelet.exec(container_id, "sh", "-c", f"echo written by run {attempt} > {region}")
            assert (hami_core / "containers" / f"{uid}_main" / "cudevshr.cache").exists()
            kubelet.runtime.StopContainer(api_pb2.StopContainerRequest(container_id=container_id, timeout=0))
            # ...and the next creation of the container starts with none
    finally:
        kubelet.remove_pod(sandbox_id)


def test_a_share_pods_region_directory_goes_with_its_pod_and_a_live_pods_stays(
    kubelet: Cri, key: bytes, hami_core: Path, tmp_path: Path
) -> None:
    """Each share container's region directory on the host holds whatever its code wrote there, counted in no pod's
    ephemeral storage; it was left when the pod ended, so a node running many short share pods filled its disk
    (T140). The kubelet stops and removes the ended pod's sandbox through the shim: its directory goes, and the
    directory of the pod still running stays, with the region its container is using."""
    engine = _gpu_scheduler(key)
    placed = {name: _place_share(engine, name, 30, 4096) for name in ("ended", "running")}
    sandboxes: dict[str, str] = {}
    containers: dict[str, str] = {}
    try:
        for name, (uid, written) in placed.items():
            sandbox = host_network_sandbox(name, uid, annotations=written, log_directory=tmp_path)
            sandboxes[name] = kubelet.run_pod(sandbox)
            containers[name] = kubelet.create(sandboxes[name], container_config("main"), sandbox)
            kubelet.start(containers[name])
            # HAMi-core's region, and whatever else the container's code leaves there
            kubelet.exec(containers[name], "sh", "-c", "echo region > /usr/local/vgpu/cache/cudevshr.cache")
            kubelet.exec(containers[name], "mkdir", "-p", "/usr/local/vgpu/cache/left/behind")
        directories = {name: hami_core / "containers" / f"{uid}_main" for name, (uid, _) in placed.items()}
        assert all((d / "cudevshr.cache").exists() for d in directories.values())

        kubelet.remove_pod(sandboxes.pop("ended"))

        assert not directories["ended"].exists(), "the ended pod's region directory was left on the host"
        wait_until(  # what its container left there, set aside, is removed by the sweeper
            lambda: [p.name for p in (hami_core / "containers").iterdir()] == [directories["running"].name],
            10,
            "the ended pod's set-aside region directory removed",
        )
        assert (directories["running"] / "cudevshr.cache").read_text() == "region\n"
        assert kubelet.exec(containers["running"], "cat", "/usr/local/vgpu/cache/cudevshr.cache") == "region\n"
        kubelet.remove_pod(sandboxes.pop("running"))
        assert not directories["running"].exists()
    finally:
        for sandbox_id in sandboxes.values():
            kubelet.remove_pod(sandbox_id)


def test_a_share_holds_on_an_mps_node_whatever_the_image_sets(
    kubelet: Cri, key: bytes, node_dir: Path, tmp_path: Path, greedy_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MPS clients read their limits and the daemon's pipe from their environment: the image's
    `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100` or `CUDA_MPS_PIPE_DIRECTORY` of its own must not reach the process."""
    (node_dir / "mps-pipe").mkdir(exist_ok=True)
    (node_dir / "mps-log").mkdir(exist_ok=True)
    monkeypatch.setenv(MODE_ENV, "mps")
    monkeypatch.setenv(MPS_PIPE_ENV, str(node_dir / "mps-pipe"))
    monkeypatch.setenv(MPS_LOG_ENV, str(node_dir / "mps-log"))
    uid, written = _place_share(_gpu_scheduler(key), "greedy-mps", 30, 4096)
    sandbox = host_network_sandbox("greedy-mps", uid, annotations=written, log_directory=tmp_path)
    sandbox_id = kubelet.run_pod(sandbox)
    try:
        config = container_config("main")
        config.image.image = greedy_image
        container_id = kubelet.create(sandbox_id, config, sandbox)
        kubelet.start(container_id)
        assert {k: v for k, v in _env(kubelet, container_id).items() if k.startswith("CUDA_MPS_")} == {
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
            "CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING": "0",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
            "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
            "CUDA_MPS_LOG_DIRECTORY": "/var/log/nvidia-mps",
        }
    finally:
        kubelet.remove_pod(sandbox_id)


def _tampered(annotations: dict[str, str], **_: Any) -> dict[str, str]:
    record = decode_allocation(annotations[ALLOCATION_KEY])
    grabbed = record.model_copy(update={"containers": {"main": {FPGA: CARDS}}})  # all four cards, signature kept
    return {**annotations, ALLOCATION_KEY: encode_allocation(grabbed)}


def _unsigned(annotations: dict[str, str], **_: Any) -> dict[str, str]:
    record = decode_allocation(annotations[ALLOCATION_KEY]).model_copy(update={"signature": None})
    return {**annotations, ALLOCATION_KEY: encode_allocation(record)}


def _copied(annotations: dict[str, str], *, other: dict[str, str], **_: Any) -> dict[str, str]:
    return {**annotations, ALLOCATION_KEY: other[ALLOCATION_KEY]}


def _other_node(annotations: dict[str, str], *, elsewhere: dict[str, str], **_: Any) -> dict[str, str]:
    return {**annotations, ALLOCATION_KEY: elsewhere[ALLOCATION_KEY]}


@pytest.mark.parametrize(
    ("forge", "check"),
    [
        pytest.param(_tampered, "signature", id="devices-tampered"),
        pytest.param(_copied, "pod", id="copied-from-another-pod"),
        pytest.param(_other_node, "node", id="for-another-node"),
        pytest.param(_unsigned, "unsigned", id="unsigned"),
    ],
)
def test_a_forged_allocation_is_refused_and_nothing_is_created(
    kubelet: Cri,
    direct: Cri,
    scheduler: Scheduler,
    fpga: tuple[ModuleType, ModuleType],
    key: bytes,
    tmp_path: Path,
    forge: Any,
    check: str,
) -> None:
    uid, annotations = scheduler.place("victim", 1)
    _, other = scheduler.place("donor", 2)
    # The same pod, placed on another node by the same scheduler: only the node check can refuse it.
    _, elsewhere = Scheduler(fpga[0], key, node="node-b").place("victim", 1, uid=uid)
    forged = forge(annotations, other=other, elsewhere=elsewhere)

    assert f"kubegpu: {check} check failed" in _creation_refused(kubelet, "victim", uid, forged, tmp_path, direct)


def _creation_refused(
    kubelet: Cri, name: str, uid: str, annotations: dict[str, str], logs: Path, direct: Cri | None = None
) -> str:
    """Run the pod's sandbox and try its container: refused with FAILED_PRECONDITION (nothing created, where
    `direct`, containerd itself, can tell); the refusal's details."""
    sandbox = host_network_sandbox(name, uid, annotations=annotations, log_directory=logs)
    sandbox_id = kubelet.run_pod(sandbox)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            kubelet.create(sandbox_id, container_config("main"), sandbox)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        if direct is not None:
            assert direct.containers(sandbox_id) == []
        return str(refused.value.details())
    finally:
        kubelet.remove_pod(sandbox_id)


def _output(cri: Cri, container_id: str, log_file: Path) -> list[str]:
    """What the container wrote, once it has exited, from its CRI log (`<time> <stream> <tag> <line>`)."""

    def exited() -> bool:
        status = cri.runtime.ContainerStatus(api_pb2.ContainerStatusRequest(container_id=container_id), timeout=5)
        return bool(status.status.state == api_pb2.ContainerState.CONTAINER_EXITED)

    wait_until(exited, 30, f"container {container_id} to exit")
    return [line.split(" ", 3)[3] for line in log_file.read_text().splitlines() if line.count(" ") >= 3]


def test_a_container_setting_nvidia_visible_devices_without_an_allocation_runs_without_it(
    kubelet: Cri, direct: Cri, tmp_path: Path
) -> None:
    greedy = {"GREETING": "hello", "NVIDIA_VISIBLE_DEVICES": "all", "AWS_NEURON_VISIBLE_DEVICES": "0-15"}
    printed: dict[str, list[str]] = {}
    for path, cri in (("through the shim", kubelet), ("straight to containerd", direct)):
        name = "greedy-shim" if cri is kubelet else "greedy-direct"
        sandbox = host_network_sandbox(name, f"uid-{name}-{secrets.token_hex(4)}", log_directory=tmp_path)
        sandbox_id = cri.run_pod(sandbox)
        try:
            config = container_config(name, ("env",), envs=greedy)
            container_id = cri.create(sandbox_id, config, sandbox)
            cri.start(container_id)
            printed[path] = _output(cri, container_id, tmp_path / config.log_path)
        finally:
            cri.remove_pod(sandbox_id)

    # The runtime obeys what it is given: straight to containerd, the variables reach the process...
    assert "NVIDIA_VISIBLE_DEVICES=all" in printed["straight to containerd"]
    # ...through the shim, the container runs, and its own output shows neither, only the harmless one.
    assert "GREETING=hello" in printed["through the shim"]
    assert not [line for line in printed["through the shim"] if line.startswith(("NVIDIA_", "AWS_NEURON_"))]


def test_the_allocation_containerd_recorded_for_the_sandbox_is_applied_not_the_requests_copy(
    kubelet: Cri, direct: Cri, scheduler: Scheduler, tmp_path: Path
) -> None:
    uid, earlier = scheduler.place("moved", 1)  # fpga0; the bind fails and the scheduler rolls it back
    scheduler.engine.release("default/moved")
    scheduler.place("someone-else", 1)  # fpga0 again
    _, current = scheduler.place("moved", 1, uid=uid)  # fpga1: the scheduler's current decision
    assert decode_allocation(current[ALLOCATION_KEY]).device_ids("main", FPGA) == ["fpga1"]
    sandbox = host_network_sandbox("moved", uid, annotations=current, log_directory=tmp_path)
    sandbox_id = kubelet.run_pod(sandbox)
    try:
        # containerd 1.6 reports the annotations a sandbox was created with, in ListPodSandbox.
        listed = {s.id: s for s in direct.runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest()).items}
        assert listed[sandbox_id].annotations[ALLOCATION_KEY] == current[ALLOCATION_KEY]
        # The pod's owner put the earlier allocation back; the kubelet copies the pod's annotations as they are now.
        replayed = api_pb2.PodSandboxConfig()
        replayed.CopyFrom(sandbox)
        replayed.annotations[ALLOCATION_KEY] = earlier[ALLOCATION_KEY]
        container_id = kubelet.create(sandbox_id, container_config("main"), replayed)
        kubelet.start(container_id)
        assert _cards_in(kubelet, container_id) == ["fpga1"]
    finally:
        kubelet.remove_pod(sandbox_id)


def test_a_pods_allocation_removed_after_it_started_still_gives_its_restart_the_device_containerd_recorded(
    kubelet: Cri, direct: Cri, fpga: tuple[ModuleType, ModuleType], key: bytes, tmp_path: Path
) -> None:
    """An editor removes the pod's allocation after its sandbox was created: the kubelet's copy in the restart's
    request has none, and the restarted container lost its card. containerd's record of the sandbox is used, checked
    as any: once the card is the live holder's (the scheduler gave it on), the restart is refused as stale."""
    uid, placed = Scheduler(fpga[0], key).place("edited", 1)
    sandbox = host_network_sandbox("edited", uid, annotations=placed, log_directory=tmp_path)
    sandbox_id = kubelet.run_pod(sandbox)
    holder_id = ""
    try:
        first = kubelet.create(sandbox_id, container_config("main"), sandbox)
        kubelet.start(first)
        kubelet.runtime.StopContainer(api_pb2.StopContainerRequest(container_id=first, timeout=0), timeout=30)
        edited = api_pb2.PodSandboxConfig()
        edited.CopyFrom(sandbox)
        del edited.annotations[ALLOCATION_KEY]
        again = kubelet.create(sandbox_id, container_config("main", attempt=1), edited)
        kubelet.start(again)
        assert _cards_in(kubelet, again) == ["fpga0"]

        holder_uid, fresh = Scheduler(fpga[0], key).place("holder", 1)  # issued later: fpga0 is the holder's now
        kubelet.runtime.StopContainer(api_pb2.StopContainerRequest(container_id=again, timeout=0), timeout=30)
        holder = host_network_sandbox("holder", holder_uid, annotations=fresh, log_directory=tmp_path)
        holder_id = kubelet.run_pod(holder)
        kubelet.start(kubelet.create(holder_id, container_config("main"), holder))
        with pytest.raises(grpc.RpcError) as restart:
            kubelet.create(sandbox_id, container_config("main", attempt=2), edited)
        assert restart.value.details().startswith("kubegpu: stale check failed: pod default/edited container main: ")
    finally:
        kubelet.remove_pod(sandbox_id)
        if holder_id:
            kubelet.remove_pod(holder_id)


def test_a_stale_allocation_whose_device_a_live_pod_was_given_is_refused_and_nothing_is_created(
    kubelet: Cri, direct: Cri, fpga: tuple[ModuleType, ModuleType], key: bytes, tmp_path: Path
) -> None:
    # The scheduler gave fpga0 to `victim`; the bind failed and was rolled back; after a restart it gave fpga0 to
    # `holder`, which runs. The victim's owner puts the rolled-back (still validly signed) allocation back.
    victim_uid, stale = Scheduler(fpga[0], key).place("victim", 1)
    holder_uid, fresh = Scheduler(fpga[0], key).place("holder", 1)
    assert decode_allocation(stale[ALLOCATION_KEY]).device_ids("main", FPGA) == ["fpga0"]
    assert decode_allocation(fresh[ALLOCATION_KEY]).device_ids("main", FPGA) == ["fpga0"]

    holder = host_network_sandbox("holder", holder_uid, annotations=fresh, log_directory=tmp_path)
    holder_id = kubelet.run_pod(holder)
    victim = host_network_sandbox("victim", victim_uid, annotations=stale, log_directory=tmp_path)
    victim_id = kubelet.run_pod(victim)
    try:
        kubelet.start(kubelet.create(holder_id, container_config("main"), holder))
        with pytest.raises(grpc.RpcError) as refused:
            kubelet.create(victim_id, container_config("main"), victim)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.details().startswith("kubegpu: stale check failed: pod default/victim container main: ")
        assert "the scheduler has since given it to pod default/holder" in refused.value.details()
        assert direct.containers(victim_id) == []
    finally:
        kubelet.remove_pod(victim_id)
        kubelet.remove_pod(holder_id)


def test_two_pods_of_one_name_are_told_apart_and_the_advice_to_stop_the_old_sandbox_works(
    kubelet: Cri, fpga: tuple[ModuleType, ModuleType], key: bytes, tmp_path: Path
) -> None:
    """Pod default/p was force-deleted and created again; the scheduler gave the new one fpga0 too, while the old one's
    sandbox lingers in containerd. The new one waits (`in-use`) and the old one's restart is refused (`stale`), each
    naming both pods by a short UID (before: "pod default/p ... pod default/p"); the old one is not told to delete
    default/p, the new pod's name now (before: "delete the pod"), but to stop its sandbox by the ID shown, which
    containerd takes: then the new pod gets the card."""
    old_uid, old_annotations = Scheduler(fpga[0], key).place("p", 1, uid=str(uuid.uuid4()))
    new_uid, new_annotations = Scheduler(fpga[0], key).place("p", 1, uid=str(uuid.uuid4()))  # fpga0 again, later
    old = host_network_sandbox("p", old_uid, annotations=old_annotations, log_directory=tmp_path)
    old_id = kubelet.run_pod(old)
    running = kubelet.create(old_id, container_config("main"), old)
    kubelet.start(running)
    new = host_network_sandbox("p", new_uid, annotations=new_annotations, log_directory=tmp_path)
    new_id = kubelet.run_pod(new)
    this, that = f"pod default/p (uid {new_uid[:8]})", f"pod default/p (uid {old_uid[:8]})"
    try:
        with pytest.raises(grpc.RpcError) as waiting:
            kubelet.create(new_id, container_config("main"), new)
        assert waiting.value.details().startswith(f"kubegpu: in-use check failed: {this} container main: ")
        assert f"in use by container main of {that}" in waiting.value.details()

        kubelet.runtime.StopContainer(api_pb2.StopContainerRequest(container_id=running, timeout=0), timeout=30)
        with pytest.raises(grpc.RpcError) as restart:
            kubelet.create(old_id, container_config("main", attempt=1), old)
        refused = restart.value.details()
        assert refused.startswith(f"kubegpu: stale check failed: {that} container main: "), refused
        assert f"do not delete default/p, that name is now {this}'s" in refused, refused
        shown = refused.rsplit("`crictl stopp ", 1)[1].split("`", 1)[0]
        assert shown == old_id[:13]

        kubelet.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=shown), timeout=30)  # as crictl
        container_id = kubelet.create(new_id, container_config("main"), new)
        kubelet.start(container_id)
        assert _cards_in(kubelet, container_id) == ["fpga0"]
    finally:
        kubelet.remove_pod(old_id)
        kubelet.remove_pod(new_id)


def test_a_stale_pods_container_that_exited_leaves_the_device_to_the_pod_it_was_given_to(
    kubelet: Cri, direct: Cri, fpga: tuple[ModuleType, ModuleType], key: bytes, tmp_path: Path
) -> None:
    """The victim's replayed allocation got fpga0 before the holder (the scheduler's current choice) came: the holder
    waits (`in-use`) while the victim's container runs. The victim's container exits, and the kubelet's restart of it
    is refused as stale: from then on fpga0 goes to the holder, as a shim restarted meanwhile already decided from
    containerd's list (before: `in-use ... by container main of pod default/victim` until the victim was deleted)."""
    victim_uid, stale = Scheduler(fpga[0], key).place("victim", 1)
    holder_uid, fresh = Scheduler(fpga[0], key).place("holder", 1)
    victim = host_network_sandbox("victim", victim_uid, annotations=stale, log_directory=tmp_path)
    victim_id = kubelet.run_pod(victim)
    first = kubelet.create(victim_id, container_config("main"), victim)  # no other pod on the node claims fpga0 yet
    kubelet.start(first)
    holder = host_network_sandbox("holder", holder_uid, annotations=fresh, log_directory=tmp_path)
    holder_id = kubelet.run_pod(holder)
    try:
        with pytest.raises(grpc.RpcError) as waiting:
            kubelet.create(holder_id, container_config("main"), holder)
        assert waiting.value.details().startswith("kubegpu: in-use check failed: pod default/holder container main: ")

        kubelet.runtime.StopContainer(api_pb2.StopContainerRequest(container_id=first, timeout=0), timeout=30)
        with pytest.raises(grpc.RpcError) as restart:
            kubelet.create(victim_id, container_config("main", attempt=1), victim)
        assert restart.value.details().startswith("kubegpu: stale check failed: pod default/victim container main: ")

        container_id = kubelet.create(holder_id, container_config("main"), holder)
        kubelet.start(container_id)
        assert _cards_in(kubelet, container_id) == ["fpga0"]
        assert [c.id for c in direct.containers(victim_id)] == [first]
    finally:
        kubelet.remove_pod(victim_id)
        kubelet.remove_pod(holder_id)


def test_a_shim_started_while_a_device_pod_runs_gives_its_device_to_nobody_else_until_it_exits(
    kubelet: Cri,
    containerd: Containerd,
    fpga: tuple[ModuleType, ModuleType],
    key: bytes,
    node_dir: Path,
    tmp_path: Path,
) -> None:
    """The shim restarted while a container runs with fpga0: the new process has applied nothing, and reads from
    containerd which containers hold what. A later allocation of fpga0 is refused `in-use` while that container
    runs, and applied once it has exited (its own restarts are then refused as stale)."""
    first_uid, stale = Scheduler(fpga[0], key).place("first", 1)
    second_uid, fresh = Scheduler(fpga[0], key).place("second", 1)
    first = host_network_sandbox("first", first_uid, annotations=stale, log_directory=tmp_path)
    first_id = kubelet.run_pod(first)
    running = kubelet.create(first_id, container_config("main"), first)
    kubelet.start(running)
    socket = node_dir / "restarted.sock"
    process = start_shim_process(
        socket=socket,
        runtime_endpoint=containerd.endpoint,
        node_name=NODE,
        key_file=node_dir / "allocation.key",
        dev_root=node_dir / "dev",
        log=tmp_path / "crishim.log",
        python_path=fpga_plugin_path(tmp_path / "site"),
    )
    restarted = Cri(f"unix://{socket}")
    second = host_network_sandbox("second", second_uid, annotations=fresh, log_directory=tmp_path)
    second_id = restarted.run_pod(second)
    try:
        with pytest.raises(grpc.RpcError) as waiting:
            restarted.create(second_id, container_config("main"), second)
        assert waiting.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "fpga0 is in use by container main of pod default/first" in waiting.value.details()

        restarted.runtime.StopContainer(api_pb2.StopContainerRequest(container_id=running, timeout=0), timeout=30)
        container_id = restarted.create(second_id, container_config("main"), second)
        restarted.start(container_id)
        assert _cards_in(restarted, container_id) == ["fpga0"]
    finally:
        restarted.remove_pod(second_id)
        restarted.remove_pod(first_id)
        restarted.close()
        assert process.terminate() == 0, process.output()


def test_a_pod_annotation_that_is_not_utf8_costs_no_other_pod_its_devices(
    kubelet: Cri, direct: Cri, scheduler: Scheduler, tmp_path: Path
) -> None:
    """A pod whose annotation value is not UTF-8 (stored by the API server as a protobuf client sent it, passed on by
    the kubelet): containerd keeps the bytes and lists them. The shim read that list strictly, so every device pod
    on the node was refused (`error check failed: DecodeError`) until the pod was gone; now the device pod runs."""
    poisoned = host_network_sandbox("poisoned", f"uid-poisoned-{secrets.token_hex(4)}", log_directory=tmp_path)
    poisoned.annotations["example.com/note"] = "POISON"
    body = api_pb2.RunPodSandboxRequest(config=poisoned).SerializeToString()
    assert body.count(b"POISON") == 1
    run_raw = kubelet.channel.unary_unary("/runtime.v1.RuntimeService/RunPodSandbox")
    poisoned_id = api_pb2.RunPodSandboxResponse.FromString(run_raw(body.replace(b"POISON", b"\xff" * 6), timeout=60))
    try:
        with pytest.raises(grpc.RpcError) as strict:  # containerd kept the bytes: a strict reader cannot read its list
            direct.runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=10)
        assert strict.value.code() == grpc.StatusCode.INTERNAL

        uid, annotations = scheduler.place("trainer", 2)
        sandbox = host_network_sandbox("trainer", uid, annotations=annotations, log_directory=tmp_path)
        sandbox_id = kubelet.run_pod(sandbox)
        try:
            container_id = kubelet.create(sandbox_id, container_config("main"), sandbox)
            kubelet.start(container_id)
            assert _cards_in(kubelet, container_id) == ["fpga0", "fpga1"]
        finally:
            kubelet.remove_pod(sandbox_id)
    finally:
        kubelet.remove_pod(poisoned_id.pod_sandbox_id)


@pytest.mark.parametrize(
    ("poison", "check"),
    [
        pytest.param(
            lambda text: text.replace('"signature":"', '"signature":"\u00e9', 1), "signature", id="non-ascii-signature"
        ),
        pytest.param(lambda _: "[" * 3000 + "]" * 3000, "malformed", id="3000-deep-json"),
        pytest.param(
            lambda text: text.replace('"issued":', '"issued":' + "9" * 5000 + ',"was":', 1),
            "malformed",
            id="5000-digit-integer",
        ),
    ],
)
def test_a_poison_allocation_is_failed_precondition_and_nothing_is_created(
    kubelet: Cri, direct: Cri, scheduler: Scheduler, tmp_path: Path, poison: Any, check: str
) -> None:
    uid, annotations = scheduler.place("poisoned", 1)
    poisoned = {**annotations, ALLOCATION_KEY: poison(annotations[ALLOCATION_KEY])}
    sandbox = host_network_sandbox("poisoned", uid, annotations=poisoned, log_directory=tmp_path)
    sandbox_id = kubelet.run_pod(sandbox)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            kubelet.create(sandbox_id, container_config("main"), sandbox)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.details().startswith(f"kubegpu: {check} check failed: pod default/poisoned")
        assert direct.containers(sandbox_id) == []
    finally:
        kubelet.remove_pod(sandbox_id)


def _by_id(items: Any) -> list[Any]:
    return sorted(items, key=lambda item: item.id)


def test_other_calls_answer_as_containerd_does(kubelet: Cri, direct: Cri, tmp_path: Path) -> None:
    assert kubelet.version() == direct.version()
    sandbox = host_network_sandbox("plain", f"uid-plain-{secrets.token_hex(4)}", log_directory=tmp_path)
    sandbox_id = kubelet.run_pod(sandbox)
    try:
        container_id = kubelet.create(sandbox_id, container_config("main", envs={"GREETING": "hello"}), sandbox)
        kubelet.start(container_id)
        assert _env(kubelet, container_id)["GREETING"] == "hello"
        assert _by_id(kubelet.containers()) == _by_id(direct.containers())
        request = api_pb2.ListPodSandboxRequest()
        assert _by_id(kubelet.runtime.ListPodSandbox(request).items) == _by_id(
            direct.runtime.ListPodSandbox(request).items
        )
        # containerd lists its images in no fixed order (two or more once a test built its own image)
        assert _by_id(kubelet.images.ListImages(api_pb2.ListImagesRequest()).images) == _by_id(
            direct.images.ListImages(api_pb2.ListImagesRequest()).images
        )
        # An error is containerd's own, code and message.
        with pytest.raises(grpc.RpcError) as through_shim:
            kubelet.runtime.ContainerStatus(api_pb2.ContainerStatusRequest(container_id="no-such-container"))
        with pytest.raises(grpc.RpcError) as from_containerd:
            direct.runtime.ContainerStatus(api_pb2.ContainerStatusRequest(container_id="no-such-container"))
        assert (through_shim.value.code(), through_shim.value.details()) == (
            from_containerd.value.code(),
            from_containerd.value.details(),
        )
    finally:
        kubelet.remove_pod(sandbox_id)


def test_container_events_are_relayed_as_containerd_serves_them(kubelet: Cri, direct: Cri, tmp_path: Path) -> None:
    try:
        next(iter(direct.runtime.GetContainerEvents(api_pb2.GetEventsRequest(), timeout=1)))
        supported = True
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            supported = True
        else:
            # containerd 1.6 (Debian bookworm) predates evented PLEG: the shim must answer exactly the same.
            with pytest.raises(grpc.RpcError) as through_shim:
                next(iter(kubelet.runtime.GetContainerEvents(api_pb2.GetEventsRequest(), timeout=5)))
            assert (through_shim.value.code(), through_shim.value.details()) == (exc.code(), exc.details())
            supported = False
    if not supported:
        return
    stream = kubelet.runtime.GetContainerEvents(api_pb2.GetEventsRequest(), timeout=30)
    sandbox = host_network_sandbox("events", f"uid-events-{secrets.token_hex(4)}", log_directory=tmp_path)
    sandbox_id = kubelet.run_pod(sandbox)
    try:
        event = next(iter(stream))
        assert event.container_id
    finally:
        stream.cancel()
        kubelet.remove_pod(sandbox_id)


def test_a_containerd_restart_is_unavailable_then_served_without_restarting_the_shim(
    kubelet: Cri, containerd: Containerd, tmp_path: Path
) -> None:
    sandbox = host_network_sandbox("survivor", f"uid-survivor-{secrets.token_hex(4)}", log_directory=tmp_path)
    sandbox_id = kubelet.run_pod(sandbox)
    container_id = kubelet.create(sandbox_id, container_config("main"), sandbox)
    kubelet.start(container_id)

    containerd.stop()
    for call in (kubelet.version, kubelet.containers):
        with pytest.raises(grpc.RpcError) as down:
            call()
        assert down.value.code() == grpc.StatusCode.UNAVAILABLE

    containerd.start()
    wait_until(lambda: kubelet.version(timeout=2).runtime_name, 20, "the shim to serve Version after the restart")
    running = {c.id: c.state for c in kubelet.containers(sandbox_id)}
    assert running == {container_id: api_pb2.ContainerState.CONTAINER_RUNNING}
    assert kubelet.exec(container_id, "echo", "still here").strip() == "still here"
    kubelet.remove_pod(sandbox_id)


def test_the_crishim_command_serves_a_private_socket_and_stops_cleanly_on_sigterm(
    containerd: Containerd, scheduler: Scheduler, node_dir: Path, tmp_path: Path
) -> None:
    socket = node_dir / "cmd.sock"
    process = start_shim_process(
        socket=socket,
        runtime_endpoint=containerd.endpoint,
        node_name=NODE,
        key_file=node_dir / "allocation.key",
        dev_root=node_dir / "dev",
        log=tmp_path / "crishim.log",
        python_path=fpga_plugin_path(tmp_path / "site"),  # the example plugin, found through its entry points
    )
    kubelet = Cri(f"unix://{socket}")
    try:
        assert stat.S_IMODE(socket.stat().st_mode) == 0o600
        uid, annotations = scheduler.place("cmd", 1)
        for name, pod_annotations in (("cmd", annotations), ("cmd-plain", {})):
            pod_uid = uid if pod_annotations else f"uid-{name}"
            sandbox = host_network_sandbox(name, pod_uid, annotations=pod_annotations, log_directory=tmp_path)
            sandbox_id = kubelet.run_pod(sandbox)
            try:
                container_id = kubelet.create(sandbox_id, container_config("main"), sandbox)
                kubelet.start(container_id)
                assert _cards_in(kubelet, container_id) == (["fpga0"] if pod_annotations else [])
            finally:
                kubelet.remove_pod(sandbox_id)
    finally:
        kubelet.close()
        code = process.terminate()
    assert code == 0, process.output()
    assert not socket.exists()
    assert "applied allocation" in process.output()


def test_a_shim_rolled_out_with_a_new_key_still_starts_the_containers_the_old_key_allocated(
    containerd: Containerd,
    direct: Cri,
    scheduler: Scheduler,
    fpga: tuple[ModuleType, ModuleType],
    node_dir: Path,
    tmp_path: Path,
) -> None:
    """A key rotation (docs/security.md, "The allocation key"): the node side runs `--allocation-key-file NEW
    --allocation-verify-key-file OLD`. A pod the scheduler placed under the old key (its container restarting, or not
    started yet) still gets its cards, a pod placed under the new key too, and one signed with neither is refused."""
    new_key = secrets.token_hex(32).encode()
    new_file = tmp_path / "new.key"
    new_file.write_bytes(new_key + b"\n")
    new_file.chmod(0o600)
    socket = node_dir / "rotated.sock"
    process = start_shim_process(
        socket=socket,
        runtime_endpoint=containerd.endpoint,
        node_name=NODE,
        key_file=new_file,
        dev_root=node_dir / "dev",
        log=tmp_path / "crishim.log",
        python_path=fpga_plugin_path(tmp_path / "site"),
        extra=["--allocation-verify-key-file", str(node_dir / "allocation.key")],
    )
    kubelet = Cri(f"unix://{socket}")
    try:
        placed = [
            ("old", *scheduler.place("old", 1)),
            ("new", *Scheduler(fpga[0], new_key).place("new", 2)),
        ]
        for name, uid, annotations in placed:
            sandbox = host_network_sandbox(name, uid, annotations=annotations, log_directory=tmp_path)
            sandbox_id = kubelet.run_pod(sandbox)
            try:
                container_id = kubelet.create(sandbox_id, container_config("main"), sandbox)
                kubelet.start(container_id)
                ids = decode_allocation(annotations[ALLOCATION_KEY]).device_ids("main", FPGA)
                assert _cards_in(kubelet, container_id) == sorted(ids), name
            finally:
                kubelet.remove_pod(sandbox_id)
        uid, annotations = Scheduler(fpga[0], secrets.token_hex(32).encode()).place("neither", 1)
        details = _creation_refused(kubelet, "neither", uid, annotations, tmp_path, direct)
        assert "does not verify with any of this node's keys" in details
    finally:
        kubelet.close()
        code = process.terminate()
    assert code == 0, process.output()


# ------------------------------------------------------------------------------------------------------------
# MIG: a fake NVML (no GPU here) under the real shim and containerd
# ------------------------------------------------------------------------------------------------------------


def _mig_nvml(layouts: dict[int, list[tuple[str, int]]]) -> ModuleType:
    """A `pynvml` module over two A100 80GB GPUs: GPU 0 whole, GPU 1 MIG-enabled with `layouts[1]` (profile, start)
    in NVML's order; MIG device i of GPU g has UUID MIG-g-i."""
    nvml = ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def instances(gpu: int) -> list[tuple[str, int]]:
        return layouts.get(gpu, [])

    def mig_handle(gpu: int, index: int) -> tuple[int, int]:
        if gpu not in layouts or index >= len(instances(gpu)):
            raise NVMLError("Not Found")
        return (gpu, index)

    def name(handle: Any) -> str:
        return (
            f"NVIDIA A100-SXM4-80GB MIG {instances(handle[0])[handle[1]][0]}"
            if isinstance(handle, tuple)
            else ("NVIDIA A100-SXM4-80GB")
        )

    def info(instance: tuple[int, int]) -> Any:
        return SimpleNamespace(placement=SimpleNamespace(start=instances(instance[0])[instance[1] - 1][1]))

    functions: dict[str, Any] = {
        "NVMLError": NVMLError,
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetMinorNumber": lambda h: h,
        "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=f"00000000:{0x10 + h:02X}:00.0"),
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=81920 << 20),
        "nvmlDeviceGetName": name,
        "nvmlDeviceGetUUID": lambda h: f"MIG-{h[0]}-{h[1]}" if isinstance(h, tuple) else f"GPU-{h}",
        "nvmlDeviceGetMigMode": lambda h: (1, 1) if h in layouts else (0, 0),
        "nvmlDeviceGetMaxMigDeviceCount": lambda h: 7 if h in layouts else 0,
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
        "nvmlDeviceGetGpuInstanceId": lambda m: m[1] + 1,
        "nvmlDeviceGetGpuInstanceById": lambda h, i: (h, i),
        "nvmlGpuInstanceGetInfo": info,
    }
    for key, value in functions.items():
        setattr(nvml, key, value)
    return nvml


def test_a_mig_pod_runs_with_its_mig_device_and_a_stale_one_is_refused(
    kubelet: Cri, key: bytes, node_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_char_devices(node_dir / "dev", ["nvidia1"])
    caps = make_char_devices(node_dir / "dev" / "nvidia-caps", ["nvidia-cap21"])
    layouts = {1: [("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3)]}
    monkeypatch.setitem(sys.modules, "pynvml", _mig_nvml(layouts))
    monkeypatch.setattr(nvidia_device, "_gpu_cache", None)
    inventory = nvidia_device.kubegpu_device_discover(host_root=node_dir)
    assert inventory is not None
    capacity = nvidia_device.kubegpu_device_advertise(inventory=inventory).capacity
    engine = Engine(
        make_plugin_manager("scheduler", plugins=[("nvidia", nvidia_scheduler)], autoload=False), signing_key=key
    )
    devices = encode_devices(NodeDevices(inventories={"nvidia": inventory}))
    engine.add_node(make_node(NODE, annotations={DEVICES_KEY: devices}, allocatable=capacity))

    def place(name: str, profile: str) -> tuple[str, dict[str, str]]:
        uid = f"uid-{name}-{secrets.token_hex(4)}"
        manifest = pod_manifest(name, {"main": {f"nvidia.com/mig-{profile}": 1}})
        manifest["metadata"]["uid"] = uid
        decision = engine.schedule(pod_request(manifest)[0])
        assert decision.scheduled, decision.reason
        return uid, dict(decision.annotations)

    sandboxes = []
    try:
        uid, written = place("inference", "3g.40gb")
        assert decode_allocation(written[ALLOCATION_KEY]).containers["main"] == {"nvidia.com/mig-3g.40gb": ["1@4"]}
        sandbox = host_network_sandbox("inference", uid, annotations=written, log_directory=tmp_path)
        sandboxes.append(sandbox_id := kubelet.run_pod(sandbox))
        # the tenant asks for every GPU, and for another MIG instance's capability device
        config = container_config(
            "main",
            envs={"NVIDIA_VISIBLE_DEVICES": "all"},
            devices=[(str(caps[0]), "/dev/nvidia-caps/nvidia-cap21")],
        )
        container_id = kubelet.create(sandbox_id, config, sandbox)
        kubelet.start(container_id)
        assert _env(kubelet, container_id)["NVIDIA_VISIBLE_DEVICES"] == "MIG-1-0"  # GPU 1's 3g.40gb, by MIG UUID
        listed = kubelet.exec(container_id, "ls", "/dev").split()
        assert sorted(n for n in listed if n.startswith("nvidia")) == ["nvidia1", "nvidiactl"]  # its parent GPU only
        assert "nvidia-caps" not in listed  # no other instance's capability device

        # the operator relays GPU 1 out after scheduling: the 2g.20gb at slice 0 is gone
        uid, written = place("notebook", "2g.20gb")
        layouts[1] = [("3g.40gb", 4), ("3g.40gb", 0)]
        sandbox = host_network_sandbox("notebook", uid, annotations=written, log_directory=tmp_path)
        sandboxes.append(late := kubelet.run_pod(sandbox))
        with pytest.raises(grpc.RpcError) as refused:
            kubelet.create(late, container_config("main"), sandbox)
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "MIG device 1@0 is a 3g.40gb here, the allocation names nvidia.com/mig-2g.20gb" in str(
            refused.value.details()
        )
        assert kubelet.exec(container_id, "true") == ""  # the shim serves on
    finally:
        for sandbox_id in sandboxes:
            kubelet.remove_pod(sandbox_id)
