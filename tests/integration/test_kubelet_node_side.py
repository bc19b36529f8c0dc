"""The node side on a real kubelet 1.20.2 (straight to containerd, `kubegpu device-plugin` registered): the kubelet's
PodResources reach the ledger, and seed 000's own flow runs on real components.

* A pod written with `spec.nodeName` (it bypasses every scheduler) asks for two Neuron devices; the device plugin,
  run with `--foreign-pods allow`, lets the kubelet give it the ids it chose. `kubegpu advertise` reads the kubelet's
  PodResources and publishes those ids as `kubegpu.io/foreign-devices`; `kubegpu scheduler` then holds exactly them,
  so every 4-device pod it places afterwards avoids them and is admitted (a guess would collide with the kubelet's
  choice whenever the kubelet picked other ids than the scheduler's count hold).
* Seed 000, steps 1 to 11: the device plugin lists the devices to the kubelet (1), which advertises them (2); a pod
  asks for `aws.amazon.com/neuron: 2` (3); kube-scheduler 1.20.2 calls `kubegpu extender`'s filter (4, 5) and bind
  (6); the extender writes the pod annotation with the contiguous ids (7, `NEURON_DEVS: 2,3` beside the signed
  `kubegpu.io/allocation`) and binds (8); the kubelet calls the device plugin's Allocate (9), which reads the pod's
  annotation (10) and exports `AWS_NEURON_VISIBLE_DEVICES=2,3` to the container (11).
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.annotations import (
    DEVICES_KEY,
    FOREIGN_DEVICES_KEY,
    NODE_LEASE_NAMESPACE,
    NODE_LEASE_PREFIX,
    decode_allocation,
    decode_foreign_devices,
)
from kubegpu.kube.client import ApiError

from .cluster import Cluster, free_port, wait_for
from .conftest import SchedulerProcess
from .containerd import Containerd, make_char_devices, running_containerd
from .kubelet import Kubelet, pod, read_output, wait_running
from .test_extender import extender_stack  # noqa: F401  (the fixture: kubegpu extender behind kube-scheduler)

NODE = "kubegpu-ns-0"
NEURON = "aws.amazon.com/neuron"
NEURONDEVICE = "aws.amazon.com/neurondevice"
ROWS = [{str(i) for i in range(r, r + 4)} for r in (0, 4, 8, 12)]


@pytest.fixture(scope="module")
def host() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="kubegpu-nsh-"))
    make_char_devices(root / "dev", [f"neuron{i}" for i in range(16)])
    (root / "out").mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def containerd() -> Iterator[Containerd]:
    with running_containerd(cni_subnet="10.88.213.0/24") as runtime:
        yield runtime


@pytest.fixture(scope="module")
def kubelet(cluster: Cluster, containerd: Containerd) -> Iterator[Kubelet]:
    node = Kubelet(cluster, NODE, containerd.endpoint)
    try:
        node.start()
        yield node
    finally:
        node.close()


class NodeProcess:
    """A `kubegpu` node-side command (device-plugin or advertise) as its DaemonSet runs it."""

    def __init__(self, module: str, args: list[str], log: Path) -> None:
        self.log = log
        env = {**os.environ, "PATH": str(Path(sys.executable).parent), "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", f"kubegpu.crishim.{module}", *args],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            env=env,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=20)


@pytest.fixture
def node_side(
    cluster: Cluster, host: Path, kubelet: Kubelet, key_file: Path, tmp_path: Path
) -> Iterator[Callable[..., NodeProcess]]:
    started: list[NodeProcess] = []

    def start(module: str, *extra: str) -> NodeProcess:
        common = ["--node-name", NODE, "--kubeconfig", str(cluster.kubeconfig), "--host-root", str(host)]
        if module == "deviceplugin":
            common += ["--allocation-key-file", str(key_file), "--dev-root", str(host / "dev"),
                       "--device-plugin-dir", str(kubelet.device_plugin_dir), "--interval", "5s"]  # fmt: skip
        process = NodeProcess(module, [*common, *extra], tmp_path / f"{module}-{len(started)}.log")
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
    # The Node as its kubelet left it: what an advertiser published goes with it, its node Lease too (expired, it
    # would keep the next test's pods off the node).
    cluster.client.patch(
        f"/api/v1/nodes/{NODE}", {"metadata": {"annotations": {DEVICES_KEY: None, FOREIGN_DEVICES_KEY: None}}}
    )
    try:
        cluster.client.delete(
            f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases/{NODE_LEASE_PREFIX}{NODE}"
        )
    except ApiError as exc:
        if exc.status != 404:
            raise


@pytest.fixture
def space(cluster: Cluster) -> Iterator[str]:
    name = cluster.create_namespace(f"ns-{secrets.token_hex(3)}")
    yield name
    for item in cluster.pods(name):
        cluster.delete_pod(name, item["metadata"]["name"])
    wait_for(lambda: not cluster.pods(name), 60, f"the pods of {name} gone")


def node(cluster: Cluster) -> dict[str, Any]:
    found: dict[str, Any] = cluster.client.get(f"/api/v1/nodes/{NODE}")
    return found


def checkpoint(kubelet: Kubelet, pod_uid: str, resource: str) -> list[str]:
    """The device ids the kubelet itself recorded for a pod (its device manager's checkpoint)."""
    data = json.loads((kubelet.device_plugin_dir / "kubelet_internal_checkpoint").read_text())
    return sorted(
        (i for e in data["Data"]["PodDeviceEntries"] if e["PodUID"] == pod_uid and e["ResourceName"] == resource
         for ids in e["DeviceIDs"].values() for i in ids),
        key=int,
    )  # fmt: skip


def test_a_pod_that_bypassed_the_scheduler_holds_exactly_the_ids_the_kubelet_gave_it(
    cluster: Cluster,
    kubelet: Kubelet,
    node_side: Callable[..., NodeProcess],
    host: Path,
    key_file: Path,
    space: str,
    tmp_path: Path,
) -> None:
    out = host / "out"
    plugin = node_side("deviceplugin", "--foreign-pods", "allow")
    wait_for(lambda: node(cluster)["status"]["capacity"].get(NEURONDEVICE) == "16", 60, "neurondevice capacity")
    cluster.client.patch(
        f"/api/v1/nodes/{NODE}", {"metadata": {"labels": {"node.kubernetes.io/instance-type": "trn1.32xlarge"}}}
    )
    bypass = pod(space, "bypass", {"main": {NEURONDEVICE: 2}}, scheduler="nobody", out=out, node=NODE)
    cluster.client.post(f"/api/v1/namespaces/{space}/pods", bypass)
    running = wait_running(cluster, space, "bypass", timeout=60)
    ids = checkpoint(kubelet, running["metadata"]["uid"], NEURONDEVICE)
    assert len(ids) == 2, plugin.output()[-2000:]
    _, env = read_output(out, "bypass", "main")
    assert env["AWS_NEURON_VISIBLE_DEVICES"] == ",".join(ids)

    node_side("advertise", "--interval", "1s", "--pod-resources-socket", str(kubelet.pod_resources_socket))

    def published() -> dict[str, Any] | None:
        raw = (node(cluster)["metadata"].get("annotations") or {}).get(FOREIGN_DEVICES_KEY)
        return decode_foreign_devices(raw).pods if raw else None

    assert wait_for(published, 30, "the foreign devices published") == {
        f"{space}/bypass": {"main": {NEURONDEVICE: ids}}
    }

    scheduler = SchedulerProcess(
        ["--kubeconfig", str(cluster.kubeconfig), "--scheduler-name", "kubegpu-ns", "--allocation-key-file",
         str(key_file), "--metrics-address", f"127.0.0.1:{free_port()}", "--no-leader-elect"],
        tmp_path / "scheduler.log",
        0,
    )  # fmt: skip
    try:
        free_rows = [row for row in ROWS if row.isdisjoint(ids)]
        placed = []
        for i in range(len(free_rows)):  # one at a time: two pending pods of one shape may swap ids (deviceplugin.py)
            manifest = pod(space, f"row{i}", {"main": {NEURONDEVICE: 4}}, scheduler="kubegpu-ns", out=out)
            cluster.client.post(f"/api/v1/namespaces/{space}/pods", manifest)
            row = wait_running(cluster, space, f"row{i}", timeout=60)
            allocation = decode_allocation(row["metadata"]["annotations"]["kubegpu.io/allocation"])
            placed.append(set(allocation.containers["main"][NEURONDEVICE]))
            assert checkpoint(kubelet, row["metadata"]["uid"], NEURONDEVICE) == sorted(placed[-1], key=int)
        assert sorted(map(sorted, placed)) == sorted(map(sorted, free_rows))  # every row the bypassing pod left free
        # The ledger counts the bypassing pod's two ids: no row is left for one more 4-device pod. (Held by count, a
        # trn1 cannot even set 2 devices aside, so without the publication this pod would be placed on its ids.)
        extra = pod(space, "extra", {"main": {NEURONDEVICE: 4}}, scheduler="kubegpu-ns", out=out)
        cluster.client.post(f"/api/v1/namespaces/{space}/pods", extra)

        def refused() -> str | None:
            for event in cluster.events(space):
                if event["involvedObject"]["name"] == "extra" and event["reason"] == "FailedScheduling":
                    return str(event["message"])
            return None

        message = wait_for(refused, 30, "the extra pod refused")
        # Too few devices left, or enough left but no free row among them (the kubelet chose the bypassing pod's ids).
        assert message.startswith("0/1 nodes are available: 1 ") and (
            f"Insufficient {NEURONDEVICE}" in message or "no free aligned torus block of 4 Neuron devices" in message
        ), message
        assert not cluster.client.get(f"/api/v1/namespaces/{space}/pods/extra")["spec"].get("nodeName")
    finally:
        scheduler.kill(signal.SIGTERM)


def neuron_devices_advertised(
    cluster: Cluster, node_side: Callable[..., NodeProcess], instance_type: str = "inf1.24xlarge"
) -> None:
    """The device-plugin mode lists the 16 Neuron devices of an inf1.24xlarge (a ring; or `instance_type`) to the
    kubelet, which advertises them on its Node."""
    node_side("deviceplugin")
    cluster.client.patch(
        f"/api/v1/nodes/{NODE}", {"metadata": {"labels": {"node.kubernetes.io/instance-type": instance_type}}}
    )
    wait_for(lambda: node(cluster)["status"]["allocatable"].get(NEURON) == "16", 60, "aws.amazon.com/neuron: 16")


def test_seed_000_steps_1_to_11_on_kube_scheduler_the_extender_the_kubelet_and_the_device_plugin(
    cluster: Cluster,
    kubelet: Kubelet,
    node_side: Callable[..., NodeProcess],
    extender_stack: Any,  # noqa: F811
    host: Path,
    space: str,
) -> None:
    out = host / "out"
    neuron_devices_advertised(cluster, node_side)  # steps 1 and 2: the device list to the kubelet, its Node
    _, extender, scheduler = extender_stack(https=True)
    for name in ("first", "second"):  # step 3: pods asking for aws.amazon.com/neuron: 2
        manifest = pod(space, name, {"main": {NEURON: 2}}, scheduler="gpu-scheduler", out=out)
        cluster.client.post(f"/api/v1/namespaces/{space}/pods", manifest)
        wait_running(cluster, space, name, timeout=90)
    second = cluster.client.get(f"/api/v1/namespaces/{space}/pods/second")
    # Steps 4 to 8: kube-scheduler asked the extender to filter and to bind; the extender wrote the annotations.
    log = extender.output()
    assert f"msg=filter pod={space}/second" in log and f"msg=bound pod={space}/second" in log
    annotations = second["metadata"]["annotations"]
    assert annotations["NEURON_DEVS"] == "2,3"
    assert decode_allocation(annotations["kubegpu.io/allocation"]).containers == {"main": {NEURON: ["2", "3"]}}
    # Steps 9 to 11: the kubelet's Allocate, answered from the pod's annotation, and the container's environment.
    assert checkpoint(kubelet, second["metadata"]["uid"], NEURON) == ["2", "3"]
    devices, env = read_output(out, "second", "main")
    assert env["AWS_NEURON_VISIBLE_DEVICES"] == "2,3"
    assert sorted(d for d in devices if d.startswith("neuron")) == ["neuron2", "neuron3"]
    assert scheduler.process.poll() is None


def run_checked(
    cluster: Cluster,
    node_side: Callable[..., NodeProcess],
    extender_stack: Any,  # noqa: F811
    space: str,
    out: Path,
    app: dict[str, int],
    init: int,
    instance_type: str = "inf1.24xlarge",
) -> tuple[dict[str, Any], Any]:
    """Pod `checked` bound through kube-scheduler and the extender on a Neuron node of `instance_type`: its app
    container `main` asking `app`, before it an init container `check` asking `init` Neuron devices and writing what
    it sees to `out`; the pod once running, and the extender stack's scheduler."""
    neuron_devices_advertised(cluster, node_side, instance_type)
    _, extender, scheduler = extender_stack(https=False)
    manifest = pod(space, "checked", {"main": app}, scheduler="gpu-scheduler", out=out)
    check = {
        **manifest["spec"]["containers"][0],
        "name": "check",
        "command": ["sh", "-c", "ls /dev > /out/$C.devices; env > /out/$C.env"],
        "env": [{"name": "C", "value": "checked.check"}],
        "resources": {"limits": {NEURON: str(init)}},
    }
    manifest["spec"]["initContainers"] = [check]
    cluster.client.post(f"/api/v1/namespaces/{space}/pods", manifest)
    try:
        return wait_running(cluster, space, "checked", timeout=90), scheduler
    except AssertionError:
        events = [e["message"] for e in cluster.events(space)]
        raise AssertionError(f"{events}\n---\n{extender.output()[-3000:]}") from None


def test_a_pod_whose_only_devices_are_its_init_containers_runs_with_them_through_the_extender(
    cluster: Cluster,
    kubelet: Kubelet,
    node_side: Callable[..., NodeProcess],
    extender_stack: Any,  # noqa: F811
    host: Path,
    space: str,
) -> None:
    """An init container asks for two Neuron devices (a firmware check before a cpu-only app): kube-scheduler binds
    the pod through the extender, whose allocation names the init container's devices (before, it named none and the
    kubelet refused the pod at admission); the kubelet's Allocate for the init container is answered with them, the
    init container sees exactly them, and the pod runs."""
    out = host / "out"
    running, scheduler = run_checked(cluster, node_side, extender_stack, space, out, {}, 2)
    record = decode_allocation(running["metadata"]["annotations"]["kubegpu.io/allocation"])
    ids = record.containers["check"][NEURON]
    assert len(ids) == 2 and list(record.containers) == ["check"], record.containers
    assert checkpoint(kubelet, running["metadata"]["uid"], NEURON) == sorted(ids, key=int)
    devices, env = read_output(out, "checked", "check")
    assert env["AWS_NEURON_VISIBLE_DEVICES"] == ",".join(ids)
    assert sorted(d for d in devices if d.startswith("neuron")) == sorted(f"neuron{i}" for i in ids)
    assert scheduler.process.poll() is None


def test_an_init_container_asking_more_devices_than_the_app_runs_with_them_and_the_app_with_one(
    cluster: Cluster,
    kubelet: Kubelet,
    node_side: Callable[..., NodeProcess],
    extender_stack: Any,  # noqa: F811
    host: Path,
    space: str,
) -> None:
    """An init container asks for four Neuron devices, the app for one (a check of the devices the pod's node gives it
    before a one-device server): the kubelet gives the init container four and keeps them for the pod, the app's one
    taken from them at its own pick. The scheduler counted four but named only the app's one, so the kubelet's
    Allocate of four for the init container matched no allocation and the pod failed admission. The allocation now
    names the init container's four (the app's among them); the pod runs, each container with ids the allocation
    names, and the kubelet holds for the pod exactly the four the scheduler counted."""
    out = host / "out"
    running, scheduler = run_checked(cluster, node_side, extender_stack, space, out, {NEURON: 1}, 4)
    record = decode_allocation(running["metadata"]["annotations"]["kubegpu.io/allocation"])
    init = record.init["check"][NEURON]
    held = sorted({i for resources in record.containers.values() for i in resources.get(NEURON, [])}, key=int)
    assert len(init) == 4 and sorted(init, key=int) == held, record
    # What the kubelet holds for the pod (its checkpoint lists the init container's four, then the app's one again).
    assert sorted(set(checkpoint(kubelet, running["metadata"]["uid"], NEURON)), key=int) == held
    devices, env = read_output(out, "checked", "check")
    assert sorted(env["AWS_NEURON_VISIBLE_DEVICES"].split(","), key=int) == held
    assert sorted(d for d in devices if d.startswith("neuron")) == sorted(f"neuron{i}" for i in held)
    devices, env = read_output(out, "checked", "main")
    (app,) = env["AWS_NEURON_VISIBLE_DEVICES"].split(",")
    assert app in init and [d for d in devices if d.startswith("neuron")] == [f"neuron{app}"]
    assert scheduler.process.poll() is None


def test_a_torus_row_checked_before_a_one_device_server_runs_the_check_on_the_whole_row(
    cluster: Cluster,
    kubelet: Kubelet,
    node_side: Callable[..., NodeProcess],
    extender_stack: Any,  # noqa: F811
    host: Path,
    space: str,
) -> None:
    """The same check of four devices before a server of one, on a trn1.32xlarge (a 4x4 torus: 1, 4, 8 or 16
    devices). The extender refused the pod with `Instance type trn1.32xlarge does not support requests for device:
    3`, a count nobody asked (the three the check holds beyond the server's one, placed as a request of their own).
    The pod now runs: the check on an aligned row, device nodes and env, the server on one device of it."""
    out = host / "out"
    running, scheduler = run_checked(cluster, node_side, extender_stack, space, out, {NEURON: 1}, 4, "trn1.32xlarge")
    record = decode_allocation(running["metadata"]["annotations"]["kubegpu.io/allocation"])
    row = sorted(record.init["check"][NEURON], key=int)
    assert row in [[str(i) for i in range(start, start + 4)] for start in (0, 4, 8, 12)], record
    assert sorted(set(checkpoint(kubelet, running["metadata"]["uid"], NEURON)), key=int) == row
    devices, env = read_output(out, "checked", "check")
    assert sorted(env["AWS_NEURON_VISIBLE_DEVICES"].split(","), key=int) == row
    assert sorted(d for d in devices if d.startswith("neuron")) == sorted(f"neuron{i}" for i in row)
    devices, env = read_output(out, "checked", "main")
    (server,) = env["AWS_NEURON_VISIBLE_DEVICES"].split(",")
    assert server in row and [d for d in devices if d.startswith("neuron")] == [f"neuron{server}"]
    assert running["metadata"]["annotations"]["NEURON_DEVS"] == ",".join(row)
    assert scheduler.process.poll() is None
