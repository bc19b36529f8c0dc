"""A real kubelet 1.20 whose runtime endpoint is `kubegpu crishim`, in front of a real containerd: the KubeGPU path.

The story of one node: kube-apiserver, `kubegpu scheduler`, a kubelet (speaking CRI v1alpha2, as 1.20 does) pointed
at the shim, and the shim in front of containerd. The node's devices are character devices made with mknod under a
temporary dev root (the shim's `--dev-root`): sixteen Neuron devices (trn1.32xlarge), two Intel cards with their
render nodes and eight NVIDIA GPUs; its labels and extended capacity are what the advertiser and GPU Feature
Discovery would publish. A Neuron pod, a two-container Intel pod and an NVIDIA pod reach Running, and every container
writes what it has (its `/dev` and env, to a hostPath directory): exactly the devices and env of its allocation. The
node offers GPU shares as HAMi-core enforces them (ten per GPU, the shim told `KUBEGPU_NVIDIA_SHARE_LIMITS=hami-core`):
two share pods run with their GPU and the HAMi-core limits of their own share, whatever the spec says. A pod
put on the node with a forged allocation shows kubegpu's refusal in its Events and never runs. The kubelet and
containerd restart under running pods, and a new device pod still gets its devices.

One kubelet, one containerd and one shim serve the whole module.
"""

from __future__ import annotations

import secrets
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.annotations import (
    ALLOCATION_KEY,
    AllocationRecord,
    decode_allocation,
    encode_allocation,
    sign_allocation,
)

from .cluster import Cluster, free_port, wait_for
from .conftest import SchedulerProcess
from .containerd import Containerd, ShimProcess, make_char_devices, running_containerd, start_shim_process
from .kubelet import Kubelet, pod, read_output, wait_running

NODE = "kubegpu-kubelet-0"
SCHEDULER = "kubegpu"
LABELS = {
    "node.kubernetes.io/instance-type": "trn1.32xlarge",
    "gpu.intel.com/cards": "card0.card1",
    "nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.memory": "16160",
}
CAPACITY = {
    "aws.amazon.com/neuron": "16",
    "aws.amazon.com/neurondevice": "16",
    "gpu.intel.com/i915": "2",
    "nvidia.com/gpu": "80",  # eight GPUs, each split ten ways
    "nvidia.com/gpucores": "800",
    "nvidia.com/gpumem": str(8 * 16160),
}
DEVICES = [
    *(f"neuron{i}" for i in range(16)),
    *(f"nvidia{i}" for i in range(8)),
    "nvidiactl",
    "dri/card0",
    "dri/card1",
    "dri/renderD128",
    "dri/renderD129",
]


@pytest.fixture(scope="module")
def node_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="kubegpu-kn-"))
    (directory / "dev" / "dri").mkdir(parents=True)
    make_char_devices(directory / "dev", DEVICES)
    (directory / "out").mkdir()
    (directory / "out").chmod(0o777)
    (directory / "allocation.key").write_text(secrets.token_hex(32) + "\n")
    # HAMi-core's directory as an operator installs it (the library a stand-in: there is no GPU here)
    (directory / "vgpu" / "vgpulock").mkdir(parents=True)
    (directory / "vgpu" / "libvgpu.so").write_bytes(b"")
    (directory / "vgpu" / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def containerd() -> Iterator[Containerd]:
    with running_containerd(cni_subnet="10.88.211.0/24") as runtime:
        yield runtime


@pytest.fixture(scope="module")
def shim(cluster: Cluster, containerd: Containerd, node_dir: Path) -> Iterator[ShimProcess]:
    process = start_shim_process(
        socket=node_dir / "cri.sock",
        runtime_endpoint=containerd.endpoint,
        node_name=NODE,
        key_file=node_dir / "allocation.key",
        dev_root=node_dir / "dev",
        log=node_dir / "shim.log",
        kubeconfig=cluster.kubeconfig,
        env={"KUBEGPU_NVIDIA_SHARE_LIMITS": "hami-core", "KUBEGPU_HAMI_CORE_DIR": str(node_dir / "vgpu")},
    )
    yield process
    process.terminate()


@pytest.fixture(scope="module")
def kubelet(cluster: Cluster, shim: ShimProcess) -> Iterator[Kubelet]:
    node = Kubelet(cluster, NODE, shim.endpoint)
    try:
        node.start()
        cluster.client.patch(f"/api/v1/nodes/{NODE}", {"metadata": {"labels": LABELS}})
        cluster.client.patch(f"/api/v1/nodes/{NODE}/status", {"status": {"capacity": CAPACITY}})
        wait_for(
            lambda: cluster.client.get(f"/api/v1/nodes/{NODE}")["status"]["allocatable"].get("nvidia.com/gpu") == "80",
            30,
            "the node's extended resources allocatable",
        )
        yield node
    finally:
        node.close()


@pytest.fixture(scope="module")
def scheduler(cluster: Cluster, node_dir: Path, kubelet: Kubelet) -> Iterator[SchedulerProcess]:
    process = SchedulerProcess(
        [
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--scheduler-name",
            SCHEDULER,
            "--allocation-key-file",
            str(node_dir / "allocation.key"),
            "--metrics-address",
            f"127.0.0.1:{free_port()}",
            "--no-leader-elect",
        ],
        node_dir / "scheduler.log",
        0,
    )
    yield process
    process.kill(signal.SIGTERM)


@pytest.fixture
def space(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of this test's own; its pods are deleted afterwards (the node stays: the kubelet is shared)."""
    name = cluster.create_namespace(f"kl-{request.node.name[5:30].replace('_', '-')}-{secrets.token_hex(2)}")
    yield name
    for item in cluster.pods(name):
        cluster.delete_pod(name, item["metadata"]["name"])


def run(cluster: Cluster, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    cluster.client.post(f"/api/v1/namespaces/{namespace}/pods", manifest)
    return wait_running(cluster, namespace, manifest["metadata"]["name"], timeout=90)


def allocated(found: dict[str, Any], container: str) -> dict[str, list[str]]:
    return dict(decode_allocation(found["metadata"]["annotations"][ALLOCATION_KEY]).containers[container])


def family(entries: list[str], prefix: str) -> list[str]:
    return sorted(e for e in entries if e.startswith(prefix) and e[len(prefix) :].isdigit())


def test_neuron_intel_and_nvidia_pods_run_with_exactly_their_devices(
    cluster: Cluster, kubelet: Kubelet, scheduler: SchedulerProcess, node_dir: Path, space: str
) -> None:
    out = node_dir / "out"
    trainer = run(
        cluster,
        space,
        pod(space, "trainer", {"main": {"aws.amazon.com/neurondevice": 4}}, scheduler=SCHEDULER, out=out),
    )
    encoder = run(
        cluster,
        space,
        pod(
            space,
            "encoder",
            {"a": {"gpu.intel.com/i915": 1}, "b": {"gpu.intel.com/i915": 1}},
            scheduler=SCHEDULER,
            out=out,
        ),
    )
    cuda = run(cluster, space, pod(space, "cuda", {"main": {"nvidia.com/gpu": 2}}, scheduler=SCHEDULER, out=out))

    neuron = allocated(trainer, "main")["aws.amazon.com/neurondevice"]
    assert len(neuron) == 4
    devices, env = read_output(out, "trainer", "main")
    assert family(devices, "neuron") == sorted(f"neuron{i}" for i in neuron)
    assert env["AWS_NEURON_VISIBLE_DEVICES"] == ",".join(neuron)
    assert not family(devices, "nvidia")

    cards = {c: allocated(encoder, c)["gpu.intel.com/i915"] for c in ("a", "b")}
    assert sorted(cards["a"] + cards["b"]) == ["card0", "card1"]
    for container, names in cards.items():
        devices, env = read_output(out, "encoder", container)
        assert family(devices, "card") == names
        assert env["KUBEGPU_INTEL_CARDS"] == ",".join(names)
        assert "AWS_NEURON_VISIBLE_DEVICES" not in env

    gpus = allocated(cuda, "main")["nvidia.com/gpu"]
    devices, env = read_output(out, "cuda", "main")
    assert family(devices, "nvidia") == sorted(f"nvidia{i}" for i in gpus)
    assert "nvidiactl" in devices
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(gpus)
    assert not family(devices, "neuron")


def test_two_containers_sharing_an_intel_card_each_see_only_their_own_tile(
    cluster: Cluster, kubelet: Kubelet, scheduler: SchedulerProcess, node_dir: Path, space: str
) -> None:
    """The node's cards become Data Center GPU Max cards for this test (2 tiles each, 4 containers per card, as NFD
    would publish them): a pod of two containers each asking one tile of card1 (`gas-allow`) gets both on card1, each
    its own tile, named in `gas-container-tiles`, and each process runs masked to its tile by `ZE_AFFINITY_MASK` in
    Level Zero's FLAT numbering; the mask `b` sets itself in its spec never reaches its process."""
    out = node_dir / "out"
    status = f"/api/v1/nodes/{NODE}/status"

    def allocatable(resource: str) -> str | None:
        value: str | None = cluster.client.get(f"/api/v1/nodes/{NODE}")["status"]["allocatable"].get(resource)
        return value

    cluster.client.patch(status, {"status": {"capacity": {"gpu.intel.com/i915": "8", "gpu.intel.com/tiles": "4"}}})
    try:
        wait_for(lambda: allocatable("gpu.intel.com/tiles") == "4", 30, "the node's tiles allocatable")
        tile = {"gpu.intel.com/i915": 1, "gpu.intel.com/tiles": 1}
        manifest = pod(
            space, "max", {"a": tile, "b": tile}, scheduler=SCHEDULER, out=out, annotations={"gas-allow": "card1"}
        )
        manifest["spec"]["containers"][1]["env"].append({"name": "ZE_AFFINITY_MASK", "value": "0,1"})
        running = run(cluster, space, manifest)

        annotations = running["metadata"]["annotations"]
        assert (annotations["gas-container-cards"], annotations["gas-container-tiles"]) == (
            "card1|card1",
            "card1:gt0|card1:gt1",
        )
        seen = {}
        for container in ("a", "b"):
            devices, env = read_output(out, "max", container)
            seen[container] = (family(devices, "card"), env.get("KUBEGPU_INTEL_CARDS"), env.get("ZE_AFFINITY_MASK"))
        assert seen == {"a": (["card1"], "card1", "0"), "b": (["card1"], "card1", "1")}
    finally:
        cluster.delete_pod(space, "max")
        wait_for(lambda: "max" not in {p["metadata"]["name"] for p in cluster.pods(space)}, 60, "pod max gone")
        cluster.client.patch(status, {"status": {"capacity": {"gpu.intel.com/i915": "2", "gpu.intel.com/tiles": None}}})
        wait_for(lambda: allocatable("gpu.intel.com/i915") == "2", 30, "the node's cards back to one container each")


def checked_pod(space: str, name: str, check: dict[str, str], out: Path) -> dict[str, Any]:
    """A pod whose app asks one GPU, after a GPU check: an init container `check` asking `check` that writes what
    it sees (its devices and env) to `out`, as the app does."""
    manifest = pod(space, name, {"main": {"nvidia.com/gpu": 1}}, scheduler=SCHEDULER, out=out)
    manifest["spec"]["initContainers"] = [
        {
            **manifest["spec"]["containers"][0],
            "name": "check",
            "command": ["sh", "-c", "ls /dev > /out/$C.devices; env > /out/$C.env"],
            "env": [{"name": "C", "value": f"{name}.check"}],
            "resources": {"limits": check},
        }
    ]
    return manifest


def test_an_init_container_runs_with_the_gpus_its_allocation_names_and_the_app_with_one_of_them(
    cluster: Cluster, kubelet: Kubelet, scheduler: SchedulerProcess, node_dir: Path, space: str
) -> None:
    """A GPU check before the app (`nvidia.com/gpu: 2` on the init container, 1 on the app): the shim created the
    init container with no GPU at all (its allocation named none to it). It now sees the 2 GPUs the allocation
    names for it, device nodes and env, and the app its own one, among them."""
    out = node_dir / "out"
    running = run(cluster, space, checked_pod(space, "checked", {"nvidia.com/gpu": "2"}, out))

    devices, env = read_output(out, "checked", "check")
    seen = (family(devices, "nvidia"), env.get("NVIDIA_VISIBLE_DEVICES"))
    assert len(seen[0]) == 2 and "nvidiactl" in devices, seen
    record = decode_allocation(running["metadata"]["annotations"][ALLOCATION_KEY])
    init, (app,) = record.init["check"]["nvidia.com/gpu"], record.containers["main"]["nvidia.com/gpu"]
    assert len(set(init)) == 2 and app in init, record
    assert seen == (sorted(f"nvidia{i}" for i in init), ",".join(init))
    devices, env = read_output(out, "checked", "main")
    assert family(devices, "nvidia") == [f"nvidia{app}"] and env["NVIDIA_VISIBLE_DEVICES"] == app


def test_an_init_container_asking_a_share_of_the_apps_whole_gpu_runs_held_to_its_share(
    cluster: Cluster, kubelet: Kubelet, scheduler: SchedulerProcess, node_dir: Path, space: str
) -> None:
    """A HAMi user's check before the app: the init container asks 30 % of a GPU (`nvidia.com/gpu: 1`,
    `nvidia.com/gpucores: 30`), the app the whole GPU. The scheduler refused the pod ("container check requests
    nvidia.com/gpucores without nvidia.com/gpu"); it now runs: the init container on the app's GPU held to 30 % of
    its compute by HAMi-core, the app on the same GPU whole, unlimited."""
    out = node_dir / "out"
    check = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}
    running = run(cluster, space, checked_pod(space, "checked-share", check, out))

    record = decode_allocation(running["metadata"]["annotations"][ALLOCATION_KEY])
    (gpu,) = record.containers["main"]["nvidia.com/gpu"]
    assert record.init == {"check": {"nvidia.com/gpu": [gpu]}}, record
    assert record.shares == {"check": {"nvidia.com/gpucores": {gpu: 30}}}, record
    held = {"CUDA_DEVICE_SM_LIMIT": "30", "CUDA_DEVICE_SM_LIMIT_0": "30"}  # the bare name and the GPU's own
    for container, limit in (("check", held), ("main", {})):
        devices, env = read_output(out, "checked-share", container)
        assert family(devices, "nvidia") == [f"nvidia{gpu}"] and "nvidiactl" in devices, container
        assert env["NVIDIA_VISIBLE_DEVICES"] == gpu, container
        assert {k: v for k, v in env.items() if k.startswith("CUDA_DEVICE_SM_LIMIT")} == limit, container
        assert limit or not any(k.startswith("CUDA_") for k in env), container  # a whole GPU: no limits at all


def test_two_gpu_shares_run_each_with_its_gpu_and_its_own_hami_core_limits(
    cluster: Cluster, kubelet: Kubelet, scheduler: SchedulerProcess, node_dir: Path, space: str
) -> None:
    out = node_dir / "out"
    shares = {"notebook": (30, 4096), "inference": (60, 8192)}
    running = {}
    for name, (cores, mib) in shares.items():
        limits = {"nvidia.com/gpu": 1, "nvidia.com/gpucores": cores, "nvidia.com/gpumem": mib}
        manifest = pod(space, name, {"main": limits}, scheduler=SCHEDULER, out=out)
        # the tenant writes the whole GPU's compute and memory into its spec, and HAMi-core's off switch
        manifest["spec"]["containers"][0]["env"] += [
            {"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"},
            {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "16160m"},
            {"name": "CUDA_DISABLE_CONTROL", "value": "true"},
        ]
        running[name] = run(cluster, space, manifest)

    for name, (cores, mib) in shares.items():
        record = decode_allocation(running[name]["metadata"]["annotations"][ALLOCATION_KEY])
        (gpu,) = record.containers["main"]["nvidia.com/gpu"]
        assert record.shares["main"]["nvidia.com/gpucores"] == {gpu: cores}
        devices, env = read_output(out, name, "main")
        assert family(devices, "nvidia") == [f"nvidia{gpu}"] and "nvidiactl" in devices
        assert {k: v for k, v in env.items() if k.startswith(("CUDA_", "NVIDIA_"))} == {
            "NVIDIA_VISIBLE_DEVICES": gpu,
            "CUDA_DEVICE_SM_LIMIT": str(cores),
            "CUDA_DEVICE_SM_LIMIT_0": str(cores),
            "CUDA_OVERSUBSCRIBE": "false",
            "CUDA_TASK_PRIORITY": "1",
            "CUDA_REDIRECT": "/usr/local/vgpu/libvgpu.so",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/cache/cudevshr.cache",
            "CUDA_DEVICE_MEMORY_LIMIT_0": f"{mib}m",
        }, name


def test_a_forged_allocation_is_refused_in_the_pods_events_and_never_runs(
    cluster: Cluster, kubelet: Kubelet, node_dir: Path, space: str
) -> None:
    # Signed, for this node, with devices that are free: but with a key that is not the cluster's.
    containers = {"main": {"aws.amazon.com/neurondevice": ["0", "1", "2", "3"]}}
    forged = sign_allocation(
        AllocationRecord(version=1, node=NODE, podUID="x", containers=containers), b"not-the-cluster-key"
    )
    manifest = pod(
        space,
        "forged",
        {"main": {"aws.amazon.com/neurondevice": 4}},
        scheduler=SCHEDULER,
        out=node_dir / "out",
        annotations={ALLOCATION_KEY: encode_allocation(forged)},
        node=NODE,
    )
    cluster.client.post(f"/api/v1/namespaces/{space}/pods", manifest)

    def refusal() -> str | None:
        for event in cluster.events(space):
            message = event.get("message") or ""
            if event["involvedObject"].get("name") == "forged" and "kubegpu:" in message:
                return str(message)
        return None

    message = wait_for(refusal, 60, "kubegpu's refusal in the forged pod's events")
    assert "kubegpu: signature check failed" in message
    found = cluster.client.get(f"/api/v1/namespaces/{space}/pods/forged")
    assert found["status"].get("phase") == "Pending"
    statuses = found["status"].get("containerStatuses") or []
    assert all("running" not in (s.get("state") or {}) for s in statuses)


def test_running_pods_survive_kubelet_and_containerd_restarts_and_new_pods_still_get_their_devices(
    cluster: Cluster, kubelet: Kubelet, containerd: Containerd, scheduler: SchedulerProcess, node_dir: Path, space: str
) -> None:
    out = node_dir / "out"
    before = run(
        cluster, space, pod(space, "before", {"main": {"aws.amazon.com/neurondevice": 4}}, scheduler=SCHEDULER, out=out)
    )
    uid = before["metadata"]["uid"]

    kubelet.restart()
    after_kubelet = run(
        cluster, space, pod(space, "after-kubelet", {"main": {"nvidia.com/gpu": 1}}, scheduler=SCHEDULER, out=out)
    )
    gpus = allocated(after_kubelet, "main")["nvidia.com/gpu"]
    assert read_output(out, "after-kubelet", "main")[1]["NVIDIA_VISIBLE_DEVICES"] == ",".join(gpus)

    containerd.restart()
    after_containerd = run(
        cluster,
        space,
        pod(space, "after-containerd", {"main": {"aws.amazon.com/neurondevice": 4}}, scheduler=SCHEDULER, out=out),
    )
    neuron = allocated(after_containerd, "main")["aws.amazon.com/neurondevice"]
    devices, env = read_output(out, "after-containerd", "main")
    assert family(devices, "neuron") == sorted(f"neuron{i}" for i in neuron)
    assert env["AWS_NEURON_VISIBLE_DEVICES"] == ",".join(neuron)

    survivor = cluster.client.get(f"/api/v1/namespaces/{space}/pods/before")
    assert survivor["metadata"]["uid"] == uid
    assert survivor["status"]["phase"] == "Running"
    assert all(s.get("restartCount", 0) == 0 for s in survivor["status"]["containerStatuses"])
