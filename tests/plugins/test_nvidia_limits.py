"""GPU shares on the node: the env and mounts a share container gets, by the node's enforcement, through the CRI shim.

What an operator would notice: on a HAMi-core node, a container with 30 % of two GPUs and 4 GiB of each runs with
`CUDA_DEVICE_SM_LIMIT=30` and `CUDA_DEVICE_MEMORY_LIMIT_0/1=4096m` and libvgpu.so preloaded; on an MPS node with
`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30` and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M,1=4096M` and the daemon's pipe;
a whole-GPU container gets none of it; a tenant who writes a larger limit into the pod spec runs with the
allocation's; a share on a node that enforces none, or a malformed share, is refused with a sentence that says what
is wrong, and the shim goes on serving.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2

from kubegpu.core.annotations import ALLOCATION_KEY, encode_allocation, merge_allocations, sign_allocation
from kubegpu.core.models import ContainerAllocation, ContainerEdit, Mount, PluginAllocation
from kubegpu.core.plugin_manager import KubegpuPluginManager, PluginHookError
from kubegpu.crishim.deviceplugin import allocate_response
from kubegpu.crishim.shim import ContainerEditor
from kubegpu.crishim.verify import AllocationRefused, PodIdentity
from kubegpu.plugins.nvidia import device, limits

from .regions import swept
from .test_nvidia_device import MIB, FakeGpu, fake_nvml

GPU = "nvidia.com/gpu"
CORES = "nvidia.com/gpucores"
MEM = "nvidia.com/gpumem"
MEM_PCT = "nvidia.com/gpumem-percentage"
KEY = b"node-and-scheduler-share-this"
NODE = "gpu-node-0"
POD = PodIdentity("team-a", "notebook", "uid-notebook")
# What every share container on a HAMi-core node is written besides its limits: HAMi-core's switches at the values
# that hold the share, and its shared region in the node's directory (so that the image's ENV cannot set them).
HAMI_NEUTRAL = {
    "CUDA_OVERSUBSCRIBE": "false",
    "GPU_CORE_UTILIZATION_POLICY": "default",
    "CUDA_TASK_PRIORITY": "1",
    "CUDA_REDIRECT": "/usr/local/vgpu/libvgpu.so",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/cache/cudevshr.cache",
}


@pytest.fixture
def pm(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> KubegpuPluginManager:
    manager: KubegpuPluginManager = make_plugin_manager("device", nvidia=device)
    return manager


@pytest.fixture(autouse=True)
def no_nvml(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No NVML unless a test installs the fake; no enforcement configured unless a test sets one; HAMi-core's
    directory (where the node makes each share container's region directory) a temporary one, never the host's."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    for name in (limits.MODE_ENV, limits.MPS_PIPE_ENV, limits.MPS_LOG_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(limits.HAMI_DIR_ENV, str(tmp_path_factory.mktemp("vgpu")))


def share(ids: list[str], cores: int = 30, memory: int = 4096, memory_resource: str = MEM) -> ContainerAllocation:
    return ContainerAllocation(
        pod_uid=POD.uid,
        node=NODE,
        container="main",
        resources={GPU: ids, CORES: ids, memory_resource: ids},
        shares={
            GPU: dict.fromkeys(ids, 1),
            CORES: dict.fromkeys(ids, cores),
            memory_resource: dict.fromkeys(ids, memory),
        },
    )


def edit_with(pm: KubegpuPluginManager, allocation: ContainerAllocation, dev_root: Path) -> ContainerEdit:
    edit = ContainerEdit(envs={"PATH": "/bin"})
    pm.call("nvidia", "kubegpu_device_edit_container", allocation=allocation, edit=edit, dev_root=dev_root)
    return edit


# ------------------------------------------------------------------------------------------------------------
# The limits each mode writes
# ------------------------------------------------------------------------------------------------------------


def test_a_share_on_a_hami_core_node_gets_hami_cores_limits_and_library(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hami = tmp_path / "hami"
    hami.mkdir()
    monkeypatch.setenv(limits.MODE_ENV, "hami-core")
    monkeypatch.setenv(limits.HAMI_DIR_ENV, str(hami))
    edit = edit_with(pm, share(["3", "1"]), tmp_path)
    assert edit.envs == {
        "PATH": "/bin",
        "NVIDIA_VISIBLE_DEVICES": "1,3",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "4096m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "CUDA_DEVICE_SM_LIMIT_0": "30",
        "CUDA_DEVICE_SM_LIMIT_1": "30",
        **HAMI_NEUTRAL,
    }
    assert edit.mounts == [
        Mount(host_path=f"{hami}/libvgpu.so", container_path="/usr/local/vgpu/libvgpu.so", readonly=True),
        Mount(host_path=f"{hami}/ld.so.preload", container_path="/etc/ld.so.preload", readonly=True),
        Mount(host_path=f"{hami}/vgpulock", container_path="/tmp/vgpulock"),
        Mount(host_path=f"{hami}/containers/uid-notebook_main", container_path="/usr/local/vgpu/cache"),
        Mount(host_path="/dev/null", container_path="/overrideEnv", readonly=True),
    ]


def test_a_share_on_an_mps_node_gets_the_daemons_limits_and_pipe(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(limits.MODE_ENV, "mps")
    monkeypatch.setenv(limits.MPS_PIPE_ENV, "/run/nvidia/mps")
    edit = edit_with(pm, share(["0", "2"], cores=50, memory=2048), tmp_path)
    assert edit.envs == {
        "PATH": "/bin",
        "NVIDIA_VISIBLE_DEVICES": "0,2",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        "CUDA_MPS_LOG_DIRECTORY": "/var/log/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
        "CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING": "0",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M,1=2048M",
    }
    assert edit.mounts == [
        Mount(host_path="/run/nvidia/mps", container_path="/tmp/nvidia-mps"),
        Mount(host_path="/var/log/nvidia-mps", container_path="/var/log/nvidia-mps", readonly=True),
    ]


@pytest.mark.parametrize("mode", ["hami-core", "mps", "none", None])
def test_a_whole_gpu_container_gets_no_limits(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: str | None
) -> None:
    if mode:
        monkeypatch.setenv(limits.MODE_ENV, mode)
    whole = ContainerAllocation(pod_uid=POD.uid, node=NODE, container="main", resources={GPU: ["0", "1"]})
    edit = edit_with(pm, whole, tmp_path)
    assert edit.envs == {"PATH": "/bin", "NVIDIA_VISIBLE_DEVICES": "0,1"} and edit.mounts == []


def test_a_memory_percent_is_turned_into_mib_from_nvml_and_a_whole_memory_needs_no_limit(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(limits.MODE_ENV, "hami-core")
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([FakeGpu(memory=16160 * MIB)] * 2))
    edit = edit_with(pm, share(["1"], memory=25, memory_resource=MEM_PCT), tmp_path)
    assert edit.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4040m"
    edit = edit_with(pm, share(["1"], cores=0, memory=100, memory_resource=MEM_PCT), tmp_path)
    assert not [name for name in edit.envs if name.startswith(("CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT"))]


@pytest.mark.parametrize(
    ("environ", "allocation", "words"),
    [
        pytest.param({}, share(["0"]), "this node enforces no GPU shares: set KUBEGPU_NVIDIA_SHARE_LIMITS", id="unset"),
        pytest.param({limits.MODE_ENV: "vgpu"}, share(["0"]), "is 'vgpu'; give one of hami-core, mps, none", id="typo"),
        pytest.param(
            {limits.MODE_ENV: "mps"}, share(["0"], memory=50, memory_resource=MEM_PCT), "NVML", id="percent-unknown"
        ),
        pytest.param({limits.MODE_ENV: "mps"}, share(["0"], cores=150), "gpucores is 150", id="cores-over-100"),
        pytest.param({limits.MODE_ENV: "mps"}, share(["0"], memory=0), "gpumem of GPU 0 is 0 MiB", id="no-memory"),
        pytest.param(
            {limits.MODE_ENV: "mps"},
            ContainerAllocation(
                pod_uid="u", node=NODE, container="main", resources={GPU: ["0"]}, shares={GPU: {"0": 1}}
            ),
            "names no nvidia.com/gpucores and no memory",
            id="share-without-amounts",
        ),
        pytest.param(
            {limits.MODE_ENV: "mps"},
            share(["0"]).model_copy(update={"shares": {**share(["0"]).shares, CORES: {"1": 30}}}),
            "gpucores names GPU(s) 1, the container has GPU(s) 0",
            id="other-gpu",
        ),
        pytest.param(
            {limits.MODE_ENV: "hami-core", limits.HAMI_DIR_ENV: "/nonexistent/vgpu"},
            share(["0"]),
            "/nonexistent/vgpu/containers/uid-notebook_main': No such file or directory (KUBEGPU_HAMI_CORE_DIR must "
            "name the directory HAMi-core is installed in",
            id="hami-core-not-installed",
        ),
        pytest.param(
            {limits.MODE_ENV: "hami-core"},
            share(["0"]).model_copy(update={"container": "../x"}),
            "the container's name on the node ('uid-notebook_../x') is not a plain file name",
            id="holder-not-a-name",
        ),
    ],
)
def test_a_share_the_node_cannot_hold_is_refused_saying_why(
    pm: KubegpuPluginManager,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    environ: dict[str, str],
    allocation: ContainerAllocation,
    words: str,
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(PluginHookError) as caught:
        edit_with(pm, allocation, tmp_path)
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("entry", "owned"),
    [
        pytest.param(("env", "CUDA_DEVICE_SM_LIMIT"), True, id="sm-limit"),
        pytest.param(("env", "CUDA_DEVICE_MEMORY_LIMIT_0"), True, id="memory-limit-0"),
        pytest.param(("env", "CUDA_DEVICE_MEMORY_LIMIT"), True, id="memory-limit"),
        pytest.param(("env", "CUDA_DEVICE_SM_LIMIT_0"), True, id="sm-limit-0"),
        pytest.param(("env", "CUDA_TASK_PRIORITY"), True, id="hami-priority"),
        pytest.param(("env", "ACTIVE_OOM_KILLER"), True, id="hami-oom-killer"),
        pytest.param(("env", "CUDA_DISABLE_CONTROL"), True, id="hami-off-switch"),
        pytest.param(("env", "GPU_CORE_UTILIZATION_POLICY"), True, id="hami-core-policy"),
        pytest.param(("env", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), True, id="mps-threads"),
        pytest.param(("env", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), True, id="mps-memory"),
        pytest.param(("env", "CUDA_MPS_PIPE_DIRECTORY"), True, id="mps-pipe"),
        pytest.param(("env", "CUDA_CACHE_PATH"), False, id="other-cuda-env"),
        pytest.param(("mount", "/etc/ld.so.preload"), True, id="preload"),
        pytest.param(("mount", "/usr/local/vgpu/libvgpu.so"), True, id="libvgpu"),
        pytest.param(("mount", "/tmp/nvidia-mps"), True, id="mps-pipe-mount"),
        pytest.param(("mount", "/etc/ld.so.conf"), False, id="other-etc"),
    ],
)
def test_the_plugin_owns_the_limits(pm: KubegpuPluginManager, entry: tuple[str, str], owned: bool) -> None:
    ownership = pm.call("nvidia", "kubegpu_device_owned")
    kind, value = entry
    assert (ownership.owns_env if kind == "env" else ownership.owns_mount)(value) is owned


# ------------------------------------------------------------------------------------------------------------
# Through the CRI shim and the device-plugin mode
# ------------------------------------------------------------------------------------------------------------


def signed(containers: dict[str, ContainerAllocation]) -> str:
    part = PluginAllocation(
        plugin="nvidia",
        containers={name: dict(a.resources) for name, a in containers.items()},
        shares={name: dict(a.shares) for name, a in containers.items() if a.shares},
    )
    return encode_allocation(sign_allocation(merge_allocations(NODE, POD.uid, [part]), KEY))


def create(text: str, container: str = "main", envs: dict[str, str] | None = None) -> api_pb2.CreateContainerRequest:
    sandbox = api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name=POD.name, namespace=POD.namespace, uid=POD.uid),
        annotations={ALLOCATION_KEY: text},
    )
    config = api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name=container),
        envs=[api_pb2.KeyValue(key=k, value=v) for k, v in (envs or {}).items()],
        mounts=[api_pb2.Mount(host_path="/tmp/empty", container_path="/etc/ld.so.preload", readonly=True)],
    )
    return api_pb2.CreateContainerRequest(pod_sandbox_id="sandbox-1", config=config, sandbox_config=sandbox)


def test_a_tenant_cannot_raise_its_limit_from_the_pod_spec(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(limits.MODE_ENV, "hami-core")
    editor = ContainerEditor(pm, node=NODE, key=KEY, dev_root=tmp_path)
    raised = {
        "CUDA_DEVICE_SM_LIMIT": "100",
        "CUDA_DEVICE_SM_LIMIT_0": "100",  # HAMi-core's per-GPU compute limit wins over CUDA_DEVICE_SM_LIMIT
        "CUDA_TASK_PRIORITY": "0",  # HAMi-core hangs the GPU's other (priority 1) tasks while this one runs
        "CUDA_DEVICE_MEMORY_LIMIT_0": "81920m",
        "CUDA_DEVICE_MEMORY_LIMIT": "81920m",
        "CUDA_DISABLE_CONTROL": "true",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
        "GREETING": "hello",
    }
    sent = create(signed({"main": share(["0"])}), envs=raised)
    edited = api_pb2.CreateContainerRequest.FromString(editor.create_container(sent.SerializeToString()))
    envs = {kv.key: kv.value for kv in edited.config.envs}
    assert envs == {
        "GREETING": "hello",
        "NVIDIA_VISIBLE_DEVICES": "0",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "CUDA_DEVICE_SM_LIMIT_0": "30",
        **HAMI_NEUTRAL,
    }
    # the tenant's empty file over /etc/ld.so.preload (which would skip libvgpu.so) is replaced by the node's
    preload = [m.host_path for m in edited.config.mounts if m.container_path == "/etc/ld.so.preload"]
    assert preload == [f"{os.environ[limits.HAMI_DIR_ENV]}/ld.so.preload"]

    # ...and a container of the pod without GPUs keeps none of it
    text = signed({"main": share(["0"])})
    sidecar = api_pb2.CreateContainerRequest.FromString(
        editor.create_container(create(text, container="sidecar", envs=raised).SerializeToString())
    )
    assert {kv.key for kv in sidecar.config.envs} == {"GREETING"} and not list(sidecar.config.mounts)


@pytest.mark.parametrize(
    "path",
    ["/overrideEnv", "/tmp/cudevshr.cache"],
    ids=["hami-core-override-file", "hami-core-shared-region"],
)
def test_a_tenant_cannot_lift_its_limit_with_a_file_hami_core_reads(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, path: str
) -> None:
    """HAMi-core reads two files of the container besides its environment: `/overrideEnv`, whose `NAME=value` lines
    it sets over the environment before anything else (so a ConfigMap mounted there holding
    `CUDA_DEVICE_MEMORY_LIMIT_0=81920m` and `CUDA_DEVICE_SM_LIMIT=100` undid the share's limits the shim wrote), and
    its shared region `/tmp/cudevshr.cache`, whose limits, once written, win over the environment of every later
    process (a volume holding a region written elsewhere did the same). Both came from the pod spec as mounts, which
    the shim let through; now it owns both paths, as it owns `/etc/ld.so.preload`, and removes them from every
    container (a share container gets the node's empty `/overrideEnv` instead)."""
    monkeypatch.setenv(limits.MODE_ENV, "hami-core")
    editor = ContainerEditor(pm, node=NODE, key=KEY, dev_root=tmp_path)
    text = signed({"main": share(["0"])})
    for container in ("main", "sidecar"):  # the share container, and one of its pod without GPUs
        sent = create(text, container=container)
        sent.config.mounts.append(api_pb2.Mount(host_path="/var/lib/kubelet/pods/x/volumes/cm", container_path=path))
        sent.config.mounts.append(api_pb2.Mount(host_path="/data", container_path="/tmp/data"))
        edited = api_pb2.CreateContainerRequest.FromString(editor.create_container(sent.SerializeToString()))
        mounts = [m.container_path for m in edited.config.mounts]
        tenants = [m.container_path for m in edited.config.mounts if m.host_path.startswith("/var/lib/kubelet")]
        assert tenants == [] and "/tmp/data" in mounts, mounts


@pytest.mark.parametrize(
    "path",
    [
        "//overrideEnv",
        "/./overrideEnv",
        "/tmp/../overrideEnv",
        "/overrideEnv/",
        "/etc//ld.so.preload",
        "/tmp//nvidia-mps",
    ],
)
def test_an_owned_path_spelled_otherwise_is_owned_all_the_same(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, path: str
) -> None:
    """The API server and the kubelet pass a volume's `mountPath` as the tenant wrote it, and the runtime cleans it
    (`//overrideEnv` mounts at `/overrideEnv`): the shim compared the written path with the owned ones, so a file
    mounted at `//overrideEnv` reached HAMi-core in a share container, and the MPS daemon's pipe at `/tmp//nvidia-mps`
    reached a container without a share. Paths are compared as the runtime mounts them."""
    monkeypatch.setenv(limits.MODE_ENV, "hami-core")
    editor = ContainerEditor(pm, node=NODE, key=KEY, dev_root=tmp_path)
    text = signed({"main": share(["0"])})
    for container in ("main", "sidecar"):
        sent = create(text, container=container)
        sent.config.mounts.append(api_pb2.Mount(host_path="/var/lib/tenant/file", container_path=path))
        edited = api_pb2.CreateContainerRequest.FromString(editor.create_container(sent.SerializeToString()))
        assert "/var/lib/tenant/file" not in [m.host_path for m in edited.config.mounts], container


def test_a_malformed_share_refuses_its_container_and_the_shim_keeps_serving(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(limits.MODE_ENV, "mps")
    editor = ContainerEditor(pm, node=NODE, key=KEY, dev_root=tmp_path)
    bad = signed({"main": share(["0"], cores=250)})
    with pytest.raises(AllocationRefused) as caught:
        editor.create_container(create(bad).SerializeToString())
    assert caught.value.check == "plugin"
    assert "pod team-a/notebook container main" in str(caught.value) and "gpucores is 250" in str(caught.value)
    good = api_pb2.CreateContainerRequest.FromString(
        editor.create_container(create(signed({"main": share(["0"])})).SerializeToString())
    )
    assert {kv.key: kv.value for kv in good.config.envs}["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"


def test_the_device_plugin_mode_answers_the_share_limits_too(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kubegpu.core.annotations import decode_allocation
    from kubegpu.crishim.deviceplugin import Candidate

    monkeypatch.setenv(limits.MODE_ENV, "hami-core")
    record = decode_allocation(signed({"main": share(["1"])}))
    candidate = Candidate(pod=POD, created="", record=record, order=["main"], requests={"main": {GPU: 1}})
    response = allocate_response(pm, "nvidia", candidate, "main", GPU, ["1"], tmp_path)
    assert dict(response.envs) == {
        "NVIDIA_VISIBLE_DEVICES": "1",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "CUDA_DEVICE_SM_LIMIT_0": "30",
        **HAMI_NEUTRAL,
    }
    assert {m.container_path for m in response.mounts} == {
        "/usr/local/vgpu/libvgpu.so",
        "/etc/ld.so.preload",
        "/tmp/vgpulock",
        "/usr/local/vgpu/cache",
        "/overrideEnv",
    }


# ------------------------------------------------------------------------------------------------------------
# What a node configured for shares advertises
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "capacity"),
    [
        pytest.param({}, {GPU: 2}, id="not-configured"),
        pytest.param(
            {limits.MODE_ENV: "hami-core"},
            {GPU: 20, CORES: 200, MEM_PCT: 200, MEM: 32320},
            id="hami-core-default-split",
        ),
        pytest.param(
            {limits.MODE_ENV: "mps", device.SPLIT_ENV: "4"}, {GPU: 8, CORES: 200, MEM_PCT: 200, MEM: 32320}, id="mps-4"
        ),
        pytest.param({limits.MODE_ENV: "mps", device.SPLIT_ENV: "0"}, {GPU: 2}, id="bad-split-advertises-whole"),
    ],
)
def test_a_node_configured_for_shares_advertises_them_as_the_scheduler_reads_them(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], capacity: dict[str, int]
) -> None:
    from kubegpu.core.models import DeviceInfo, DeviceInventory
    from kubegpu.core.testing import make_node
    from kubegpu.plugins.nvidia import scheduler

    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    gpus = [DeviceInfo(id=str(i), model="Tesla V100-SXM2-16GB", memory=16160 * MIB) for i in range(2)]
    inventory = DeviceInventory(
        plugin="nvidia", devices=[*gpus, gpus[0].model_copy(update={"id": "2", "healthy": False})]
    )
    advertised = pm.call("nvidia", "kubegpu_device_advertise", inventory=inventory)
    assert advertised.capacity == capacity and advertised.labels["nvidia.com/gpu.count"] == "2"

    node = make_node("n", labels=advertised.labels, allocatable=advertised.capacity)
    state = scheduler.plugin.kubegpu_scheduler_build_node(node=node, shared=None)
    assert state is not None and state.split == capacity[GPU] // 2


# ------------------------------------------------------------------------------------------------------------
# What the image and the tenant's volumes cannot change (T133, T134)
# ------------------------------------------------------------------------------------------------------------


def _limit(env: dict[str, str], name: str) -> int:
    """HAMi-core's `get_limit_from_env`: a number with an optional k/m/g suffix, 0 when unset or not a number."""
    text = env.get(name, "")
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1:].lower(), 1)
    digits = text[:-1] if scale != 1 else text
    return int(digits) * scale if digits.isascii() and digits.isdigit() else 0


def hami_core_reads(env: dict[str, str], gpus: int) -> dict[str, object]:
    """What HAMi-core (src/multiprocess/multiprocess_memory_limit.c, src/libvgpu.c) takes from an environment: per GPU
    the `_<i>` limit, else the bare one (compute: else 100, no limit), and its switches."""
    sm = _limit(env, "CUDA_DEVICE_SM_LIMIT") or 100
    memory = _limit(env, "CUDA_DEVICE_MEMORY_LIMIT")
    return {
        "compute": [_limit(env, f"CUDA_DEVICE_SM_LIMIT_{i}") or sm for i in range(gpus)],
        "memory MiB": [(_limit(env, f"CUDA_DEVICE_MEMORY_LIMIT_{i}") or memory) // MIB for i in range(gpus)],
        "oversubscribe": env.get("CUDA_OVERSUBSCRIBE", "").lower() in ("true", "1"),
        "utilization policy": env.get("GPU_CORE_UTILIZATION_POLICY", "").lower() in ("force", "disable")
        and env["GPU_CORE_UTILIZATION_POLICY"].lower(),
        "priority": env.get("CUDA_TASK_PRIORITY", "1"),
        "library": env.get("CUDA_REDIRECT") or "/usr/local/vgpu/libvgpu.so",
        "region": env.get("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/cudevshr.cache"),
    }


GREEDY_IMAGE = {  # an image's ENV: what a HAMi setup it was built for, or its author, left there
    "CUDA_DEVICE_SM_LIMIT": "100",
    "CUDA_DEVICE_SM_LIMIT_0": "100",
    "CUDA_DEVICE_SM_LIMIT_1": "100",
    "CUDA_DEVICE_MEMORY_LIMIT": "80g",
    "CUDA_DEVICE_MEMORY_LIMIT_0": "81920m",
    "CUDA_DEVICE_MEMORY_LIMIT_1": "81920m",
    "CUDA_OVERSUBSCRIBE": "true",
    "GPU_CORE_UTILIZATION_POLICY": "disable",
    "CUDA_TASK_PRIORITY": "0",
    "CUDA_REDIRECT": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/mine.cache",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=81920M,1=81920M",
    "CUDA_MPS_PIPE_DIRECTORY": "/tmp/my-own-mps",
    "CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING": "1",
    "PATH": "/usr/local/bin:/bin",
}


def test_a_share_holds_on_a_hami_core_node_whatever_the_image_sets(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The runtime merges the image's ENV under the container config's (a config variable of the same name wins, one
    of another name stays; in device-plugin mode Allocate's env is config env too). The shim wrote only
    `CUDA_DEVICE_SM_LIMIT` and the memory limits: an image's `CUDA_DEVICE_SM_LIMIT_0=100`, which HAMi-core reads
    first, lifted the compute limit, and its switches (`GPU_CORE_UTILIZATION_POLICY=disable`, `CUDA_OVERSUBSCRIBE`,
    `CUDA_TASK_PRIORITY=0`, `CUDA_REDIRECT`, a shared region of its own) stayed as the image set them."""
    monkeypatch.setenv(limits.MODE_ENV, "hami-core")
    for edit in (
        edit_with(pm, share(["3", "1"]), tmp_path),
        ContainerEdit(envs=dict(allocate_response(pm, "nvidia", candidate_of(share(["1", "3"])), "main", GPU,
                                                  ["1", "3"], tmp_path).envs)),
    ):  # fmt: skip
        effective = {**GREEDY_IMAGE, **edit.envs}  # as containerd merges them
        assert hami_core_reads(effective, 2) == {
            "compute": [30, 30],
            "memory MiB": [4096, 4096],
            "oversubscribe": False,
            "utilization policy": False,
            "priority": "1",
            "library": "/usr/local/vgpu/libvgpu.so",
            "region": "/usr/local/vgpu/cache/cudevshr.cache",
        }


def test_a_share_holds_on_an_mps_node_whatever_the_image_sets(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(limits.MODE_ENV, "mps")
    effective = {**GREEDY_IMAGE, **edit_with(pm, share(["0", "2"], cores=50, memory=2048), tmp_path).envs}
    assert {k: v for k, v in effective.items() if k.startswith("CUDA_MPS_")} == {
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        "CUDA_MPS_LOG_DIRECTORY": "/var/log/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
        "CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING": "0",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M,1=2048M",
    }


def hami_core_share(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> tuple[Path, ContainerEditor, str]:
    """A HAMi-core node (its directory under `tmp_path`), the shim's editor on it, and a signed allocation of a
    share of GPU 0 for container main: what a test of the region directory starts from."""
    hami = tmp_path / "vgpu"
    hami.mkdir()
    monkeypatch.setenv(limits.MODE_ENV, "hami-core")
    monkeypatch.setenv(limits.HAMI_DIR_ENV, str(hami))
    return hami, ContainerEditor(pm, node=NODE, key=KEY, dev_root=tmp_path), signed({"main": share(["0"])})


def test_the_shared_region_lies_in_a_directory_of_the_node_made_empty_for_each_container(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """HAMi-core takes the limits of a shared region already written over the environment's. The region was at the
    default `/tmp/cudevshr.cache`, in the container's own `/tmp`: a tenant's emptyDir at `/tmp` that an init container
    filled with a crafted region (or an image shipping one) set the share's limits. Now it is in a directory of the
    node, mounted over whatever the tenant has at `/tmp` or `/usr/local`, and emptied at each creation of the
    container (an earlier run's region, which its code could write, is gone)."""
    hami, editor, text = hami_core_share(pm, monkeypatch, tmp_path)
    tenant = tmp_path / "emptydir"
    tenant.mkdir()
    (tenant / "cudevshr.cache").write_bytes(b"a region with the limits the tenant likes")
    for run in range(2):  # the container, then the same container restarted
        sent = create(text)
        sent.config.mounts.append(api_pb2.Mount(host_path=str(tenant), container_path="/tmp"))
        sent.config.mounts.append(api_pb2.Mount(host_path=str(tenant), container_path="/usr/local"))
        edited = api_pb2.CreateContainerRequest.FromString(editor.create_container(sent.SerializeToString()))
        envs = {kv.key: kv.value for kv in edited.config.envs}
        region = hami_core_reads(envs, 1)["region"]
        mounts = [(m.container_path, m.host_path, m.readonly) for m in edited.config.mounts]
        assert region == "/usr/local/vgpu/cache/cudevshr.cache", envs
        directory = hami / "containers" / f"{POD.uid}_main"
        assert ("/usr/local/vgpu/cache", str(directory), False) in mounts
        assert ("/overrideEnv", "/dev/null", True) in mounts  # an image's own /overrideEnv is covered
        # the node's mounts come after the tenant's /tmp and /usr/local (and lie deeper): mounted on top of them
        order = [path for path, _, _ in mounts]
        assert order.index("/tmp") < order.index("/tmp/vgpulock") and order.index("/usr/local") < order.index(
            "/usr/local/vgpu/cache"
        )
        assert list(directory.iterdir()) == [] and directory.stat().st_mode & 0o777 == 0o777, run
        (directory / "cudevshr.cache").write_bytes(b"written by the first run")  # its code may write its region
        (directory / "elsewhere").symlink_to(tenant)
    assert (tenant / "cudevshr.cache").exists()  # emptying the directory never followed the link out of it


def _nest(directory: Path, depth: int) -> None:
    """What a container's code can leave in its region directory: directories nested `depth` deep, a file and a
    link at the bottom (made relative to each level, as a process inside would, so no path grows too long)."""
    fd = os.open(directory, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(os.open("cudevshr.cache", os.O_WRONLY | os.O_CREAT, 0o666, dir_fd=fd))
    os.symlink("/", "root", dir_fd=fd)
    os.close(fd)


def test_a_region_directory_nested_deep_by_its_container_is_emptied_at_its_next_creation(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The container's code owns its region directory while it runs and may leave anything there: directories
    nested 3,000 deep made the node's emptying (`shutil.rmtree`, one recursion and one open file per level) fail
    with a RecursionError, so every later creation of the container was refused; 400 deep, under a limit of open
    files the shim's other calls share, it ran out of them. The directory is emptied, with a few files open."""

    hami, editor, text = hami_core_share(pm, monkeypatch, tmp_path)
    directory = hami / "containers" / f"{POD.uid}_main"
    try:
        editor.create_container(create(text).SerializeToString())
        _nest(directory, 3000)
        editor.create_container(create(text).SerializeToString())  # the container restarted
        assert list(directory.iterdir()) == []
        assert swept(hami) == [directory.name]  # what the last run left, removed by the sweeper
        _nest(directory, 400)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 32, hard))
        try:
            editor.create_container(create(text).SerializeToString())
            assert swept(hami) == [directory.name]
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert list(directory.iterdir()) == [] and directory.stat().st_mode & 0o777 == 0o777
    finally:  # a tree left by a failure would stop pytest's own clean-up of tmp_path (shutil.rmtree)
        subprocess.run(["rm", "-rf", str(hami)], check=True)


def candidate_of(allocation: ContainerAllocation) -> Any:
    from kubegpu.core.annotations import decode_allocation
    from kubegpu.crishim.deviceplugin import Candidate

    record = decode_allocation(signed({"main": allocation}))
    return Candidate(pod=POD, created="", record=record, order=["main"], requests={"main": {GPU: 1}})
