"""The CRI shim as a trust boundary, with a fake runtime behind it (issue 10, findings 1, 7 and 8).

What a tenant who controls a pod's annotations and env can try, and what the shim does about it:

* **Poison** (finding 1): an allocation the codec chokes on (a non-ASCII signature, 3000-deep JSON, a 5000-digit
  number) or a plugin that blows up is a refusal, FAILED_PRECONDITION naming the pod and container (or the plugin and
  hook), never UNKNOWN or an unanswered call, and nothing reaches the runtime.
* **Unallocated device selections** (finding 8): `NVIDIA_VISIBLE_DEVICES=all`, `AWS_NEURON_VISIBLE_DEVICES`, a GPU
  device node, the NVIDIA runtime's volume-mount list or a CDI name reach the runtime removed from every container
  that was not granted that plugin's devices: no allocation at all (the shipped systemd unit has no
  `--kubeconfig`), a sidecar the allocation does not name, another plugin's variables in a container that does get
  devices. The granted plugin then adds back exactly its devices.
* **Replayed and stale allocations** (finding 7): the allocation applied is the one the sandbox was created with, as
  the runtime recorded it, not the pod's current annotations; and no whole device is ever applied to two live pods
  on the node: of two verified allocations naming one device, the earlier (stale) one is refused, and a device a
  live container already has is never given to another pod.

The fake runtime records what it was asked to create and reports its sandboxes (with the annotations they were
created with) and containers, as containerd 1.6 does (checked on the real one in tests/integration/test_crishim.py).
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import random
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2, api_pb2_grpc

from kubegpu.core.annotations import ALLOCATION_KEY, AllocationRecord, encode_allocation, sign_allocation
from kubegpu.core.device_hooks import hookimpl
from kubegpu.core.models import ContainerAllocation, ContainerEdit, DeviceOwnership
from kubegpu.core.plugin_manager import KubegpuPluginManager
from kubegpu.crishim.shim import ContainerEditor, RunningShim, RuntimeSandboxes, Sandbox, _names, start_shim
from kubegpu.crishim.verify import AllocationRefused
from kubegpu.plugins.intel_gas import device as intel_device
from kubegpu.plugins.neuron import device as neuron_device
from kubegpu.plugins.nvidia import device as nvidia_device

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fpga"
FPGA = "example.com/fpga"
GPU = "nvidia.com/gpu"
I915 = "gpu.intel.com/i915"
KEY = b"node-and-scheduler-share-this-key"
NODE = "node-a"
T1 = 1_763_820_000_000_000_000  # 2025-11-22T14:00:00Z, in the scheduler's nanoseconds
T2 = T1 + 5_000_000_000

# What a tenant puts in a pod without asking the scheduler for anything.
GREEDY_ENV = {
    "GREETING": "hello",
    "NVIDIA_VISIBLE_DEVICES": "all",
    "CUDA_VISIBLE_DEVICES": "0",
    "AWS_NEURON_VISIBLE_DEVICES": "0-15",
    "NEURON_RT_VISIBLE_CORES": "0-31",
    "FPGA_VISIBLE_DEVICES": "fpga0,fpga1,fpga2,fpga3",
}
UNOWNED_ENV = [("GREETING", "hello"), ("CUDA_VISIBLE_DEVICES", "0")]


@pytest.fixture(scope="module")
def fpga_device() -> ModuleType:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLE))
        return importlib.import_module("kubegpu_fpga.device")


@pytest.fixture
def plugins(
    fpga_device: ModuleType,
    make_plugin_manager: Callable[..., KubegpuPluginManager],
    monkeypatch: pytest.MonkeyPatch,
) -> KubegpuPluginManager:
    """Every built-in plugin and the example FPGA plugin, as a node with all of them installed has them."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML in the shim: GPU index = minor number
    return make_plugin_manager(
        "device", fpga=fpga_device, nvidia=nvidia_device, neuron=neuron_device, **{"intel-gas": intel_device}
    )


def signed(
    uid: str,
    containers: Mapping[str, Mapping[str, list[str]]],
    *,
    issued: int = T1,
    shares: Mapping[str, Any] | None = None,
    node: str = NODE,
    init: Mapping[str, Mapping[str, list[str]]] | None = None,
) -> str:
    """The annotation the kubegpu scheduler writes: signed with the cluster key, stamped `issued`."""
    record = AllocationRecord(
        version=1,
        node=node,
        podUID=uid,
        containers={c: dict(r) for c, r in containers.items()},
        shares=dict(shares or {}),
        init={c: dict(r) for c, r in (init or {}).items()},
        issued=issued,
    )
    return encode_allocation(sign_allocation(record, KEY))


# ---------------------------------------------------------------------------------------------------------------
# A fake runtime and a kubelet in front of the shim
# ---------------------------------------------------------------------------------------------------------------


class FakeRuntime(api_pb2_grpc.RuntimeServiceServicer):
    """Keeps sandboxes (with the annotations they were created with) and containers; records every creation."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, api_pb2.PodSandbox] = {}
        self.containers: dict[str, api_pb2.Container] = {}
        self.created: list[api_pb2.CreateContainerRequest] = []
        self.report_annotations = True
        self.refuse: str | None = None  # the runtime's refusal of the next creation (INVALID_ARGUMENT)
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.listed: list[str] = []  # each ListPodSandbox's id filter ('' for every sandbox)

    def RunPodSandbox(self, request: Any, context: grpc.ServicerContext) -> api_pb2.RunPodSandboxResponse:
        sandbox_id = f"sandbox-{next(self.ids)}"
        self.sandboxes[sandbox_id] = api_pb2.PodSandbox(
            id=sandbox_id,
            metadata=request.config.metadata,
            state=api_pb2.PodSandboxState.SANDBOX_READY,
            annotations=request.config.annotations,
        )
        return api_pb2.RunPodSandboxResponse(pod_sandbox_id=sandbox_id)

    def StopPodSandbox(self, request: Any, context: grpc.ServicerContext) -> api_pb2.StopPodSandboxResponse:
        self.sandboxes[request.pod_sandbox_id].state = api_pb2.PodSandboxState.SANDBOX_NOTREADY
        for container in self.containers.values():
            if container.pod_sandbox_id == request.pod_sandbox_id:
                container.state = api_pb2.ContainerState.CONTAINER_EXITED
        return api_pb2.StopPodSandboxResponse()

    def RemovePodSandbox(self, request: Any, context: grpc.ServicerContext) -> api_pb2.RemovePodSandboxResponse:
        del self.sandboxes[request.pod_sandbox_id]
        return api_pb2.RemovePodSandboxResponse()

    def ListPodSandbox(self, request: Any, context: grpc.ServicerContext) -> api_pb2.ListPodSandboxResponse:
        wanted = request.filter.id  # as containerd does: exact ids only (a unique prefix is resolved first)
        self.listed.append(wanted)
        items = []
        for sandbox in self.sandboxes.values():
            if wanted and sandbox.id != wanted:
                continue
            item = api_pb2.PodSandbox()
            item.CopyFrom(sandbox)
            if not self.report_annotations:
                item.annotations.clear()
            items.append(item)
        return api_pb2.ListPodSandboxResponse(items=items)

    def CreateContainer(self, request: Any, context: grpc.ServicerContext) -> api_pb2.CreateContainerResponse:
        refuse, self.refuse = self.refuse, None
        if refuse is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, refuse)
        with self.lock:
            self.created.append(request)
            container_id = f"container-{next(self.ids)}"
            self.containers[container_id] = api_pb2.Container(
                id=container_id,
                pod_sandbox_id=request.pod_sandbox_id,
                metadata=request.config.metadata,
                state=api_pb2.ContainerState.CONTAINER_CREATED,
            )
        return api_pb2.CreateContainerResponse(container_id=container_id)

    def ListContainers(self, request: Any, context: grpc.ServicerContext) -> api_pb2.ListContainersResponse:
        wanted = request.filter.pod_sandbox_id
        return api_pb2.ListContainersResponse(
            containers=[c for c in self.containers.values() if not wanted or c.pod_sandbox_id == wanted]
        )


class Kubelet:
    """Plays the kubelet against the shim: runs pod sandboxes and creates their containers."""

    def __init__(self, socket: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.runtime = api_pb2_grpc.RuntimeServiceStub(self.channel)

    def run_pod(self, name: str, uid: str, annotations: Mapping[str, str] | None = None) -> tuple[str, Any]:
        config = api_pb2.PodSandboxConfig(
            metadata=api_pb2.PodSandboxMetadata(name=name, namespace="team-a", uid=uid),
            annotations={"kubernetes.io/config.source": "api", **(annotations or {})},
        )
        response = self.runtime.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=config), timeout=5)
        return response.pod_sandbox_id, config

    def create(
        self,
        pod: tuple[str, Any],
        container: str = "main",
        *,
        envs: Mapping[str, str] | None = None,
        devices: Sequence[str] = (),
        mounts: Sequence[str] = (),
        cdi: Sequence[str] = (),
        annotations: Mapping[str, str] | None = None,
    ) -> str:
        sandbox_id, sandbox = pod
        config = api_pb2.ContainerConfig(
            metadata=api_pb2.ContainerMetadata(name=container),
            image=api_pb2.ImageSpec(image="busybox"),
            envs=[api_pb2.KeyValue(key=k, value=v) for k, v in (envs or {}).items()],
            devices=[api_pb2.Device(host_path=d, container_path=d, permissions="rw") for d in devices],
            mounts=[api_pb2.Mount(host_path="/tmp/empty", container_path=m) for m in mounts],
            CDI_devices=[api_pb2.CDIDevice(name=n) for n in cdi],
            annotations=dict(annotations or {}),
        )
        request = api_pb2.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox)
        container_id: str = self.runtime.CreateContainer(request, timeout=5).container_id
        return container_id

    def refused(self, pod: tuple[str, Any], container: str = "main", **kwargs: Any) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as failed:
            self.create(pod, container, **kwargs)
        return failed.value


class Node:
    """A fake runtime, the shim in front of it, and the kubelet talking to the shim."""

    def __init__(self, directory: Path, plugins: KubegpuPluginManager) -> None:
        self.directory = directory
        self.plugins = plugins
        self.runtime = FakeRuntime()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        api_pb2_grpc.add_RuntimeServiceServicer_to_server(self.runtime, self.server)
        self.server.add_insecure_port(f"unix://{directory / 'runtime.sock'}")
        self.server.start()
        self.shim = self.start_shim()
        self.kubelet = Kubelet(self.shim.socket)

    def start_shim(self) -> RunningShim:
        editor = ContainerEditor(self.plugins, node=NODE, key=KEY, dev_root=Path("/dev"))
        return start_shim(
            f"unix://{self.directory / 'shim.sock'}", f"unix://{self.directory / 'runtime.sock'}", editor, workers=8
        )

    def restart_shim(self) -> None:
        self.shim.stop(0)
        self.shim = self.start_shim()

    def last(self) -> api_pb2.ContainerConfig:
        config: api_pb2.ContainerConfig = self.runtime.created[-1].config
        return config

    def stop(self) -> None:
        self.kubelet.channel.close()
        self.shim.stop(0)
        self.server.stop(0).wait()


@pytest.fixture
def node(plugins: KubegpuPluginManager) -> Iterator[Node]:
    directory = Path(tempfile.mkdtemp(prefix="kubegpu-trust-"))
    running = Node(directory, plugins)
    yield running
    running.stop()
    shutil.rmtree(directory, ignore_errors=True)


def envs(config: api_pb2.ContainerConfig) -> list[tuple[str, str]]:
    return [(kv.key, kv.value) for kv in config.envs]


def refusal(error: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    return error.code(), error.details() or ""


# ---------------------------------------------------------------------------------------------------------------
# Finding 8: device selections without an allocation reach the runtime removed
# ---------------------------------------------------------------------------------------------------------------


def test_a_pod_without_an_allocation_gets_no_device_selection_through(node: Node) -> None:
    # The shim runs as the shipped systemd unit does: no --kubeconfig, so nothing but the sandbox tells it anything.
    pod = node.kubelet.run_pod("greedy", "uid-greedy")
    node.kubelet.create(
        pod,
        envs=GREEDY_ENV,
        devices=["/dev/nvidia0", "/dev/neuron3", "/dev/dri/renderD128", "/dev/fuse"],
        mounts=["/var/run/nvidia-container-devices/all", "/data"],
        cdi=["nvidia.com/gpu=all", "vendor.com/nic=eth0"],
        annotations={"cdi.k8s.io/greedy": "aws.amazon.com/neuron=neuron0,vendor.com/nic=eth1"},
    )

    config = node.last()
    assert envs(config) == UNOWNED_ENV
    assert [d.container_path for d in config.devices] == ["/dev/fuse"]
    assert [m.container_path for m in config.mounts] == ["/data"]
    assert [d.name for d in config.CDI_devices] == ["vendor.com/nic=eth0"]
    assert dict(config.annotations) == {"cdi.k8s.io/greedy": "vendor.com/nic=eth1"}


def test_a_pod_without_device_selections_reaches_the_runtime_as_sent(node: Node) -> None:
    pod = node.kubelet.run_pod("plain", "uid-plain")
    node.kubelet.create(pod, envs={"GREETING": "hello", "CUDA_VISIBLE_DEVICES": "0"}, devices=["/dev/fuse"])

    assert envs(node.last()) == UNOWNED_ENV
    assert [d.permissions for d in node.last().devices] == ["rw"]


def test_a_sidecar_the_allocation_does_not_name_gets_nothing_through(node: Node) -> None:
    pod = node.kubelet.run_pod(
        "trainer", "uid-trainer", {ALLOCATION_KEY: signed("uid-trainer", {"main": {GPU: ["1"]}})}
    )
    node.kubelet.create(pod, "sidecar", envs=GREEDY_ENV, devices=["/dev/nvidia1"])

    config = node.last()
    assert envs(config) == UNOWNED_ENV
    assert list(config.devices) == []


def test_a_container_granted_one_plugins_devices_loses_the_other_plugins_selections(node: Node) -> None:
    pod = node.kubelet.run_pod("fpga", "uid-fpga", {ALLOCATION_KEY: signed("uid-fpga", {"main": {FPGA: ["fpga2"]}})})
    node.kubelet.create(pod, envs=GREEDY_ENV, devices=["/dev/nvidia0", "/dev/fpga0"])

    config = node.last()
    assert envs(config) == [*UNOWNED_ENV, ("FPGA_VISIBLE_DEVICES", "fpga2")]
    assert [d.container_path for d in config.devices] == ["/dev/fpga2"]
    assert [d.name for d in config.CDI_devices] == ["example.com/fpga=fpga2"]


def test_a_container_granted_gpus_gets_exactly_its_gpus_whatever_it_set(node: Node) -> None:
    pod = node.kubelet.run_pod("cuda", "uid-cuda", {ALLOCATION_KEY: signed("uid-cuda", {"main": {GPU: ["1"]}})})
    node.kubelet.create(
        pod, envs=GREEDY_ENV, devices=["/dev/nvidia0"], mounts=["/var/run/nvidia-container-devices/all"]
    )

    config = node.last()
    assert envs(config) == [("GREETING", "hello"), ("NVIDIA_VISIBLE_DEVICES", "1"), ("CUDA_VISIBLE_DEVICES", "0")]
    assert [d.container_path for d in config.devices if d.container_path.startswith("/dev/nvidia")] == ["/dev/nvidia1"]
    assert list(config.mounts) == []
    assert [d.name for d in config.CDI_devices] == ["nvidia.com/gpu=1"]


def test_without_a_runtime_view_the_same_selections_are_removed(plugins: KubegpuPluginManager) -> None:
    """The editor alone (no runtime behind it, no API server): what `kubegpu crishim` does for every container."""
    editor = ContainerEditor(plugins, node=NODE, key=KEY)
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id="s",
        config=api_pb2.ContainerConfig(
            metadata=api_pb2.ContainerMetadata(name="main"),
            envs=[api_pb2.KeyValue(key="NVIDIA_VISIBLE_DEVICES", value="all")],
        ),
        sandbox_config=api_pb2.PodSandboxConfig(metadata=api_pb2.PodSandboxMetadata(name="p", uid="u")),
    )
    edited = api_pb2.CreateContainerRequest.FromString(editor.create_container(request.SerializeToString()))
    assert list(edited.config.envs) == []


class _SaysNothing:
    """A plugin whose ownership hook fails: it owns nothing, and every other plugin's entries still go."""

    @hookimpl
    def kubegpu_device_resources(self) -> list[str]:
        return ["example.com/mystery"]

    @hookimpl
    def kubegpu_device_owned(self) -> DeviceOwnership:
        raise RuntimeError("cannot tell")


def test_a_plugin_that_cannot_say_what_it_owns_is_logged_and_the_others_still_apply(
    make_plugin_manager: Callable[..., KubegpuPluginManager], caplog: pytest.LogCaptureFixture
) -> None:
    manager = make_plugin_manager("device", nvidia=nvidia_device, mystery=_SaysNothing())
    editor = ContainerEditor(manager, node=NODE, key=KEY)
    assert "plugin 'mystery' failed in kubegpu_device_owned: RuntimeError: cannot tell" in caplog.text
    assert editor.owned == nvidia_device.OWNED


# ---------------------------------------------------------------------------------------------------------------
# Finding 1: poison is a refusal, never UNKNOWN
# ---------------------------------------------------------------------------------------------------------------


def _non_ascii_signature() -> str:
    text = signed("uid-victim", {"main": {FPGA: ["fpga1"]}})
    return text.replace('"signature":"', '"signature":"\u00e9', 1)


POISON = [
    pytest.param(_non_ascii_signature, "signature", id="non-ascii-signature"),
    pytest.param(lambda: "[" * 3000 + "]" * 3000, "malformed", id="3000-deep-json"),
    pytest.param(
        lambda: (
            '{"version": 1, "node": "node-a", "podUID": "uid-victim", "containers": {}, "issued": ' + "9" * 5000 + "}"
        ),
        "malformed",
        id="5000-digit-integer",
    ),
]


@pytest.mark.parametrize(("poison", "check"), POISON)
def test_a_poison_allocation_is_refused_as_failed_precondition_and_nothing_is_created(
    node: Node, poison: Callable[[], str], check: str
) -> None:
    pod = node.kubelet.run_pod("victim", "uid-victim", {ALLOCATION_KEY: poison()})

    code, details = refusal(node.kubelet.refused(pod))

    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert details.startswith(f"kubegpu: {check} check failed: pod team-a/victim: ")
    assert ALLOCATION_KEY in details
    assert len(details) < 1000
    assert node.runtime.created == []
    # The worker that refused is still serving: the next pod starts.
    node.kubelet.create(node.kubelet.run_pod("next", "uid-next"))
    assert len(node.runtime.created) == 1


@pytest.mark.parametrize(("poison", "check"), POISON)
def test_a_poison_allocation_on_another_live_pod_holds_nothing(
    node: Node, poison: Callable[[], str], check: str
) -> None:
    node.kubelet.run_pod("victim", "uid-victim", {ALLOCATION_KEY: poison()})  # ready, never gets a container
    pod = node.kubelet.run_pod("good", "uid-good", {ALLOCATION_KEY: signed("uid-good", {"main": {FPGA: ["fpga1"]}})})

    node.kubelet.create(pod)

    assert [d.container_path for d in node.last().devices] == ["/dev/fpga1"]


class _Exits:
    @hookimpl
    def kubegpu_device_resources(self) -> list[str]:
        return [FPGA]

    @hookimpl
    def kubegpu_device_edit_container(self, allocation: ContainerAllocation, edit: ContainerEdit) -> bool:
        raise SystemExit(3)


class _Sloppy:
    @hookimpl
    def kubegpu_device_resources(self) -> list[str]:
        return [FPGA]

    @hookimpl
    def kubegpu_device_edit_container(self, allocation: ContainerAllocation, edit: ContainerEdit) -> bool:
        edit.envs["FPGA_COUNT"] = len(allocation.resources[FPGA])  # type: ignore[assignment]
        return True


@pytest.mark.parametrize(
    ("plugin", "words"),
    [
        pytest.param(_Exits(), "plugin 'bad' failed in kubegpu_device_edit_container: SystemExit: 3", id="exits"),
        pytest.param(
            _Sloppy(),
            "plugin 'bad' failed in kubegpu_device_edit_container: WrongAnswer: left an invalid container config: "
            "edit.envs.FPGA_COUNT: Input should be a valid string",
            id="non-string-env",
        ),
    ],
)
def test_a_plugin_that_fails_any_way_is_a_refusal_naming_the_plugin_and_hook(
    make_plugin_manager: Callable[..., KubegpuPluginManager], tmp_path: Path, plugin: object, words: str
) -> None:
    directory = Path(tempfile.mkdtemp(prefix="kubegpu-trust-"))
    running = Node(directory, make_plugin_manager("device", bad=plugin))
    try:
        pod = running.kubelet.run_pod("p", "uid-p", {ALLOCATION_KEY: signed("uid-p", {"main": {FPGA: ["fpga1"]}})})
        code, details = refusal(running.kubelet.refused(pod))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert details.startswith("kubegpu: plugin check failed: pod team-a/p container main: ")
        assert words in details
        assert running.runtime.created == []
    finally:
        running.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_a_request_the_shim_cannot_decode_is_refused(plugins: KubegpuPluginManager) -> None:
    editor = ContainerEditor(plugins, node=NODE, key=KEY)
    with pytest.raises(AllocationRefused) as refused:
        editor.create_container(b"\x0a\xff\xff\xff")
    assert refused.value.check == "request"


# ---------------------------------------------------------------------------------------------------------------
# Finding 7: the sandbox's own allocation, and no device on two live pods
# ---------------------------------------------------------------------------------------------------------------


def test_the_allocation_applied_is_the_one_the_sandbox_was_created_with(node: Node) -> None:
    current = signed("uid-p", {"main": {FPGA: ["fpga2"]}}, issued=T2)
    rolled_back = signed("uid-p", {"main": {FPGA: ["fpga1"]}}, issued=T1)
    sandbox_id, sandbox = node.kubelet.run_pod("p", "uid-p", {ALLOCATION_KEY: current})
    # The pod's owner put the rolled-back allocation back; the kubelet copies the pod's annotations as they are now.
    sandbox.annotations[ALLOCATION_KEY] = rolled_back

    node.kubelet.create((sandbox_id, sandbox))

    assert [d.container_path for d in node.last().devices] == ["/dev/fpga2"]


def test_an_allocation_added_after_the_sandbox_was_created_gives_nothing(node: Node) -> None:
    sandbox_id, sandbox = node.kubelet.run_pod("p", "uid-p")
    sandbox.annotations[ALLOCATION_KEY] = signed("uid-p", {"main": {FPGA: ["fpga1"]}})

    node.kubelet.create((sandbox_id, sandbox), envs={"FPGA_VISIBLE_DEVICES": "fpga1"})

    assert list(node.last().devices) == []
    assert envs(node.last()) == []


def test_a_pods_allocation_removed_after_it_started_still_gives_its_restarted_container_its_devices(
    node: Node,
) -> None:
    """An editor removes the pod's allocation after its sandbox was created; the kubelet copies the pod's annotations
    as they are now, so the container's restart found none and was created without its card. The allocation the
    runtime recorded for the sandbox is applied, checked as any (T208's rules): once the scheduler has given the card
    to a later pod that holds it live, the restart is refused, never given the card twice."""
    pod = node.kubelet.run_pod("p", "uid-p", {ALLOCATION_KEY: signed("uid-p", {"main": {FPGA: ["fpga1"]}}, issued=T1)})
    node.kubelet.create(pod)
    del pod[1].annotations[ALLOCATION_KEY]
    for container in node.runtime.containers.values():
        container.state = api_pb2.ContainerState.CONTAINER_EXITED  # it crashed; the kubelet restarts it

    node.kubelet.create(pod)

    assert [d.container_path for d in node.last().devices] == ["/dev/fpga1"]
    assert envs(node.last()) == [("FPGA_VISIBLE_DEVICES", "fpga1")]
    for container in node.runtime.containers.values():
        container.state = api_pb2.ContainerState.CONTAINER_EXITED
    later = node.kubelet.run_pod(
        "later", "uid-later", {ALLOCATION_KEY: signed("uid-later", {"main": {FPGA: ["fpga1"]}}, issued=T2)}
    )
    node.kubelet.create(later)
    assert "stale check failed" in refusal(node.kubelet.refused(pod))[1]
    assert [d.container_path for d in node.last().devices] == ["/dev/fpga1"]  # the later pod's, alone


def test_a_container_without_devices_costs_one_sandbox_lookup_not_a_listing_of_the_node(node: Node) -> None:
    """Every container of a pod without devices is looked up in the runtime (its sandbox may have recorded an
    allocation the pod's annotations lost since). That lookup asks for its own sandbox only: a listing of every
    sandbox on the node, decoded in Python, cost each such creation in proportion to the node's pods."""
    for i in range(20):
        node.kubelet.run_pod(f"busy-{i}", f"uid-busy-{i}")
    pod = node.kubelet.run_pod("plain", "uid-plain")
    node.runtime.listed.clear()

    node.kubelet.create(pod)
    node.kubelet.create(pod, "sidecar")

    assert node.runtime.listed == [pod[0], pod[0]]
    assert list(node.last().devices) == [] and node.last().metadata.name == "sidecar"


def test_a_runtime_that_reports_no_annotations_leaves_the_kubelets_copy(node: Node) -> None:
    node.runtime.report_annotations = False
    pod = node.kubelet.run_pod("p", "uid-p", {ALLOCATION_KEY: signed("uid-p", {"main": {FPGA: ["fpga1"]}})})

    node.kubelet.create(pod)

    assert [d.container_path for d in node.last().devices] == ["/dev/fpga1"]


def test_a_stale_allocation_is_refused_while_the_pod_the_scheduler_gave_the_device_to_lives(node: Node) -> None:
    # The scheduler gave fpga1 to `victim` (T1), rolled it back after a failed bind, and gave it to `holder` (T2).
    holder = node.kubelet.run_pod(
        "holder", "uid-holder", {ALLOCATION_KEY: signed("uid-holder", {"main": {FPGA: ["fpga1"]}}, issued=T2)}
    )
    # Not even created yet: the later allocation wins all the same.
    victim = node.kubelet.run_pod(
        "victim", "uid-victim", {ALLOCATION_KEY: signed("uid-victim", {"main": {FPGA: ["fpga1"]}}, issued=T1)}
    )

    code, details = refusal(node.kubelet.refused(victim))

    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert details == (
        "kubegpu: stale check failed: pod team-a/victim container main: the allocation issued at "
        "1763820000000000000 (2025-11-22T14:00:00.000Z) is older than pod team-a/holder's allocation of the same "
        "device (example.com/fpga fpga1) issued at 1763820005000000000 (2025-11-22T14:00:05.000Z); the scheduler has "
        "since given it to pod team-a/holder. This allocation was rolled back or replayed: delete the pod so that the "
        "scheduler places it again; if it was force-deleted (gone from the API server), its sandbox sandbox-2 lingers "
        "on this node until the kubelet stops it: `crictl stopp sandbox-2` stops it now"
    )
    assert node.runtime.created == []
    node.kubelet.create(holder)
    assert [d.container_path for d in node.last().devices] == ["/dev/fpga1"]


def test_a_device_a_live_container_has_is_never_given_to_another_pod(node: Node) -> None:
    stale = node.kubelet.run_pod(
        "stale", "uid-stale", {ALLOCATION_KEY: signed("uid-stale", {"main": {FPGA: ["fpga1"]}}, issued=T1)}
    )
    node.kubelet.create(stale)  # nobody else claimed fpga1 yet: it is applied
    later = node.kubelet.run_pod(
        "later", "uid-later", {ALLOCATION_KEY: signed("uid-later", {"main": {FPGA: ["fpga1", "fpga2"]}}, issued=T2)}
    )

    code, details = refusal(node.kubelet.refused(later))

    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert details == (
        "kubegpu: in-use check failed: pod team-a/later container main: example.com/fpga fpga1 is in use by "
        "container main of pod team-a/stale (its allocation issued at 1763820000000000000 "
        "(2025-11-22T14:00:00.000Z), this one at 1763820005000000000 (2025-11-22T14:00:05.000Z)); pod "
        "team-a/stale's allocation is older (stale), but a device is never given to two live pods: this container "
        "can be created once pod team-a/stale has ended; if it was force-deleted (gone from the API server), its "
        "sandbox sandbox-1 lingers on this node until the kubelet stops it: `crictl stopp sandbox-1` stops it now"
    )
    assert len(node.runtime.created) == 1
    # The stale pod ends: its sandbox is stopped, and the device is free for the pod the scheduler gave it to.
    node.kubelet.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=stale[0]), timeout=5)
    node.kubelet.create(later)
    assert [d.container_path for d in node.last().devices] == ["/dev/fpga1", "/dev/fpga2"]


def test_a_device_a_live_init_container_has_is_never_given_to_another_pod(node: Node) -> None:
    """An init container is given fpga1 and fpga2 (fpga1 the app's, handed on after it, as the kubelet does): while
    it lives, a later allocation of fpga1 to another pod is refused, naming the init container."""
    stale = node.kubelet.run_pod(
        "stale",
        "uid-stale",
        {ALLOCATION_KEY: signed(
            "uid-stale", {"main": {FPGA: ["fpga1"]}, "check": {FPGA: ["fpga2"]}},
            init={"check": {FPGA: ["fpga1", "fpga2"]}}, issued=T1,
        )},
    )  # fmt: skip
    node.kubelet.create(stale, "check")
    assert [d.container_path for d in node.last().devices] == ["/dev/fpga1", "/dev/fpga2"]
    later = node.kubelet.run_pod(
        "later", "uid-later", {ALLOCATION_KEY: signed("uid-later", {"main": {FPGA: ["fpga1"]}}, issued=T2)}
    )

    code, details = refusal(node.kubelet.refused(later))

    assert (code, details.split(":")[1]) == (grpc.StatusCode.FAILED_PRECONDITION, " in-use check failed")
    assert "fpga1 is in use by container check of pod team-a/stale" in details


def test_a_shim_restart_still_sees_which_live_containers_have_a_device(node: Node) -> None:
    stale = node.kubelet.run_pod(
        "stale", "uid-stale", {ALLOCATION_KEY: signed("uid-stale", {"main": {FPGA: ["fpga1"]}}, issued=T1)}
    )
    node.kubelet.create(stale)
    node.restart_shim()  # the new process has applied nothing yet: it asks the runtime for live containers
    node.kubelet.channel.close()
    node.kubelet = Kubelet(node.shim.socket)
    later = node.kubelet.run_pod(
        "later", "uid-later", {ALLOCATION_KEY: signed("uid-later", {"main": {FPGA: ["fpga1"]}}, issued=T2)}
    )

    code, details = refusal(node.kubelet.refused(later))

    assert (code, details.split(":")[1]) == (grpc.StatusCode.FAILED_PRECONDITION, " in-use check failed")


def test_a_stale_pods_exited_container_no_longer_keeps_the_device_from_the_pod_it_was_given_to(node: Node) -> None:
    """A stale pod's container got fpga1 before the pod the scheduler gave it to came; it exits, and its restarts are
    refused as stale: the device is free for the later pod at once, not only after the stale pod is deleted (before:
    `in-use ... by container main of pod team-a/stale` for as long as the stale pod existed, unless the shim was
    restarted meanwhile)."""
    stale = node.kubelet.run_pod(
        "stale", "uid-stale", {ALLOCATION_KEY: signed("uid-stale", {"main": {FPGA: ["fpga1"]}}, issued=T1)}
    )
    node.kubelet.create(stale)
    later = node.kubelet.run_pod(
        "later", "uid-later", {ALLOCATION_KEY: signed("uid-later", {"main": {FPGA: ["fpga1"]}}, issued=T2)}
    )
    assert "in-use check failed" in refusal(node.kubelet.refused(later))[1]

    for container in node.runtime.containers.values():
        container.state = api_pb2.ContainerState.CONTAINER_EXITED  # its process ended; the sandbox stays ready
    assert "stale check failed" in refusal(node.kubelet.refused(stale))[1]  # the kubelet restarting it

    node.kubelet.create(later)
    assert [d.container_path for d in node.last().devices] == ["/dev/fpga1"]


def test_a_pod_recreated_under_its_name_waits_for_the_old_ones_containers_to_stop(node: Node) -> None:
    """The pod is deleted and created again under its name (a new UID, a new allocation of the same card) while the
    old one's container is still stopping: the new one waits (`in-use`, the kubelet retries), then gets the card."""
    old = node.kubelet.run_pod("p", "uid-old", {ALLOCATION_KEY: signed("uid-old", {"main": {FPGA: ["fpga1"]}})})
    node.kubelet.create(old)
    new = node.kubelet.run_pod(
        "p", "uid-new", {ALLOCATION_KEY: signed("uid-new", {"main": {FPGA: ["fpga1"]}}, issued=T2)}
    )

    code, details = refusal(node.kubelet.refused(new))

    assert (code, details.split(":")[1]) == (grpc.StatusCode.FAILED_PRECONDITION, " in-use check failed")
    assert "fpga1 is in use by container main of pod team-a/p (uid uid-old)" in details
    node.kubelet.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=old[0]), timeout=5)
    node.kubelet.create(new)
    assert [d.container_path for d in node.last().devices] == ["/dev/fpga1"]


def test_refusals_between_two_pods_of_one_name_tell_them_apart_and_never_advise_deleting_the_new_one(
    node: Node,
) -> None:
    """The pod was force-deleted (gone from the API server at once) and created again under its name; the scheduler
    gave the new one the same card. The old one's sandbox lingers on the node. Both refusals name each pod by a short
    UID, and the old one's restart is not told to "delete the pod" (that name is the new pod's now): it is told to stop
    the lingering sandbox (before: "pod team-a/p ... pod team-a/p", and "delete the pod so that the scheduler places it
    again")."""
    old_uid, new_uid = "3f2c1a9e-0b7d-4c55-9e1a-aa01", "8d41e0c2-6f3a-4b19-8c7e-bb02"
    old = node.kubelet.run_pod("p", old_uid, {ALLOCATION_KEY: signed(old_uid, {"main": {FPGA: ["fpga1"]}})})
    node.kubelet.create(old)
    new = node.kubelet.run_pod("p", new_uid, {ALLOCATION_KEY: signed(new_uid, {"main": {FPGA: ["fpga1"]}}, issued=T2)})

    waiting = refusal(node.kubelet.refused(new))[1]
    for container in node.runtime.containers.values():
        container.state = api_pb2.ContainerState.CONTAINER_EXITED  # the old one's process ended; its sandbox lingers
    restarting = refusal(node.kubelet.refused(old))[1]

    assert waiting == (
        "kubegpu: in-use check failed: pod team-a/p (uid 8d41e0c2) container main: example.com/fpga fpga1 is in use by "
        "container main of pod team-a/p (uid 3f2c1a9e) (its allocation issued at 1763820000000000000 "
        "(2025-11-22T14:00:00.000Z), this one at 1763820005000000000 (2025-11-22T14:00:05.000Z)); pod team-a/p (uid "
        "3f2c1a9e)'s allocation is older (stale), but a device is never given to two live pods: this container can be "
        "created once pod team-a/p (uid 3f2c1a9e), the earlier pod of that name, has ended; if it was force-deleted "
        "(gone from the API server), its sandbox sandbox-1 lingers on this node until the kubelet stops it: `crictl "
        "stopp sandbox-1` stops it now"
    )
    assert restarting == (
        "kubegpu: stale check failed: pod team-a/p (uid 3f2c1a9e) container main: the allocation issued at "
        "1763820000000000000 (2025-11-22T14:00:00.000Z) is older than pod team-a/p (uid 8d41e0c2)'s allocation of the "
        "same device (example.com/fpga fpga1) issued at 1763820005000000000 (2025-11-22T14:00:05.000Z); the scheduler "
        "has since given it to pod team-a/p (uid 8d41e0c2). This pod was deleted and team-a/p created again: do not "
        "delete team-a/p, that name is now pod team-a/p (uid 8d41e0c2)'s; this pod's sandbox sandbox-1 lingers on this "
        "node until the kubelet stops it: `crictl stopp sandbox-1` stops it now"
    )
    node.kubelet.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=old[0]), timeout=5)
    node.kubelet.create(new)
    assert [d.container_path for d in node.last().devices] == ["/dev/fpga1"]


@pytest.mark.parametrize(
    ("old", "new", "shown"),
    [
        ("3f2c1a9e-0b7d", "8d41e0c2-6f3a", ("3f2c1a9e", "8d41e0c2")),
        ("3f2c1a9e-0b7d", "3f2c1a9e-6f3a", ("3f2c1a9e-0b7d", "3f2c1a9e-6f3a")),
    ],
    ids=["first-characters-differ", "longer-where-they-do-not"],
)
def test_two_pods_of_one_name_are_told_apart_by_as_much_uid_as_it_takes(
    old: str, new: str, shown: tuple[str, str]
) -> None:
    assert _names("team-a/p", old, "team-a/p", new) == tuple(f"pod team-a/p (uid {uid})" for uid in shown)
    assert _names("team-a/p", old, "team-a/q", new) == ("pod team-a/p", "pod team-a/q")


def test_a_creation_the_runtime_refused_holds_no_device(node: Node) -> None:
    """The runtime refused to create a stale pod's container (its mount source is missing): nothing has fpga1, and
    the pod the scheduler gave it to gets it (before: `in-use`, naming a container that never existed)."""
    stale = node.kubelet.run_pod(
        "stale", "uid-stale", {ALLOCATION_KEY: signed("uid-stale", {"main": {FPGA: ["fpga1"]}}, issued=T1)}
    )
    node.runtime.refuse = "failed to create containerd container: mount source does not exist"
    assert refusal(node.kubelet.refused(stale))[0] == grpc.StatusCode.INVALID_ARGUMENT
    later = node.kubelet.run_pod(
        "later", "uid-later", {ALLOCATION_KEY: signed("uid-later", {"main": {FPGA: ["fpga1"]}}, issued=T2)}
    )

    node.kubelet.create(later)

    assert [d.container_path for d in node.last().devices] == ["/dev/fpga1"]
    assert len(node.runtime.created) == 1


def test_a_creation_in_flight_or_whose_answer_was_lost_holds_its_devices(plugins: KubegpuPluginManager) -> None:
    """Between the check and the runtime's answer the runtime does not list the container yet, and after a lost
    answer (the caller's deadline) it may still create it: either way the device is not given to another pod."""
    node = FakeSandboxes()
    editor = ContainerEditor(plugins, node=NODE, key=KEY, sandboxes=node)
    first = Sandbox("s1", "team-a", "first", "uid-first", True, signed("uid-first", {"main": {FPGA: ["fpga1"]}}), True)
    second = Sandbox(
        "s2", "team-a", "second", "uid-second", True, signed("uid-second", {"main": {FPGA: ["fpga1"]}}), True
    )
    node.listed = {"s1": first, "s2": second}

    creation = editor.prepare(_request(first, "main"))
    assert creation.holds
    assert _decide(editor, _request(second, "main")) == "in-use"  # in flight
    editor.answered(creation, created=None)
    assert _decide(editor, _request(second, "main")) == "in-use"  # lost: the runtime may still create it
    # The kubelet retries; the runtime refuses the retry (the name is reserved by the lost one): that settles only
    # the retry, and the lost creation still holds the device.
    editor.answered(editor.prepare(_request(first, "main")), created=False)
    assert _decide(editor, _request(second, "main")) == "in-use"
    # The first pod's sandbox goes: nothing holds the device any more.
    del node.listed["s1"]
    assert _decide(editor, _request(second, "main")) == "fpga1"


class RawRuntime:
    """`RuntimeVersions.call` answering bytes as a runtime wrote them: a Go runtime does not check that a text is
    UTF-8 (containerd 1.6 keeps a pod's annotation values as the kubelet sent them)."""

    def __init__(self, answers: Mapping[str, bytes]) -> None:
        self.answers = answers

    def call(self, served: str, service: str, method: str, request: bytes, **_: Any) -> tuple[bytes, None]:
        return self.answers[method], None


def _not_utf8(message: Any, marker: str) -> bytes:
    """`message`'s bytes with the text `marker` in it made into bytes that are not UTF-8, of the same length."""
    body: bytes = message.SerializeToString()
    assert body.count(marker.encode()) == 1
    return body.replace(marker.encode(), b"\xff" * len(marker.encode()))


def test_a_sandbox_whose_annotation_is_not_utf8_costs_only_itself(plugins: KubegpuPluginManager) -> None:
    """A pod's annotation value that is not UTF-8 (the API server stores what a protobuf client sends, the kubelet
    passes it on) made the runtime's whole list of sandboxes unreadable: every device pod on the node was refused
    (`error check failed: DecodeError`). Now the list is read with U+FFFD for those bytes: the poisoned pod still
    holds the device its valid allocation names, and every other pod gets its devices."""
    poisoned = api_pb2.PodSandbox(
        id="s-poisoned",
        metadata=api_pb2.PodSandboxMetadata(name="poisoned", namespace="team-a", uid="uid-poisoned"),
        state=api_pb2.PodSandboxState.SANDBOX_READY,
        annotations={
            ALLOCATION_KEY: signed("uid-poisoned", {"main": {FPGA: ["fpga1"]}}, issued=T1),
            "note": "POISON",
        },
    )
    pods = {
        name: api_pb2.PodSandbox(
            id=f"s-{name}",
            metadata=api_pb2.PodSandboxMetadata(name=name, namespace="team-a", uid=f"uid-{name}"),
            state=api_pb2.PodSandboxState.SANDBOX_READY,
            annotations={ALLOCATION_KEY: signed(f"uid-{name}", {"main": {FPGA: [card]}}, issued=T2)},
        )
        for name, card in (("later", "fpga1"), ("other", "fpga2"))
    }
    listed = api_pb2.ListPodSandboxResponse(items=[poisoned, *pods.values()])
    containers = api_pb2.ListContainersResponse(
        containers=[
            api_pb2.Container(
                id="c-poisoned",
                pod_sandbox_id="s-poisoned",
                metadata=api_pb2.ContainerMetadata(name="main"),
                state=api_pb2.ContainerState.CONTAINER_RUNNING,
                labels={"note": "POISON"},
            )
        ]
    )
    runtime = RawRuntime(
        {"ListPodSandbox": _not_utf8(listed, "POISON"), "ListContainers": _not_utf8(containers, "POISON")}
    )
    editor = ContainerEditor(plugins, node=NODE, key=KEY, sandboxes=RuntimeSandboxes(runtime))  # type: ignore[arg-type]

    def sandbox(item: Any) -> Sandbox:
        return Sandbox(
            item.id, "team-a", item.metadata.name, item.metadata.uid, True, item.annotations[ALLOCATION_KEY], True
        )

    assert _decide(editor, _request(sandbox(pods["other"]), "main")) == "fpga2"
    assert _decide(editor, _request(sandbox(pods["later"]), "main")) == "in-use"
    held = {s.id: s for s in editor.sandboxes.sandboxes()}["s-poisoned"]  # type: ignore[union-attr]
    assert held.allocation == poisoned.annotations[ALLOCATION_KEY]


def test_other_containers_of_the_same_pod_and_the_pods_next_sandbox_share_its_devices(node: Node) -> None:
    allocation = {ALLOCATION_KEY: signed("uid-p", {"init": {FPGA: ["fpga1"]}, "main": {FPGA: ["fpga1"]}})}
    first = node.kubelet.run_pod("p", "uid-p", allocation)
    node.kubelet.create(first, "init")
    node.kubelet.create(first, "main")
    # The kubelet replaces the sandbox (a new attempt) while the old one is still listed as ready.
    node.kubelet.create(node.kubelet.run_pod("p", "uid-p", allocation), "main")
    assert len(node.runtime.created) == 3


def test_shared_intel_cards_are_not_exclusive(node: Node) -> None:
    for name in ("encode-1", "encode-2"):
        uid = f"uid-{name}"
        allocation = signed(uid, {"main": {I915: ["card0"]}}, shares={"main": {I915: {"card0": 1}}})
        node.kubelet.create(node.kubelet.run_pod(name, uid, {ALLOCATION_KEY: allocation}))
    assert len(node.runtime.created) == 2


def test_an_unverifiable_claim_on_another_pod_holds_nothing(node: Node) -> None:
    copied = signed("uid-holder", {"main": {FPGA: ["fpga1"]}}, issued=T2)  # issued to another pod: copied
    node.kubelet.run_pod("squatter", "uid-squatter", {ALLOCATION_KEY: copied})  # ready; its containers are refused
    pod = node.kubelet.run_pod("p", "uid-p", {ALLOCATION_KEY: signed("uid-p", {"main": {FPGA: ["fpga1"]}})})

    node.kubelet.create(pod)

    assert [d.container_path for d in node.last().devices] == ["/dev/fpga1"]


class _Hangs:
    """A plugin whose edit waits on something that never answers (a wedged device's sysfs file, a hung NVML call)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    @hookimpl
    def kubegpu_device_resources(self) -> list[str]:
        return [FPGA]

    @hookimpl
    def kubegpu_device_edit_container(self, allocation: ContainerAllocation, edit: ContainerEdit) -> bool:
        self.entered.set()
        self.release.wait(60)
        return True


def test_a_plugin_edit_that_hangs_costs_the_shim_one_worker_not_the_node(
    make_plugin_manager: Callable[..., KubegpuPluginManager],
) -> None:
    """A plugin's edit hangs while it holds the node's device check: the creations waiting for that check used to
    wait past their callers' deadlines, each holding one of the shim's workers, so once the kubelet had retried as
    many times as there are workers the shim answered nothing else (ListPodSandbox, Status: the node goes NotReady).
    A creation that cannot have the check before its deadline is answered UNAVAILABLE (the kubelet retries) and
    gives its worker back."""
    hangs = _Hangs()
    directory = Path(tempfile.mkdtemp(prefix="kubegpu-trust-"))
    running = Node(directory, make_plugin_manager("device", bad=hangs))  # the shim has 8 workers

    def hold_the_check() -> None:
        """A creation whose edit hangs, holding the node's device check; it ends either way (its deadline, or the
        edit let go), and how is not what this test is about."""
        pod = running.kubelet.run_pod("s", "uid-s", {ALLOCATION_KEY: signed("uid-s", {"main": {FPGA: ["fpga0"]}})})
        with contextlib.suppress(grpc.RpcError):
            running.kubelet.create(pod)

    stuck = threading.Thread(target=hold_the_check, daemon=True)
    try:
        stuck.start()
        assert hangs.entered.wait(5)
        answers = []
        for i in range(9):  # the kubelet's retries of other device pods, one more than the shim has workers
            sandbox_id, config = running.kubelet.run_pod(f"p{i}", f"uid-p{i}", {
                ALLOCATION_KEY: signed(f"uid-p{i}", {"main": {FPGA: [f"fpga{1 + i % 3}"]}})})  # fmt: skip
            request = api_pb2.CreateContainerRequest(
                pod_sandbox_id=sandbox_id,
                config=api_pb2.ContainerConfig(metadata=api_pb2.ContainerMetadata(name="main")),
                sandbox_config=config,
            )
            with pytest.raises(grpc.RpcError) as failed:
                running.kubelet.runtime.CreateContainer(request, timeout=0.6)  # the kubelet's is 2 minutes
            answers.append(refusal(failed.value))
        listed = running.kubelet.runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=3)
        assert len(listed.items) == 10
        # Answered just before the deadline (on a busy machine the deadline may come first: the worker is freed
        # either way, which the calls above, each through a worker, show).
        assert {code for code, _ in answers} <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
        assert any(
            code == grpc.StatusCode.UNAVAILABLE and "held the node's device check for longer" in details
            for code, details in answers
        ), answers
    finally:
        hangs.release.set()
        stuck.join(10)
        running.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_concurrent_creations_never_hand_one_device_to_two_pods(node: Node) -> None:
    pods = [
        node.kubelet.run_pod(
            f"p{i}", f"uid-p{i}", {ALLOCATION_KEY: signed(f"uid-p{i}", {"main": {FPGA: ["fpga1"]}}, issued=T1)}
        )
        for i in range(8)
    ]
    start = threading.Barrier(len(pods))

    def create(pod: tuple[str, Any]) -> bool:
        start.wait()
        try:
            node.kubelet.create(pod)
            return True
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
            return False

    with futures.ThreadPoolExecutor(len(pods)) as pool:
        results = list(pool.map(create, pods))

    assert results.count(True) == 1
    assert len(node.runtime.created) == 1


# ---------------------------------------------------------------------------------------------------------------
# The shim's memory (verified allocations per sandbox, devices it applied) against a fresh shim as the oracle
# ---------------------------------------------------------------------------------------------------------------


class FakeSandboxes:
    """A `SandboxSource` kept in memory, so that two editors can be asked about the same node state."""

    def __init__(self) -> None:
        self.listed: dict[str, Sandbox] = {}
        self.live: dict[str, list[str]] = {}
        self.listings = 0  # sandboxes(): every sandbox on the node
        self.lookups = 0  # sandbox(id): one

    def sandboxes(self) -> list[Sandbox]:
        self.listings += 1
        return list(self.listed.values())

    def sandbox(self, sandbox_id: str) -> Sandbox | None:
        self.lookups += 1
        return self.listed.get(sandbox_id)

    def live_containers(self, sandbox_id: str) -> list[str]:
        return list(self.live.get(sandbox_id, []))


def _request(sandbox: Sandbox, container: str) -> bytes:
    return api_pb2.CreateContainerRequest(
        pod_sandbox_id=sandbox.id,
        config=api_pb2.ContainerConfig(metadata=api_pb2.ContainerMetadata(name=container)),
        sandbox_config=api_pb2.PodSandboxConfig(
            metadata=api_pb2.PodSandboxMetadata(name=sandbox.name, namespace=sandbox.namespace, uid=sandbox.uid),
            annotations={ALLOCATION_KEY: sandbox.allocation} if sandbox.allocation else {},
        ),
    ).SerializeToString()


def _decide(editor: ContainerEditor, body: bytes) -> str:
    """The devices the container gets (the plugin's env), or the check that refused it; the runtime creates it."""
    try:
        creation = editor.prepare(body)
    except AllocationRefused as refused:
        return refused.check
    editor.answered(creation, created=True)
    return api_pb2.CreateContainerRequest.FromString(creation.body).config.envs[0].value


@pytest.mark.parametrize("seed", range(6))
def test_a_long_lived_shim_decides_as_a_fresh_one_would(plugins: KubegpuPluginManager, seed: int) -> None:
    chance = random.Random(seed)
    node = FakeSandboxes()
    remembering = ContainerEditor(plugins, node=NODE, key=KEY, sandboxes=node)
    names = itertools.count()
    for step in range(60):
        action = chance.random()
        if action < 0.35 or not node.listed:
            uid = f"uid-{next(names)}"
            cards = sorted(chance.sample(["fpga0", "fpga1", "fpga2", "fpga3"], chance.randint(1, 2)))
            kind = chance.random()
            text = (
                signed(uid, {"main": {FPGA: cards}}, issued=T1 + chance.randint(0, 20))
                if kind < 0.8
                else "[" * 3000 + "]" * 3000
                if kind < 0.9
                else signed("uid-elsewhere", {"main": {FPGA: cards}})
            )
            sandbox = Sandbox(f"s{step}", "team-a", uid, uid, True, text, True)
            node.listed[sandbox.id] = sandbox
        elif action < 0.42:
            # A container's process ends (its pod's sandbox stays): it holds nothing, unless restarted.
            running = [sandbox_id for sandbox_id, names in node.live.items() if names]
            if running:
                node.live[chance.choice(running)].pop()
        elif action < 0.5:
            gone = chance.choice(list(node.listed))
            if chance.random() < 0.5:
                node.listed[gone] = node.listed[gone]._replace(ready=False)
            else:
                del node.listed[gone]
            node.live.pop(gone, None)
        else:
            sandbox = chance.choice(list(node.listed.values()))
            body = _request(sandbox, "main")
            oracle = ContainerEditor(plugins, node=NODE, key=KEY, sandboxes=node)
            expected = _decide(oracle, body)
            assert _decide(remembering, body) == expected, f"step {step}: {sandbox}"
            if expected.startswith("fpga") and sandbox.ready:
                node.live.setdefault(sandbox.id, []).append("main")
