"""`kubegpu device-plugin` without a kubelet: a fake kubelet's Registration service, and the plugin's own sockets.

What a node operator would notice: every kubegpu resource registers with the kubelet and lists the ids the scheduler
allocates; the kubelet is steered to the ids the scheduler signed for the pod it admits (init containers and
containers in the kubelet's order, the oldest pod first); Allocate answers exactly the device nodes and env the CRI
shim would apply, and refuses ids no verified allocation names; a pod kubegpu did not place that the kubelet
admits first (older, same count) is steered nowhere and gets nothing signed for another pod; a kubelet restart (its
sockets removed, a new `kubelet.sock`) is followed by a new registration. The real kubelet 1.20 runs the same code in
tests/integration/test_kubelet_deviceplugin.py.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import grpc
import pytest

from kubegpu.core.annotations import (
    ALLOCATION_KEY,
    encode_allocation,
    merge_allocations,
    sign_allocation,
)
from kubegpu.core.manifests import pod_request
from kubegpu.core.models import DeviceInfo, DeviceInventory, PluginAllocation, share_slot
from kubegpu.core.plugin_manager import KubegpuPluginManager
from kubegpu.core.plugin_manager import make_plugin_manager as build_plugin_manager
from kubegpu.core.testing import make_node, pod_manifest
from kubegpu.crishim.deviceplugin import (
    VANISHED_MEMORY,
    Candidate,
    DevicePluginService,
    HostIdentity,
    PendingPods,
    allocate_response,
    shared_devices,
    socket_name,
    wrong_node,
)
from kubegpu.crishim.protos import DEVICE_PLUGIN, DEVICE_PLUGIN_PACKAGE, POD_RESOURCES, method_path
from kubegpu.crishim.verify import AllocationRefused, PodIdentity
from kubegpu.plugins.intel_gas import device as intel_device
from kubegpu.plugins.intel_gas import scheduler as intel_scheduler
from kubegpu.plugins.neuron import device as neuron_device
from kubegpu.plugins.nvidia import device as nvidia_device
from kubegpu.plugins.nvidia import scheduler as nvidia_scheduler
from kubegpu.scheduler.engine import Engine

KEY = b"device-plugin-and-scheduler-share-this"
NODE = "trn1-dp"
NEURONDEVICE = "aws.amazon.com/neurondevice"
M = DEVICE_PLUGIN


def allocated_pod(
    name: str,
    containers: dict[str, list[str]],
    *,
    created: str = "2025-01-01T00:00:00Z",
    key: bytes = KEY,
    init: dict[str, list[str]] | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    uid = f"uid-{name}"
    allocation = {c: {NEURONDEVICE: ids} for c, ids in {**(init or {}), **containers}.items()}
    record = merge_allocations(
        NODE, uid, [PluginAllocation(plugin="neuron", containers=allocation, fields={"coresPerDevice": 2})]
    )
    spec: dict[str, Any] = {"nodeName": NODE, "containers": [asking(c, len(ids)) for c, ids in containers.items()]}
    if init:
        spec["initContainers"] = [asking(c, len(ids)) for c, ids in init.items()]
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": uid,
            "creationTimestamp": created,
            "annotations": {ALLOCATION_KEY: encode_allocation(sign_allocation(record, key))},
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def asking(container: str, count: int, resource: str = NEURONDEVICE) -> dict[str, Any]:
    return {"name": container, "resources": {"limits": {resource: str(count)}}}


def unplaced_pod(name: str, containers: dict[str, int], *, created: str, phase: str = "Pending") -> dict[str, Any]:
    """A pod kubegpu did not place: `spec.nodeName` written by its owner (or another scheduler), no allocation."""
    return {
        "metadata": {"name": name, "namespace": "tenant", "uid": f"uid-{name}", "creationTimestamp": created},
        "spec": {"nodeName": NODE, "containers": [asking(c, n) for c, n in containers.items()]},
        "status": {"phase": phase},
    }


# ---------------------------------------------------------------------------------------------------------------
# The ids each plugin names, and the messages
# ---------------------------------------------------------------------------------------------------------------


def test_each_plugin_names_the_ids_its_scheduler_side_allocates() -> None:
    neuron = DeviceInventory(
        plugin="neuron", devices=[DeviceInfo(id="0", cores=2), DeviceInfo(id="1", cores=2, healthy=False)]
    )
    assert neuron_device.kubegpu_device_plugin_ids(neuron) == {
        "aws.amazon.com/neuron": {"0": True, "1": False},
        NEURONDEVICE: {"0": True, "1": False},
        "aws.amazon.com/neuroncore": {"0": True, "1": True, "2": False, "3": False},
    }
    cards = DeviceInventory(
        plugin="intel-gas",
        devices=[DeviceInfo(id="card1"), DeviceInfo(id="card0"), DeviceInfo(id="card2", attributes={"driver": "xe"})],
    )
    assert intel_device.kubegpu_device_plugin_ids(cards) == {
        "gpu.intel.com/i915": {"card0": True, "card1": True},
        "gpu.intel.com/xe": {"card2": True},
    }
    gpus = DeviceInventory(plugin="nvidia", devices=[DeviceInfo(id="0"), DeviceInfo(id="1")])
    assert nvidia_device.kubegpu_device_plugin_ids(gpus) == {"nvidia.com/gpu": {"0": True, "1": True}}


def test_messages_use_the_documented_field_numbers() -> None:
    # ContainerAllocateResponse: envs = 1 (map), mounts = 2, devices = 3; DeviceSpec: container_path 1, host_path 2.
    response = M["ContainerAllocateResponse"](
        envs={"A": "1"}, devices=[M["DeviceSpec"](container_path="/dev/x", host_path="/h", permissions="rw")]
    )
    assert response.SerializeToString() == b"\n\x06\n\x01A\x12\x011\x1a\x10\n\x06/dev/x\x12\x02/h\x1a\x02rw"
    listed = POD_RESOURCES["ListPodResourcesResponse"].FromString(
        b"\n\x1a\n\x01p\x12\x02ns\x1a\x11\n\x01c\x12\x0c\n\x01r\x12\x011\x12\x012\x12\x013"
    )
    assert [list(d.device_ids) for d in listed.pod_resources[0].containers[0].devices] == [["1", "2", "3"]]


# ---------------------------------------------------------------------------------------------------------------
# Which pod is being admitted
# ---------------------------------------------------------------------------------------------------------------


def pending(*pods: dict[str, Any]) -> PendingPods:
    listed = list(pods)
    return PendingPods(lambda: listed, NODE, KEY)


def test_a_pod_signed_with_a_verify_key_is_admitted_while_the_key_is_rotated() -> None:
    """`--allocation-verify-key-file` (tests/scheduler/test_key_rotation.py): a pod the scheduler signed with the key
    being rotated out is still the pod being admitted, not nobody."""
    rotated_out = b"the-key-before-this-one-was-rolled-out"
    old = allocated_pod("old", {"main": ["0", "1"]}, key=rotated_out)
    new = allocated_pod("new", {"main": ["2", "3"]}, created="2025-01-01T00:00:05Z")
    rotating = PendingPods(lambda: [old, new], NODE, KEY, verify_keys=(rotated_out,))
    rotating.refresh()
    assert rotating.claim(NEURONDEVICE, ["1", "0"]) is not None
    assert rotating.claim(NEURONDEVICE, ["2", "3"]) is not None
    plain = pending(old, new)
    plain.refresh()
    assert plain.claim(NEURONDEVICE, ["0", "1"]) is None, "without the verify key the old pod is nobody"


def test_the_oldest_pending_pods_containers_are_preferred_in_the_kubelets_order() -> None:
    later = allocated_pod("later", {"main": ["8", "9", "10", "11"]}, created="2025-01-01T00:00:09Z")
    first = allocated_pod(
        "first", {"main": ["4", "5", "6", "7"]}, init={"warmup": ["0", "1", "2", "3"]}, created="2025-01-01T00:00:01Z"
    )
    running = allocated_pod("running", {"main": ["12", "13", "14", "15"]}, phase="Running")
    forged = allocated_pod("forged", {"main": ["12", "13"]}, key=b"someone-else")  # another count: not in the way
    pods = pending(later, first, running, forged)
    pods.refresh()
    everything = [str(i) for i in range(16)]
    assert pods.preferred(NEURONDEVICE, everything, [], 4) == ["0", "1", "2", "3"]  # the init container comes first
    assert pods.claim(NEURONDEVICE, ["3", "2", "1", "0"]) is not None
    assert pods.preferred(NEURONDEVICE, everything, [], 4) == ["4", "5", "6", "7"]
    candidate, container = pods.claim(NEURONDEVICE, ["4", "5", "6", "7"]) or (None, "")
    assert candidate is not None and candidate.pod.name == "first" and container == "main"
    assert pods.preferred(NEURONDEVICE, everything, [], 4) == ["8", "9", "10", "11"]
    # Ids that are not all available, or another count, are no preference; a running or forged pod is nobody.
    assert pods.preferred(NEURONDEVICE, [str(i) for i in range(9)], [], 4) == []
    assert pods.preferred(NEURONDEVICE, everything, [], 2) == []
    assert pods.claim(NEURONDEVICE, ["12", "13", "14", "15"]) is None
    assert pods.claim(NEURONDEVICE, ["12", "13"]) is None


EVERYTHING = [str(i) for i in range(16)]
PLACED_IDS = ["4", "5", "6", "7"]


def test_a_pod_kubegpu_did_not_place_never_gets_the_devices_signed_for_another_pod() -> None:
    # The tenant's pod was created first with spec.nodeName written by hand and asks the same count as the pod
    # kubegpu placed on devices 4-7: the kubelet admits it first (creation order) and takes the preferred ids.
    squatter = unplaced_pod("squatter", {"main": 4}, created="2025-01-01T00:00:01Z")
    placed = allocated_pod("placed", {"main": PLACED_IDS}, created="2025-01-01T00:00:02Z")
    pods = pending(squatter, placed)
    pods.refresh()

    assert pods.preferred(NEURONDEVICE, EVERYTHING, [], 4) == []  # no steering onto 4-7 while it could be the squatter
    with pytest.raises(AllocationRefused) as refused:
        pods.claim(NEURONDEVICE, PLACED_IDS)  # the kubelet chose 4-7 itself (say, the only free ones)

    assert refused.value.check == "ambiguous"
    message = str(refused.value)
    assert "tenant/squatter" in message and "team/placed" in message and "4,5,6,7" in message


def test_a_tenant_deleting_its_pod_during_its_admission_still_gets_nothing_signed_for_another() -> None:
    # The kubelet is admitting the squatter (creation order) when its owner deletes it: a finalizer keeps the object,
    # pending and marked for deletion, or a force-delete makes it disappear from the listing. Either way the call
    # being answered may still be the squatter's: it is refused, and only the next one goes to the placed pod.
    squatter = unplaced_pod("squatter", {"main": 4}, created="2025-01-01T00:00:01Z")
    placed = allocated_pod("placed", {"main": PLACED_IDS}, created="2025-01-01T00:00:02Z")
    listed = [squatter, placed]
    now = [0.0]
    pods = PendingPods(lambda: list(listed), NODE, KEY, clock=lambda: now[0])
    pods.refresh()

    squatter["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:09Z"  # held by the tenant's finalizer
    pods.refresh()
    assert pods.preferred(NEURONDEVICE, EVERYTHING, [], 4) == []

    listed.remove(squatter)  # force-deleted, never seen Failed
    pods.refresh()
    assert pods.preferred(NEURONDEVICE, EVERYTHING, [], 4) == []
    with pytest.raises(AllocationRefused) as refused:
        pods.claim(NEURONDEVICE, PLACED_IDS)  # the answer to the squatter's admission
    assert refused.value.check == "ambiguous" and "tenant/squatter" in str(refused.value)

    pods.refresh()  # the kubelet's next call is the placed pod's
    assert pods.preferred(NEURONDEVICE, EVERYTHING, [], 4) == PLACED_IDS
    candidate, _ = pods.claim(NEURONDEVICE, PLACED_IDS) or (None, "")
    assert candidate is not None and candidate.pod.name == "placed"


def test_a_vanished_unplaced_pod_stops_counting_once_refused_or_after_a_while() -> None:
    now = [0.0]

    def placed_after(squatter_refused_first: bool, waited: float) -> list[str]:
        squatter = unplaced_pod("squatter", {"main": 4}, created="2025-01-01T00:00:01Z")
        placed = allocated_pod("placed", {"main": PLACED_IDS}, created="2025-01-01T00:00:02Z")
        listed = [squatter, placed]
        pods = PendingPods(lambda: list(listed), NODE, KEY, clock=lambda: now[0])
        pods.refresh()
        if squatter_refused_first:  # its own admission was answered while it was listed, then it was force-deleted
            with pytest.raises(AllocationRefused):
                pods.claim(NEURONDEVICE, PLACED_IDS)
        listed.remove(squatter)
        pods.refresh()
        now[0] += waited
        pods.refresh()
        return pods.preferred(NEURONDEVICE, EVERYTHING, [], 4)

    assert placed_after(squatter_refused_first=True, waited=0.0) == PLACED_IDS
    assert placed_after(squatter_refused_first=False, waited=1.0) == []
    assert placed_after(squatter_refused_first=False, waited=VANISHED_MEMORY) == PLACED_IDS


@pytest.mark.parametrize(
    ("squatter", "granted"),
    [
        (unplaced_pod("squatter", {"main": 4}, created="2025-01-01T00:00:01Z", phase="Failed"), True),
        (unplaced_pod("squatter", {"main": 2}, created="2025-01-01T00:00:01Z"), True),
        (unplaced_pod("squatter", {"main": 4}, created="2025-01-01T00:00:03Z"), False),
        (allocated_pod("squatter", {"main": ["0", "1", "2", "3"]}, key=b"someone-else"), False),
    ],
    ids=["squatter-already-refused", "another-count", "squatter-newer", "forged-allocation"],
)
def test_the_placed_pod_gets_its_devices_only_when_no_unplaced_pod_could_be_the_one_admitted(
    squatter: dict[str, Any], granted: bool
) -> None:
    pods = pending(squatter, allocated_pod("placed", {"main": PLACED_IDS}, created="2025-01-01T00:00:02Z"))
    pods.refresh()

    if granted:
        assert pods.preferred(NEURONDEVICE, EVERYTHING, [], 4) == PLACED_IDS
        candidate, container = pods.claim(NEURONDEVICE, PLACED_IDS) or (None, "")
        assert candidate is not None and candidate.pod.name == "placed" and container == "main"
    else:
        assert pods.preferred(NEURONDEVICE, EVERYTHING, [], 4) == []
        with pytest.raises(AllocationRefused, match="squatter"):
            pods.claim(NEURONDEVICE, PLACED_IDS)


def test_a_container_whose_allocation_lacks_the_resource_is_a_pod_kubegpu_did_not_place_for_it() -> None:
    placed = allocated_pod("placed", {"main": PLACED_IDS}, created="2025-01-01T00:00:02Z")
    partial = allocated_pod("partial", {"main": ["0", "1"]}, created="2025-01-01T00:00:01Z")
    partial["spec"]["containers"].insert(0, asking("sidecar", 4))  # asks 4 devices the scheduler never signed
    pods = pending(partial, placed)
    pods.refresh()

    with pytest.raises(AllocationRefused, match=r"team/partial \(its kubegpu.io/allocation signs no 4 .* sidecar"):
        pods.claim(NEURONDEVICE, PLACED_IDS)


# ---------------------------------------------------------------------------------------------------------------
# The service against a fake kubelet
# ---------------------------------------------------------------------------------------------------------------


class FakeKubelet:
    """The kubelet's Registration service on `kubelet.sock`; records every registration."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.registered: list[Any] = []
        self.event = threading.Condition()
        self.server: grpc.Server | None = None

    def start(self) -> None:
        def register(request: Any, context: grpc.ServicerContext) -> Any:
            with self.event:
                self.registered.append(request)
                self.event.notify_all()
            return M["Empty"]()

        handler = grpc.method_handlers_generic_handler(
            f"{DEVICE_PLUGIN_PACKAGE}.Registration",
            {
                "Register": grpc.unary_unary_rpc_method_handler(
                    register,
                    request_deserializer=M["RegisterRequest"].FromString,
                    response_serializer=lambda m: m.SerializeToString(),
                )
            },
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix://{self.directory / 'kubelet.sock'}")
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait()
        (self.directory / "kubelet.sock").unlink(missing_ok=True)

    def wait_registrations(self, count: int, timeout: float = 10.0) -> list[Any]:
        with self.event:
            assert self.event.wait_for(lambda: len(self.registered) >= count, timeout), (
                f"{len(self.registered)} registrations, expected {count}"
            )
            return list(self.registered)


@pytest.fixture
def directory() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kubegpu-dp-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def neuron_plugins(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> KubegpuPluginManager:
    return make_plugin_manager("device", neuron=neuron_device)


def call(directory: Path, resource: str, method: str, request: Any, response: str) -> Any:
    with grpc.insecure_channel(f"unix://{directory / socket_name(resource)}") as channel:
        return channel.unary_unary(
            method_path(DEVICE_PLUGIN_PACKAGE, "DevicePlugin", method),
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=M[response].FromString,
        )(request, timeout=5)


def test_registration_listing_preference_allocation_and_reregistration(
    directory: Path, neuron_plugins: KubegpuPluginManager, tmp_path: Path
) -> None:
    host = tmp_path / "host"
    (host / "dev").mkdir(parents=True)
    for i in range(16):
        (host / "dev" / f"neuron{i}").touch()
    pods = pending(allocated_pod("train", {"main": ["4", "5", "6", "7"]}))
    kubelet = FakeKubelet(directory)
    kubelet.start()
    service = DevicePluginService(
        neuron_plugins, pods, directory=directory, host_root=host, dev_root=Path("/host/dev"), interval=3600
    )
    service.start()
    try:
        registered = kubelet.wait_registrations(2)
        assert sorted(r.resource_name for r in registered) == ["aws.amazon.com/neuron", NEURONDEVICE]
        assert all(r.version == "v1beta1" and r.options.get_preferred_allocation_available for r in registered)

        with grpc.insecure_channel(f"unix://{directory / socket_name(NEURONDEVICE)}") as channel:
            stream = channel.unary_stream(
                method_path(DEVICE_PLUGIN_PACKAGE, "DevicePlugin", "ListAndWatch"),
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=M["ListAndWatchResponse"].FromString,
            )(M["Empty"](), timeout=5)
            first = next(stream)
            assert [(d.ID, d.health) for d in first.devices] == [(str(i), "Healthy") for i in range(16)]
            stream.cancel()

        ask = M["PreferredAllocationRequest"](
            container_requests=[
                M["ContainerPreferredAllocationRequest"](
                    available_deviceIDs=[str(i) for i in range(16)], allocation_size=4
                )
            ]
        )
        preferred = call(directory, NEURONDEVICE, "GetPreferredAllocation", ask, "PreferredAllocationResponse")
        assert list(preferred.container_responses[0].deviceIDs) == ["4", "5", "6", "7"]

        ids = ["4", "5", "6", "7"]
        grant = M["AllocateRequest"](container_requests=[M["ContainerAllocateRequest"](devicesIDs=ids)])
        answer = call(directory, NEURONDEVICE, "Allocate", grant, "AllocateResponse").container_responses[0]
        assert dict(answer.envs) == {"AWS_NEURON_VISIBLE_DEVICES": "4,5,6,7"}
        assert [(d.host_path, d.container_path) for d in answer.devices] == [
            (f"/host/dev/neuron{i}", f"/dev/neuron{i}") for i in (4, 5, 6, 7)
        ]
        assert [d.name for d in answer.cdi_devices] == [f"aws.amazon.com/neuron=neuron{i}" for i in (4, 5, 6, 7)]

        forged = M["AllocateRequest"](container_requests=[M["ContainerAllocateRequest"](devicesIDs=["0", "1"])])
        with pytest.raises(grpc.RpcError) as refused:
            call(directory, NEURONDEVICE, "Allocate", forged, "AllocateResponse")
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "no pod bound to this node has a verified kubegpu.io/allocation" in (refused.value.details() or "")

        # The kubelet restarts: it removes the plugin sockets and serves a new kubelet.sock.
        kubelet.stop()
        for path in directory.glob("kubegpu-*.sock"):
            path.unlink()
        kubelet = FakeKubelet(directory)
        kubelet.start()
        again = kubelet.wait_registrations(2)
        assert sorted(r.resource_name for r in again) == ["aws.amazon.com/neuron", NEURONDEVICE]
        deadline = time.monotonic() + 5
        while not (directory / socket_name(NEURONDEVICE)).exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        service.stop()
        kubelet.stop()


def admit(directory: Path, available: list[str], size: int) -> Any:
    """What the kubelet's device manager does for one container: ask for a preference, take it if it is usable
    (else the first free ids), then Allocate. The AllocateResponse, or the RpcError that fails the pod's admission."""
    return admitted(directory, available, size, NEURONDEVICE)[1]


def admitted(directory: Path, available: list[str], size: int, resource: str) -> tuple[list[str], Any]:
    """`admit` for `resource`: the ids the kubelet took, and the AllocateResponse or the RpcError."""
    ask = M["PreferredAllocationRequest"](
        container_requests=[
            M["ContainerPreferredAllocationRequest"](available_deviceIDs=available, allocation_size=size)
        ]
    )
    preferred = call(directory, resource, "GetPreferredAllocation", ask, "PreferredAllocationResponse")
    ids = list(preferred.container_responses[0].deviceIDs) or available[:size]
    return ids, allocate(directory, resource, ids)


def allocate(directory: Path, resource: str, ids: list[str]) -> Any:
    """The kubelet's Allocate of `ids` for one container: its response, or the RpcError."""
    grant = M["AllocateRequest"](container_requests=[M["ContainerAllocateRequest"](devicesIDs=ids)])
    try:
        return call(directory, resource, "Allocate", grant, "AllocateResponse").container_responses[0]
    except grpc.RpcError as exc:
        return exc


@pytest.mark.parametrize("foreign_pods", ["refuse", "allow"])
def test_the_kubelet_admitting_an_older_unplaced_pod_first_gives_it_nothing_signed_for_the_placed_one(
    directory: Path, neuron_plugins: KubegpuPluginManager, tmp_path: Path, foreign_pods: str
) -> None:
    host = tmp_path / "host"
    (host / "dev").mkdir(parents=True)
    for i in range(16):
        (host / "dev" / f"neuron{i}").touch()
    squatter = unplaced_pod("squatter", {"main": 4}, created="2025-01-01T00:00:01Z")
    placed = allocated_pod("placed", {"main": PLACED_IDS}, created="2025-01-01T00:00:02Z")
    status_written = threading.Event()  # the kubelet wrote the squatter's new phase ...
    stale_listings = [2]  # ... but the API server still answers the old one to the next two listings

    def list_pods() -> list[dict[str, Any]]:
        if status_written.is_set() and stale_listings[0] > 0:
            stale_listings[0] -= 1
            return [unplaced_pod("squatter", {"main": 4}, created="2025-01-01T00:00:01Z"), placed]
        return [squatter, placed]

    pods = PendingPods(list_pods, NODE, KEY)
    kubelet = FakeKubelet(directory)
    kubelet.start()
    service = DevicePluginService(
        neuron_plugins, pods, directory=directory, host_root=host, dev_root=Path("/dev"), interval=3600,
        foreign_pods=foreign_pods, settle_seconds=1.5,
    )  # fmt: skip
    service.start()
    try:
        kubelet.wait_registrations(2)
        # Only devices 4-7 are free (the others are busy): whatever the preference, the kubelet gives the squatter 4-7.
        # While both pods look pending, the device plugin lists them again for up to settle_seconds, then refuses.
        started = time.monotonic()
        answer = admit(directory, PLACED_IDS, 4)
        assert time.monotonic() - started < 2 * 1.5 + 1
        if foreign_pods == "refuse":
            assert isinstance(answer, grpc.RpcError) and answer.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "kubegpu: ambiguous check failed" in (answer.details() or "")
            assert "tenant/squatter" in (answer.details() or "")
        else:  # the ids the kubelet chose, as for any pod kubegpu did not place: nothing of the placed pod's record
            assert not isinstance(answer, grpc.RpcError), answer
            assert dict(answer.envs) == {"AWS_NEURON_VISIBLE_DEVICES": "4,5,6,7"}
            assert "coresPerDevice" not in str(answer) and "uid-placed" not in str(answer)

        # The kubelet writes the squatter's status (Failed, or Running) and admits the placed pod at once: the device
        # plugin lists the pods again until the squatter is no longer pending, then steers the kubelet to 4-7.
        squatter["status"]["phase"] = "Failed" if foreign_pods == "refuse" else "Running"
        status_written.set()
        answer = admit(directory, EVERYTHING, 4)
        assert not isinstance(answer, grpc.RpcError), answer
        assert dict(answer.envs) == {"AWS_NEURON_VISIBLE_DEVICES": "4,5,6,7"}
    finally:
        service.stop()
        kubelet.stop()


# ---------------------------------------------------------------------------------------------------------------
# GPU shares: one id per share slot, turned back into the GPU and the share the allocation names
# ---------------------------------------------------------------------------------------------------------------

GPU = "nvidia.com/gpu"


def one_gpu_nvml(count: int = 1, layouts: dict[int, list[tuple[str, int]]] | None = None) -> ModuleType:
    """A `pynvml` module over `count` GPUs of 16 GiB, or of 80 GiB with GPU g MIG-enabled as `layouts[g]` (profile,
    start slice) when given; MIG device i of GPU g has UUID MIG-g-i (no GPU here: only the library is made up)."""
    nvml = ModuleType("pynvml")
    migs = layouts or {}

    class NVMLError(Exception):
        pass

    def mig_handle(gpu: int, index: int) -> tuple[int, int]:
        if index >= len(migs.get(gpu, [])):
            raise NVMLError("Not Found")
        return (gpu, index)

    def name(handle: Any) -> str:
        if isinstance(handle, tuple):
            return f"NVIDIA A100-SXM4-80GB MIG {migs[handle[0]][handle[1]][0]}"
        return "NVIDIA A100-SXM4-80GB" if layouts is not None else "Tesla V100-SXM2-16GB"

    def info(instance: tuple[int, int]) -> Any:
        return SimpleNamespace(placement=SimpleNamespace(start=migs[instance[0]][instance[1] - 1][1]))

    memory = (81920 if layouts is not None else 16384) << 20
    functions: dict[str, Any] = {
        "NVMLError": NVMLError,
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: count,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetHandleByUUID": lambda uuid: int(uuid.rsplit("-", 1)[1]),
        "nvmlDeviceGetMinorNumber": lambda h: h,
        "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=f"00000000:{0x10 + h:02X}:00.0"),
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=memory),
        "nvmlDeviceGetName": name,
        "nvmlDeviceGetUUID": lambda h: f"MIG-{h[0]}-{h[1]}" if isinstance(h, tuple) else f"GPU-{h}",
        "nvmlDeviceGetMigMode": lambda h: (1, 1) if h in migs else (0, 0),
        "nvmlDeviceGetMaxMigDeviceCount": lambda h: 7 if h in migs else 0,
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
        "nvmlDeviceGetGpuInstanceId": lambda m: m[1] + 1,
        "nvmlDeviceGetGpuInstanceById": lambda h, i: (h, i),
        "nvmlGpuInstanceGetInfo": info,
    }
    for key, value in functions.items():
        setattr(nvml, key, value)
    return nvml


@pytest.fixture
def shared_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A node configured for shares (HAMi-core, split 4) with one fake GPU; its host root."""
    vgpu = tmp_path / "vgpu"
    (vgpu / "vgpulock").mkdir(parents=True)
    (vgpu / "libvgpu.so").write_bytes(b"")
    (vgpu / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    monkeypatch.setenv("KUBEGPU_NVIDIA_SHARE_LIMITS", "hami-core")
    monkeypatch.setenv("KUBEGPU_HAMI_CORE_DIR", str(vgpu))
    monkeypatch.setenv("KUBEGPU_NVIDIA_SPLIT_COUNT", "4")
    monkeypatch.setitem(sys.modules, "pynvml", one_gpu_nvml())
    host = tmp_path / "host"
    (host / "dev").mkdir(parents=True)
    return host


def share_pods(shares: dict[str, tuple[int, int]]) -> list[dict[str, Any]]:
    """Pods placed by the real engine on a one-GPU node offered as HAMi offers it (split 4): `name -> (cores, MiB)`."""
    plugins = build_plugin_manager("scheduler", plugins=[("nvidia", nvidia_scheduler)], autoload=False)
    engine = Engine(plugins, signing_key=KEY)
    labels = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "16384"}
    engine.add_node(
        make_node(NODE, labels=labels, allocatable={GPU: 4, "nvidia.com/gpucores": 100, "nvidia.com/gpumem": 16384})
    )
    pods = []
    for second, (name, (cores, mib)) in enumerate(shares.items()):
        manifest = pod_manifest(
            name, {"main": {GPU: 1, "nvidia.com/gpucores": cores, "nvidia.com/gpumem": mib}}, namespace="team"
        )
        manifest["metadata"].update(uid=f"uid-{name}", creationTimestamp=f"2025-01-01T00:00:0{second}Z")
        decision = engine.schedule(pod_request(manifest)[0])
        assert decision.scheduled, decision.reason
        manifest["metadata"]["annotations"].update(decision.annotations)
        manifest["spec"]["nodeName"] = NODE
        manifest["status"] = {"phase": "Pending"}
        pods.append(manifest)
    return pods


def test_a_node_configured_for_shares_lists_one_id_per_share_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = DeviceInventory(plugin="nvidia", devices=[DeviceInfo(id="0"), DeviceInfo(id="1", healthy=False)])
    monkeypatch.setenv("KUBEGPU_NVIDIA_SHARE_LIMITS", "hami-core")
    monkeypatch.setenv("KUBEGPU_NVIDIA_SPLIT_COUNT", "3")
    assert nvidia_device.kubegpu_device_plugin_ids(gpus) == {
        GPU: {"0::0": True, "0::1": True, "0::2": True, "1::0": False, "1::1": False, "1::2": False}
    }
    monkeypatch.setenv("KUBEGPU_NVIDIA_SPLIT_COUNT", "1")  # one share per GPU: the GPUs themselves
    assert nvidia_device.kubegpu_device_plugin_ids(gpus) == {GPU: {"0": True, "1": False}}
    monkeypatch.delenv("KUBEGPU_NVIDIA_SHARE_LIMITS")  # a node that does not share
    assert nvidia_device.kubegpu_device_plugin_ids(gpus) == {GPU: {"0": True, "1": False}}


def test_two_share_pods_on_one_gpu_each_get_a_slot_of_it_and_their_own_limits(
    directory: Path, shared_node: Path, make_plugin_manager: Callable[..., KubegpuPluginManager]
) -> None:
    listed = share_pods({"notebook": (30, 4096), "inference": (60, 8192)})
    kubelet = FakeKubelet(directory)
    kubelet.start()
    service = DevicePluginService(
        make_plugin_manager("device", nvidia=nvidia_device), PendingPods(lambda: listed, NODE, KEY),
        directory=directory, host_root=shared_node, dev_root=Path("/host/dev"), interval=3600,
    )  # fmt: skip
    service.start()
    try:
        assert [r.resource_name for r in kubelet.wait_registrations(1)] == [GPU]
        with grpc.insecure_channel(f"unix://{directory / socket_name(GPU)}") as channel:
            stream = channel.unary_stream(
                method_path(DEVICE_PLUGIN_PACKAGE, "DevicePlugin", "ListAndWatch"),
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=M["ListAndWatchResponse"].FromString,
            )(M["Empty"](), timeout=5)
            assert [d.ID for d in next(stream).devices] == ["0::0", "0::1", "0::2", "0::3"]
            stream.cancel()

        free = ["0::0", "0::1", "0::2", "0::3"]
        seen = {}
        for manifest in listed:  # the kubelet admits them in creation order, each taking one slot of GPU 0
            taken, answer = admitted(directory, free, 1, GPU)
            assert not isinstance(answer, grpc.RpcError), answer.details()
            seen[manifest["metadata"]["name"]] = answer
            free.remove(*taken)
            manifest["status"]["phase"] = "Running"
        assert free == ["0::2", "0::3"]  # the lowest free slot preferred each time
        for name, (cores, mib) in {"notebook": (30, 4096), "inference": (60, 8192)}.items():
            envs = dict(seen[name].envs)
            assert {k: v for k, v in envs.items() if k.startswith(("CUDA_", "NVIDIA_"))} == {
                "NVIDIA_VISIBLE_DEVICES": "0",
                "CUDA_DEVICE_SM_LIMIT": str(cores),
                "CUDA_DEVICE_SM_LIMIT_0": str(cores),
                "CUDA_OVERSUBSCRIBE": "false",
                "CUDA_TASK_PRIORITY": "1",
                "CUDA_REDIRECT": "/usr/local/vgpu/libvgpu.so",
                "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/cache/cudevshr.cache",
                "CUDA_DEVICE_MEMORY_LIMIT_0": f"{mib}m",
            }, name
            assert [d.container_path for d in seen[name].devices] == ["/dev/nvidia0"]
            assert "/usr/local/vgpu/libvgpu.so" in {m.container_path for m in seen[name].mounts}

        # Two slots of GPU 0 for one container: a share of two GPUs cannot be two shares of one.
        refused = allocate(directory, GPU, ["0::2", "0::3"])
        assert isinstance(refused, grpc.RpcError) and refused.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "kubegpu: shares check failed: nvidia.com/gpu 0::2,0::3: 2 share slots of device 0" in (
            refused.details() or ""
        )
        # A slot nobody's allocation names (both pods started): refused, naming the GPU the slot is a share of.
        refused = allocate(directory, GPU, ["0::3"])
        assert isinstance(refused, grpc.RpcError)
        assert "nvidia.com/gpu 0::3 (shares of device 0): no pod bound to this node" in (refused.details() or "")
    finally:
        service.stop()
        kubelet.stop()


@pytest.mark.parametrize(
    ("mount_path", "refused"),
    [
        ("/overrideEnv", True),
        ("//overrideEnv", True),
        ("/tmp/../overrideEnv", True),
        ("/etc/ld.so.preload", True),
        ("/usr/local/vgpu/cache", True),
        ("/usr/local/vgpu/cache/cudevshr.cache", True),
        ("/tmp/vgpulock/lock", True),
        ("/tmp", False),  # a parent: the node's mounts lie deeper, and the runtime mounts them on top
        ("/usr/local", False),
        ("/data", False),
    ],
)
def test_a_share_container_mounting_a_volume_over_a_path_the_node_owns_is_refused_naming_it(
    directory: Path,
    shared_node: Path,
    make_plugin_manager: Callable[..., KubegpuPluginManager],
    mount_path: str,
    refused: bool,
) -> None:
    """The CRI shim removes a tenant's volume at a path the node owns (`/overrideEnv`, whose lines HAMi-core sets
    over the environment; `/etc/ld.so.preload`; the shared region's directory); a device plugin cannot, and the
    kubelet mounts the pod's volumes after the device plugin's mounts, so the runtime mounted the tenant's on top and
    the share's limits were the tenant's. Such a container is refused its admission, the mount named."""
    listed = share_pods({"notebook": (30, 4096), "inference": (20, 2048)})
    listed[0]["spec"]["containers"][0]["volumeMounts"] = [{"name": "settings", "mountPath": mount_path}]
    with serving_gpus(directory, make_plugin_manager("device", nvidia=nvidia_device), listed, shared_node):
        _, answer = admitted(directory, ["0::0", "0::1", "0::2", "0::3"], 1, GPU)
        if not refused:
            assert not isinstance(answer, grpc.RpcError), answer.details()
            assert dict(answer.envs)["CUDA_DEVICE_SM_LIMIT_0"] == "30"
            return
        assert isinstance(answer, grpc.RpcError), f"admitted with a volume at {mount_path}"
        assert answer.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert f"kubegpu: mount check failed: pod team/notebook container main mounts a volume at {mount_path!r}" in (
            answer.details() or ""
        ), answer.details()
        # ...and the device plugin goes on serving: the kubelet fails the pod, and admits the next one
        listed[0]["status"]["phase"] = "Failed"
        _, answer = admitted(directory, ["0::0", "0::1", "0::2", "0::3"], 1, GPU)
        assert not isinstance(answer, grpc.RpcError), answer.details()
        assert dict(answer.envs)["CUDA_DEVICE_SM_LIMIT_0"] == "20"


def test_a_share_admitted_while_the_pods_gone_are_forgotten_keeps_its_region_directory(
    directory: Path, shared_node: Path, make_plugin_manager: Callable[..., KubegpuPluginManager]
) -> None:
    """At every interval the device plugin lists the node's pods and the nvidia plugin removes the region directories
    of the others (T140). A pod bound after that listing and admitted before the removal would lose the directory
    its Allocate just made: the Allocate waits for the removal (one lock spans both), so its directory stays."""
    pending = share_pods({"notebook": (30, 4096)})
    listed: list[dict[str, Any]] = []
    forget_listed, go_on = threading.Event(), threading.Event()

    def list_pods() -> list[dict[str, Any]]:
        answer = list(listed)
        if threading.current_thread().name == "forget":
            forget_listed.set()
            assert go_on.wait(10)
        return answer

    kubelet = FakeKubelet(directory)
    kubelet.start()
    service = DevicePluginService(
        make_plugin_manager("device", nvidia=nvidia_device), PendingPods(list_pods, NODE, KEY),
        directory=directory, host_root=shared_node, dev_root=Path("/host/dev"), interval=3600,
    )  # fmt: skip
    service.start()
    region = Path(os.environ["KUBEGPU_HAMI_CORE_DIR"]) / "containers" / "uid-notebook_main"
    try:
        assert [r.resource_name for r in kubelet.wait_registrations(1)] == [GPU]
        forget = threading.Thread(target=service.forget_gone_pods, name="forget")
        forget.start()
        assert forget_listed.wait(10)
        listed.extend(pending)  # bound after the removal listed the node's pods, admitted at once
        with futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(allocate, directory, GPU, ["0::0"])
            with pytest.raises(futures.TimeoutError):
                answer.result(timeout=0.2)  # held behind the removal
            go_on.set()
            assert not isinstance(answer.result(timeout=10), grpc.RpcError)
        forget.join(10)
        assert region.is_dir()
        service.forget_gone_pods()  # the next removal lists the pod: kept
        assert region.is_dir()
        listed.clear()  # the pod ended and was deleted
        service.forget_gone_pods()
        assert not region.exists()
    finally:
        go_on.set()
        service.stop()
        kubelet.stop()


@pytest.mark.parametrize("path", ["/etc/ld.so.preload", "/overrideEnv", "/usr/local/vgpu/cache/cudevshr.cache"])
def test_a_share_container_whose_termination_message_path_is_one_the_node_owns_is_refused_naming_it(
    directory: Path, shared_node: Path, make_plugin_manager: Callable[..., KubegpuPluginManager], path: str
) -> None:
    """The kubelet mounts a fresh, empty, writable file of its own at a container's `terminationMessagePath`, after
    the device plugin's mounts and the pod's volumes, so the runtime mounts it on top of whatever the node put
    there: at `/etc/ld.so.preload` HAMi-core is never loaded and the 30 % share runs with the whole GPU; at
    `/overrideEnv` or in the region directory the container's own file replaces the node's. The pod spec names the
    path, no volume: such a container is refused as one mounting a volume there is."""
    listed = share_pods({"notebook": (30, 4096), "inference": (20, 2048)})
    listed[0]["spec"]["containers"][0]["terminationMessagePath"] = path
    with serving_gpus(directory, make_plugin_manager("device", nvidia=nvidia_device), listed, shared_node):
        _, answer = admitted(directory, ["0::0", "0::1", "0::2", "0::3"], 1, GPU)
        assert isinstance(answer, grpc.RpcError), f"admitted with its termination message at {path}"
        assert answer.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert (
            f"kubegpu: mount check failed: pod team/notebook container main mounts its termination message file at "
            f"{path!r}" in (answer.details() or "")
        ), answer.details()
        listed[0]["status"]["phase"] = "Failed"
        _, answer = admitted(directory, ["0::0", "0::1", "0::2", "0::3"], 1, GPU)
        assert not isinstance(answer, grpc.RpcError), answer.details()
        assert dict(answer.envs)["CUDA_DEVICE_SM_LIMIT_0"] == "20"


def test_an_init_container_asking_a_share_of_its_apps_whole_gpu_is_admitted_held_to_its_share(
    directory: Path, shared_node: Path, make_plugin_manager: Callable[..., KubegpuPluginManager]
) -> None:
    """A HAMi user's check before the app: the init container asks 30 % of a GPU, the app the whole GPU, on a node
    offering shares (split 4). The kubelet allocates the init container a slot of the GPU the allocation names to it
    (the app's) and hands the app that slot: the init container is admitted held to 30 % of the GPU's compute, the
    app with the whole GPU, unlimited."""
    plugins = build_plugin_manager("scheduler", plugins=[("nvidia", nvidia_scheduler)], autoload=False)
    engine = Engine(plugins, signing_key=KEY)
    engine.add_node(
        make_node(NODE, labels={"nvidia.com/gpu.count": "1"}, allocatable={GPU: 4, "nvidia.com/gpucores": 100})
    )
    manifest = pod_manifest("checked", {"main": {GPU: 1}}, namespace="team")
    manifest["spec"]["initContainers"] = [
        {"name": "check", "resources": {"limits": {GPU: "1", "nvidia.com/gpucores": "30"}}}
    ]
    manifest["metadata"].update(uid="uid-checked", creationTimestamp="2025-01-01T00:00:00Z")
    decision = engine.schedule(pod_request(manifest, plugins.qualifiers)[0])
    assert decision.scheduled, decision.reason
    manifest["metadata"]["annotations"].update(decision.annotations)
    manifest["spec"]["nodeName"] = NODE
    manifest["status"] = {"phase": "Pending"}

    with serving_gpus(directory, make_plugin_manager("device", nvidia=nvidia_device), manifest, shared_node):
        taken, answer = admitted(directory, ["0::0", "0::1", "0::2", "0::3"], 1, GPU)
        assert not isinstance(answer, grpc.RpcError), answer.details()
        envs = dict(answer.envs)
        assert envs["NVIDIA_VISIBLE_DEVICES"] == "0"
        assert {k: v for k, v in envs.items() if k.startswith("CUDA_DEVICE_SM_LIMIT")} == {
            "CUDA_DEVICE_SM_LIMIT": "30",
            "CUDA_DEVICE_SM_LIMIT_0": "30",
        }
        answer = allocate(directory, GPU, taken)  # the kubelet hands the app the init container's slot
        assert not isinstance(answer, grpc.RpcError), answer.details()
        assert {k: v for k, v in dict(answer.envs).items() if k.startswith(("CUDA_", "NVIDIA_"))} == {
            "NVIDIA_VISIBLE_DEVICES": "0"
        }


def test_a_pod_kubegpu_did_not_place_is_refused_a_share_slot_even_where_foreign_pods_are_allowed(
    directory: Path, shared_node: Path, make_plugin_manager: Callable[..., KubegpuPluginManager]
) -> None:
    """A share's limits come from the scheduler's signed allocation. A pod kubegpu did not place has none: granted a
    slot, it would get the whole GPU without limits, over the shares the placed pods on that GPU were promised."""
    listed = share_pods({"notebook": (30, 4096)})
    kubelet = FakeKubelet(directory)
    kubelet.start()
    service = DevicePluginService(
        make_plugin_manager("device", nvidia=nvidia_device), PendingPods(lambda: listed, NODE, KEY),
        directory=directory, host_root=shared_node, dev_root=Path("/host/dev"), interval=3600,
        foreign_pods="allow", settle_seconds=0.2,
    )  # fmt: skip
    service.start()
    try:
        kubelet.wait_registrations(1)
        taken, answer = admitted(directory, ["0::0", "0::1", "0::2", "0::3"], 1, GPU)
        assert not isinstance(answer, grpc.RpcError), answer.details()
        assert (taken, dict(answer.envs)["CUDA_DEVICE_SM_LIMIT"]) == (["0::0"], "30")  # the placed pod's share
        listed[0]["status"]["phase"] = "Running"
        squatter = unplaced_pod("squatter", {}, created="2025-01-01T00:00:05Z")
        squatter["spec"]["containers"] = [asking("main", 1, GPU)]
        listed.append(squatter)
        answer = allocate(directory, GPU, ["0::1"])  # the kubelet admits the squatter to the next slot of GPU 0
        assert isinstance(answer, grpc.RpcError), f"a share slot granted without limits: {dict(answer.envs)}"
        assert answer.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert (
            "kubegpu: foreign-share check failed: nvidia.com/gpu 0::1 (shares of device 0): no pod bound to this node "
            "has a verified kubegpu.io/allocation for these share slots, and a share's limits come only from one"
        ) in (answer.details() or "")
    finally:
        service.stop()
        kubelet.stop()


def test_share_slots_are_read_back_as_their_devices_or_refused() -> None:
    assert shared_devices(GPU, ["1::0", "0::7"]) == ["1", "0"]
    assert shared_devices(GPU, ["0", "1"]) == ["0", "1"]  # a node that does not share
    for ids, wrong in ((["0::0", "1"], "mixed with device ids (1)"), (["2::1", "2::0"], "2 share slots of device 2")):
        with pytest.raises(AllocationRefused, match=re.escape(wrong)) as refused:
            shared_devices(GPU, ids)
        assert refused.value.check == "shares"
    with pytest.raises(AllocationRefused) as many:  # a container asking a thousand slots: the message stays short
        shared_devices(GPU, [f"0::{slot}" for slot in range(1000)])
    assert "and 992 more: 1000 share slots of device 0" in str(many.value) and len(str(many.value)) < 400
    assert [share_slot(i) for i in ("0::3", "card0", "0::", "::3", "0::1000", "0::-1", "a::b::2")] == [
        ("0", 3),
        None,
        None,
        None,
        None,
        None,
        ("a::b", 2),
    ]


def test_a_container_asking_every_share_slot_of_a_big_node_is_refused_in_time_linear_in_its_ids() -> None:
    """32 GPUs split 1000 ways (`KUBEGPU_NVIDIA_SPLIT_COUNT` allows it) are 32,000 slot ids, and a tenant's
    `nvidia.com/gpu: 32000` has the kubelet send them all in one Allocate: counting each id's device among all the
    others was 32,000 x 32,000 steps (6 s of the device plugin's CPU; 64 GPUs, 47 s)."""
    ids = [f"{gpu}::{slot}" for gpu in range(32) for slot in range(1000)]
    started = time.process_time()
    with pytest.raises(AllocationRefused, match="1000 share slots of device 0 for one container"):
        shared_devices(GPU, ids)
    assert time.process_time() - started < 1.0


# ---------------------------------------------------------------------------------------------------------------
# MIG devices, where the node serves them from kubegpu's device plugin
# ---------------------------------------------------------------------------------------------------------------


def test_a_node_serving_mig_lists_each_mig_device_and_a_pod_gets_the_one_its_allocation_names(
    directory: Path,
    make_plugin_manager: Callable[..., KubegpuPluginManager],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # GPU 0 whole, GPU 1 laid out 3g.40gb@0, 2g.20gb@4, 1g.10gb@6 (NVML's order: the 2g.20gb is MIG device 1).
    monkeypatch.setitem(sys.modules, "pynvml", one_gpu_nvml(2, {1: [("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)]}))
    host = tmp_path / "host"
    (host / "dev").mkdir(parents=True)
    plugins = make_plugin_manager("device", nvidia=nvidia_device)
    inventory = nvidia_device.kubegpu_device_discover(host_root=host)
    assert inventory is not None
    assert list(nvidia_device.kubegpu_device_plugin_ids(inventory)) == [GPU]  # NVIDIA's device plugin serves MIG
    monkeypatch.setenv("KUBEGPU_NVIDIA_SERVE_MIG", "true")
    assert nvidia_device.kubegpu_device_plugin_ids(inventory) == {
        GPU: {"0": True},
        "nvidia.com/mig-3g.40gb": {"1@0": True},
        "nvidia.com/mig-2g.20gb": {"1@4": True},
        "nvidia.com/mig-1g.10gb": {"1@6": True},
    }

    record = merge_allocations(
        NODE, "uid-mig", [PluginAllocation(plugin="nvidia", containers={"main": {"nvidia.com/mig-2g.20gb": ["1@4"]}})]
    )
    manifest = {
        "metadata": {
            "name": "mig",
            "namespace": "team",
            "uid": "uid-mig",
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "annotations": {ALLOCATION_KEY: encode_allocation(sign_allocation(record, KEY))},
        },
        "spec": {"nodeName": NODE, "containers": [asking("main", 1, "nvidia.com/mig-2g.20gb")]},
        "status": {"phase": "Pending"},
    }
    kubelet = FakeKubelet(directory)
    kubelet.start()
    service = DevicePluginService(
        plugins, PendingPods(lambda: [manifest], NODE, KEY), directory=directory, host_root=host,
        dev_root=Path("/host/dev"), interval=3600,
    )  # fmt: skip
    service.start()
    try:
        registered = kubelet.wait_registrations(4)
        assert sorted(r.resource_name for r in registered) == [
            GPU, "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"
        ]  # fmt: skip
        taken, answer = admitted(directory, ["1@4"], 1, "nvidia.com/mig-2g.20gb")
        assert taken == ["1@4"] and not isinstance(answer, grpc.RpcError), answer
        assert dict(answer.envs) == {"NVIDIA_VISIBLE_DEVICES": "MIG-1-1"}
        assert [d.container_path for d in answer.devices] == ["/dev/nvidia1"]
        assert [d.name for d in answer.cdi_devices] == ["nvidia.com/gpu=1:1"]
        # A MIG device no verified allocation names (the kubelet's own pick for a pod kubegpu did not place): refused.
        refused = allocate(directory, "nvidia.com/mig-3g.40gb", ["1@0"])
        assert isinstance(refused, grpc.RpcError) and refused.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "nvidia.com/mig-3g.40gb 1@0: no pod bound to this node has a verified" in (refused.details() or "")
    finally:
        service.stop()
        kubelet.stop()


def two_gpu_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, count: int = 2) -> tuple[Engine, Path]:
    """An engine with the node of two GPUs (or `count`; NVML faked for the device-plugin side), and the node's host
    root."""
    monkeypatch.setitem(sys.modules, "pynvml", one_gpu_nvml(count))
    host = tmp_path / "host"
    (host / "dev").mkdir(parents=True)
    engine = Engine(
        build_plugin_manager("scheduler", plugins=[("nvidia", nvidia_scheduler)], autoload=False), signing_key=KEY
    )
    engine.add_node(make_node(NODE, labels={"nvidia.com/gpu.count": str(count)}, allocatable={GPU: count}))
    return engine, host


@contextmanager
def serving_gpus(
    directory: Path, plugins: KubegpuPluginManager, pods: dict[str, Any] | list[dict[str, Any]], host: Path
) -> Iterator[FakeKubelet]:
    """The device-plugin mode serving nvidia GPUs to a fake kubelet, `pods` the node's pending pod or pods (a list
    the test may change as it goes), once it registered `nvidia.com/gpu`."""
    listed = pods if isinstance(pods, list) else [pods]
    kubelet = FakeKubelet(directory)
    kubelet.start()
    service = DevicePluginService(
        plugins, PendingPods(lambda: listed, NODE, KEY),
        directory=directory, host_root=host, dev_root=Path("/host/dev"), interval=3600,
    )  # fmt: skip
    service.start()
    try:
        assert [r.resource_name for r in kubelet.wait_registrations(1)] == [GPU]
        yield kubelet
    finally:
        service.stop()
        kubelet.stop()


def init_container_admitted_with(directory: Path, signed_gpu: list[str]) -> list[str]:
    """The GPUs the kubelet's Allocate for the pod's init container (of the node's two) is admitted with: the ones
    its allocation names, the container seeing them."""
    taken, answer = admitted(directory, ["0", "1"], 1, GPU)
    assert not isinstance(answer, grpc.RpcError), answer.details()
    assert taken == signed_gpu and dict(answer.envs)["NVIDIA_VISIBLE_DEVICES"] == signed_gpu[0]
    return taken


def test_a_placed_pods_init_container_asking_gpus_is_admitted_with_gpus_of_its_pod(
    directory: Path,
    make_plugin_manager: Callable[..., KubegpuPluginManager],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A pod whose init container checks its GPU before the app starts (`nvidia.com/gpu: 1` on both), placed by the
    real engine: the scheduler counts the init container's devices among the pod's and names none of its own (the
    kubelet hands an init container's devices on to the containers after it), so the kubelet's Allocate for the init
    container matched no container and the pod failed admission, told that it must be scheduled by kubegpu. The init
    container now gets GPUs the allocation names for its pod (an app container's), and the app container the same."""
    engine, host = two_gpu_node(monkeypatch, tmp_path)
    engine.add_node(make_node("elsewhere", labels={"nvidia.com/gpu.count": "2"}, allocatable={GPU: 2}))
    manifest = pod_manifest("checked", {"main": {GPU: 1}}, namespace="team")
    manifest["spec"]["initContainers"] = [{"name": "gpu-check", "resources": {"limits": {GPU: "1"}}}]
    manifest["metadata"].update(uid="uid-checked", creationTimestamp="2025-01-01T00:00:00Z")
    decision = engine.schedule(pod_request(manifest)[0])
    assert decision.scheduled and decision.allocation is not None
    assert list(decision.allocation.containers) == ["main"]  # the scheduler names no device of the init container
    manifest["metadata"]["annotations"].update(decision.annotations)
    manifest["spec"]["nodeName"] = NODE
    manifest["status"] = {"phase": "Pending"}
    signed_gpu = decision.allocation.containers["main"][GPU]

    with serving_gpus(directory, make_plugin_manager("device", nvidia=nvidia_device), manifest, host):
        taken = init_container_admitted_with(directory, signed_gpu)
        answer = allocate(directory, GPU, taken)  # the app container, given the init container's GPU again
        assert not isinstance(answer, grpc.RpcError), answer.details()
        assert dict(answer.envs)["NVIDIA_VISIBLE_DEVICES"] == signed_gpu[0]


def test_a_pod_whose_only_gpus_are_its_init_containers_is_placed_with_them_named_and_admitted(
    directory: Path,
    make_plugin_manager: Callable[..., KubegpuPluginManager],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A pod whose init container alone asks a GPU (a firmware check or a model download before a cpu-only app): the
    engine counted the GPU among the pod's and named it to no container, so the pod got no allocation annotation and
    the kubelet's Allocate for the init container failed admission. The scheduler now names the init container's
    GPU (its own, held for the pod's life as the kubelet keeps it), and the kubelet admits it with that GPU."""
    engine, host = two_gpu_node(monkeypatch, tmp_path)
    manifest = pod_manifest("fetch", {"main": {"cpu": "1"}}, namespace="team")
    manifest["spec"]["initContainers"] = [{"name": "gpu-check", "resources": {"limits": {GPU: "1"}}}]
    manifest["metadata"].update(uid="uid-fetch", creationTimestamp="2025-01-01T00:00:00Z")
    decision = engine.schedule(pod_request(manifest)[0])
    assert decision.scheduled and decision.allocation is not None, decision
    assert list(decision.allocation.containers) == ["gpu-check"]
    signed_gpu = decision.allocation.containers["gpu-check"][GPU]
    assert len(signed_gpu) == 1
    # The init container's GPU is held, the node's other one free: a pod of 2 GPUs does not fit.
    assert not engine.schedule(pod_request(pod_manifest("two", {"main": {GPU: 2}}))[0]).scheduled
    manifest["metadata"]["annotations"].update(decision.annotations)
    manifest["spec"]["nodeName"] = NODE
    manifest["status"] = {"phase": "Pending"}

    with serving_gpus(directory, make_plugin_manager("device", nvidia=nvidia_device), manifest, host):
        init_container_admitted_with(directory, signed_gpu)


def test_an_init_container_is_given_its_gpus_from_the_init_container_that_holds_them() -> None:
    """Two init containers ask GPUs no app container asks (1, then 2): the scheduler has the pod's 2 held by the one
    that asks the most, and names the first of them to the other too, as the kubelet gives the second init container
    the first one's device and one more."""
    manifest = pod_manifest("p", {"main": {"cpu": 1}}, namespace="team")
    manifest["spec"]["initContainers"] = [
        {"name": "small", "resources": {"limits": {GPU: "1"}}}, {"name": "big", "resources": {"limits": {GPU: "2"}}}
    ]  # fmt: skip
    steps = pod_request(manifest)[0].init_steps
    record = merge_allocations(
        NODE, "uid-p", [PluginAllocation(plugin="nvidia", containers={"big": {GPU: ["0", "1"]}})], init=steps
    )
    candidate = Candidate(
        PodIdentity("team", "p", "uid-p"), "2025-01-01T00:00:00Z", record, ["small", "big", "main"],
        {"small": {GPU: 1}, "big": {GPU: 2}}, classic=frozenset({"small", "big"}),
    )  # fmt: skip
    assert candidate.ids("small", GPU) == ["0"]
    assert candidate.ids("big", GPU) == ["0", "1"]


def test_an_init_container_asking_more_gpus_than_the_app_is_admitted_and_the_app_with_any_of_them(
    directory: Path,
    make_plugin_manager: Callable[..., KubegpuPluginManager],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """An init container asks 4 GPUs, the app 1 (a check of the whole node's GPUs before a one-GPU server): the
    engine counts 4 for the pod, but the allocation named only the app's 1, so the kubelet's Allocate of 4 for the
    init container matched nothing and the pod failed admission. The allocation now names the init container's 4; the
    kubelet gives it them, then hands the app any one of them (it picks from the init container's devices at random,
    without asking the plugin), and that one is what the app is admitted with."""
    engine, host = two_gpu_node(monkeypatch, tmp_path, count=4)
    manifest = pod_manifest("checked", {"main": {GPU: 1}}, namespace="team")
    manifest["spec"]["initContainers"] = [{"name": "gpu-check", "resources": {"limits": {GPU: "4"}}}]
    manifest["metadata"].update(uid="uid-checked", creationTimestamp="2025-01-01T00:00:00Z")
    decision = engine.schedule(pod_request(manifest)[0])
    assert decision.scheduled and decision.allocation is not None, decision
    manifest["metadata"]["annotations"].update(decision.annotations)
    manifest["spec"]["nodeName"] = NODE
    manifest["status"] = {"phase": "Pending"}
    app_gpu = decision.allocation.containers["main"][GPU]

    with serving_gpus(directory, make_plugin_manager("device", nvidia=nvidia_device), manifest, host):
        taken, answer = admitted(directory, ["0", "1", "2", "3"], 4, GPU)
        assert not isinstance(answer, grpc.RpcError), answer.details()
        assert dict(answer.envs)["NVIDIA_VISIBLE_DEVICES"] == ",".join(taken)
        # The kubelet's reuse: the app gets one of the init container's GPUs, not necessarily the one named to it.
        reused = next(i for i in taken if i not in app_gpu)
        answer = allocate(directory, GPU, [reused])
        assert not isinstance(answer, grpc.RpcError), answer.details()
        assert dict(answer.envs)["NVIDIA_VISIBLE_DEVICES"] == reused
    assert sorted(decision.allocation.init["gpu-check"][GPU]) == sorted(taken) == ["0", "1", "2", "3"]


def init_checked_pod(name: str, init: int, apps: dict[str, list[str]], created: str) -> dict[str, Any]:
    """A pending pod placed by kubegpu whose init container `check` asks `init` Neuron devices before app containers
    holding `apps`: its allocation names what the init container is given, as the scheduler names it."""
    manifest = pod_manifest(name, {c: {NEURONDEVICE: len(ids)} for c, ids in apps.items()}, namespace="team")
    manifest["spec"]["initContainers"] = [asking("check", init)]
    manifest["spec"]["nodeName"] = NODE
    manifest["metadata"].update(uid=f"uid-{name}", creationTimestamp=created)
    manifest["status"] = {"phase": "Pending"}
    steps = pod_request(manifest)[0].init_steps
    part = PluginAllocation(plugin="neuron", containers={c: {NEURONDEVICE: ids} for c, ids in apps.items()})
    record = sign_allocation(merge_allocations(NODE, f"uid-{name}", [part], init=steps), KEY)
    manifest["metadata"]["annotations"][ALLOCATION_KEY] = encode_allocation(record)
    return manifest


def test_containers_after_an_init_container_get_whichever_of_their_pods_ids_the_kubelet_hands_them() -> None:
    """The init container asks 2, then app `a` 1 and app `b` 2 (the pod holds 3: 4, 5, 6; the init container is
    given 4 and 5). The kubelet hands `a` one of the init container's at its own pick (5, not the 4 named to it), and
    `b` the other (4) with one more it asks the plugin for: `b` is steered to the pod's 6 and admitted with 4 and 6.
    Ids of another pod's are never taken for this one's, and a pod kubegpu did not place asking the same count
    still makes the call ambiguous."""
    pods = pending(init_checked_pod("p", 2, {"a": ["4"], "b": ["5", "6"]}, "2025-01-01T00:00:00Z"))
    pods.refresh()
    assert pods.preferred(NEURONDEVICE, EVERYTHING, [], 2) == ["4", "5"]
    assert pods.claim(NEURONDEVICE, ["5", "4"]) is not None
    assert pods.claim(NEURONDEVICE, ["9"]) is None  # not the pod's: refused (missing) by the caller
    candidate, container = pods.claim(NEURONDEVICE, ["5"]) or (None, "")
    assert candidate is not None and candidate.pod.name == "p" and container == "a"
    free = [i for i in EVERYTHING if i != "5"]
    assert pods.preferred(NEURONDEVICE, free, ["4"], 2) == ["4", "6"]
    candidate, container = pods.claim(NEURONDEVICE, ["6", "4"]) or (None, "")
    assert candidate is not None and container == "b"

    squatter = unplaced_pod("squatter", {"main": 1}, created="2025-01-01T00:00:01Z")
    pods = pending(init_checked_pod("p", 2, {"a": ["4"], "b": ["5", "6"]}, "2025-01-01T00:00:00Z"), squatter)
    pods.refresh()
    assert pods.claim(NEURONDEVICE, ["4", "5"]) is not None  # the init container asks 2, the squatter 1
    with pytest.raises(AllocationRefused) as refused:
        pods.claim(NEURONDEVICE, ["5"])
    assert refused.value.check == "ambiguous" and "tenant/squatter" in str(refused.value)


def test_an_allocation_written_before_the_init_field_still_admits_its_init_container_with_its_pods_ids() -> None:
    """A pod placed by a scheduler from before the allocation named init containers' devices (`init`), pending while
    the node side is upgraded: its init container asks the app's one device, which the allocation names to the app
    alone. The device plugin then gave the init container the app's id; reading the missing `init` as "given
    nothing" refused the pod's admission (no preference, Allocate `missing`) and, its init container reading as
    unplaced, refused another placed pod asking as many as ambiguous. The pod's own signed ids are still given."""
    old = allocated_pod("old", {"main": ["4"]})
    old["spec"]["initContainers"] = [asking("check", 1)]
    other = allocated_pod("other", {"main": ["5"]}, created="2025-01-01T00:00:01Z")
    pods = pending(old, other)
    pods.refresh()
    assert pods.preferred(NEURONDEVICE, EVERYTHING, [], 1) == ["4"]
    candidate, container = pods.claim(NEURONDEVICE, ["4"]) or (None, "")
    assert candidate is not None and (candidate.pod.name, container) == ("old", "check")
    candidate, container = pods.claim(NEURONDEVICE, ["4"]) or (None, "")  # the app, given the init container's again
    assert candidate is not None and (candidate.pod.name, container) == ("old", "main")

    pods = pending(old, other)
    pods.refresh()
    candidate, container = pods.claim(NEURONDEVICE, ["5"]) or (None, "")
    assert candidate is not None and (candidate.pod.name, container) == ("other", "main")


# ---------------------------------------------------------------------------------------------------------------
# A container's own env ranks above Allocate's (the kubelet passes it after): what could stand in is refused
# ---------------------------------------------------------------------------------------------------------------

I915, TILES = "gpu.intel.com/i915", "gpu.intel.com/tiles"


def intel_tile_pod(
    engine: Engine, name: str, env: list[dict[str, Any]], env_from: list[dict[str, Any]], tiles: int
) -> dict[str, Any]:
    """A pod the scheduler placed on the node's two 2-tile cards: one container asking one card (and `tiles` of it),
    with its own `env` and `envFrom`."""
    plugins = build_plugin_manager("scheduler", plugins=[("intel-gas", intel_scheduler)], autoload=False)
    manifest = pod_manifest(name, {"main": {I915: 1, **({TILES: tiles} if tiles else {})}}, namespace="team")
    manifest["spec"]["containers"][0].update(env=env, envFrom=env_from)
    manifest["metadata"].update(uid=f"uid-{name}", creationTimestamp="2025-01-01T00:00:00Z")
    decision = engine.schedule(pod_request(manifest, plugins.qualifiers)[0])
    assert decision.scheduled, decision.reason
    manifest["metadata"]["annotations"].update(decision.annotations)
    manifest["spec"]["nodeName"] = NODE
    manifest["status"] = {"phase": "Pending"}
    return manifest


@pytest.mark.parametrize(
    ("env", "env_from", "tiles", "outcome"),
    [
        ([], [], 1, {"ZE_AFFINITY_MASK": "0", "ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}),
        # the hierarchy the container asks for, written as the node writes it: the mask is written in it, as the shim
        (
            [{"name": "ZE_FLAT_DEVICE_HIERARCHY", "value": "COMPOSITE"}],
            [],
            1,
            {"ZE_AFFINITY_MASK": "0.0", "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"},
        ),
        ([{"name": "ZE_FLAT_DEVICE_HIERARCHY", "value": "composite"}], [], 1, "sets ZE_FLAT_DEVICE_HIERARCHY"),
        ([{"name": "ZE_FLAT_DEVICE_HIERARCHY", "value": "COMBINED"}], [], 1, "to 'COMBINED'"),
        (
            [{"name": "ZE_FLAT_DEVICE_HIERARCHY", "valueFrom": {"configMapKeyRef": {"name": "l0", "key": "h"}}}],
            [],
            1,
            "set from elsewhere (valueFrom)",
        ),
        ([{"name": "ZE_AFFINITY_MASK", "value": "0,1"}], [], 1, "the intel-gas plugin owns it"),
        ([{"name": "ZE_AFFINITY_MASK", "value": "0,1"}], [], 0, "the intel-gas plugin owns it"),
        ([], [{"configMapRef": {"name": "settings"}}], 1, "imports env from a ConfigMap or Secret (envFrom) without"),
        ([], [{"configMapRef": {"name": "settings"}, "prefix": "ZE_"}], 1, "with the prefix 'ZE_'"),
        ([], [{"configMapRef": {"name": "settings"}, "prefix": "APP_"}], 1, {"ZE_AFFINITY_MASK": "0"}),
        # a whole card: the node sets no hierarchy, and the container's own is its business
        ([{"name": "ZE_FLAT_DEVICE_HIERARCHY", "value": "COMBINED"}], [], 0, {"KUBEGPU_INTEL_CARDS": "card0"}),
    ],
    ids=[
        "none", "composite-exactly", "composite-spelled-otherwise", "combined", "value-from", "own-mask",
        "own-mask-whole-card", "env-from-without-prefix", "env-from-prefix-reaching", "env-from-prefix-apart",
        "whole-card-hierarchy",
    ],
)  # fmt: skip
def test_a_containers_own_env_never_stands_in_for_what_the_device_plugin_sets(
    make_plugin_manager: Callable[..., KubegpuPluginManager],
    env: list[dict[str, Any]],
    env_from: list[dict[str, Any]],
    tiles: int,
    outcome: dict[str, str] | str,
) -> None:
    """The kubelet passes Allocate's env first and the container's own env after it, and the runtime keeps the last:
    a real kubelet and containerd ran a container given tile gt0 of card0 with `ZE_AFFINITY_MASK=0` (the node's) and
    `ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE` (its own), which Level Zero reads as the whole of card0, both tiles (T210).
    A hierarchy written exactly as the node writes it is honoured (the mask is written in it, as the CRI shim does);
    anything else that would stand in for what Allocate sets, or for what the plugin owns, refuses the container."""
    engine = Engine(
        build_plugin_manager("scheduler", plugins=[("intel-gas", intel_scheduler)], autoload=False), signing_key=KEY
    )
    engine.add_node(make_node(NODE, labels={"gpu.intel.com/gpu-numbers": "0.1"}, allocatable={I915: 2, TILES: 4}))
    pods = pending(intel_tile_pod(engine, "tiled", env, env_from, tiles))
    pods.refresh()
    claimed = pods.claim(I915, ["card0"])
    assert claimed is not None
    plugins = make_plugin_manager("device", **{"intel-gas": intel_device})
    try:
        answer = allocate_response(plugins, "intel-gas", *claimed, I915, ["card0"], Path("/host/dev"))
    except AllocationRefused as refused:
        assert isinstance(outcome, str), f"refused: {refused}"
        assert refused.check == "env" and "pod team/tiled container main" in str(refused)
        assert outcome in str(refused), str(refused)
        return
    assert isinstance(outcome, dict), f"admitted with {dict(answer.envs)}"
    seen = {**dict(answer.envs), **{e["name"]: e.get("value") for e in env}}  # the kubelet's order: its own last
    assert {name: seen.get(name) for name in outcome} == outcome


# ---------------------------------------------------------------------------------------------------------------
# Which node this is (T217): --node-name naming another node would sweep and allocate on that node's pods
# ---------------------------------------------------------------------------------------------------------------

HERE = HostIdentity("b00t-here", "m4chine-here", "/host/etc/machine-id")


@pytest.mark.parametrize(
    ("node_info", "host", "says"),
    [
        ({"bootID": "b00t-here", "machineID": "m4chine-here"}, HERE, None),
        ({"bootID": "b00t-here"}, HERE, None),  # a kubelet that could not read a machine ID
        ({"bootID": "b00t-here", "machineID": "whatever"}, HostIdentity("b00t-here", ""), None),
        (
            {"bootID": "b00t-there", "machineID": "m4chine-here"},
            HERE,
            "--node-name 'gpu-7' names a node whose kubelet runs on another host: its boot ID is 'b00t-there', this "
            "host's is 'b00t-here' (/proc/sys/kernel/random/boot_id); set --node-name to this node's name (a "
            "DaemonSet's spec.nodeName: the node whose status.nodeInfo.bootID is 'b00t-here')",
        ),
        (  # containers posing as nodes share a kernel: their machine IDs tell them apart; or the ID read is the
            # device plugin's container's own (--host-root left at /): the sentence says both changes. It reaches the
            # pod the kubelet could not admit: no machine ID is quoted (T222)
            {"bootID": "b00t-here", "machineID": "m4chine-there"},
            HERE,
            "--node-name 'gpu-7' names a node whose kubelet runs on another host: its machine ID "
            "(status.nodeInfo.machineID) is not this host's (/host/etc/machine-id); set --node-name to this node's "
            "name (a DaemonSet's spec.nodeName: the node whose status.nodeInfo.bootID is 'b00t-here'); or, run in a "
            "container, --host-root to where the host's / is",
        ),
        (
            {},
            HERE,
            "--node-name 'gpu-7' names a node that reports no boot ID: no kubelet runs it; set --node-name to this "
            "node's name (a DaemonSet's spec.nodeName: the node whose status.nodeInfo.bootID is 'b00t-here')",
        ),
        (
            {"bootID": "x\n" + "y" * 500},
            HERE,
            "--node-name 'gpu-7' names a node whose kubelet runs on another host: its boot ID is 'x\\n"
            + "y" * 62
            + "', this host's is 'b00t-here' (/proc/sys/kernel/random/boot_id); set --node-name to this node's name (a "
            "DaemonSet's spec.nodeName: the node whose status.nodeInfo.bootID is 'b00t-here')",
        ),
        ({"bootID": "b00t-there"}, HostIdentity("", "m4chine-here", "/etc/machine-id"), None),  # nothing to compare
        ("not a mapping", HostIdentity("", ""), None),
    ],
    ids=[
        "same-host",
        "no-machine-id-on-the-node",
        "no-machine-id-here",
        "another-boot-id",
        "another-machine-id",
        "no-kubelet-behind-the-node",
        "its-text-quoted-and-cut",
        "no-boot-id-here",
        "node-info-not-a-mapping",
    ],
)
def test_a_node_name_is_believed_only_for_this_hosts_node(node_info: Any, host: HostIdentity, says: str | None) -> None:
    said = wrong_node("gpu-7", node_info, host)
    assert said == says
    # The kubelet writes an Allocate refusal into the status of the pod it could not admit, which its tenant reads:
    # the host's machine ID, kept from containers, is never in it (T222)
    assert said is None or not any(mid in said for mid in ("m4chine-here", "m4chine-there"))


def test_this_hosts_identity_is_read_where_its_kubelet_reads_it(tmp_path: Path) -> None:
    (tmp_path / "boot_id").write_text("b00t-here\n")
    (tmp_path / "var" / "lib" / "dbus").mkdir(parents=True)
    (tmp_path / "var" / "lib" / "dbus" / "machine-id").write_text("from-dbus\n")
    assert HostIdentity.read(tmp_path, tmp_path / "boot_id") == HostIdentity(
        "b00t-here", "from-dbus", str(tmp_path / "var/lib/dbus/machine-id")
    )
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "machine-id").write_text("from-etc\n")
    assert HostIdentity.read(tmp_path, tmp_path / "boot_id").machine_id == "from-etc"
    assert HostIdentity.read(tmp_path / "none", tmp_path / "none") == HostIdentity("", "")
