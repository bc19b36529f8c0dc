"""A broken third-party plugin installed next to kubegpu, against a real kube-apiserver: the scheduler stays up.

The plugin is a real distribution as far as `importlib.metadata` can tell (a `.dist-info` with entry points on the
scheduler process's PYTHONPATH). Its `fit` answers `True` instead of a `Status`, its `score` answers `"high"`, and on
one node its `build_node` raises (and on another it takes 1.2 s): every one of these used to crash a front-end or hide
behind "Insufficient ...", and the slow call went unsaid. The story an operator sees: the built-in plugins' pods are
bound as usual, the broken plugin's pod stays pending with a FailedScheduling event naming the plugin and the hook,
`/metrics` counts the failures and the slow calls, and the log names the slow plugin.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import urllib3

from .cluster import Cluster, free_port, wait_for

BROKEN = """
import time

from kubegpu.core.kit import WholeDevicePlugin, label_devices
from kubegpu.core.scheduler_hooks import hookimpl


class Broken(WholeDevicePlugin):
    resources = ("broken.example/card",)

    def devices(self, node):
        if node.name == "broken-raises":
            raise RuntimeError("vendor library crashed")
        if node.name == "broken-b":
            time.sleep(1.2)  # a vendor library call hanging: reported, never interrupted
        return label_devices(node.labels, "broken.example/card.count", "card"), None

    @hookimpl
    def kubegpu_scheduler_fit(self, state, pod, prepared):
        return True

    @hookimpl
    def kubegpu_scheduler_score(self, state, pod, prepared):
        return "high"


plugin = Broken()
"""


# Its books lose every holder: `take` records nothing and `allocate` always names card0.
CARELESS = """
from kubegpu.core.kit import WholeDevicePlugin, label_devices
from kubegpu.core.models import PluginAllocation
from kubegpu.core.scheduler_hooks import hookimpl
from kubegpu.core.status import Status


class Careless(WholeDevicePlugin):
    resources = ("careless.example/card",)

    def devices(self, node):
        return label_devices(node.labels, "careless.example/card.count", "card"), None

    @hookimpl
    def kubegpu_scheduler_allocate(self, state, pod, prepared):
        return PluginAllocation(plugin=self.name, containers={"main": {"careless.example/card": ["card0"]}})

    @hookimpl
    def kubegpu_scheduler_take(self, state, pod_key, allocation):
        return Status.success()


plugin = Careless()
"""


def _install_broken(directory: Path, name: str = "broken", source: str = BROKEN) -> Path:
    package = directory / f"kubegpu_{name}"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(source)
    dist_info = directory / f"kubegpu_{name}-0.1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: kubegpu-{name}\nVersion: 0.1.0\n")
    (dist_info / "entry_points.txt").write_text(f"[kubegpu.scheduler]\n{name} = kubegpu_{name}:plugin\n")
    return directory


def _scheduler_with(cluster: Cluster, key_file: Path, site: Path, log: Path, port: int | None = None) -> Any:
    """`kubegpu scheduler` on the real API server, with the plugin installed under `site` importable beside the
    built-in ones, logging to `log`, serving /metrics on `port` (a free one when None)."""
    environment = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable, "-m", "kubegpu", "scheduler", "--kubeconfig", str(cluster.kubeconfig),
        "--scheduler-name", "kubegpu", "--allocation-key-file", str(key_file),
        "--metrics-address", f"127.0.0.1:{port or free_port()}", "--no-leader-elect",
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=environment)


def _events(cluster: Cluster, namespace: str, pod: str) -> list[str]:
    return [e.get("message", "") for e in cluster.events(namespace) if e["involvedObject"].get("name") == pod]


def test_a_broken_third_party_plugin_leaves_the_scheduler_up_and_other_plugins_pods_bound(
    cluster: Cluster, namespace: str, key_file: Path, tmp_path: Path
) -> None:
    cluster.create_ready_node(
        "inf2-broken",
        labels={"node.kubernetes.io/instance-type": "inf2.48xlarge"},
        allocatable={"aws.amazon.com/neuron": 12},
    )
    for name in ("broken-a", "broken-b", "broken-raises"):
        cluster.create_ready_node(
            name, labels={"broken.example/card.count": "2"}, allocatable={"broken.example/card": 2}
        )
    port = free_port()
    log = tmp_path / "scheduler.log"
    process = _scheduler_with(cluster, key_file, _install_broken(tmp_path / "site"), log, port)
    try:
        cluster.create_pod(namespace, "broken-pod", {"main": {"broken.example/card": 1}}, scheduler="kubegpu")
        cluster.create_pod(namespace, "neuron-pod", {"main": {"aws.amazon.com/neuron": 2}}, scheduler="kubegpu")

        def bound(name: str) -> Any:
            pods = {p["metadata"]["name"]: p for p in cluster.pods(namespace)}
            return pods.get(name, {}).get("spec", {}).get("nodeName")

        assert wait_for(lambda: bound("neuron-pod"), 60, "the neuron pod bound") == "inf2-broken"
        messages = wait_for(
            lambda: [m for m in _events(cluster, namespace, "broken-pod") if "plugin 'broken'" in m],
            60,
            "a FailedScheduling event naming the broken plugin",
        )
        assert any("kubegpu_scheduler_fit: WrongAnswer: returned True (bool)" in m for m in messages), messages
        assert any(
            "plugin 'broken' failed on node broken-raises in kubegpu_scheduler_build_node: RuntimeError" in m
            for m in messages
        ), messages
        assert bound("broken-pod") is None

        cluster.create_pod(namespace, "neuron-later", {"main": {"aws.amazon.com/neuron": 4}}, scheduler="kubegpu")
        assert wait_for(lambda: bound("neuron-later"), 60, "a later neuron pod bound") == "inf2-broken"
        assert process.poll() is None, log.read_text()
        metrics = urllib3.PoolManager().request("GET", f"http://127.0.0.1:{port}/metrics").data.decode()
        assert 'kubegpu_scheduler_plugin_failures_total{hook="kubegpu_scheduler_fit",plugin="broken"}' in metrics
        slow = 'kubegpu_scheduler_plugin_slow_calls_total{hook="kubegpu_scheduler_build_node",plugin="broken"}'
        assert slow in metrics, metrics
        assert "plugin 'broken' took 1.2 s in kubegpu_scheduler_build_node" in log.read_text()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=20)


def test_a_plugin_whose_books_lose_their_holders_never_binds_two_pods_to_one_card(
    cluster: Cluster, namespace: str, key_file: Path, tmp_path: Path
) -> None:
    """A third-party plugin whose `allocate` always names card0 and whose `take` records nothing: `kubegpu scheduler`
    bound both pods to card0 of the one node (two signed allocations naming it). Now the second is refused as the
    plugin's failure in allocate, with a FailedScheduling event naming the plugin, the hook and the pod holding the
    card; it stays pending, and the scheduler keeps serving."""
    cluster.create_ready_node(
        "careless-0", labels={"careless.example/card.count": "2"}, allocatable={"careless.example/card": 2}
    )
    log = tmp_path / "scheduler.log"
    process = _scheduler_with(cluster, key_file, _install_broken(tmp_path / "site", "careless", CARELESS), log)
    try:
        cluster.create_pod(namespace, "first", {"main": {"careless.example/card": 1}}, scheduler="kubegpu")

        def bound(name: str) -> Any:
            pods = {p["metadata"]["name"]: p for p in cluster.pods(namespace)}
            return pods.get(name, {}).get("spec", {}).get("nodeName")

        assert wait_for(lambda: bound("first"), 60, "the first pod bound") == "careless-0"
        cluster.create_pod(namespace, "second", {"main": {"careless.example/card": 1}}, scheduler="kubegpu")
        messages = wait_for(
            lambda: [m for m in _events(cluster, namespace, "second") if "plugin 'careless'" in m],
            60,
            "a FailedScheduling event naming the careless plugin",
        )
        assert any(
            "kubegpu_scheduler_allocate: WrongAnswer: named careless.example/card device 'card0' for container main, "
            f"which pod {namespace}/first already holds on this node" in m
            for m in messages
        ), messages
        assert bound("second") is None
        assert process.poll() is None, log.read_text()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=20)
