"""`kubegpu device-plugin` with a real kubelet 1.20 that talks to containerd directly (a managed node: no CRI shim).

The device plugin registers every resource with the kubelet, and the Node's capacity shows them: sixteen Neuron
devices and two Intel cards (fake device files and sysfs under a temporary host root). `kubegpu scheduler` places
pods; the kubelet asks the device plugin which ids it prefers (the ones the scheduler signed for the pod), allocates
them, and runs the container with what Allocate answered. A 4-device pod on the node as a trn1.32xlarge gets a torus
row, a 3-device pod on it as an inf2.48xlarge gets three ring neighbours, and a two-container Intel pod gets one
card per container: in each case exactly the ids the scheduler chose, as the containers themselves report them and
as the kubelet's own checkpoint records them. A pod bound with a forged allocation fails admission with kubegpu's
reason, and so does a tenant's pod with `spec.nodeName` written by hand that the kubelet admits just before a pod
kubegpu placed (a gate plugin holds the kubelet's admission queue so that both wait in it): the placed pod then
runs with its own devices. The kubelet restarts and the device plugin registers again. On a node configured for GPU
shares (HAMi-core, a fake NVML: no GPU here), the kubelet admits two share pods on the node's one GPU, each holding a
share slot of it, and each container runs with the GPU and its own limits. On the Intel cards as two-tile cards, a
container given a tile whose spec asks `ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE` runs with its mask written in COMPOSITE
(the kubelet passes the spec's env after Allocate's: it wins), one spelling it otherwise fails admission, and a classic
init container asking a tile runs masked to a tile of its pod's. A device plugin whose `--node-name` is another
node's sweeps nothing, and a pod the kubelet asks it a GPU for fails admission with its reason; started again with
this node's name, it serves the pod made again.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubegpu.core.annotations import ALLOCATION_KEY, AllocationRecord, encode_allocation, sign_allocation
from kubegpu.crishim.protos import DEVICE_PLUGIN, DEVICE_PLUGIN_PACKAGE, DEVICE_PLUGIN_VERSION, method_path

from .cluster import Cluster, free_port, wait_for
from .conftest import SchedulerProcess
from .containerd import Containerd, make_char_devices, running_containerd
from .kubelet import Kubelet, pod, read_output, wait_running
from .test_kubelet_crishim import allocated, family

NODE = "kubegpu-dp-0"
SCHEDULER = "kubegpu-dp"
NEURON = "aws.amazon.com/neurondevice"
I915 = "gpu.intel.com/i915"
M = DEVICE_PLUGIN


@pytest.fixture(scope="module")
def host() -> Iterator[Path]:
    """A fake host root: /dev/neuron0..15, Intel cards card0 and card1 in sysfs and /dev/dri, the key, an output dir."""
    root = Path(tempfile.mkdtemp(prefix="kubegpu-dph-"))
    (root / "dev" / "dri").mkdir(parents=True)
    make_char_devices(root / "dev", [*(f"neuron{i}" for i in range(16)), "dri/card0", "dri/card1"])
    for card in ("card0", "card1"):
        device = root / "sys" / "class" / "drm" / card / "device"
        device.mkdir(parents=True)
        (device / "vendor").write_text("0x8086\n")
    (root / "out").mkdir()
    (root / "allocation.key").write_text(secrets.token_hex(32) + "\n")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def containerd() -> Iterator[Containerd]:
    with running_containerd(cni_subnet="10.88.212.0/24") as runtime:
        yield runtime


@pytest.fixture(scope="module")
def kubelet(cluster: Cluster, containerd: Containerd) -> Iterator[Kubelet]:
    node = Kubelet(cluster, NODE, containerd.endpoint)
    try:
        node.start()
        yield node
    finally:
        node.close()


class DevicePluginProcess:
    def __init__(
        self,
        host: Path,
        kubelet: Kubelet,
        cluster: Cluster,
        env: dict[str, str] | None = None,
        *,
        node: str = NODE,
        plugin_dir: Path | None = None,
        interval: str = "5s",
    ) -> None:
        self.log = host / "device-plugin.log"
        args = [
            "--node-name", node, "--allocation-key-file", str(host / "allocation.key"),
            "--kubeconfig", str(cluster.kubeconfig), "--host-root", str(host), "--dev-root", str(host / "dev"),
            "--device-plugin-dir", str(plugin_dir or kubelet.device_plugin_dir), "--interval", interval,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kubegpu.crishim.deviceplugin", *args],
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=20)


@pytest.fixture(scope="module")
def device_plugin(host: Path, kubelet: Kubelet, cluster: Cluster) -> Iterator[DevicePluginProcess]:
    process = DevicePluginProcess(host, kubelet, cluster)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def scheduler(cluster: Cluster, host: Path, kubelet: Kubelet) -> Iterator[SchedulerProcess]:
    process = SchedulerProcess(
        [
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--scheduler-name",
            SCHEDULER,
            "--allocation-key-file",
            str(host / "allocation.key"),
            "--metrics-address",
            f"127.0.0.1:{free_port()}",
            "--no-leader-elect",
        ],
        host / "scheduler.log",
        0,
    )
    yield process
    process.kill(signal.SIGTERM)


@pytest.fixture
def space(cluster: Cluster) -> Iterator[str]:
    name = cluster.create_namespace(f"dp-{secrets.token_hex(3)}")
    yield name
    for item in cluster.pods(name):
        cluster.delete_pod(name, item["metadata"]["name"])
    wait_for(lambda: not cluster.pods(name), 60, f"the pods of {name} gone")


def capacity(cluster: Cluster) -> dict[str, str]:
    found: dict[str, str] = cluster.client.get(f"/api/v1/nodes/{NODE}")["status"].get("capacity") or {}
    return found


def allocatable(cluster: Cluster) -> dict[str, str]:
    found: dict[str, str] = cluster.client.get(f"/api/v1/nodes/{NODE}")["status"].get("allocatable") or {}
    return found


def offer_tiles(cluster: Cluster) -> dict[str, int]:
    """The node's two cards offered as two tiles each, as `kubegpu advertise --update-capacity` (or NFD) adds them
    beside the device plugin; the request of one tile of one card."""
    wait_for(lambda: capacity(cluster).get(I915) == "2", 60, "gpu.intel.com/i915 capacity")
    label(cluster, {"gpu.intel.com/gpu-numbers": "0.1"})
    cluster.client.patch(f"/api/v1/nodes/{NODE}/status", {"status": {"capacity": {"gpu.intel.com/tiles": "4"}}})
    wait_for(lambda: allocatable(cluster).get("gpu.intel.com/tiles") == "4", 60, "tiles allocatable")
    return {I915: 1, "gpu.intel.com/tiles": 1}


def label(cluster: Cluster, labels: dict[str, str | None]) -> None:
    cluster.client.patch(f"/api/v1/nodes/{NODE}", {"metadata": {"labels": labels}})


def ran_or_refused(cluster: Cluster, space: str, name: str, timeout: float, what: str) -> dict[str, Any]:
    """The pod `name` once the kubelet ran it or refused it (phase Running or Failed)."""

    def settled() -> dict[str, Any] | None:
        found: dict[str, Any] = cluster.client.get(f"/api/v1/namespaces/{space}/pods/{name}")
        return found if found["status"].get("phase") in ("Failed", "Running") else None

    found: dict[str, Any] = wait_for(settled, timeout, what)
    return found


def checkpoint(kubelet: Kubelet, pod_uid: str, resource: str) -> list[str]:
    """The device ids the kubelet itself recorded for a pod (its device manager's checkpoint file)."""
    data = json.loads((kubelet.device_plugin_dir / "kubelet_internal_checkpoint").read_text())
    return sorted(
        i
        for entry in data["Data"]["PodDeviceEntries"]
        if entry["PodUID"] == pod_uid and entry["ResourceName"] == resource
        for ids in entry["DeviceIDs"].values()
        for i in ids
    )


def test_the_node_capacity_shows_every_resource_of_the_device_plugin(
    cluster: Cluster, kubelet: Kubelet, device_plugin: DevicePluginProcess
) -> None:
    wanted = {"aws.amazon.com/neuron": "16", NEURON: "16", I915: "2"}
    try:
        wait_for(lambda: all(capacity(cluster).get(k) == v for k, v in wanted.items()), 60, f"capacity {wanted}")
    except AssertionError as exc:
        kubelet_lines = [line for line in kubelet.output().splitlines() if "evice" in line][-20:]
        raise AssertionError(f"{exc}\n{device_plugin.output()[-3000:]}\n" + "\n".join(kubelet_lines)) from None


def test_pods_get_exactly_the_ids_the_scheduler_chose(
    cluster: Cluster,
    kubelet: Kubelet,
    device_plugin: DevicePluginProcess,
    scheduler: SchedulerProcess,
    host: Path,
    space: str,
) -> None:
    out = host / "out"
    wait_for(lambda: capacity(cluster).get(NEURON) == "16", 60, "neurondevice capacity")
    label(cluster, {"node.kubernetes.io/instance-type": "trn1.32xlarge", "gpu.intel.com/cards": "card0.card1"})
    filler = pod(space, "filler", {"main": {NEURON: 4}}, scheduler=SCHEDULER, out=out)
    cluster.client.post(f"/api/v1/namespaces/{space}/pods", filler)
    wait_running(cluster, space, "filler", timeout=90)
    cluster.client.post(
        f"/api/v1/namespaces/{space}/pods", pod(space, "row", {"main": {NEURON: 4}}, scheduler=SCHEDULER, out=out)
    )
    row = wait_running(cluster, space, "row", timeout=90)
    ids = allocated(row, "main")[NEURON]
    assert ids in (["0", "1", "2", "3"], ["4", "5", "6", "7"], ["8", "9", "10", "11"], ["12", "13", "14", "15"])
    devices, env = read_output(out, "row", "main")
    assert family(devices, "neuron") == sorted(f"neuron{i}" for i in ids)
    assert env["AWS_NEURON_VISIBLE_DEVICES"] == ",".join(ids)
    assert checkpoint(kubelet, row["metadata"]["uid"], NEURON) == sorted(ids)

    two = pod(space, "encoder", {"a": {I915: 1}, "b": {I915: 1}}, scheduler=SCHEDULER, out=out)
    cluster.client.post(f"/api/v1/namespaces/{space}/pods", two)
    encoder = wait_running(cluster, space, "encoder", timeout=90)
    cards = {c: allocated(encoder, c)[I915] for c in ("a", "b")}
    assert sorted(cards["a"] + cards["b"]) == ["card0", "card1"]
    for container, names in cards.items():
        devices, env = read_output(out, "encoder", container)
        assert family(devices, "card") == names
        assert env["KUBEGPU_INTEL_CARDS"] == ",".join(names)

    # The same node as an inf2.48xlarge (a ring of 12): three contiguous devices, around the ones still held.
    for name in ("filler", "row"):
        cluster.delete_pod(space, name)
    wait_for(lambda: {p["metadata"]["name"] for p in cluster.pods(space)} == {"encoder"}, 60, "the Neuron pods gone")
    label(cluster, {"node.kubernetes.io/instance-type": "inf2.48xlarge"})
    cluster.client.post(
        f"/api/v1/namespaces/{space}/pods", pod(space, "ring", {"main": {NEURON: 3}}, scheduler=SCHEDULER, out=out)
    )
    ring = wait_running(cluster, space, "ring", timeout=90)
    ids = allocated(ring, "main")[NEURON]
    numbers = [int(i) for i in ids]
    assert len(numbers) == 3 and numbers == list(range(numbers[0], numbers[0] + 3)) and numbers[-1] < 12
    devices, env = read_output(out, "ring", "main")
    assert family(devices, "neuron") == sorted(f"neuron{i}" for i in ids)
    assert checkpoint(kubelet, ring["metadata"]["uid"], NEURON) == sorted(ids)


class GatePlugin:
    """A device plugin for one fake device of `example.com/gate` whose Allocate waits until `release()`. The kubelet
    admits one pod at a time: while it waits on the gate, the pods bound to the node meanwhile queue up behind it
    and are admitted in the order they arrived, as after a kubelet restart or a busy moment."""

    RESOURCE = "example.com/gate"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.socket = directory / "test-gate.sock"
        self.called = threading.Event()
        self.released = threading.Event()
        self.stopped = threading.Event()
        self.server: grpc.Server | None = None

    def start(self) -> None:
        def list_and_watch(_request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            yield M["ListAndWatchResponse"](devices=[M["Device"](ID="g0", health="Healthy")])
            while context.is_active() and not self.stopped.wait(1.0):
                pass  # the device stays listed until the kubelet hangs up or the test stops the plugin

        def allocate(request: Any, _context: grpc.ServicerContext) -> Any:
            self.called.set()
            self.released.wait(120)
            return M["AllocateResponse"](
                container_responses=[M["ContainerAllocateResponse"]() for _ in request.container_requests]
            )

        def unary(function: Any, request: str) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                function,
                request_deserializer=M[request].FromString,
                response_serializer=lambda m: m.SerializeToString(),
            )

        methods = {
            "GetDevicePluginOptions": unary(lambda _r, _c: M["DevicePluginOptions"](), "Empty"),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                list_and_watch,
                request_deserializer=M["Empty"].FromString,
                response_serializer=lambda m: m.SerializeToString(),
            ),
            "Allocate": unary(allocate, "AllocateRequest"),
            "PreStartContainer": unary(lambda _r, _c: M["PreStartContainerResponse"](), "PreStartContainerRequest"),
        }
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(f"{DEVICE_PLUGIN_PACKAGE}.DevicePlugin", methods),)
        )
        self.socket.unlink(missing_ok=True)
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()
        with grpc.insecure_channel(f"unix://{self.directory / 'kubelet.sock'}") as channel:
            channel.unary_unary(
                method_path(DEVICE_PLUGIN_PACKAGE, "Registration", "Register"),
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=M["Empty"].FromString,
            )(
                M["RegisterRequest"](
                    version=DEVICE_PLUGIN_VERSION,
                    endpoint=self.socket.name,
                    resource_name=self.RESOURCE,
                    options=M["DevicePluginOptions"](),
                ),
                timeout=10,
            )

    def release(self) -> None:
        self.released.set()

    def stop(self) -> None:
        self.released.set()
        self.stopped.set()
        if self.server is not None:
            self.server.stop(0).wait()
        self.socket.unlink(missing_ok=True)


def test_a_pod_kubegpu_did_not_place_admitted_first_gets_nothing_signed_for_the_pod_it_placed(
    cluster: Cluster,
    kubelet: Kubelet,
    device_plugin: DevicePluginProcess,
    scheduler: SchedulerProcess,
    host: Path,
    space: str,
) -> None:
    out = host / "out"
    wait_for(lambda: capacity(cluster).get(NEURON) == "16", 60, "neurondevice capacity")
    label(cluster, {"node.kubernetes.io/instance-type": "trn1.32xlarge"})
    gate = GatePlugin(kubelet.device_plugin_dir)
    gate.start()
    try:
        wait_for(lambda: capacity(cluster).get(GatePlugin.RESOURCE) == "1", 60, "the gate's capacity")
        # The kubelet starts admitting a pod and waits on the gate's Allocate.
        keeper = pod(space, "keeper", {"main": {GatePlugin.RESOURCE: 1}}, scheduler=SCHEDULER, out=out, node=NODE)
        cluster.client.post(f"/api/v1/namespaces/{space}/pods", keeper)
        assert gate.called.wait(60), "the kubelet never called the gate's Allocate"
        # Meanwhile: a tenant's pod, its spec.nodeName written by hand, no allocation; then a pod kubegpu places.
        squatter = pod(space, "squatter", {"main": {NEURON: 4}}, scheduler=SCHEDULER, out=out, node=NODE)
        cluster.client.post(f"/api/v1/namespaces/{space}/pods", squatter)
        placed = pod(space, "placed", {"main": {NEURON: 4}}, scheduler=SCHEDULER, out=out)
        cluster.client.post(f"/api/v1/namespaces/{space}/pods", placed)

        def bound() -> dict[str, Any] | None:
            found: dict[str, Any] = cluster.client.get(f"/api/v1/namespaces/{space}/pods/placed")
            return found if ALLOCATION_KEY in (found["metadata"].get("annotations") or {}) else None

        signed = allocated(wait_for(bound, 60, "the placed pod bound with its allocation"), "main")[NEURON]
        gate.release()  # the kubelet admits the squatter (older, first in the queue), then the placed pod

        refused = ran_or_refused(cluster, space, "squatter", 60, "the kubelet to admit or refuse the squatter")
        if refused["status"]["phase"] == "Running":
            taken = read_output(out, "squatter", "main")[1].get("AWS_NEURON_VISIBLE_DEVICES")
            raise AssertionError(
                f"the squatter runs with AWS_NEURON_VISIBLE_DEVICES={taken}; the placed pod's: {signed}"
            )
        assert "kubegpu:" in refused["status"].get("message", ""), refused["status"]
        assert checkpoint(kubelet, refused["metadata"]["uid"], NEURON) == []
        running = wait_running(cluster, space, "placed", timeout=90)
        devices, env = read_output(out, "placed", "main")
        assert env["AWS_NEURON_VISIBLE_DEVICES"] == ",".join(signed)
        assert family(devices, "neuron") == sorted(f"neuron{i}" for i in signed)
        assert checkpoint(kubelet, running["metadata"]["uid"], NEURON) == sorted(signed)
        assert not (out / "squatter.main.env").exists()
    finally:
        gate.stop()


def test_a_forged_allocation_fails_admission_and_a_restarted_kubelet_is_registered_with_again(
    cluster: Cluster, kubelet: Kubelet, device_plugin: DevicePluginProcess, host: Path, space: str
) -> None:
    wait_for(lambda: capacity(cluster).get(NEURON) == "16", 60, "neurondevice capacity")
    containers = {"main": {NEURON: ["0", "1", "2", "3"]}}
    forged = sign_allocation(AllocationRecord(version=1, node=NODE, podUID="x", containers=containers), b"other-key")
    manifest = pod(
        space,
        "forged",
        {"main": {NEURON: 4}},
        scheduler=SCHEDULER,
        out=host / "out",
        annotations={ALLOCATION_KEY: encode_allocation(forged)},
        node=NODE,
    )
    cluster.client.post(f"/api/v1/namespaces/{space}/pods", manifest)

    def failed() -> dict[str, Any] | None:
        found: dict[str, Any] = cluster.client.get(f"/api/v1/namespaces/{space}/pods/forged")
        return found if found["status"].get("phase") == "Failed" else None

    status = wait_for(failed, 60, "the forged pod to fail admission")["status"]
    assert "kubegpu: missing check failed" in status.get("message", ""), status

    registered = device_plugin.output().count("registered aws.amazon.com/neurondevice")
    kubelet.restart()
    wait_for(
        lambda: device_plugin.output().count("registered aws.amazon.com/neurondevice") > registered,
        30,
        "the device plugin to register again with the restarted kubelet",
    )
    wait_for(lambda: capacity(cluster).get(NEURON) == "16", 60, "neurondevice capacity after the restart")


# ---------------------------------------------------------------------------------------------------------------
# GPU shares: the kubelet admits several share pods per GPU
# ---------------------------------------------------------------------------------------------------------------

GPU = "nvidia.com/gpu"
FAKE_NVML = """
# A stand-in for nvidia-ml-py over one 16 GiB GPU (the test host has no GPU): only the library underneath is made up.
from types import SimpleNamespace


class NVMLError(Exception):
    pass


def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetHandleByUUID(uuid): return 0
def nvmlDeviceGetMinorNumber(h): return h
def nvmlDeviceGetPciInfo(h): return SimpleNamespace(busId="00000000:10:00.0")
def nvmlDeviceGetMemoryInfo(h): return SimpleNamespace(total=16384 << 20)
def nvmlDeviceGetName(h): return "Tesla V100-SXM2-16GB"
def nvmlDeviceGetUUID(h): return "GPU-0"
"""


@pytest.fixture(scope="module")
def gpu_node(cluster: Cluster, kubelet: Kubelet, host: Path) -> Iterator[tuple[Path, DevicePluginProcess]]:
    """The node's NVIDIA side for GPU shares: one GPU (its device files, a fake NVML), HAMi-core installed, GPUs split
    10 ways, the device plugin serving them; the GPU host directory (with `out/`) and the device plugin process."""
    gpus = host / "gpu-host"
    make_char_devices(gpus / "dev", ["nvidia0", "nvidiactl"])
    (gpus / "python").mkdir(exist_ok=True)
    (gpus / "python" / "pynvml.py").write_text(FAKE_NVML)
    vgpu = gpus / "vgpu"
    (vgpu / "vgpulock").mkdir(parents=True, exist_ok=True)
    (vgpu / "libvgpu.so").write_bytes(b"")  # a stand-in: busybox is static, nothing is preloaded
    (vgpu / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    (gpus / "allocation.key").write_text((host / "allocation.key").read_text())
    (gpus / "out").mkdir(exist_ok=True)
    env = {
        "PYTHONPATH": os.pathsep.join([str(gpus / "python"), os.environ.get("PYTHONPATH", "")]),
        "KUBEGPU_NVIDIA_SHARE_LIMITS": "hami-core",
        "KUBEGPU_HAMI_CORE_DIR": str(vgpu),
    }
    plugin = DevicePluginProcess(gpus, kubelet, cluster, env)
    try:
        wait_for(lambda: capacity(cluster).get(GPU) == "10", 60, "nvidia.com/gpu capacity of 1 GPU x 10 share slots")
        # What `kubegpu advertise --update-capacity` and GPU Feature Discovery add beside the device plugin.
        label(cluster, {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "16384"})
        shares = {"nvidia.com/gpucores": "100", "nvidia.com/gpumem": "16384"}
        cluster.client.patch(f"/api/v1/nodes/{NODE}/status", {"status": {"capacity": shares}})
        wait_for(lambda: allocatable(cluster).get("nvidia.com/gpucores") == "100", 60, "gpucores allocatable")

        yield gpus, plugin
    finally:
        plugin.stop()


def test_a_device_plugin_named_after_no_node_removes_no_running_pods_region(
    cluster: Cluster, kubelet: Kubelet, host: Path, tmp_path: Path
) -> None:
    """A `--node-name` that is not this node's lists no pod: each round would take every pod running here for gone
    and remove its HAMi-core region, lifting its limits (T199). The device plugin checks that the node exists
    before trusting a listing of no pod, says what is wrong, and removes nothing."""
    vgpu = tmp_path / "vgpu"
    region = vgpu / "containers" / "uid-running_main"
    region.mkdir(parents=True)
    (region / "region.cache").write_bytes(b"\0" * 64)
    (tmp_path / "allocation.key").write_text((host / "allocation.key").read_text())
    (tmp_path / "dev").mkdir()
    env = {"KUBEGPU_NVIDIA_SHARE_LIMITS": "hami-core", "KUBEGPU_HAMI_CORE_DIR": str(vgpu)}
    plugin = DevicePluginProcess(
        tmp_path, kubelet, cluster, env, node="no-such-node", plugin_dir=tmp_path / "plugins", interval="1s"
    )
    try:
        said = "the API server knows no node 'no-such-node': --node-name must be this node's name"
        wait_for(lambda: plugin.output().count(said) >= 3 or not region.exists(), 60, "three rounds")
        assert region.is_dir() and (region / "region.cache").exists(), "a running pod's region was removed"
        assert not list((vgpu / "containers").glob(".gone-*"))
    finally:
        plugin.stop()


def test_a_device_plugin_named_after_another_node_acts_on_nothing_and_names_both(
    cluster: Cluster, kubelet: Kubelet, host: Path, space: str, tmp_path: Path
) -> None:
    """A `--node-name` naming another node that exists lists that node's pods: the pods running here would count as
    gone and their HAMi-core regions be swept, lifting their limits, and Allocate would hand out what the scheduler
    signed for the other node (T217). The device plugin compares the Node's boot ID (its kubelet's) with this
    host's, names both, sweeps nothing and allocates nothing."""
    other = f"kubegpu-dp-elsewhere-{secrets.token_hex(2)}"
    cluster.create_ready_node(other)
    cluster.client.patch(f"/api/v1/nodes/{other}/status", {"status": {"nodeInfo": {"bootID": "0ther-b00t"}}})
    cluster.client.post(
        f"/api/v1/namespaces/{space}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "there", "namespace": space},
            "spec": {"nodeName": other, "containers": [{"name": "main", "image": "busybox"}]},
        },
    )
    vgpu = tmp_path / "vgpu"
    region = vgpu / "containers" / "uid-running_main"
    region.mkdir(parents=True)
    (region / "region.cache").write_bytes(b"\0" * 64)
    (tmp_path / "allocation.key").write_text((host / "allocation.key").read_text())
    (tmp_path / "dev").mkdir()
    env = {"KUBEGPU_NVIDIA_SHARE_LIMITS": "hami-core", "KUBEGPU_HAMI_CORE_DIR": str(vgpu)}
    plugin = DevicePluginProcess(
        tmp_path, kubelet, cluster, env, node=other, plugin_dir=tmp_path / "plugins", interval="1s"
    )
    try:
        said = f"--node-name {other!r} names a node whose kubelet runs on another host: its boot ID is '0ther-b00t'"
        wait_for(lambda: plugin.output().count(said) >= 3 or not region.exists(), 60, "three rounds")
        assert region.is_dir() and (region / "region.cache").exists(), "a running pod's region was removed"
        assert not list((vgpu / "containers").glob(".gone-*"))
        assert "this host's is " + repr(Path("/proc/sys/kernel/random/boot_id").read_text().strip()) in plugin.output()
    finally:
        plugin.stop()
        cluster.delete_pod(space, "there")
        cluster.client.request("DELETE", f"/api/v1/nodes/{other}")


def test_a_pod_given_a_device_while_the_node_name_is_anothers_fails_admission_saying_so_and_runs_once_it_is_right(
    cluster: Cluster,
    kubelet: Kubelet,
    scheduler: SchedulerProcess,
    host: Path,
    space: str,
    tmp_path: Path,
) -> None:
    """The device plugin serves this node's GPU to the real kubelet, but `--node-name` names another node (T217). The
    scheduler places a pod on the GPU and the kubelet asks the plugin to allocate it: refused, so the pod fails
    admission, and its status and its `UnexpectedAdmissionError` Event say why in the plugin's words, naming the node,
    its boot ID and this host's (before, only the sweep was tested, not what a pod asking a device meets). Started
    again with this node's name, the plugin allocates the GPU, and the pod made again runs with it."""
    other = f"kubegpu-dp-elsewhere-{secrets.token_hex(2)}"
    cluster.create_ready_node(other)
    cluster.client.patch(f"/api/v1/nodes/{other}/status", {"status": {"nodeInfo": {"bootID": "0ther-b00t"}}})
    make_char_devices(tmp_path / "dev", ["nvidia0", "nvidiactl"])
    (tmp_path / "python").mkdir()
    (tmp_path / "python" / "pynvml.py").write_text(FAKE_NVML)
    (tmp_path / "allocation.key").write_text((host / "allocation.key").read_text())
    out = host / "out"
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "python"), os.environ.get("PYTHONPATH", "")])}
    plugin = DevicePluginProcess(tmp_path, kubelet, cluster, env, node=other, interval="1s")
    try:
        wait_for(lambda: allocatable(cluster).get(GPU) == "1", 60, "nvidia.com/gpu allocatable: the plugin registered")
        label(cluster, {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "16384"})
        cluster.client.post(
            f"/api/v1/namespaces/{space}/pods", pod(space, "first", {"main": {GPU: 1}}, scheduler=SCHEDULER, out=out)
        )

        def failed() -> dict[str, Any] | None:
            found: dict[str, Any] = cluster.client.get(f"/api/v1/namespaces/{space}/pods/first")
            return found if found["status"].get("phase") == "Failed" else None

        status = wait_for(failed, 90, "the pod to fail admission")["status"]
        said = f"--node-name {other!r} names a node whose kubelet runs on another host: its boot ID is '0ther-b00t'"
        assert said in status.get("message", ""), status
        assert status.get("reason") == "UnexpectedAdmissionError", status  # kubelet 1.20: "Pod Allocate failed due
        # to rpc error: code = Unavailable desc = kubegpu: --node-name ... , which is unexpected", and the same Event
        told = [e["message"] for e in cluster.events(space) if e["involvedObject"].get("name") == "first"]
        assert any(said in m for m in told), told
        assert not (out / "first.main.env").exists()

        plugin.stop()  # the kubelet counts the GPU unhealthy until a plugin lists it again
        wait_for(lambda: allocatable(cluster).get(GPU) == "0", 60, "nvidia.com/gpu unallocatable: the plugin gone")
        plugin = DevicePluginProcess(tmp_path, kubelet, cluster, env, interval="1s")  # this node's name
        wait_for(lambda: allocatable(cluster).get(GPU) == "1", 60, "nvidia.com/gpu allocatable again")
        cluster.client.post(
            f"/api/v1/namespaces/{space}/pods", pod(space, "again", {"main": {GPU: 1}}, scheduler=SCHEDULER, out=out)
        )
        wait_running(cluster, space, "again", timeout=90)
        devices, _ = read_output(out, "again", "main")
        assert "nvidia0" in devices
    except AssertionError as exc:
        kubelet_lines = [line for line in kubelet.output().splitlines() if "evice" in line][-20:]
        pods = {p["metadata"]["name"]: p["status"] for p in cluster.pods(space)}
        raise AssertionError(
            f"{exc}\n{pods}\n{plugin.output()[-3000:]}\n{scheduler.output()[-3000:]}\n" + "\n".join(kubelet_lines)
        ) from None
    finally:
        plugin.stop()
        cluster.client.request("DELETE", f"/api/v1/nodes/{other}")


def test_two_share_pods_are_admitted_on_one_gpu_each_with_its_own_limits(
    cluster: Cluster,
    kubelet: Kubelet,
    scheduler: SchedulerProcess,
    space: str,
    gpu_node: tuple[Path, DevicePluginProcess],
) -> None:
    gpus, plugin = gpu_node
    try:
        # One pod after the other: the kubelet does not say which pod it admits, so two share pods of one count
        # admitted in another order than their creation's swap their signed sets, limits included
        # (docs/security.md T21, "Left"); admitted in turn, each gets exactly its own.
        asked = {"notebook": (30, 4096), "inference": (60, 8192)}
        slots = {}
        for name, (cores, mib) in asked.items():
            limits = {GPU: 1, "nvidia.com/gpucores": cores, "nvidia.com/gpumem": mib}
            manifest = pod(space, name, {"main": limits}, scheduler=SCHEDULER, out=gpus / "out")
            cluster.client.post(f"/api/v1/namespaces/{space}/pods", manifest)
            placed = wait_running(cluster, space, name, timeout=90)
            assert allocated(placed, "main")[GPU] == ["0"]  # both shares on the node's one GPU
            slots[name] = checkpoint(kubelet, placed["metadata"]["uid"], GPU)
            devices, env_seen = read_output(gpus / "out", name, "main")
            assert family(devices, "nvidia") == ["nvidia0"] and "nvidiactl" in devices
            assert {k: v for k, v in env_seen.items() if k.startswith(("CUDA_", "NVIDIA_"))} == {
                "NVIDIA_VISIBLE_DEVICES": "0",
                "CUDA_DEVICE_SM_LIMIT": str(cores),
                "CUDA_DEVICE_SM_LIMIT_0": str(cores),
                "CUDA_OVERSUBSCRIBE": "false",
                "CUDA_TASK_PRIORITY": "1",
                "CUDA_REDIRECT": "/usr/local/vgpu/libvgpu.so",
                "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/cache/cudevshr.cache",
                "CUDA_DEVICE_MEMORY_LIMIT_0": f"{mib}m",
            }, name
        # The kubelet holds one share slot of GPU 0 for each: two pods admitted on one GPU.
        assert sorted(slots.values()) == [["0::0"], ["0::1"]], slots
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{plugin.output()[-3000:]}") from None


def test_a_share_pod_mounting_a_volume_at_a_path_the_node_owns_fails_admission_naming_it(
    cluster: Cluster, scheduler: SchedulerProcess, space: str, gpu_node: tuple[Path, DevicePluginProcess]
) -> None:
    """Device-plugin mode: the kubelet mounts a pod's volumes itself, after the device plugin's mounts, and the
    runtime mounts the later of two at one path on top. A share pod with a volume at `/overrideEnv` (HAMi-core sets
    its `NAME=value` lines over the environment) ran with the tenant's file there, its limits the tenant's (T135). It
    fails its admission with the mount named; a share pod with its own volume at `/tmp` (a parent of the node's
    `/tmp/vgpulock`) runs, with the node's lock directory and the node's empty `/overrideEnv`."""
    gpus, plugin = gpu_node
    (gpus / "vgpu" / "vgpulock" / "node-lock").write_text("")
    settings = gpus / "tenant-override"
    settings.write_text("CUDA_DEVICE_SM_LIMIT=100\nCUDA_DEVICE_SM_LIMIT_0=100\n")
    share = {GPU: 1, "nvidia.com/gpucores": 10, "nvidia.com/gpumem": 1024}
    command = (
        "cat /overrideEnv > /out/$C.override; ls /tmp/vgpulock > /out/$C.lock; ls /dev > /out/$C.devices; "
        "env > /out/$C.env; sleep 3600"
    )
    try:
        peeker = pod(space, "peeker", {"main": share}, scheduler=SCHEDULER, out=gpus / "out", command=command)
        peeker["spec"]["volumes"].append({"name": "settings", "hostPath": {"path": str(settings), "type": "File"}})
        peeker["spec"]["containers"][0]["volumeMounts"].append({"name": "settings", "mountPath": "/overrideEnv"})
        cluster.client.post(f"/api/v1/namespaces/{space}/pods", peeker)

        found = ran_or_refused(cluster, space, "peeker", 90, "the pod with a volume at /overrideEnv to fail or run")
        status = found["status"]
        ran = (gpus / "out" / "peeker.main.override").read_text() if status["phase"] == "Running" else ""
        assert status["phase"] == "Failed", f"it ran, reading /overrideEnv: {ran!r}"
        assert (
            f"kubegpu: mount check failed: pod {space}/peeker container main mounts a volume at '/overrideEnv'"
            in status.get("message", "")
        ), status

        scratch = pod(space, "scratch", {"main": share}, scheduler=SCHEDULER, out=gpus / "out", command=command)
        scratch["spec"]["volumes"].append({"name": "scratch", "emptyDir": {}})
        scratch["spec"]["containers"][0]["volumeMounts"].append({"name": "scratch", "mountPath": "/tmp"})
        cluster.client.post(f"/api/v1/namespaces/{space}/pods", scratch)
        wait_running(cluster, space, "scratch", timeout=90)
        _, env_seen = read_output(gpus / "out", "scratch", "main")
        assert env_seen["CUDA_DEVICE_SM_LIMIT_0"] == "10"
        assert (gpus / "out" / "scratch.main.override").read_text() == ""
        assert (gpus / "out" / "scratch.main.lock").read_text().split() == ["node-lock"]
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{plugin.output()[-3000:]}") from None


def test_a_share_pod_whose_termination_message_path_is_the_preload_file_fails_admission_naming_it(
    cluster: Cluster, scheduler: SchedulerProcess, space: str, gpu_node: tuple[Path, DevicePluginProcess]
) -> None:
    """Device-plugin mode: the kubelet mounts a fresh empty file of its own at the container's
    `terminationMessagePath`, after every other mount, so the runtime mounts it on top of the node's. A share pod
    naming `/etc/ld.so.preload` there, no volume, ran with that file empty: HAMi-core was never loaded and the 10 %
    share had the whole GPU. It fails its admission with the mount named."""
    gpus, plugin = gpu_node
    share = {GPU: 1, "nvidia.com/gpucores": 10, "nvidia.com/gpumem": 1024}
    command = "cat /etc/ld.so.preload > /out/$C.preload; env > /out/$C.env; sleep 3600"
    try:
        unloaded = pod(space, "unloaded", {"main": share}, scheduler=SCHEDULER, out=gpus / "out", command=command)
        unloaded["spec"]["containers"][0]["terminationMessagePath"] = "/etc/ld.so.preload"
        cluster.client.post(f"/api/v1/namespaces/{space}/pods", unloaded)

        status = ran_or_refused(
            cluster, space, "unloaded", 90, "the pod with its termination message at /etc/ld.so.preload to fail or run"
        )
        status = status["status"]
        if status["phase"] == "Running":
            wait_for(lambda: (gpus / "out" / "unloaded.main.env").exists() or None, 30, "the container's output")
        ran = (gpus / "out" / "unloaded.main.preload").read_text() if status["phase"] == "Running" else ""
        assert status["phase"] == "Failed", f"it ran, reading /etc/ld.so.preload: {ran!r}"
        assert (
            f"kubegpu: mount check failed: pod {space}/unloaded container main mounts its termination message file "
            "at '/etc/ld.so.preload'" in status.get("message", "")
        ), status
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{plugin.output()[-3000:]}") from None


def test_a_tile_containers_own_device_hierarchy_never_widens_its_mask(
    cluster: Cluster,
    kubelet: Kubelet,
    device_plugin: DevicePluginProcess,
    scheduler: SchedulerProcess,
    host: Path,
    space: str,
) -> None:
    """The kubelet passes Allocate's env first and the container's own `env` after it, and containerd keeps the last
    value of a name. A pod given tile gt0 of a two-tile card, its spec setting `ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE`,
    ran with the node's FLAT mask `0` and its own COMPOSITE, which Level Zero reads as the whole of card0, both tiles
    (T210). The device plugin writes the mask in the hierarchy the container names, as the CRI shim does (`0.0`);
    a hierarchy the node does not write (`composite`) fails the pod's admission, naming it."""
    out = host / "out"
    tile = offer_tiles(cluster)
    try:
        composite = pod(space, "composite", {"main": tile}, scheduler=SCHEDULER, out=out)
        composite["spec"]["containers"][0]["env"].append({"name": "ZE_FLAT_DEVICE_HIERARCHY", "value": "COMPOSITE"})
        cluster.client.post(f"/api/v1/namespaces/{space}/pods", composite)
        running = wait_running(cluster, space, "composite", timeout=90)
        card = allocated(running, "main")[I915]
        _, env = read_output(out, "composite", "main")
        seen = {k: env.get(k) for k in ("ZE_FLAT_DEVICE_HIERARCHY", "ZE_AFFINITY_MASK", "KUBEGPU_INTEL_CARDS")}
        assert seen == {
            "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE",
            "ZE_AFFINITY_MASK": "0.0",
            "KUBEGPU_INTEL_CARDS": card[0],
        }, seen

        spelled = pod(space, "spelled", {"main": tile}, scheduler=SCHEDULER, out=out)
        spelled["spec"]["containers"][0]["env"].append({"name": "ZE_FLAT_DEVICE_HIERARCHY", "value": "composite"})
        cluster.client.post(f"/api/v1/namespaces/{space}/pods", spelled)

        found = ran_or_refused(cluster, space, "spelled", 90, "the pod spelling the hierarchy otherwise to fail or run")
        status = found["status"]
        if status["phase"] == "Running":
            _, env = read_output(out, "spelled", "main")
        ran = {k: env.get(k) for k in ("ZE_FLAT_DEVICE_HIERARCHY", "ZE_AFFINITY_MASK")}
        assert status["phase"] == "Failed", f"it ran with {ran}"
        assert (
            f"kubegpu: env check failed: pod {space}/spelled container main sets ZE_FLAT_DEVICE_HIERARCHY"
            in status.get("message", "")
        ), status
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{device_plugin.output()[-3000:]}") from None


def test_a_classic_init_container_asking_a_tile_runs_masked_to_a_tile_of_its_pods(
    cluster: Cluster,
    kubelet: Kubelet,
    device_plugin: DevicePluginProcess,
    scheduler: SchedulerProcess,
    host: Path,
    space: str,
) -> None:
    """A pod whose init container asks one card and one tile before its app asks the same: the kubelet allocates the
    init container the app's card, and the init container ran with no mask, the whole card, both tiles (one of them
    another pod's to take). It runs masked to its pod's tile, as the app does."""
    out = host / "out"
    tile = offer_tiles(cluster)
    try:
        checked = pod(space, "checked", {"main": tile}, scheduler=SCHEDULER, out=out)
        prep = dict(
            checked["spec"]["containers"][0],
            name="prep",
            command=["sh", "-c", "ls /dev/dri > /out/$C.devices; env > /out/$C.env"],
        )
        prep["env"] = [{"name": "C", "value": "checked.prep"}]
        checked["spec"]["initContainers"] = [prep]
        cluster.client.post(f"/api/v1/namespaces/{space}/pods", checked)
        running = wait_running(cluster, space, "checked", timeout=90)
        card = allocated(running, "main")[I915]
        _, init_env = read_output(out, "checked", "prep")
        _, app_env = read_output(out, "checked", "main")
        seen = {
            name: (env.get("KUBEGPU_INTEL_CARDS"), env.get("ZE_AFFINITY_MASK"))
            for name, env in (("prep", init_env), ("main", app_env))
        }
        assert seen == {"prep": (card[0], "0"), "main": (card[0], "0")}, seen
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{device_plugin.output()[-3000:]}") from None
