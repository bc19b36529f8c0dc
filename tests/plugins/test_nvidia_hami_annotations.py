"""HAMi's per-pod GPU annotations on kubegpu's scheduler: a tenant's HAMi manifest that names the GPU types it may, or
may not, run on (`nvidia.com/use-gputype`, `nvidia.com/nouse-gputype`) keeps landing on those types only, on nodes as
HAMi's device plugin and GPU Feature Discovery label them. Before, kubegpu read neither annotation: a pod asking
`use-gputype: A100` was bound to a T4 (docs/migrating-from-hami.md)."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.engine import Engine

# The models as GFD labels them (`nvidia.com/gpu.product`: NVML's name with spaces made `-`).
A100 = "NVIDIA-A100-SXM4-80GB"
T4 = "Tesla-T4"


def hami_cluster() -> Engine:
    """A T4 node, fuller first under binpack, and an A100 node; both as HAMi's device plugin left them."""
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    for name, product, gpus, mib in (("t4", T4, 2, 15360), ("a100", A100, 4, 81920)):
        labels = {
            "nvidia.com/gpu.count": str(gpus),
            "nvidia.com/gpu.memory": str(mib),
            "nvidia.com/gpu.product": product,
        }
        allocatable = {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": str(gpus * 10)}
        node = {"kind": "Node", "metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}
        engine.add_node(node_info(node))
    return engine


def pod(name: str, annotations: dict[str, str], limits: dict[str, str] | None = None) -> PodRequest:
    limits = limits or {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]}
    meta = {"name": name, "namespace": "ns", "uid": name, "annotations": annotations}
    return pod_request({"kind": "Pod", "metadata": meta, "spec": spec})[0]


@pytest.mark.parametrize(
    ("annotations", "node"),
    [
        ({"nvidia.com/use-gputype": "A100"}, "a100"),
        ({"nvidia.com/use-gputype": "a100"}, "a100"),  # HAMi compares case-insensitively
        ({"nvidia.com/use-gputype": "NVIDIA A100"}, "a100"),  # NVML's spelling against GFD's label
        ({"nvidia.com/use-gputype": "H100, A100"}, "a100"),  # a list: any of them
        ({"nvidia.com/nouse-gputype": "T4"}, "a100"),
        ({"nvidia.com/nouse-gputype": "V100,Tesla T4"}, "a100"),
        ({"nvidia.com/use-gputype": "T4"}, "t4"),
        ({"nvidia.com/use-gputype": "NVIDIA,Tesla", "nvidia.com/nouse-gputype": "T4"}, "a100"),  # both apply
        ({}, "t4"),  # the fuller node, binpack's choice: what the annotations above turn away from
    ],
)
def test_a_hami_pod_naming_gpu_types_lands_on_those_types_only(annotations: dict[str, str], node: str) -> None:
    engine = hami_cluster()
    assert engine.schedule(pod("first", {"nvidia.com/use-gputype": "T4"})).node == "t4"  # makes t4 the fuller node
    placed = engine.schedule(pod("tenant", annotations))
    assert placed.scheduled, placed.reason
    assert placed.node == node


def test_whole_gpu_pods_are_held_to_their_gpu_types_too() -> None:
    engine = hami_cluster()
    whole = {"nvidia.com/gpu": "2"}
    assert engine.schedule(pod("a", {"nvidia.com/nouse-gputype": "a100"}, whole)).node == "t4"
    refused = engine.schedule(pod("b", {"nvidia.com/use-gputype": "T4"}, whole))
    assert not refused.scheduled  # both T4s are held whole
    assert engine.schedule(pod("c", {"nvidia.com/use-gputype": "A100"}, whole)).node == "a100"


def test_a_pod_whose_gpu_types_no_node_has_is_refused_naming_the_annotation() -> None:
    engine = hami_cluster()
    refused = engine.schedule(pod("v100", {"nvidia.com/use-gputype": "V100"}))
    assert refused.reason == '0/2 nodes are available: 2 node(s) have no GPU of type "V100" (nvidia.com/use-gputype).'
    refused = engine.schedule(pod("none", {"nvidia.com/nouse-gputype": "Tesla,NVIDIA"}))
    assert refused.reason == (
        '0/2 nodes are available: 2 node(s) have no GPU of a type, none of type "Tesla,NVIDIA" '
        "(nvidia.com/nouse-gputype)."
    )


def test_a_gpu_of_unknown_model_is_of_no_type() -> None:
    """A node without GFD's product label (and no advertiser) cannot show its GPU to be an A100, nor not to be a T4."""
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    labels = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "16384"}
    allocatable = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "10"}
    engine.add_node(
        node_info({"kind": "Node", "metadata": {"name": "n", "labels": labels}, "status": {"allocatable": allocatable}})
    )
    for annotation in ("nvidia.com/use-gputype", "nvidia.com/nouse-gputype"):
        assert not engine.schedule(pod(annotation, {annotation: "T4"})).scheduled
    assert engine.schedule(pod("plain", {})).scheduled


def test_a_type_list_beyond_the_bound_is_refused_saying_what_to_change() -> None:
    engine = hami_cluster()
    many = ",".join(f"type{i}" for i in range(nvidia.MAX_GPU_TYPES + 1))
    refused = engine.schedule(pod("many", {"nvidia.com/use-gputype": many}))
    assert not refused.scheduled
    assert (
        refused.reason == f"annotation nvidia.com/use-gputype lists more than {nvidia.MAX_GPU_TYPES} GPU types; "
        f"list at most {nvidia.MAX_GPU_TYPES}"
    )
    long = "A" * (nvidia.MAX_GPU_TYPE_CHARS + 1)
    refused = engine.schedule(pod("long", {"nvidia.com/nouse-gputype": long}))
    assert not refused.scheduled and "longer than 256 characters" in refused.reason
    # at the bound, fine; empty items name nothing
    assert engine.schedule(pod("edge", {"nvidia.com/use-gputype": ",".join(["x"] * 63 + ["A100"])})).node == "a100"
    assert engine.schedule(pod("empty", {"nvidia.com/use-gputype": " , "})).scheduled


def test_types_after_many_empty_items_are_read_as_types() -> None:
    """Empty items name nothing: types listed after more of them than the bound on types are read one by one. Before,
    the list was cut after the bound's count of items, empty or not, and `A100,T4` was read as one type, `,,a100,t4`
    (no GPU's), so the pod was refused. A list longer than the bound's worth of text is refused, saying so."""
    engine = hami_cluster()
    placed = engine.schedule(pod("commas", {"nvidia.com/use-gputype": "," * (nvidia.MAX_GPU_TYPES + 6) + "A100,T4"}))
    assert placed.scheduled, placed.reason
    huge = "," * (nvidia.MAX_GPU_TYPES * (nvidia.MAX_GPU_TYPE_CHARS + 1)) + "A100"
    refused = engine.schedule(pod("huge", {"nvidia.com/use-gputype": huge}))
    assert not refused.scheduled and "is longer than 64 GPU types of 256 characters" in refused.reason


def test_a_pod_type_quoted_in_a_refusal_is_escaped_and_bounded() -> None:
    engine = hami_cluster()
    refused = engine.schedule(pod("evil", {"nvidia.com/use-gputype": "V100\x1b[2J," + ",".join(["x" * 200] * 5)}))
    assert not refused.scheduled
    assert "\x1b" not in refused.reason and "\\x1b[2J" in refused.reason
    assert len(refused.reason) < 400


@pytest.mark.parametrize("annotation", ["nvidia.com/use-gpuuuid", "nvidia.com/nouse-gpuuuid"])
def test_a_pod_choosing_gpus_by_uuid_is_refused_rather_than_placed_on_others(annotation: str) -> None:
    """HAMi gives such a pod only the GPUs it names (or never the ones it excludes); kubegpu keeps no UUID in its
    books. Before, the annotation was not read and the pod took whichever GPU the policy chose."""
    engine = hami_cluster()
    refused = engine.schedule(pod("pinned", {annotation: "GPU-8f2c0b6e-0000-0000-0000-000000000000"}))
    assert not refused.scheduled
    assert refused.reason.startswith(f"annotation {annotation} (HAMi's choice of GPUs by UUID) is not read by kubegpu")
    assert f"remove {annotation}" in refused.reason
