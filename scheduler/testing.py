"""Scheduler-side testing helpers that need the engine (so they cannot live in `kubegpu.core.testing`).

`simulate(documents, plugins={"fpga": module})` runs `kubegpu simulate --json` in-process: the same engine, the
same queue order, preemption and event records, on Node and Pod manifests (`node_manifest`, `pod_manifest`), with
exactly the plugins given (or the installed ones with `plugins=None`). A plugin failure never raises: it is the
pod's reason, as on a real cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kubegpu.core.plugin_manager import KubegpuPluginManager, make_plugin_manager
from kubegpu.scheduler.engine import Engine, Policy
from kubegpu.scheduler.simulate import OBJECT_KINDS, Cluster, PodEvent, _process

__all__ = ["simulate"]


def simulate(
    documents: Iterable[Mapping[str, Any]],
    *,
    plugins: Mapping[str, object] | None = None,
    manager: KubegpuPluginManager | None = None,
    policy: Policy = "binpack",
) -> list[dict[str, Any]]:
    """The records `kubegpu simulate --json` prints for these manifests, one per pod document (and per victim of a
    preemption): `pod`, `event`, `node`, `reason`, `devices`, `annotations`."""
    from kubegpu.core.manifests import node_info, pod_request

    if manager is None:
        manager = (
            make_plugin_manager("scheduler")
            if plugins is None
            else make_plugin_manager("scheduler", plugins=plugins.items(), autoload=False)
        )
    engine = Engine(manager, policy=policy)
    pods: list[PodEvent] = []
    found: list[tuple[str, str, dict[str, Any]]] = []
    for number, document in enumerate(documents, 1):
        kind = document.get("kind")
        if kind == "Node":
            engine.add_node(node_info(document))
        elif kind == "Pod":
            request, deleting = pod_request(document)
            pods.append(PodEvent(f"document#{number}", request, deleting or request.phase in ("Succeeded", "Failed")))
        elif kind in OBJECT_KINDS:
            found.append((str(kind), f"document#{number}", dict(document)))
        else:
            raise ValueError(f"document#{number}: kind {kind!r} is not simulated")
    return list(_process(engine, pods, [], Cluster.load(engine, found)))
