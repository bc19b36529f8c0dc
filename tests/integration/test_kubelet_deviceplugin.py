"""`kubegpu device-plugin` with a real kubelet 1.20 that talks to containerd directly (a managed node: no CRI shim).

The device plugin registers every resource with the kubelet, and the Node's capacity shows them: sixteen Neuron
devices and two Intel cards (fake device files and sysfs under a temporary host root). `kubegpu scheduler` places
pods; the kubelet asks the device plugin which ids it prefers (the ones the scheduler signed for the pod), allocates
them, and runs the container with what Allocate answered. A 4-device pod on the node as a trn1.32xlarge gets a torus
row, a 3-device pod on it as an inf2.48xlarge gets three ring neighbours, and a two-container Intel pod gets one
card per container: in each case exactly the ids the scheduler chose, as the containers themselves report them and
as the kubelet's own checkpoint records them. A pod bound with a forged allocation fails admission with kubegpu's
reason. The kubelet restarts and the device plugin registers again.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.annotations import ALLOCATION_KEY, AllocationRecord, encode_allocation, sign_allocation

from .cluster import Cluster, free_port, wait_for
from .conftest import SchedulerProcess
from .containerd import Containerd, make_char_devices, running_containerd
from .kubelet import Kubelet, pod, read_output, wait_running
from .test_kubelet_crishim import allocated, family

NODE = "kubegpu-dp-0"
SCHEDULER = "kubegpu-dp"
NEURON = "aws.amazon.com/neurondevice"
I915 = "gpu.intel.com/i915"


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
    def __init__(self, host: Path, kubelet: Kubelet, cluster: Cluster) -> None:
        self.log = host / "device-plugin.log"
        args = [
            "--node-name", NODE, "--allocation-key-file", str(host / "allocation.key"),
            "--kubeconfig", str(cluster.kubeconfig), "--host-root", str(host), "--dev-root", str(host / "dev"),
            "--device-plugin-dir", str(kubelet.device_plugin_dir), "--interval", "5s",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kubegpu.crishim.deviceplugin", *args],
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
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


def label(cluster: Cluster, labels: dict[str, str | None]) -> None:
    cluster.client.patch(f"/api/v1/nodes/{NODE}", {"metadata": {"labels": labels}})


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
