"""The allocation key rotated as docs/security.md ("Rotating the key") tells an operator, on real components.

The story: kube-apiserver and etcd, two `kubegpu scheduler` replicas taking turns by leader election, a kubelet whose
runtime endpoint is `kubegpu crishim` in front of a real containerd, and sixteen Neuron devices (character devices
under the shim's `--dev-root`). Pods run under the old key; then each step of the procedure is rolled as a
Deployment and a systemd unit roll them (one replica after the other, the leader stopped with SIGTERM; the shim
stopped and started again under the running kubelet), with a pod arriving during each roll. After every step: every
pod that should run runs with exactly the devices of its allocation, no device is held by two pods, a container
of a pod the old key placed still starts again when it exits, and `kubegpu_scheduler_pods_on_verify_keys` counts
the pods on the old key on the leader and on the standby alike (a standby that takes over says the same). `kubegpu
top` draws every pod's devices with either key as `--allocation-key-file`. When the gauge reads 0, the old key goes
everywhere and the pods the new key placed still restart. The same walk runs on the extender path (kube-scheduler
calling `kubegpu extender`, rolled as its Deployment's `Recreate` rolls it), and a node rolled late shows how the
broken order mends. The three tests take about six minutes together.

Each container writes its `/dev` and env to a hostPath directory, then waits for a stop file of its own generation
(`POD.main.stopN`): touching it ends the container, and the kubelet starts it again through the shim, which
verifies the pod's allocation anew.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import urllib3

from kubegpu.core.annotations import ALLOCATION_KEY, decode_allocation, verify_allocation

from .cluster import Cluster, config_flag, free_port, wait_for
from .conftest import SchedulerProcess
from .containerd import Containerd, ShimProcess, make_char_devices, running_containerd, start_shim_process
from .kubelet import Kubelet, pod, wait_running
from .test_extender import Process

NODE = "kubegpu-rotation-0"
SCHEDULER = "kubegpu-rotation"
NEURON = "aws.amazon.com/neurondevice"
LABELS = {"node.kubernetes.io/instance-type": "trn1.32xlarge"}
CAPACITY = {"aws.amazon.com/neuron": "16", NEURON: "16"}
LEASE = ["--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5"]
# Write what the container has, then its generation (last: the test waits on it), then wait for its stop file.
COMMAND = (
    "n=$(( $(cat /out/$C.n 2>/dev/null || echo 0) + 1 )); ls /dev > /out/$C.devices; env > /out/$C.env; "
    "echo $n > /out/$C.n; while [ ! -e /out/$C.stop$n ]; do sleep 0.2; done"
)


def verify_flags(directory: Path, names: tuple[str, ...]) -> list[str]:
    return [flag for name in names for flag in ("--allocation-verify-key-file", str(directory / name))]


@pytest.fixture(scope="module")
def node_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="kubegpu-rot-"))
    (directory / "dev").mkdir()
    make_char_devices(directory / "dev", [f"neuron{i}" for i in range(16)])
    (directory / "out").mkdir()
    (directory / "out").chmod(0o777)
    for name in ("old.key", "new.key"):
        (directory / name).write_text(secrets.token_hex(32) + "\n")
        (directory / name).chmod(0o600)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def containerd() -> Iterator[Containerd]:
    with running_containerd(cni_subnet="10.88.214.0/24") as runtime:
        yield runtime


class Node:
    """The node side: the shim (rolled with new flags as its systemd unit would be) under one kubelet."""

    def __init__(self, cluster: Cluster, containerd: Containerd, directory: Path) -> None:
        self.cluster, self.containerd, self.directory = cluster, containerd, directory
        self.rolls = 0
        self.shim: ShimProcess | None = None
        self.kubelet: Kubelet | None = None

    def roll(self, key: str, *verify: str) -> None:
        if self.shim is not None:
            assert self.shim.terminate() == 0, self.shim.output()
        self.rolls += 1
        self.shim = start_shim_process(
            socket=self.directory / "cri.sock",
            runtime_endpoint=self.containerd.endpoint,
            node_name=NODE,
            key_file=self.directory / key,
            dev_root=self.directory / "dev",
            log=self.directory / f"shim-{self.rolls}.log",
            kubeconfig=self.cluster.kubeconfig,
            extra=verify_flags(self.directory, verify),
        )

    def output(self) -> str:
        return "\n".join((self.directory / f"shim-{n}.log").read_text() for n in range(1, self.rolls + 1))


@pytest.fixture(scope="module")
def node(cluster: Cluster, containerd: Containerd, node_dir: Path) -> Iterator[Node]:
    side = Node(cluster, containerd, node_dir)
    side.roll("old.key")
    assert side.shim is not None
    side.kubelet = Kubelet(cluster, NODE, side.shim.endpoint)
    try:
        side.kubelet.start()
        cluster.client.patch(f"/api/v1/nodes/{NODE}", {"metadata": {"labels": LABELS}})
        cluster.client.patch(f"/api/v1/nodes/{NODE}/status", {"status": {"capacity": CAPACITY}})
        wait_for(
            lambda: cluster.client.get(f"/api/v1/nodes/{NODE}")["status"]["allocatable"].get(NEURON) == "16",
            30,
            "the node's Neuron devices allocatable",
        )
        yield side
    finally:
        side.kubelet.close()
        if side.shim is not None:
            side.shim.terminate()


class Walk:
    """The cluster as the operator sees it during the rotation, and the checks made after every step. The scheduler
    side: two `kubegpu scheduler` replicas under leader election (`ExtenderWalk`: kube-scheduler and the extender)."""

    scheduler = SCHEDULER

    def __init__(self, cluster: Cluster, node: Node, namespace: str, directory: Path) -> None:
        self.cluster, self.node, self.namespace, self.directory = cluster, node, namespace, directory
        self.out = directory / "out"
        self.replicas: list[SchedulerProcess] = []
        self.flags: tuple[str, ...] = ()  # the key files the scheduler side was last rolled with
        self.http = urllib3.PoolManager()

    # -- the scheduler side --------------------------------------------------------------------------------------

    def start(self, key: str, *verify: str) -> None:
        self.replica(key, *verify)
        self.replica(key, *verify)
        self.leader()

    def stop(self) -> None:
        for replica in self.replicas:
            replica.kill(signal.SIGTERM)

    def failover(self) -> None:
        """The leader stops (a node drained): the standby, which counted the pods all along, takes over."""
        leader = self.leader()
        leader.kill(signal.SIGTERM)
        self.replica(*self.flags)
        assert self.leader() is not leader

    def replica(self, key: str, *verify: str) -> SchedulerProcess:
        port = free_port()
        args = [
            "--kubeconfig", str(self.cluster.kubeconfig), "--scheduler-name", SCHEDULER,
            "--allocation-key-file", str(self.directory / key),
            *verify_flags(self.directory, verify),
            "--metrics-address", f"127.0.0.1:{port}", "--lease-namespace", self.namespace, *LEASE,
        ]  # fmt: skip
        process = SchedulerProcess(args, self.directory / f"scheduler-{len(self.replicas)}.log", port)
        self.replicas.append(process)
        self.flags = (key, *verify)
        return process

    def metric(self, replica: SchedulerProcess | str, name: str) -> float | None:
        url = replica if isinstance(replica, str) else f"http://127.0.0.1:{replica.metrics_port}"
        try:
            text = self.http.request("GET", f"{url}/metrics", retries=False, timeout=5.0).data
        except urllib3.exceptions.HTTPError:
            return None
        found = re.search(rf"^{name} (\S+)$", text.decode(), re.MULTILINE)
        return float(found.group(1)) if found else None

    def live(self) -> list[SchedulerProcess]:
        return [r for r in self.replicas if r.process.poll() is None]

    def leader(self) -> SchedulerProcess:
        def leading() -> SchedulerProcess | None:
            holders = [r for r in self.live() if self.metric(r, "kubegpu_scheduler_is_leader") == 1.0]
            return holders[0] if len(holders) == 1 else None

        found: SchedulerProcess = wait_for(leading, 30, "one replica leading")
        return found

    def roll_scheduler(self, key: str, *verify: str, arriving: str | None = None) -> None:
        """Replace both replicas, one after the other, as a Deployment's RollingUpdate does: a new one started, then
        an old one stopped (the standby first, then the leader, which hands its Lease over). `arriving`: a pod
        created while the leader is being replaced."""
        old = self.live()
        leader = self.leader()
        for replaced in sorted(old, key=lambda r: r is leader):
            self.replica(key, *verify)
            if replaced is leader and arriving is not None:
                self.create(arriving, 1)
            replaced.kill(signal.SIGTERM)
            self.leader()

    def gauge_everywhere(self, expected: float) -> None:
        """`kubegpu_scheduler_pods_on_verify_keys` as the operator reads it, on the leader and on the standby."""

        def agreed() -> bool:
            return all(self.metric(r, "kubegpu_scheduler_pods_on_verify_keys") == expected for r in self.live())

        assert len(self.live()) == 2
        wait_for(agreed, 30, f"kubegpu_scheduler_pods_on_verify_keys {expected} on both replicas")

    # -- pods ----------------------------------------------------------------------------------------------------

    def create(self, name: str, devices: int) -> None:
        manifest = pod(self.namespace, name, {"main": {NEURON: devices}}, scheduler=self.scheduler, out=self.out,
                       command=COMMAND)  # fmt: skip
        self.cluster.client.post(f"/api/v1/namespaces/{self.namespace}/pods", manifest)

    def generation(self, name: str) -> int:
        path = self.out / f"{name}.main.n"
        return int(path.read_text().strip() or 0) if path.exists() else 0

    def restart(self, name: str) -> None:
        """End the container of pod `name`: the kubelet starts it again through the shim."""
        before = self.generation(name)
        (self.out / f"{name}.main.stop{before}").touch()
        wait_for(lambda: self.generation(name) == before + 1, 90, f"the container of {name} started again")

    def signed_by(self, found: dict[str, Any]) -> str:
        record = decode_allocation(found["metadata"]["annotations"][ALLOCATION_KEY])
        for name in ("old.key", "new.key"):
            if verify_allocation(record, (self.directory / name).read_text().strip().encode()):
                return name
        raise AssertionError(f"{found['metadata']['name']}: signed by neither key")

    def check(self, running: dict[str, str]) -> None:
        """Every pod of `running` (name -> the key that signed it) runs with exactly its allocation's devices, as
        its latest container saw them, and no device is held by two pods."""
        held: dict[str, str] = {}
        for name, key in running.items():
            found = wait_running(self.cluster, self.namespace, name, timeout=90)
            assert self.signed_by(found) == key, name
            ids = decode_allocation(found["metadata"]["annotations"][ALLOCATION_KEY]).device_ids("main", NEURON)
            for device in ids:
                assert device not in held, f"device {device} held by {held.get(device)} and {name}"
                held[device] = name
            wait_for(lambda n=name: self.generation(n) > 0, 60, f"{name} wrote what it has")
            env = dict(
                line.split("=", 1) for line in (self.out / f"{name}.main.env").read_text().splitlines() if "=" in line
            )
            assert env.get("AWS_NEURON_VISIBLE_DEVICES") == ",".join(ids), (name, env.get("AWS_NEURON_VISIBLE_DEVICES"))
            seen = sorted(d for d in (self.out / f"{name}.main.devices").read_text().split() if d.startswith("neuron"))
            assert seen == sorted(f"neuron{i}" for i in ids), (name, seen)

    def top(self, key: str, *verify: str) -> dict[str, Any]:
        flags = verify_flags(self.directory, verify)
        answer = subprocess.run(
            [sys.executable, "-m", "kubegpu", "top", "--kubeconfig", str(self.cluster.kubeconfig), "--json",
             "--allocation-key-file", str(self.directory / key), *flags],
            capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        assert answer.returncode == 0, answer.stderr
        document: dict[str, Any] = json.loads(answer.stdout)
        return document


def drawn(document: dict[str, Any]) -> dict[str, list[str]]:
    """device id -> holders on the rotation's node, as `kubegpu top --json` draws them."""
    (entry,) = [n for n in document["nodes"] if n["name"] == NODE]
    return {c["id"]: c["holders"] for picture in entry["devices"] for c in picture["cells"] if c["holders"]}


class ExtenderWalk(Walk):
    """The extender path: kube-scheduler (profile `gpu-rotation`) calling `kubegpu extender`, which is rolled as its
    shipped Deployment is (`strategy: Recreate`: the old one stopped before the new one starts)."""

    scheduler = "gpu-rotation"

    def __init__(self, cluster: Cluster, node: Node, namespace: str, directory: Path) -> None:
        super().__init__(cluster, node, namespace, directory)
        self.url = f"http://127.0.0.1:{free_port()}"
        self.processes: list[Process] = []
        self.extender: Process | None = None

    def start(self, key: str) -> None:
        self.start_extender(key)
        config = self.directory / "kube-scheduler.yaml"
        config.write_text(
            "apiVersion: kubescheduler.config.k8s.io/v1beta1\nkind: KubeSchedulerConfiguration\n"
            f"clientConnection:\n  kubeconfig: {self.cluster.kubeconfig}\n"
            "leaderElection:\n  leaderElect: false\n"
            f"profiles:\n- schedulerName: {self.scheduler}\n"
            f"extenders:\n- urlPrefix: {self.url}\n  filterVerb: filter\n  prioritizeVerb: prioritize\n"
            "  bindVerb: bind\n  weight: 1\n  enableHTTPS: false\n  nodeCacheCapable: true\n  ignorable: false\n"
            f"  managedResources:\n  - name: {NEURON}\n    ignoredByScheduler: false\n"
        )
        self.processes.append(
            Process(
                [str(self.cluster.bin / "kube-scheduler"), config_flag(config), "--port=0",
                 f"--secure-port={free_port()}", "--bind-address=127.0.0.1",
                 f"--cert-dir={self.directory / 'ks-certs'}", "--authentication-tolerate-lookup-failure"],
                self.directory / "kube-scheduler.log",
            )
        )  # fmt: skip

    def start_extender(self, key: str, *verify: str) -> None:
        command = [sys.executable, "-m", "kubegpu", "extender", "--kubeconfig", str(self.cluster.kubeconfig),
                   "--listen", self.url.removeprefix("http://"), "--insecure-no-client-auth",
                   "--allocation-key-file", str(self.directory / key),
                   *verify_flags(self.directory, verify)]  # fmt: skip
        self.extender = Process(command, self.directory / f"extender-{len(self.processes)}.log")
        self.processes.append(self.extender)
        self.flags = (key, *verify)

        def ready() -> bool:
            return self.http.request("GET", f"{self.url}/readyz", timeout=1.0, retries=False).status == 200

        wait_for(ready, 30, "the extender to list the cluster")

    def stop(self) -> None:
        for process in self.processes:
            process.stop()

    def roll_scheduler(self, key: str, *verify: str, arriving: str | None = None) -> None:
        assert self.extender is not None
        self.extender.stop()
        if arriving is not None:
            self.create(arriving, 1)
        self.start_extender(key, *verify)

    def failover(self) -> None:
        """The extender restarts (its pod evicted): the new process counts the pods again from its list."""
        self.roll_scheduler(*self.flags)

    def gauge_everywhere(self, expected: float) -> None:
        wait_for(
            lambda: self.metric(self.url, "kubegpu_scheduler_pods_on_verify_keys") == expected,
            30,
            f"the extender's kubegpu_scheduler_pods_on_verify_keys {expected}",
        )


def rotate(walk: Walk, prefix: str) -> None:
    """docs/security.md's four steps, checked after each (names of pods: `prefix` + a, b, c for the pods placed
    before, s1-s4 for those arriving during each step)."""
    a, b, c, s1, s2, s3, s4 = (prefix + n for n in ("a", "b", "c", "s1", "s2", "s3", "s4"))
    walk.node.roll("old.key")  # where an earlier walk left it with the new key
    walk.start("old.key")
    for name in (a, b, c):
        walk.create(name, 4)
    running = {a: "old.key", b: "old.key", c: "old.key"}
    walk.check(running)
    walk.gauge_everywhere(0.0)

    # Step 1: every process accepts the new key as well; the node side first, a pod arriving during its roll.
    walk.create(s1, 1)
    walk.node.roll("old.key", "new.key")
    walk.roll_scheduler("old.key", "new.key")
    running[s1] = "old.key"
    walk.check(running)
    walk.restart(a)
    walk.check(running)
    walk.gauge_everywhere(0.0)

    # Step 2: the scheduler side signs with the new key; a pod arrives while it is rolled. Which key signs it is the
    # roll's race: the old leader may still place it before it hands over (a Deployment's RollingUpdate), and then
    # the gauge counts it with the old key's pods, and step 4 waits for it as well.
    walk.roll_scheduler("new.key", "old.key", arriving=s2)
    running[s2] = walk.signed_by(wait_running(walk.cluster, walk.namespace, s2, timeout=90))
    old_keys = [name for name, key in running.items() if key == "old.key"]  # a, b, c, s1 (and s2 if so placed)
    walk.check(running)
    walk.gauge_everywhere(float(len(old_keys)))
    walk.restart(b)
    walk.check(running)
    walk.failover()
    walk.gauge_everywhere(float(len(old_keys)))

    # Step 3: the node side verifies with the new key; a pod arrives during its roll.
    walk.create(s3, 1)
    walk.node.roll("new.key", "old.key")
    running[s3] = "new.key"
    walk.check(running)
    walk.restart(c)
    walk.restart(s2)
    walk.check(running)
    for key, verify in (("new.key", "old.key"), ("old.key", "new.key")):
        document = walk.top(key, verify)
        assert document["unverified"] == {} and document["problems"] == [], document
        held = drawn(document)
        for name in running:
            found = walk.cluster.client.get(f"/api/v1/namespaces/{walk.namespace}/pods/{name}")
            ids = decode_allocation(found["metadata"]["annotations"][ALLOCATION_KEY]).device_ids("main", NEURON)
            for device in ids:
                assert held[device] == [f"{walk.namespace}/{name}"], (key, device, held.get(device))

    # Step 4: the pods the old key placed end; the gauge reads 0; the old key goes everywhere.
    for name in old_keys:
        walk.cluster.delete_pod(walk.namespace, name)
        del running[name]
    walk.gauge_everywhere(0.0)
    walk.create(s4, 1)
    walk.node.roll("new.key")
    walk.roll_scheduler("new.key")
    running[s4] = "new.key"
    walk.check(running)
    for name in (s2, s3):
        if name in running:
            walk.restart(name)
    walk.check(running)
    refusals = [
        e.get("message") or "" for e in walk.cluster.events(walk.namespace) if "kubegpu:" in (e.get("message") or "")
    ]
    assert refusals == [], "no pod was refused by the node"


@contextmanager
def walking(kind: type[Walk], cluster: Cluster, node: Node, node_dir: Path) -> Iterator[Walk]:
    namespace = cluster.create_namespace(f"rotation-{secrets.token_hex(2)}")
    walk = kind(cluster, node, namespace, node_dir)
    try:
        yield walk
    finally:
        walk.stop()
        for item in cluster.pods(namespace):
            cluster.delete_pod(namespace, item["metadata"]["name"])
        wait_for(lambda: not cluster.pods(namespace), 60, "the walk's pods gone")


def test_the_key_rotated_step_by_step_as_the_doc_says_with_pods_running_and_arriving(
    cluster: Cluster, node: Node, node_dir: Path
) -> None:
    with walking(Walk, cluster, node, node_dir) as walk:
        rotate(walk, "")


def test_the_key_rotated_step_by_step_on_the_extender_path(cluster: Cluster, node: Node, node_dir: Path) -> None:
    """The same steps with kube-scheduler and `kubegpu extender`. A pod kube-scheduler tried while no extender
    answered (step 2's roll: Recreate) waits in kube-scheduler's unschedulable queue, about a minute in 1.20."""
    with walking(ExtenderWalk, cluster, node, node_dir) as walk:
        rotate(walk, "x-")


def test_a_node_rolled_late_refuses_the_new_keys_pods_until_it_is_rolled_then_starts_them(
    cluster: Cluster, node: Node, node_dir: Path
) -> None:
    """Step order broken: the scheduler side signs with the new key (step 2) while a node still runs its shim with
    the old key alone (its step 1 missed). The pod placed there is refused by the node, saying why in its Events, and
    is not lost: once the node is rolled, the kubelet's next retry starts it, with its devices, nothing recreated."""
    with walking(Walk, cluster, node, node_dir) as walk:
        node.roll("old.key")
        walk.start("new.key", "old.key")
        walk.create("late", 1)

        def refusal() -> str | None:
            messages = [e.get("message") or "" for e in cluster.events(walk.namespace)]
            return next((m for m in messages if "kubegpu: signature check failed" in m), None)

        wait_for(refusal, 60, "the node's refusal in the pod's Events")
        found = cluster.client.get(f"/api/v1/namespaces/{walk.namespace}/pods/late")
        assert found["status"].get("phase") == "Pending"
        uid = found["metadata"]["uid"]
        node.roll("old.key", "new.key")
        walk.check({"late": "new.key"})
        assert cluster.client.get(f"/api/v1/namespaces/{walk.namespace}/pods/late")["metadata"]["uid"] == uid
