"""The CRI shim without containerd: the checks on an allocation, the edit of a container config, and the proxy.

What a cluster operator would notice: a pod with an allocation that was tampered with, copied from another pod or
made for another node never gets devices, and the refusal says which check failed; a pod without kubegpu devices
reaches the runtime byte for byte; the devices, env and mounts the plugin decides are what the runtime receives,
with everything else the kubelet sent left as it was. The proxy tests put a fake runtime behind the shim to see what
only a fake can show: the deadline, metadata, status details and a stream arriving on the other side, and the
shim picking the runtime up when it comes back, and both CRI versions served in front of a runtime that speaks only
one of them.
"""

from __future__ import annotations

import importlib
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2, api_pb2_grpc
from cri_api.v1alpha2 import api_pb2 as alpha_pb2
from cri_api.v1alpha2 import api_pb2_grpc as alpha_pb2_grpc

from kubegpu.core.annotations import (
    ALLOCATION_KEY,
    AllocationRecord,
    encode_allocation,
    merge_allocations,
    sign_allocation,
)
from kubegpu.core.device_hooks import hookimpl
from kubegpu.core.manifests import pod_request
from kubegpu.core.models import ContainerAllocation, ContainerEdit, PluginAllocation
from kubegpu.core.plugin_manager import KubegpuPluginManager
from kubegpu.core.plugin_manager import make_plugin_manager as build_plugin_manager
from kubegpu.core.testing import make_node, pod_manifest
from kubegpu.crishim.shim import CDI_ANNOTATION, ContainerEditor, RunningShim, apply_edit, edit_from_config, start_shim
from kubegpu.crishim.verify import AllocationRefused, PodIdentity, managed_resources, verified_allocation
from kubegpu.plugins.nvidia import device as nvidia_device
from kubegpu.plugins.nvidia import scheduler as nvidia_scheduler
from kubegpu.scheduler.engine import Engine

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fpga"
FPGA = "example.com/fpga"
KEY = b"node-and-scheduler-share-this"
NODE = "fpga-node-0"
POD = PodIdentity("team-a", "trainer", "uid-trainer")


@pytest.fixture(scope="module")
def fpga_device() -> ModuleType:
    """The example plugin's node side, imported from the source tree."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLE))
        return importlib.import_module("kubegpu_fpga.device")


@pytest.fixture
def plugins(fpga_device: ModuleType, make_plugin_manager: Callable[..., KubegpuPluginManager]) -> KubegpuPluginManager:
    return make_plugin_manager("device", fpga=fpga_device)


def allocation(
    cards: Mapping[str, list[str]] | None = None,
    *,
    node: str = NODE,
    uid: str = POD.uid,
    key: bytes | None = KEY,
    fields: Mapping[str, Any] | None = None,
) -> AllocationRecord:
    containers = {c: {FPGA: ids} for c, ids in (cards or {"main": ["fpga1", "fpga2"]}).items()}
    record = merge_allocations(
        node, uid, [PluginAllocation(plugin="fpga", containers=containers, fields=dict(fields or {}))]
    )
    return sign_allocation(record, key) if key is not None else record


def request(
    annotations: Mapping[str, str] | None = None,
    *,
    container: str = "main",
    pod: PodIdentity = POD,
    devices: list[tuple[str, str]] | None = None,
    envs: Mapping[str, str] | None = None,
) -> api_pb2.CreateContainerRequest:
    """A CreateContainer request as the kubelet sends it, sandbox config included."""
    sandbox = api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name=pod.name, namespace=pod.namespace, uid=pod.uid),
        annotations=dict(annotations or {}),
    )
    config = api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name=container),
        image=api_pb2.ImageSpec(image="busybox"),
        envs=[api_pb2.KeyValue(key=k, value=v) for k, v in (envs or {"PATH": "/bin", "HOME": "/root"}).items()],
        devices=[api_pb2.Device(host_path=h, container_path=c, permissions="rw") for h, c in (devices or [])],
        mounts=[
            api_pb2.Mount(
                host_path="/var/lib/kubelet/pods/x/volumes/data",
                container_path="/data",
                propagation=api_pb2.MountPropagation.PROPAGATION_HOST_TO_CONTAINER,
                selinux_relabel=True,
            )
        ],
        annotations={"io.kubernetes.container.hash": "abc"},
    )
    return api_pb2.CreateContainerRequest(pod_sandbox_id="sandbox-1", config=config, sandbox_config=sandbox)


def annotated(record: AllocationRecord) -> dict[str, str]:
    return {ALLOCATION_KEY: encode_allocation(record)}


# ---------------------------------------------------------------------------------------------------------------
# The checks on an allocation
# ---------------------------------------------------------------------------------------------------------------


def test_a_signed_allocation_for_this_node_and_pod_verifies() -> None:
    record = verified_allocation(encode_allocation(allocation()), key=KEY, node=NODE, pod=POD)
    assert record.device_ids("main", FPGA) == ["fpga1", "fpga2"]


def _tampered() -> str:
    signed = allocation()
    changed = signed.model_copy(update={"containers": {"main": {FPGA: ["fpga0", "fpga1", "fpga2", "fpga3"]}}})
    return encode_allocation(changed)


@pytest.mark.parametrize(
    ("text", "check", "words"),
    [
        pytest.param(lambda: encode_allocation(allocation(key=None)), "unsigned", "is not signed", id="unsigned"),
        pytest.param(_tampered, "signature", "changed after the scheduler signed it", id="devices-tampered"),
        pytest.param(
            lambda: encode_allocation(allocation(key=b"another-cluster")), "signature", "different key", id="other-key"
        ),
        pytest.param(
            lambda: encode_allocation(allocation(node="fpga-node-9")), "node", "names node 'fpga-node-9'", id="node"
        ),
        pytest.param(
            lambda: encode_allocation(allocation(uid="uid-other")), "pod", "copied from another pod", id="pod"
        ),
        pytest.param(lambda: '{"version": 1, "node": "x"}', "malformed", "podUID", id="malformed"),
    ],
)
def test_each_failed_check_is_named(text: Callable[[], str], check: str, words: str) -> None:
    with pytest.raises(AllocationRefused) as refused:
        verified_allocation(text(), key=KEY, node=NODE, pod=POD)
    assert refused.value.check == check
    assert words in str(refused.value)
    assert POD.key in str(refused.value)


def _owner(resource: str) -> str | None:
    return "fpga" if resource == FPGA else None


def test_managed_resources_reads_the_containers_limits_and_requests() -> None:
    pod = pod_manifest("p", {"main": {FPGA: 2, "cpu": 1}, "sidecar": {"cpu": 1}, "idle": {FPGA: 0}})
    pod["spec"]["initContainers"] = [{"name": "warmup", "resources": {"requests": {FPGA: "1"}}}]
    assert managed_resources(pod, "main", _owner) == [FPGA]
    assert managed_resources(pod, "warmup", _owner) == [FPGA]
    assert managed_resources(pod, "sidecar", _owner) == []
    assert managed_resources(pod, "idle", _owner) == []
    assert managed_resources(pod, "unknown", _owner) == []


# ---------------------------------------------------------------------------------------------------------------
# The edit of a container config
# ---------------------------------------------------------------------------------------------------------------


def edited(editor: ContainerEditor, original: api_pb2.CreateContainerRequest) -> api_pb2.CreateContainerRequest:
    body = original.SerializeToString()
    return api_pb2.CreateContainerRequest.FromString(editor.create_container(body))


def test_allocated_cards_replace_the_ones_a_device_plugin_put_there(plugins: KubegpuPluginManager) -> None:
    editor = ContainerEditor(plugins, node=NODE, key=KEY, dev_root=Path("/host/dev"))
    original = request(
        annotated(allocation(fields={"bitstream": "resnet50"})),
        devices=[("/dev/fpga0", "/dev/fpga0"), ("/dev/fuse", "/dev/fuse")],
    )
    config = edited(editor, original).config
    assert [(d.host_path, d.container_path) for d in config.devices] == [
        ("/dev/fuse", "/dev/fuse"),
        ("/host/dev/fpga1", "/dev/fpga1"),
        ("/host/dev/fpga2", "/dev/fpga2"),
    ]
    assert config.devices[0].permissions == "rw"  # the entry the plugin kept is the kubelet's, untouched
    envs = [(kv.key, kv.value) for kv in config.envs]
    assert envs == [
        ("PATH", "/bin"),
        ("HOME", "/root"),
        ("FPGA_VISIBLE_DEVICES", "fpga1,fpga2"),
        ("FPGA_BITSTREAM", "resnet50"),
    ]
    assert [d.name for d in config.CDI_devices] == ["example.com/fpga=fpga1", "example.com/fpga=fpga2"]
    # Fields no plugin models survive: the mount's propagation and relabelling, the image, the annotations.
    assert config.mounts[0].propagation == api_pb2.MountPropagation.PROPAGATION_HOST_TO_CONTAINER
    assert config.mounts[0].selinux_relabel
    assert config.image.image == "busybox"
    assert dict(config.annotations) == {"io.kubernetes.container.hash": "abc"}


def test_a_pod_without_an_allocation_passes_byte_for_byte(plugins: KubegpuPluginManager) -> None:
    editor = ContainerEditor(plugins, node=NODE, key=KEY)
    body = request(devices=[("/dev/fuse", "/dev/fuse")]).SerializeToString()
    assert editor.create_container(body) is body


def test_a_pod_without_an_allocation_loses_the_cards_a_device_plugin_gave_it(plugins: KubegpuPluginManager) -> None:
    editor = ContainerEditor(plugins, node=NODE, key=KEY)
    original = request(
        devices=[("/dev/fpga0", "/dev/fpga0"), ("/dev/fuse", "/dev/fuse")],
        envs={"PATH": "/bin", "FPGA_VISIBLE_DEVICES": "fpga0,fpga1,fpga2,fpga3"},
    )
    config = edited(editor, original).config
    assert [d.container_path for d in config.devices] == ["/dev/fuse"]
    assert [(kv.key, kv.value) for kv in config.envs] == [("PATH", "/bin")]


def test_a_container_without_devices_in_the_allocation_passes_unchanged(plugins: KubegpuPluginManager) -> None:
    editor = ContainerEditor(plugins, node=NODE, key=KEY)
    body = request(annotated(allocation()), container="sidecar").SerializeToString()
    assert editor.create_container(body) is body


def test_a_bad_allocation_refuses_even_a_container_without_devices(plugins: KubegpuPluginManager) -> None:
    editor = ContainerEditor(plugins, node=NODE, key=KEY)
    with pytest.raises(AllocationRefused) as refused:
        editor.create_container(
            request(annotated(allocation(node="elsewhere")), container="sidecar").SerializeToString()
        )
    assert refused.value.check == "node"


def test_a_resource_no_plugin_handles_is_refused(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> None:
    editor = ContainerEditor(make_plugin_manager("device"), node=NODE, key=KEY)
    with pytest.raises(AllocationRefused) as refused:
        editor.create_container(request(annotated(allocation())).SerializeToString())
    assert refused.value.check == "plugin"
    assert f"no device plugin on this node handles {FPGA}" in str(refused.value)


class _Broken:
    @hookimpl
    def kubegpu_device_resources(self) -> list[str]:
        return [FPGA]

    @hookimpl
    def kubegpu_device_edit_container(self, allocation: ContainerAllocation, edit: ContainerEdit) -> bool:
        raise RuntimeError("card firmware mismatch")


def test_a_plugin_that_fails_refuses_the_container(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> None:
    editor = ContainerEditor(make_plugin_manager("device", broken=_Broken()), node=NODE, key=KEY)
    with pytest.raises(AllocationRefused) as refused:
        editor.create_container(request(annotated(allocation())).SerializeToString())
    assert refused.value.check == "plugin"
    assert "plugin 'broken' failed in kubegpu_device_edit_container" in str(refused.value)
    assert "card firmware mismatch" in str(refused.value)


class FakePods:
    """A `PodSource` serving fixed manifests; `error` makes every lookup fail like an unreachable API server."""

    def __init__(self, *pods: dict[str, Any], error: bool = False) -> None:
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        self.error = error
        self.lookups = 0

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.lookups += 1
        if self.error:
            raise ConnectionError("reading pod from the API server: connection refused")
        return self.pods.get((namespace, name))


def _api_pod(annotations: Mapping[str, str] | None = None, cards: int = 2) -> dict[str, Any]:
    pod = pod_manifest(POD.name, {"main": {FPGA: cards}}, namespace=POD.namespace, annotations=annotations)
    pod["metadata"]["uid"] = POD.uid
    return pod


def test_without_a_sandbox_annotation_the_api_server_decides(plugins: KubegpuPluginManager) -> None:
    body = request().SerializeToString()
    # The pod asks for cards but was never given an allocation: refused.
    editor = ContainerEditor(plugins, node=NODE, key=KEY, pods=FakePods(_api_pod()))
    with pytest.raises(AllocationRefused) as refused:
        editor.create_container(body)
    assert refused.value.check == "missing"
    assert f"requests {FPGA} but the pod has no {ALLOCATION_KEY} annotation" in str(refused.value)
    # The allocation reached the API server after the sandbox was made: it is used.
    editor = ContainerEditor(plugins, node=NODE, key=KEY, pods=FakePods(_api_pod(annotated(allocation()))))
    assert [
        d.container_path
        for d in api_pb2.CreateContainerRequest.FromString(editor.create_container(body)).config.devices
    ] == [
        "/dev/fpga1",
        "/dev/fpga2",
    ]
    # A pod without kubegpu devices, or one that is gone, passes.
    for pods in (FakePods(_api_pod(cards=0)), FakePods()):
        assert ContainerEditor(plugins, node=NODE, key=KEY, pods=pods).create_container(body) is body
    # The API server is unreachable: the shim cannot tell, the kubelet retries.
    with pytest.raises(ConnectionError):
        ContainerEditor(plugins, node=NODE, key=KEY, pods=FakePods(error=True)).create_container(body)


def test_a_sandbox_annotation_needs_no_api_lookup(plugins: KubegpuPluginManager) -> None:
    pods = FakePods(error=True)
    editor = ContainerEditor(plugins, node=NODE, key=KEY, pods=pods)
    editor.create_container(request(annotated(allocation())).SerializeToString())
    assert pods.lookups == 0


@pytest.mark.parametrize(
    ("mode", "field", "annotation"),
    [
        pytest.param("field", ["vendor.com/nic=eth1", "example.com/fpga=fpga1"], None, id="field"),
        pytest.param("annotation", ["vendor.com/nic=eth1"], "example.com/fpga=fpga1", id="annotation"),
        pytest.param("off", ["vendor.com/nic=eth1"], None, id="off"),
    ],
)
def test_cdi_names_go_where_the_runtime_reads_them(mode: Any, field: list[str], annotation: str | None) -> None:
    config = api_pb2.ContainerConfig(
        CDI_devices=[api_pb2.CDIDevice(name="vendor.com/nic=eth1"), api_pb2.CDIDevice(name="example.com/fpga=fpga0")]
    )
    before = edit_from_config(config)
    after = before.model_copy(deep=True)
    after.cdi_devices = ["vendor.com/nic=eth1", "example.com/fpga=fpga1"]  # fpga0 removed, fpga1 added
    apply_edit(config, before, after, cdi=mode)
    assert [d.name for d in config.CDI_devices] == field
    assert config.annotations.get(CDI_ANNOTATION) == annotation


def _unknown(number: int, text: bytes) -> bytes:
    """A length-delimited field `number` that the generated classes do not know (one a newer kubelet sends)."""
    return _field(number, text)


def _field(number: int, payload: bytes) -> bytes:
    """Field `number` holding `payload`, in protobuf's wire format (tag and length as varints)."""

    def varint(value: int) -> bytes:
        out = b""
        while value >= 0x80:
            out += bytes([value & 0x7F | 0x80])
            value >>= 7
        return out + bytes([value])

    return varint(number << 3 | 2) + varint(len(payload)) + payload


def test_fields_a_newer_kubelet_sends_survive_the_edit(plugins: KubegpuPluginManager) -> None:
    """Fields this shim's CRI version does not know reach the runtime as the kubelet sent them, in the request, its
    container config, and each env, mount and device entry, whichever the plugins edit (before: an env entry's were
    dropped whenever the env was edited)."""
    editor = ContainerEditor(plugins, node=NODE, key=KEY, dev_root=Path("/host/dev"))
    sent = request(annotated(allocation()), envs={"FPGA_VISIBLE_DEVICES": "all"})
    config = sent.config.SerializeToString()
    config += _field(6, api_pb2.KeyValue(key="GREETING", value="hi").SerializeToString() + _unknown(77, b"ENV-NEW"))
    config += _field(8, api_pb2.Device(host_path="/dev/fuse").SerializeToString() + _unknown(77, b"DEVICE-NEW"))
    config += _unknown(99, b"CONFIG-NEW")
    sent.ClearField("config")
    body = sent.SerializeToString() + _field(2, config) + _unknown(99, b"REQUEST-NEW")

    out = editor.create_container(body)

    assert out is not body  # edited: FPGA_VISIBLE_DEVICES is the allocation's now
    envs = [(kv.key, kv.value) for kv in api_pb2.CreateContainerRequest.FromString(out).config.envs]
    assert envs == [("FPGA_VISIBLE_DEVICES", "fpga1,fpga2"), ("GREETING", "hi")]
    assert [m for m in (b"ENV-NEW", b"DEVICE-NEW", b"CONFIG-NEW", b"REQUEST-NEW") if m not in out] == []


def test_env_entries_keep_their_order_and_removed_ones_go() -> None:
    config = api_pb2.ContainerConfig(
        envs=[api_pb2.KeyValue(key=k, value=v) for k, v in [("A", "1"), ("NVIDIA_VISIBLE_DEVICES", "all"), ("B", "2")]]
    )
    before = edit_from_config(config)
    after = before.model_copy(deep=True)
    del after.envs["A"]
    after.envs["NVIDIA_VISIBLE_DEVICES"] = "3"
    after.envs["C"] = "3"
    apply_edit(config, before, after)
    assert [(kv.key, kv.value) for kv in config.envs] == [("NVIDIA_VISIBLE_DEVICES", "3"), ("B", "2"), ("C", "3")]


# ---------------------------------------------------------------------------------------------------------------
# The proxy, in front of a fake runtime
# ---------------------------------------------------------------------------------------------------------------


class FakeRuntime(api_pb2_grpc.RuntimeServiceServicer):
    """Records what arrives; answers Version, fails ContainerStatus, streams three container events."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str], float | None]] = []
        self.created: list[api_pb2.CreateContainerRequest] = []

    def _record(self, name: str, context: grpc.ServicerContext) -> None:
        remaining = context.time_remaining()
        self.seen.append((name, dict(context.invocation_metadata()), remaining if remaining < 1e6 else None))

    def Version(self, request: api_pb2.VersionRequest, context: grpc.ServicerContext) -> api_pb2.VersionResponse:
        self._record("Version", context)
        context.set_trailing_metadata([("x-runtime-trailer", "t1")])
        return api_pb2.VersionResponse(version="0.1.0", runtime_name="fake", runtime_version="9")

    def ContainerStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._record("ContainerStatus", context)
        context.set_trailing_metadata([("x-runtime-error", "e1")])
        context.abort(grpc.StatusCode.NOT_FOUND, f"container {request.container_id!r} not found")

    def CreateContainer(self, request: Any, context: grpc.ServicerContext) -> api_pb2.CreateContainerResponse:
        self._record("CreateContainer", context)
        self.created.append(request)
        return api_pb2.CreateContainerResponse(container_id="c-1")

    def ListPodSandbox(self, request: Any, context: grpc.ServicerContext) -> api_pb2.ListPodSandboxResponse:
        return api_pb2.ListPodSandboxResponse()  # the sandboxes of these requests are not the runtime's: believed

    def GetContainerEvents(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self._record("GetContainerEvents", context)
        for i in range(3):
            yield api_pb2.ContainerEventResponse(
                container_id=f"c-{i}", container_event_type=api_pb2.ContainerEventType.CONTAINER_STARTED_EVENT
            )


class FakeImages(api_pb2_grpc.ImageServiceServicer):
    def ListImages(self, request: Any, context: grpc.ServicerContext) -> api_pb2.ListImagesResponse:
        return api_pb2.ListImagesResponse(images=[api_pb2.Image(id="sha256:1", repo_tags=["busybox:1"])])


class FakeServer:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.runtime = FakeRuntime()
        self.server: grpc.Server | None = None

    def start(self) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_RuntimeServiceServicer_to_server(self.runtime, self.server)
        api_pb2_grpc.add_ImageServiceServicer_to_server(FakeImages(), self.server)
        self.server.add_insecure_port(f"unix://{self.path}")
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait()
            self.server = None


@pytest.fixture
def sockets() -> Iterator[Path]:
    """A short directory for sockets (unix socket paths are limited to 108 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="kubegpu-shim-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def fake(sockets: Path) -> Iterator[FakeServer]:
    server = FakeServer(sockets / "runtime.sock")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def proxy(sockets: Path, fake: FakeServer, plugins: KubegpuPluginManager) -> Iterator[tuple[RunningShim, Any]]:
    editor = ContainerEditor(plugins, node=NODE, key=KEY, dev_root=Path("/host/dev"))
    shim = start_shim(f"unix://{sockets / 'shim.sock'}", f"unix://{fake.path}", editor, workers=4)
    channel = grpc.insecure_channel(f"unix://{shim.socket}")
    yield shim, api_pb2_grpc.RuntimeServiceStub(channel)
    channel.close()
    shim.stop(0)


def test_the_socket_is_private_to_its_owner(proxy: tuple[RunningShim, Any]) -> None:
    shim, _ = proxy
    mode = shim.socket.stat().st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


def test_calls_arrive_with_their_deadline_and_metadata_and_return_the_runtimes_answer(
    proxy: tuple[RunningShim, Any], fake: FakeServer
) -> None:
    _, runtime = proxy
    response, call = runtime.Version.with_call(
        api_pb2.VersionRequest(), timeout=7.5, metadata=[("x-kubelet-trace", "abc")]
    )
    assert response.runtime_name == "fake"
    assert ("x-runtime-trailer", "t1") in list(call.trailing_metadata())
    name, metadata, remaining = fake.runtime.seen[-1]
    assert name == "Version"
    assert metadata.get("x-kubelet-trace") == "abc"
    assert remaining is not None and 6.0 < remaining <= 7.6
    runtime.Version(api_pb2.VersionRequest())  # no deadline stays no deadline
    assert fake.runtime.seen[-1][2] is None


def test_a_runtime_error_keeps_its_code_details_and_trailers(proxy: tuple[RunningShim, Any]) -> None:
    _, runtime = proxy
    with pytest.raises(grpc.RpcError) as failed:
        runtime.ContainerStatus(api_pb2.ContainerStatusRequest(container_id="gone"), timeout=5)
    assert failed.value.code() == grpc.StatusCode.NOT_FOUND
    assert failed.value.details() == "container 'gone' not found"
    assert ("x-runtime-error", "e1") in list(failed.value.trailing_metadata())


def test_container_events_stream_through(proxy: tuple[RunningShim, Any]) -> None:
    _, runtime = proxy
    events = list(runtime.GetContainerEvents(api_pb2.GetEventsRequest(), timeout=5))
    assert [e.container_id for e in events] == ["c-0", "c-1", "c-2"]


def test_the_image_service_is_proxied_too(proxy: tuple[RunningShim, Any]) -> None:
    shim, _ = proxy
    with grpc.insecure_channel(f"unix://{shim.socket}") as channel:
        images = api_pb2_grpc.ImageServiceStub(channel).ListImages(api_pb2.ListImagesRequest(), timeout=5)
    assert [i.repo_tags[0] for i in images.images] == ["busybox:1"]


def test_create_container_is_edited_or_refused_before_the_runtime_sees_it(
    proxy: tuple[RunningShim, Any], fake: FakeServer
) -> None:
    _, runtime = proxy
    assert runtime.CreateContainer(request(annotated(allocation())), timeout=5).container_id == "c-1"
    assert [d.container_path for d in fake.runtime.created[-1].config.devices] == ["/dev/fpga1", "/dev/fpga2"]
    with pytest.raises(grpc.RpcError) as refused:
        runtime.CreateContainer(request(annotated(allocation(uid="uid-someone-else"))), timeout=5)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "pod check failed" in refused.value.details()
    assert len(fake.runtime.created) == 1


def test_an_absent_runtime_is_unavailable_and_picked_up_when_it_comes(
    sockets: Path, plugins: KubegpuPluginManager
) -> None:
    editor = ContainerEditor(plugins, node=NODE, key=KEY)
    later = FakeServer(sockets / "later.sock")
    shim = start_shim(f"unix://{sockets / 'shim.sock'}", f"unix://{later.path}", editor, workers=4)
    try:
        with grpc.insecure_channel(f"unix://{shim.socket}") as channel:
            runtime = api_pb2_grpc.RuntimeServiceStub(channel)
            with pytest.raises(grpc.RpcError) as down:
                runtime.Version(api_pb2.VersionRequest(), timeout=5)
            assert down.value.code() == grpc.StatusCode.UNAVAILABLE
            later.start()
            deadline = time.monotonic() + 10
            while True:
                try:
                    assert runtime.Version(api_pb2.VersionRequest(), timeout=2).runtime_name == "fake"
                    break
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE
                    assert time.monotonic() < deadline, "the shim did not reconnect to the runtime within 10 s"
                    time.sleep(0.05)
    finally:
        shim.stop(0)
        later.stop()


def test_a_stale_socket_is_replaced_but_a_live_one_is_not_taken(sockets: Path, plugins: KubegpuPluginManager) -> None:
    editor = ContainerEditor(plugins, node=NODE, key=KEY)
    path = sockets / "shim.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a killed shim leaves
    shim = start_shim(f"unix://{path}", f"unix://{sockets / 'runtime.sock'}", editor, workers=2)
    try:
        with pytest.raises(SystemExit, match="another process is serving"):
            start_shim(f"unix://{path}", f"unix://{sockets / 'runtime.sock'}", editor, workers=2)
    finally:
        shim.stop(0)


# ---------------------------------------------------------------------------------------------------------------
# Both CRI versions: kubelet 1.20-1.22 speak runtime.v1alpha2, later ones runtime.v1; runtimes speak either or both
# ---------------------------------------------------------------------------------------------------------------


class FakeAlphaRuntime(alpha_pb2_grpc.RuntimeServiceServicer):
    """A runtime from before CRI v1: only runtime.v1alpha2."""

    def __init__(self) -> None:
        self.created: list[alpha_pb2.CreateContainerRequest] = []

    def Version(self, request: Any, context: grpc.ServicerContext) -> alpha_pb2.VersionResponse:
        return alpha_pb2.VersionResponse(version="0.1.0", runtime_name="fake-alpha", runtime_version="1")

    def CreateContainer(self, request: Any, context: grpc.ServicerContext) -> alpha_pb2.CreateContainerResponse:
        self.created.append(request)
        return alpha_pb2.CreateContainerResponse(container_id="alpha-1")

    def ListPodSandbox(self, request: Any, context: grpc.ServicerContext) -> alpha_pb2.ListPodSandboxResponse:
        return alpha_pb2.ListPodSandboxResponse()


def alpha_request(record: AllocationRecord) -> alpha_pb2.CreateContainerRequest:
    """`request(...)` as a kubelet 1.20 sends it: the same fields, in the v1alpha2 messages."""
    return alpha_pb2.CreateContainerRequest.FromString(request(annotated(record)).SerializeToString())


def test_a_v1alpha2_kubelet_is_served_and_verified_in_front_of_a_v1_runtime(
    proxy: tuple[RunningShim, Any], fake: FakeServer
) -> None:
    shim, _ = proxy
    with grpc.insecure_channel(f"unix://{shim.socket}") as channel:
        runtime = alpha_pb2_grpc.RuntimeServiceStub(channel)
        assert runtime.Version(alpha_pb2.VersionRequest(), timeout=5).runtime_name == "fake"
        assert runtime.CreateContainer(alpha_request(allocation()), timeout=5).container_id == "c-1"
        assert [d.container_path for d in fake.runtime.created[-1].config.devices] == ["/dev/fpga1", "/dev/fpga2"]
        with pytest.raises(grpc.RpcError) as refused:
            runtime.CreateContainer(alpha_request(allocation(uid="uid-someone-else")), timeout=5)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "pod check failed" in refused.value.details()
        with pytest.raises(grpc.RpcError) as failed:  # the runtime's own answers keep their code
            runtime.ContainerStatus(alpha_pb2.ContainerStatusRequest(container_id="gone"), timeout=5)
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(fake.runtime.created) == 1


def test_a_v1_kubelet_is_served_in_front_of_a_v1alpha2_runtime_with_cdi_names_as_annotations(
    sockets: Path, plugins: KubegpuPluginManager
) -> None:
    alpha = FakeAlphaRuntime()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    alpha_pb2_grpc.add_RuntimeServiceServicer_to_server(alpha, server)
    server.add_insecure_port(f"unix://{sockets / 'alpha.sock'}")
    server.start()
    editor = ContainerEditor(plugins, node=NODE, key=KEY, dev_root=Path("/host/dev"))
    shim = start_shim(f"unix://{sockets / 'shim.sock'}", f"unix://{sockets / 'alpha.sock'}", editor, workers=4)
    try:
        with grpc.insecure_channel(f"unix://{shim.socket}") as channel:
            runtime = api_pb2_grpc.RuntimeServiceStub(channel)
            assert runtime.Version(api_pb2.VersionRequest(), timeout=5).runtime_name == "fake-alpha"
            assert runtime.CreateContainer(request(annotated(allocation())), timeout=5).container_id == "alpha-1"
            config = alpha.created[-1].config
            assert [d.container_path for d in config.devices] == ["/dev/fpga1", "/dev/fpga2"]
            # v1alpha2 has no CDI field: the names travel in the annotation a CDI-enabled containerd 1.6 reads.
            assert config.annotations[CDI_ANNOTATION] == "example.com/fpga=fpga1,example.com/fpga=fpga2"
            alpha_runtime = alpha_pb2_grpc.RuntimeServiceStub(channel)
            assert alpha_runtime.Version(alpha_pb2.VersionRequest(), timeout=5).runtime_name == "fake-alpha"
    finally:
        shim.stop(0)
        server.stop(0).wait()


# ---------------------------------------------------------------------------------------------------------------
# Init containers: the devices the kubelet would give them, from the pod's allocation
# ---------------------------------------------------------------------------------------------------------------


def test_a_placed_pods_init_container_gets_the_gpus_its_allocation_names(
    make_plugin_manager: Callable[..., KubegpuPluginManager],
) -> None:
    """A GPU check before the app (`nvidia.com/gpu: 2` on the init container, 1 on the app), placed by the real
    engine: the shim created the init container without any GPU. It now gets the 2 GPUs the allocation names for it
    (the app's among them, as the kubelet hands an init container's devices on), and the app its own one of them."""
    gpu = "nvidia.com/gpu"
    engine = Engine(
        build_plugin_manager("scheduler", plugins=[("nvidia", nvidia_scheduler)], autoload=False), signing_key=KEY
    )
    engine.add_node(make_node(NODE, labels={"nvidia.com/gpu.count": "4"}, allocatable={gpu: 4}))
    manifest = pod_manifest(POD.name, {"main": {gpu: 1}}, namespace=POD.namespace)
    manifest["metadata"]["uid"] = POD.uid
    manifest["spec"]["initContainers"] = [{"name": "gpu-check", "resources": {"limits": {gpu: "2"}}}]
    decision = engine.schedule(pod_request(manifest)[0])
    assert decision.scheduled and decision.allocation is not None, decision
    editor = ContainerEditor(
        make_plugin_manager("device", nvidia=nvidia_device), node=NODE, key=KEY, dev_root=Path("/host/dev")
    )

    def visible(container: str) -> tuple[list[str], list[str]]:
        config = edited(editor, request(decision.annotations, container=container)).config
        env = {kv.key: kv.value for kv in config.envs}
        gpus = env.get("NVIDIA_VISIBLE_DEVICES", "")
        return (gpus.split(",") if gpus else []), [d.container_path for d in config.devices]

    init_gpus, init_devices = visible("gpu-check")
    app_gpus, app_devices = visible("main")
    assert len(init_gpus) == 2 and set(app_gpus) < set(init_gpus) and len(app_gpus) == 1, (init_gpus, app_gpus)
    assert sorted(d for d in init_devices if d.startswith("/dev/nvidia") and d[11:].isdigit()) == sorted(
        f"/dev/nvidia{i}" for i in init_gpus
    )
    assert f"/dev/nvidia{app_gpus[0]}" in app_devices


def test_an_init_container_asking_a_share_of_its_apps_whole_gpu_is_held_to_its_share(
    make_plugin_manager: Callable[..., KubegpuPluginManager], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A HAMi user's check before the app: the init container asks 30 % of a GPU (`nvidia.com/gpu: 1`,
    `nvidia.com/gpucores: 30`), the app the whole GPU. Placed by the real engine (it was refused), the init container
    gets the app's GPU held to 30 % of its compute (HAMi-core's `CUDA_DEVICE_SM_LIMIT`), and the app the same GPU
    whole, with no limit."""
    monkeypatch.setenv("KUBEGPU_NVIDIA_SHARE_LIMITS", "hami-core")
    (tmp_path / "libvgpu.so").write_bytes(b"")  # HAMi-core installed: the containers' regions are made beside it
    monkeypatch.setenv("KUBEGPU_HAMI_CORE_DIR", str(tmp_path))
    gpu, cores = "nvidia.com/gpu", "nvidia.com/gpucores"
    plugins = build_plugin_manager("scheduler", plugins=[("nvidia", nvidia_scheduler)], autoload=False)
    engine = Engine(plugins, signing_key=KEY)
    engine.add_node(make_node(NODE, labels={"nvidia.com/gpu.count": "2"}, allocatable={gpu: 20, cores: 200}))
    manifest = pod_manifest(POD.name, {"main": {gpu: 1}}, namespace=POD.namespace)
    manifest["metadata"]["uid"] = POD.uid
    manifest["spec"]["initContainers"] = [{"name": "check", "resources": {"limits": {gpu: "1", cores: "30"}}}]
    decision = engine.schedule(pod_request(manifest, plugins.qualifiers)[0])
    assert decision.scheduled and decision.allocation is not None, decision
    editor = ContainerEditor(
        make_plugin_manager("device", nvidia=nvidia_device), node=NODE, key=KEY, dev_root=Path("/host/dev")
    )

    def env(container: str) -> dict[str, str]:
        config = edited(editor, request(decision.annotations, container=container)).config
        return {kv.key: kv.value for kv in config.envs}

    (held,) = decision.allocation.containers["main"][gpu]
    init, app = env("check"), env("main")
    assert (init["NVIDIA_VISIBLE_DEVICES"], init.get("CUDA_DEVICE_SM_LIMIT")) == (held, "30")
    assert not any(key.startswith("CUDA_DEVICE_MEMORY_LIMIT") for key in init)  # all of the GPU's memory (HAMi)
    assert (app["NVIDIA_VISIBLE_DEVICES"], app.get("CUDA_DEVICE_SM_LIMIT")) == (held, None)
