"""The links the built-in plugins report for pictures: what `kubegpu top` and the HTML report draw between devices."""

from __future__ import annotations

import pytest

from kubegpu.plugins.neuron import topology as neuron
from kubegpu.plugins.nvidia import topology as nvidia


def _undirected(pairs: tuple[tuple[int, int], ...]) -> set[frozenset[int]]:
    found = {frozenset(p) for p in pairs}
    assert len(found) == len(pairs), "a link is listed twice"
    return found


@pytest.mark.parametrize(
    ("topology", "expected"),
    [
        pytest.param(neuron.make_topology("ring", 1), set(), id="single-device"),
        pytest.param(neuron.make_topology("ring", 2), {frozenset((0, 1))}, id="two-devices-one-link"),
        pytest.param(
            neuron.make_topology("ring", 4),
            {frozenset(p) for p in [(0, 1), (1, 2), (2, 3), (3, 0)]},
            id="inf1.6xlarge-ring-closes",
        ),
    ],
)
def test_ring_links_join_neighbours_and_close_the_ring(
    topology: neuron.Topology, expected: set[frozenset[int]]
) -> None:
    assert _undirected(neuron.links(topology)) == expected


def test_a_4x4_torus_has_32_links_each_device_with_four_neighbours_including_the_wrap_around() -> None:
    links = _undirected(neuron.links(neuron.make_topology("torus", 16, 4, 4)))
    assert len(links) == 32
    for device in range(16):
        assert sum(1 for link in links if device in link) == 4
    assert frozenset((0, 3)) in links, "row wrap-around"
    assert frozenset((0, 12)) in links, "column wrap-around"
    assert frozenset((0, 5)) not in links, "no diagonals"


def test_the_dgx1_cube_mesh_links_each_quad_fully_and_the_quads_position_by_position() -> None:
    tree = nvidia.build_tree(nvidia.CUBE_MESH, 8, [[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
    links = _undirected(nvidia.link_pairs(tree))
    assert len(links) == 16
    assert all(frozenset((a, b)) in links for a in range(4) for b in range(4) if a < b)
    assert {frozenset((i, i + 4)) for i in range(4)} <= links
    assert frozenset((0, 5)) not in links
    assert all(sum(1 for link in links if gpu in link) == 4 for gpu in range(8))


@pytest.mark.parametrize(
    ("kind", "gpus", "groups"),
    [
        pytest.param(nvidia.NVSWITCH, 8, [], id="nvswitch-links-go-through-the-switch"),
        pytest.param(nvidia.FLAT, 4, [], id="unknown-topology-draws-no-links"),
    ],
)
def test_other_gpu_trees_report_no_direct_links(kind: str, gpus: int, groups: list[object]) -> None:
    assert nvidia.link_pairs(nvidia.build_tree(kind, gpus, groups)) == ()
