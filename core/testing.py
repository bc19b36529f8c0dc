"""A pytest plugin for plugin authors (registered under `pytest11`, so installing kubegpu makes it available).

Fixtures:

* `make_plugin_manager` -- build a scheduler- or device-side plugin manager with exactly the plugins you name
  (no entry-point autoload, so a test sees only what it chose);
* `fake_host_root` -- an empty host root (`tmp_path/host`) with helpers to create device files and sysfs entries,
  for the real discovery code;

Helpers (plain functions, importable as `from kubegpu.core.testing import make_node, make_pod, ...`):

* `make_node(...)` / `make_pod(...)` -- `NodeInfo` / `PodRequest` built through the same manifest parser the
  scheduler uses, from a few keyword arguments;
* `node_manifest(...)` / `pod_manifest(...)` -- the Kubernetes manifests themselves, for simulator and API tests;
* `assert_allocation(allocation, expected)` -- compare the device ids of an allocation to an expected mapping,
  with a readable diff;
* `SchedulerDriver(plugin)` -- drive one scheduler-side plugin the way the engine does, through the checked plugin
  manager: `build`, `fit`, `score`, `allocate`, `place` (allocate, then take), `hold` (take), `release`, `headroom`,
  `describe`, `snapshot`;
* `assert_conforms(scheduler=..., device=...)` -- the conformance suite (`kubegpu.core.conformance`) in one line.

Helpers that need a front-end live with it, where the layering allows: an in-process `simulate()` in
`kubegpu.scheduler.testing`; applying a signed allocation through the CRI shim's editor and advertising from a fake
host into a Node manifest in `kubegpu.crishim.testing`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.conformance import Failure, check_device, check_scheduler
from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import NodeInfo, Occupancy, PluginAllocation, PodRequest
from kubegpu.core.plugin_manager import KubegpuPluginManager, Side
from kubegpu.core.plugin_manager import make_plugin_manager as _make_plugin_manager
from kubegpu.core.scheduler_hooks import DeviceNodeState, Headroom
from kubegpu.core.status import Status

__all__ = [
    "FakeHost",
    "SchedulerDriver",
    "assert_allocation",
    "assert_conforms",
    "make_node",
    "make_pod",
    "node_manifest",
    "pod_manifest",
]


def node_manifest(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    allocatable: Mapping[str, str | int] | None = None,
    taints: Iterable[Mapping[str, str]] = (),
    cpu: str = "96",
    memory: str = "768Gi",
) -> dict[str, Any]:
    """A Ready Node manifest; `allocatable` adds to (and may override) the default cpu, memory and pods."""
    resources: dict[str, str | int] = {"cpu": cpu, "memory": memory, "pods": "110"}
    resources.update(allocatable or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": dict(labels or {}), "annotations": dict(annotations or {})},
        "spec": {"taints": [dict(t) for t in taints]},
        "status": {
            "capacity": {k: str(v) for k, v in resources.items()},
            "allocatable": {k: str(v) for k, v in resources.items()},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod_manifest(
    name: str,
    containers: Mapping[str, Mapping[str, str | int]] | None = None,
    *,
    namespace: str = "default",
    annotations: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Iterable[Mapping[str, str]] = (),
    scheduler_name: str = "default-scheduler",
    deleted: bool = False,
) -> dict[str, Any]:
    """A Pod manifest; `containers` maps container name -> resource limits (`{"main": {"nvidia.com/gpu": 2}}`)."""
    specs = []
    for container, limits in (containers or {"main": {}}).items():
        specs.append(
            {"name": container, "image": "busybox", "resources": {"limits": {k: str(v) for k, v in limits.items()}}}
        )
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": dict(annotations or {})}
    if deleted:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "schedulerName": scheduler_name,
            "containers": specs,
            "nodeSelector": dict(node_selector or {}),
            "tolerations": [dict(t) for t in tolerations],
        },
    }


def make_node(name: str = "node-0", **kwargs: Any) -> NodeInfo:
    """`node_manifest(...)` parsed into the `NodeInfo` plugins receive."""
    return node_info(node_manifest(name, **kwargs))


def make_pod(
    name: str = "pod-0", containers: Mapping[str, Mapping[str, str | int]] | None = None, **kwargs: Any
) -> PodRequest:
    """`pod_manifest(...)` parsed into the `PodRequest` plugins receive."""
    request, _ = pod_request(pod_manifest(name, containers, **kwargs))
    return request


def assert_allocation(allocation: PluginAllocation | None, expected: Mapping[str, Mapping[str, Iterable[str]]]) -> None:
    """Assert the allocation's device ids, per container and resource, equal `expected` (order-insensitive)."""
    assert allocation is not None, f"expected an allocation of {dict(expected)}, got None"
    got = {c: {r: sorted(ids) for r, ids in res.items()} for c, res in allocation.containers.items()}
    want = {c: {r: sorted(ids) for r, ids in res.items()} for c, res in expected.items()}
    assert got == want, f"allocation differs:\n  got:      {got}\n  expected: {want}"


class SchedulerDriver:
    """One scheduler-side plugin, called the way the engine calls it: through the plugin manager, whose checked
    boundary turns an exception or a wrong answer into `PluginHookError`.

    `SchedulerDriver(module_or_instance, name="fpga")`; `driver.build(labels=...)` builds a node's state from
    `make_node`'s arguments (or a `NodeInfo`), and every other method takes that state.
    """

    def __init__(self, plugin: object, name: str = "plugin", *, manager: KubegpuPluginManager | None = None) -> None:
        self.name = name
        self.manager = manager or _make_plugin_manager("scheduler", plugins=[(name, plugin)], autoload=False)
        if name not in self.manager.names:
            raise AssertionError(f"plugin {name!r} did not load: {'; '.join(map(str, self.manager.failures))}")

    def call(self, hook: str, **kwargs: Any) -> Any:
        return self.manager.call(self.name, hook, **kwargs)

    def build(self, node: NodeInfo | str = "node-0", **kwargs: Any) -> Any:
        """The plugin's state of a node: a `NodeInfo`, or `make_node(name, **kwargs)`; None when it has no devices."""
        info = node if isinstance(node, NodeInfo) else make_node(node, **kwargs)
        return self.call("kubegpu_scheduler_build_node", node=info)

    def validate(self, pod: PodRequest) -> Status | None:
        result: Status | None = self.call("kubegpu_scheduler_validate", pod=pod)
        return result

    def fit(self, state: DeviceNodeState, pod: PodRequest) -> Status:
        result: Status = self.call("kubegpu_scheduler_fit", state=state, pod=pod)
        return result

    def score(self, state: DeviceNodeState, pod: PodRequest) -> float | None:
        result: float | None = self.call("kubegpu_scheduler_score", state=state, pod=pod)
        return result

    def allocate(self, state: DeviceNodeState, pod: PodRequest) -> PluginAllocation | None:
        result: PluginAllocation | None = self.call("kubegpu_scheduler_allocate", state=state, pod=pod)
        return result

    def place(self, state: DeviceNodeState, pod: PodRequest) -> PluginAllocation:
        """What the engine does on the chosen node: allocate, then take; asserts both succeed."""
        allocation = self.allocate(state, pod)
        assert allocation is not None, f"allocate found no devices for {pod.key}"
        status = self.hold(state, pod.key, allocation)
        assert status.ok, f"take refused the fresh allocation of {pod.key}: {status.message}"
        return allocation

    def hold(self, state: DeviceNodeState, pod_key: str, allocation: PluginAllocation) -> Status:
        """`kubegpu_scheduler_take`: mark the allocation's devices as held by `pod_key`."""
        result: Status = self.call("kubegpu_scheduler_take", state=state, pod_key=pod_key, allocation=allocation)
        return result

    def release(self, state: DeviceNodeState, pod_key: str, allocation: PluginAllocation) -> Status:
        result: Status = self.call("kubegpu_scheduler_release", state=state, pod_key=pod_key, allocation=allocation)
        return result

    def headroom(self, state: DeviceNodeState) -> Headroom | None:
        result: Headroom | None = self.call("kubegpu_scheduler_headroom", state=state)
        return result

    def describe(self, state: DeviceNodeState) -> list[Occupancy]:
        return list(self.call("kubegpu_scheduler_describe", state=state) or [])

    def snapshot(self, state: DeviceNodeState) -> dict[str, Any]:
        """What a user can see of the node: its headroom and its pictures, as plain data (compare two snapshots)."""
        headroom = self.headroom(state)
        return {
            "free": dict(headroom.free) if headroom else {},
            "utilization": headroom.utilization if headroom else 0.0,
            "describe": [o.model_dump(mode="json") for o in self.describe(state)],
        }


def assert_conforms(
    *,
    scheduler: object | None = None,
    device: object | None = None,
    name: str = "plugin",
    nodes: Iterable[NodeInfo] | None = None,
) -> None:
    """Run the conformance suite on a plugin's sides and fail with every broken rule (`kubegpu.core.conformance`).

    The scheduler side runs on `nodes` (default: the plugin's `conformance_nodes`, else generated ones); the device
    side edits containers with the allocations the scheduler side made.
    """
    failures: list[Failure] = []
    allocations: list[tuple[PodRequest, PluginAllocation]] = []
    if scheduler is not None:
        failures += check_scheduler(scheduler, name, nodes=nodes, collect=allocations)
    if device is not None:
        failures += check_device(device, name, allocations)
    assert not failures, "the plugin breaks kubegpu's conformance rules:\n" + "\n".join(f"  {f}" for f in failures)


class FakeHost:
    """A fake host root for discovery tests: device files under `dev/`, sysfs entries under `sys/`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "dev").mkdir(parents=True, exist_ok=True)
        (root / "sys").mkdir(parents=True, exist_ok=True)

    def add_device_file(self, name: str) -> Path:
        """Create `dev/<name>` (a regular file standing in for a character device)."""
        path = self.root / "dev" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        return path

    def remove(self, relative: str) -> None:
        path = self.root / relative
        if path.is_dir():
            for child in sorted(path.rglob("*"), reverse=True):
                child.rmdir() if child.is_dir() else child.unlink()
            path.rmdir()
        else:
            path.unlink()

    def write(self, relative: str, content: str) -> Path:
        """Write a text file (a sysfs attribute, a JSON tool output) at `relative` under the root."""
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        return path

    def symlink(self, relative: str, target: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)
        return path


@pytest.fixture
def make_plugin_manager() -> Callable[..., KubegpuPluginManager]:
    """Factory: `make_plugin_manager("scheduler", neuron=module, ...)` -> a manager with just those plugins."""

    def factory(side: Side, **plugins: object) -> KubegpuPluginManager:
        return _make_plugin_manager(side, plugins=plugins.items(), autoload=False)

    return factory


@pytest.fixture
def fake_host_root(tmp_path: Path) -> FakeHost:
    """An empty fake host root with `dev/` and `sys/`."""
    return FakeHost(tmp_path / "host")
