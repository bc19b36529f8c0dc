"""The conformance suite: what the engine and the node side assume of every plugin, checked on real answers.

kubegpu's engine relies on a few properties that no single hook's contract can express (docs/hooks.md, "What the
engine assumes"). Each is a rule here, with a name that `kubegpu plugins check` prints next to a failure:

* `hook-answers`: no hook raises or answers outside its contract on the generated nodes and pods;
* `allocate-leaves-state`: `allocate` changes nothing a user can see (headroom, describe), and asking twice gives the
  same devices;
* `fit-iff-allocate`: `fit` succeeds exactly when `allocate` finds a set;
* `headroom-bounds-fit`: when `fit` succeeds, the headroom offers at least what each container asks (the engine
  skips nodes whose headroom is smaller, without asking `fit`);
* `take-release-restores`: `take` then `release` leaves the node as it was; a second `release` changes nothing;
* `name-and-uid-blind`: `fit`, `score` and `allocate` answer alike for a pod with another name and UID (the engine
  reuses answers across pods with equal signatures);
* `edits-owned-only`: `edit_container` touches only the device paths, env, mounts and CDI names the plugin declares
  in `kubegpu_device_owned`, and answers True for its own allocation.

`check_scheduler` and `check_device` return the failures (an empty list: the plugin conforms); `conformance_nodes`
and `conformance_pods` generate the inputs `kubegpu plugins check` uses when the plugin supplies none (a plugin object
may carry `conformance_nodes`: Node manifests, `NodeInfo`s, or a callable returning them).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import (
    ContainerAllocation,
    ContainerEdit,
    DeviceNode,
    DeviceOwnership,
    Mount,
    NodeInfo,
    PluginAllocation,
    PodRequest,
)
from kubegpu.core.plugin_manager import KubegpuPluginManager, PluginHookError, make_plugin_manager
from kubegpu.core.scheduler_hooks import DeviceNodeState

__all__ = [
    "RULES",
    "Failure",
    "check_device",
    "check_scheduler",
    "conformance_nodes",
    "conformance_pods",
]

RULES = (
    "hook-answers",
    "allocate-leaves-state",
    "fit-iff-allocate",
    "headroom-bounds-fit",
    "take-release-restores",
    "name-and-uid-blind",
    "edits-owned-only",
)
COUNTS = (1, 2, 4, 8)
FOREIGN = ContainerEdit(
    devices=[DeviceNode(host_path="/dev/null", container_path="/dev/null")],
    envs={"PATH": "/usr/bin:/bin", "KUBEGPU_CONFORMANCE": "keep"},
    mounts=[Mount(host_path="/etc/hosts", container_path="/etc/hosts", readonly=True)],
    cdi_devices=["conformance.example/other=dev0"],
    annotations={"conformance.example/note": "keep"},
)


@dataclass(frozen=True)
class Failure:
    """One broken rule, on one node and pod where that applies."""

    plugin: str
    rule: str
    message: str
    node: str | None = None
    pod: str | None = None

    def __str__(self) -> str:
        where = ", ".join(p for p in (f"node {self.node}" if self.node else "", self.pod or "") if p)
        return f"{self.plugin}: {self.rule}: {self.message}" + (f" ({where})" if where else "")


# ---------------------------------------------------------------------------------------------------------------
# Generated inputs
# ---------------------------------------------------------------------------------------------------------------


def _node(name: str, labels: dict[str, str], allocatable: dict[str, int]) -> NodeInfo:
    resources = {"cpu": "96", "memory": "768Gi", "pods": "110", **{k: str(v) for k, v in allocatable.items()}}
    return node_info(
        {
            "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "status": {"capacity": resources, "allocatable": resources},
        }
    )


def conformance_nodes(plugin: object, resources: Sequence[str]) -> list[NodeInfo]:
    """The nodes to check a scheduler-side plugin on: the plugin's own `conformance_nodes` when it has them, else
    nodes with 1, 2, 4 and 8 of each resource in allocatable and in a `<resource>.count` label (the convention of
    GPU Feature Discovery and the FPGA example). Only nodes the plugin builds a state for are useful; the caller
    keeps those."""
    own = getattr(plugin, "conformance_nodes", None)
    if callable(own):
        own = own()
    if own:
        return [n if isinstance(n, NodeInfo) else node_info(n) for n in own]
    nodes: list[NodeInfo] = []
    for resource in resources:
        if resource.endswith("/*"):
            continue
        for count in COUNTS:
            labels = {f"{resource}.count": str(count)}
            nodes.append(_node(f"conformance-{len(nodes)}", labels, {resource: count}))
    return nodes


def conformance_pods(plugin: object, node: NodeInfo, owned: Callable[[str], bool]) -> list[PodRequest]:
    """Pods asking for the resources the node offers of the plugin: each alone in 1, 2, half and all of what the
    node has, two containers of one each, and every resource at once; or the plugin's own `conformance_pods`."""
    own = getattr(plugin, "conformance_pods", None)
    if callable(own):
        own = own(node)
    if own:
        return [p if isinstance(p, PodRequest) else pod_request(p)[0] for p in own]
    offered = {r: n for r, n in sorted(node.allocatable.items()) if owned(r) and n > 0}
    shapes: list[dict[str, dict[str, int]]] = []
    for resource, amount in offered.items():
        for count in sorted({1, 2, max(1, amount // 2), amount}):
            shapes.append({"main": {resource: count}})
        shapes.append({"a": {resource: 1}, "b": {resource: 1}})
    if len(offered) > 1:
        shapes.append({"main": dict.fromkeys(offered, 1)})
    return [_pod(f"conformance-{i}", shape) for i, shape in enumerate(shapes)]


def _pod(name: str, containers: dict[str, dict[str, int]], uid: str | None = None) -> PodRequest:
    document = {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "conformance", "uid": uid or f"uid-{name}"},
        "spec": {
            "containers": [
                {"name": c, "image": "busybox", "resources": {"limits": {r: str(n) for r, n in limits.items()}}}
                for c, limits in containers.items()
            ]
        },
    }
    return pod_request(document)[0]


# ---------------------------------------------------------------------------------------------------------------
# Scheduler side
# ---------------------------------------------------------------------------------------------------------------


class _Run:
    def __init__(self, manager: KubegpuPluginManager, name: str) -> None:
        self.manager = manager
        self.name = name
        self.failures: list[Failure] = []
        self.allocations: list[tuple[PodRequest, PluginAllocation]] = []

    def fail(self, rule: str, message: str, node: str | None = None, pod: PodRequest | None = None) -> None:
        failure = Failure(self.name, rule, message, node, pod.key if pod is not None else None)
        if failure not in self.failures:
            self.failures.append(failure)

    def call(self, hook: str, where: str | None = None, who: PodRequest | None = None, /, **kwargs: Any) -> Any:
        try:
            return self.manager.call(self.name, hook, **kwargs)
        except PluginHookError as exc:
            self.fail("hook-answers", str(exc), where, who)
            raise

    def snapshot(self, state: DeviceNodeState) -> str:
        headroom = self.call("kubegpu_scheduler_headroom", state.node, state=state)
        pictures = self.call("kubegpu_scheduler_describe", state.node, state=state) or []
        return json.dumps(
            {
                "headroom": None if headroom is None else [headroom.free, headroom.utilization],
                "describe": [o.model_dump(mode="json") for o in pictures],
            },
            sort_keys=True,
        )


def check_scheduler(
    plugin: object,
    name: str,
    *,
    nodes: Iterable[NodeInfo] | None = None,
    pods: Callable[[NodeInfo], Iterable[PodRequest]] | None = None,
    manager: KubegpuPluginManager | None = None,
    collect: list[tuple[PodRequest, PluginAllocation]] | None = None,
) -> list[Failure]:
    """Check a scheduler-side plugin on `nodes` (default: `conformance_nodes`) and, on each, `pods(node)` (default:
    `conformance_pods`). Pods are placed one after the other while they fit, so the rules meet partly used nodes
    too; at the end every pod is released again and the node must be as it was. The allocations made are appended
    to `collect` (for `check_device`)."""
    if manager is None:
        manager = make_plugin_manager("scheduler", plugins=[(name, plugin)], autoload=False)
    run = _Run(manager, name)
    if name not in manager.names:
        return [Failure(name, "hook-answers", f"the plugin did not load: {'; '.join(map(str, manager.failures))}")]
    resources = manager.records[name].resources
    states = 0
    for node in conformance_nodes(plugin, resources) if nodes is None else nodes:
        try:
            state = run.call("kubegpu_scheduler_build_node", node.name, node=node)
        except PluginHookError:
            continue
        if state is None:
            continue
        states += 1
        asked = conformance_pods(plugin, node, lambda r: manager.owner_of(r) == name) if pods is None else pods(node)
        try:
            _check_node(run, state, node, list(asked))
        except PluginHookError:
            continue
    if not states and not run.failures:
        run.fail("hook-answers", "build_node gave no state for any generated node; give the plugin conformance_nodes")
    if collect is not None:
        collect.extend(run.allocations)
    return run.failures


def _check_node(run: _Run, state: DeviceNodeState, node: NodeInfo, pods: list[PodRequest]) -> None:
    initial = run.snapshot(state)
    placed: list[tuple[PodRequest, PluginAllocation]] = []
    for pod in pods:
        validation = run.call("kubegpu_scheduler_validate", node.name, pod, pod=pod)
        if validation is not None and not validation.ok:
            continue
        prepared = run.call("kubegpu_scheduler_prepare", node.name, pod, pod=pod)
        ask = {"state": state, "pod": pod, "prepared": prepared}
        before = run.snapshot(state)
        fit = run.call("kubegpu_scheduler_fit", node.name, pod, **ask)
        run.call("kubegpu_scheduler_score", node.name, pod, **ask)
        allocation = run.call("kubegpu_scheduler_allocate", node.name, pod, **ask)
        again = run.call("kubegpu_scheduler_allocate", node.name, pod, **ask)
        if run.snapshot(state) != before:
            changed = "fit, score or allocate changed the node's headroom or picture"
            run.fail("allocate-leaves-state", changed, node.name, pod)
        if _devices(allocation) != _devices(again):
            run.fail("allocate-leaves-state", "allocate chose other devices when asked again", node.name, pod)
        if fit.ok != (allocation is not None):
            run.fail(
                "fit-iff-allocate",
                f"fit answered {fit.code.name} ({fit.message or 'success'}) but allocate "
                + ("found a set" if allocation is not None else "found none"),
                node.name,
                pod,
            )
        if fit.ok:
            _check_headroom(run, state, node, pod)
        _check_blind(run, state, node, pod, fit, allocation)
        if allocation is None or not fit.ok:
            continue
        status = run.call("kubegpu_scheduler_take", node.name, pod, state=state, pod_key=pod.key, allocation=allocation)
        if not status.ok:
            run.fail("take-release-restores", f"take refused a fresh allocation: {status.message}", node.name, pod)
            continue
        taken = run.snapshot(state)
        released = run.call(
            "kubegpu_scheduler_release", node.name, pod, state=state, pod_key=pod.key, allocation=allocation
        )
        if not released.ok or run.snapshot(state) != before:
            run.fail("take-release-restores", "take then release did not leave the node as it was", node.name, pod)
        twice = run.call(
            "kubegpu_scheduler_release", node.name, pod, state=state, pod_key=pod.key, allocation=allocation
        )
        if not twice.ok or run.snapshot(state) != before:
            run.fail(
                "take-release-restores",
                f"a second release was not a no-op success ({twice.message or 'it changed the node'})",
                node.name,
                pod,
            )
        status = run.call("kubegpu_scheduler_take", node.name, pod, state=state, pod_key=pod.key, allocation=allocation)
        if not status.ok or run.snapshot(state) != taken:
            run.fail("take-release-restores", "taking again after a release did not hold the same", node.name, pod)
            continue
        placed.append((pod, allocation))
        run.allocations.append((pod, allocation))
    for pod, allocation in reversed(placed):
        run.call("kubegpu_scheduler_release", node.name, pod, state=state, pod_key=pod.key, allocation=allocation)
    if run.snapshot(state) != initial:
        run.fail("take-release-restores", "releasing every placed pod did not leave the node as it was", node.name)


def _check_headroom(run: _Run, state: DeviceNodeState, node: NodeInfo, pod: PodRequest) -> None:
    headroom = run.call("kubegpu_scheduler_headroom", node.name, pod, state=state)
    free = headroom.free if headroom is not None else {}
    for container in pod.containers:
        for resource, amount in container.resources.items():
            if run.manager.owner_of(resource) == run.name and free.get(resource, 0) < amount:
                run.fail(
                    "headroom-bounds-fit",
                    f"fit succeeded but headroom offers {free.get(resource, 0)} {resource} for a container asking "
                    f"{amount}: the engine would never have asked",
                    node.name,
                    pod,
                )


def _check_blind(
    run: _Run,
    state: DeviceNodeState,
    node: NodeInfo,
    pod: PodRequest,
    fit: Any,
    allocation: PluginAllocation | None,
) -> None:
    other = replace(pod, name=f"{pod.name}-renamed", uid=f"{pod.uid}-other")
    prepared = run.call("kubegpu_scheduler_prepare", node.name, other, pod=other)
    ask = {"state": state, "pod": other, "prepared": prepared}
    other_fit = run.call("kubegpu_scheduler_fit", node.name, other, **ask)
    other_allocation = run.call("kubegpu_scheduler_allocate", node.name, other, **ask)
    if (other_fit.code, other_fit.reasons) != (fit.code, fit.reasons) or _devices(other_allocation) != _devices(
        allocation
    ):
        run.fail("name-and-uid-blind", "fit or allocate answered differently for another name and UID", node.name, pod)


def _devices(allocation: PluginAllocation | None) -> object:
    return None if allocation is None else (allocation.containers, allocation.shares, allocation.fields)


# ---------------------------------------------------------------------------------------------------------------
# Node side
# ---------------------------------------------------------------------------------------------------------------


def check_device(
    plugin: object,
    name: str,
    allocations: Iterable[tuple[PodRequest, PluginAllocation]],
    *,
    manager: KubegpuPluginManager | None = None,
    dev_root: Path | None = None,
) -> list[Failure]:
    """Check a node-side plugin's `edit_container` on the containers of `allocations` (the scheduler side's, as
    `check_scheduler` leaves them in `kubegpu plugins check`): each edit of a container that already has entries of
    other kinds must answer True and touch only what the plugin owns."""
    if manager is None:
        manager = make_plugin_manager("device", plugins=[(name, plugin)], autoload=False)
    run = _Run(manager, name)
    if name not in manager.names:
        return [Failure(name, "hook-answers", f"the plugin did not load: {'; '.join(map(str, manager.failures))}")]
    try:
        owned = run.call("kubegpu_device_owned") or DeviceOwnership()
    except PluginHookError:
        return run.failures
    with tempfile.TemporaryDirectory() as scratch:
        root = dev_root or Path(scratch)
        for pod, allocation in allocations:
            for container, resources in allocation.containers.items():
                given = ContainerAllocation(
                    pod_uid=pod.uid,
                    node="conformance",
                    container=container,
                    resources=resources,
                    shares=allocation.shares.get(container, {}),
                    fields=allocation.fields,
                )
                edit = FOREIGN.model_copy(deep=True)
                try:
                    run.call("kubegpu_device_edit_container", None, pod, allocation=given, edit=edit, dev_root=root)
                except PluginHookError:
                    continue
                for problem in _unowned_changes(FOREIGN, edit, owned, str(root)):
                    run.fail("edits-owned-only", f"container {container}: {problem}", None, pod)
    return run.failures


def _unowned_changes(before: ContainerEdit, after: ContainerEdit, owned: DeviceOwnership, dev_root: str) -> list[str]:
    """What `after` adds to, removes from or changes in `before` that `owned` does not cover."""
    problems = []
    for key in before.envs.keys() | after.envs.keys():
        if before.envs.get(key) != after.envs.get(key) and not owned.owns_env(key):
            problems.append(f"env {key} changed, but the plugin does not declare it")
    for entry in _difference(before.devices, after.devices):
        if not owned.owns_device(entry.container_path, entry.host_path, dev_root):
            problems.append(f"device {entry.container_path} changed, but the plugin does not declare its path")
    for mount in _difference(before.mounts, after.mounts):
        if not owned.owns_mount(mount.container_path):
            problems.append(f"mount {mount.container_path} changed, but the plugin does not declare its path")
    for cdi in set(before.cdi_devices) ^ set(after.cdi_devices):
        if not owned.owns_cdi(cdi):
            problems.append(f"CDI device {cdi} changed, but the plugin does not declare its kind")
    for key in before.annotations.keys() | after.annotations.keys():
        if before.annotations.get(key) != after.annotations.get(key) and not key.startswith("cdi.k8s.io/"):
            problems.append(f"annotation {key} changed")
    return problems


def _difference(before: list[Any], after: list[Any]) -> list[Any]:
    return [e for e in before if e not in after] + [e for e in after if e not in before]
