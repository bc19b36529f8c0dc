"""A pod bound without kubegpu's allocation is counted where it runs, whatever its device plugin makes of its request.

As in test_live_owners.py, the scheduler runs without a cluster: informer events are handed to its mirror directly
and the writer records the Bindings it would have written.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.mirror import DRA_KINDS

from .test_service_guards import KEY, RecordingWriter, schedule_all

GPU, CORES, MEM_PCT = "nvidia.com/gpu", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage"


def start() -> CustomScheduler:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), signing_key=KEY)
    svc = CustomScheduler(None, RecordingWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
    labels = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "16384"}
    node = node_manifest("gpu-a", labels=labels, allocatable={GPU: 10, CORES: 100, MEM_PCT: 100}, cpu="8")
    svc.mirror.on_nodes("SYNC", [node])
    svc.mirror.on_budgets("SYNC", [])
    svc.mirror.on_podgroups("SYNC", [])
    for kind in DRA_KINDS:
        svc.mirror.on_dra(kind, "SYNC", [])
    svc.mirror.on_claims("SYNC", [])
    svc.mirror.on_volumes("SYNC", [])
    for kind in ("Service", "ReplicationController", "ReplicaSet", "StatefulSet"):
        svc.mirror.on_owners(kind, "SYNC", [])
    return svc


def pod(name: str, limits: dict[str, str], *, node: str | None = None) -> dict[str, Any]:
    manifest = pod_manifest(name, scheduler_name="kubegpu", namespace="team")
    manifest["metadata"].update(uid=f"uid-{name}", resourceVersion="1")
    manifest["spec"]["containers"][0]["resources"] = {"limits": limits, "requests": limits}
    if node is not None:  # bound by hand (`spec.nodeName`), or by another scheduler: running, no allocation
        manifest["spec"]["nodeName"] = node
        manifest["status"] = {"phase": "Running"}
    return manifest


@pytest.mark.parametrize(
    "asked",
    [{CORES: "200"}, {CORES: "30", MEM_PCT: "30", "nvidia.com/gpumem": "1000"}],
    ids=["compute-over-100", "both-memory-forms"],
)
def test_a_pod_bound_by_hand_with_a_malformed_share_still_counts_its_cpu_and_counts(asked: dict[str, str]) -> None:
    """A tenant binds a pod by hand (`spec.nodeName`) asking a GPU share kubegpu would never place (`gpucores: 200`,
    or both memory forms). The kubelet admits it by count and runs it: its 6 cores are in use. kubegpu could not set
    a GPU aside for it, and left it out of the node's books altogether, cpu included, so it bound a pod of 4 cores to
    the node's last 2, and the kubelet refused that pod (OutOfcpu): one tenant's malformed pod cost another's. It is
    counted without devices now, as the kubelet counts it."""
    service = start()
    running = pod("by-hand", {"cpu": "6", GPU: "1", **asked}, node="gpu-a")
    waiting = pod("next", {"cpu": "4"})
    service.mirror.on_pods("SYNC", [running, waiting])
    schedule_all(service)
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    assert writer.bindings() == [], "a pod of 4 cores was bound to the node's last 2"
    placement = service.engine.placement("team/by-hand")
    assert placement is not None and placement.node == "gpu-a"
    service.mirror.on_pods("DELETED", running)  # once it is gone, it holds nothing
    assert service.engine.placement("team/by-hand") is None
