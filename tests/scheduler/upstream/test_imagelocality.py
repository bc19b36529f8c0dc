"""kube-scheduler 1.20's ImageLocality table (`TestImageLocalityPriority`,
pkg/scheduler/framework/plugins/imagelocality/image_locality_test.go), held against kubegpu.

Read at kubernetes/kubernetes commit 01e014c7d694f5bb2428f3881c6afaf5e9267ada, a copy from 1.17. Its four rows are
1.20's, but not its expected scores: kubernetes/kubernetes#91138 (merged May 2020, in 1.19 and 1.20) scaled the
upper threshold by the pod's containers (1000 MiB each), so each score below is 1.20's, worked out beside its row
(each image's size counts times the share of nodes listing it). A node lists its images in `status.images`; a pod's
image without a tag is looked up as `:latest`.

Scores: ImageLocality has no NormalizeScore; upstream compares `Score`'s 0..100. kubegpu exposes the rule as
`scores.image_locality` (with `scores.normalized_image`), given each image's count of listing nodes; the table's
numbers are compared with it, and the engine, scoring with ImageLocality alone, must pick a node the table scores
highest.
"""

from __future__ import annotations

from collections import Counter

import pytest

from kubegpu.core.manifests import node_info
from kubegpu.scheduler import scores

from ._kube import case_id, container, engine, node, pod

TEST = "TestImageLocalityPriority"
MB = 1024 * 1024
NODE_40_300_2000 = [
    (["gcr.io/40:latest", "gcr.io/40:v1", "gcr.io/40:v1"], 40 * MB),
    (["gcr.io/300:latest", "gcr.io/300:v1"], 300 * MB),
    (["gcr.io/2000:latest"], 2000 * MB),
]
NODE_250_10 = [(["gcr.io/250:latest"], 250 * MB), (["gcr.io/10:latest", "gcr.io/10:v1"], 10 * MB)]
NO_IMAGES: list[tuple[list[str], int]] = []

Images = list[tuple[list[str], int]]

# (upstream case name, the pod's images, {node: its status.images}, expected score per node)
CASES: list[tuple[str, list[str], dict[str, Images], dict[str, int]]] = [
    (
        "two images spread on two nodes, prefer the larger image one",
        ["gcr.io/40", "gcr.io/250"],
        {"machine1": NODE_40_300_2000, "machine2": NODE_250_10},
        # machine1: 40M x 1/2 < 23M -> 0; machine2: 100 x (250M x 1/2 - 23M) / (2 x 1000M - 23M) = 5
        {"machine1": 0, "machine2": 5},
    ),
    (
        "two images on one node, prefer this node",
        ["gcr.io/40", "gcr.io/300"],
        {"machine1": NODE_40_300_2000, "machine2": NODE_250_10},
        # machine1: 100 x ((40M + 300M) x 1/2 - 23M) / 1977M = 7
        {"machine1": 7, "machine2": 0},
    ),
    (
        "if exceed limit, use limit",
        ["gcr.io/10", "gcr.io/2000"],
        {"machine1": NODE_40_300_2000, "machine2": NODE_250_10},
        # machine1: 100 x (2000M x 1/2 - 23M) / 1977M = 49 (the copy: 1000M reached, 100); machine2: 10M x 1/2 -> 0
        {"machine1": 49, "machine2": 0},
    ),
    (
        "if exceed limit, use limit (with node which has no images present)",
        ["gcr.io/10", "gcr.io/2000"],
        {"machine1": NODE_40_300_2000, "machine2": NODE_250_10, "machine3": NO_IMAGES},
        # machine1: 100 x (2000M x 1/3 - 23M) / 1977M = 32
        {"machine1": 32, "machine2": 0, "machine3": 0},
    ),
]

NOT_EXPRESSIBLE: dict[str, str] = {}


def image_node(name: str, images: Images) -> dict[str, object]:
    manifest = node(name)
    manifest["status"]["images"] = [{"names": names, "sizeBytes": size} for names, size in images]
    return manifest


@pytest.mark.parametrize(("images", "nodes", "expected"), [pytest.param(*c[1:], id=case_id(TEST, c[0])) for c in CASES])
def test_image_locality(images: list[str], nodes: dict[str, Images], expected: dict[str, int]) -> None:
    infos = {name: node_info(image_node(name, listed)) for name, listed in nodes.items()}
    listed: Counter[str] = Counter()
    for info in infos.values():
        listed.update(set(info.images))
    wanted = [scores.normalized_image(i) for i in images]
    got = {name: scores.image_locality(wanted, info.images, listed, len(infos)) for name, info in infos.items()}
    assert got == expected
    incoming = pod("p", {"containers": [container(f"c{i}", image=image) for i, image in enumerate(images)]})
    e = engine(
        [image_node(n, listed) for n, listed in nodes.items()], profile=scores.Profile({scores.IMAGE_LOCALITY: 1})
    )
    assert expected[e.schedule(incoming).node or ""] == max(expected.values())
