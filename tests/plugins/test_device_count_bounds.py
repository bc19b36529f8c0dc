"""A Node (or a simulator file) that claims absurd device counts costs its own pods a reason, not minutes of CPU.

Plugins build per-device structures (bitmasks, ring windows, id lists); a count chosen by whoever wrote the Node
would otherwise decide how long scheduling takes and how much memory it needs.
"""

from __future__ import annotations

import json
import time

import pytest

from kubegpu.core.annotations import DEVICES_KEY
from kubegpu.core.limits import MAX_DEVICES_PER_NODE
from kubegpu.core.manifests import node_info
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_pod, node_manifest
from kubegpu.scheduler.engine import Engine

HUGE = 100_000_000


def neuron_inventory(highest: int) -> str:
    devices = [{"id": "0"}, {"id": str(highest)}]
    return json.dumps({"version": 1, "inventories": {"neuron": {"plugin": "neuron", "devices": devices}}})


@pytest.mark.parametrize(
    ("resource", "node_kwargs"),
    [
        ("aws.amazon.com/neuron", {"allocatable": {"aws.amazon.com/neuron": HUGE}}),
        (
            "nvidia.com/gpu",
            {"allocatable": {"nvidia.com/gpu": HUGE}, "labels": {"nvidia.com/gpu.count": str(HUGE)}},
        ),
        (
            "aws.amazon.com/neuron",
            {"allocatable": {"aws.amazon.com/neuron": 2}, "annotations": {DEVICES_KEY: neuron_inventory(99_999_999)}},
        ),
    ],
    ids=["neuron-allocatable", "nvidia-count", "neuron-advertised-id"],
)
def test_a_node_claiming_absurd_devices_is_refused_quickly(resource: str, node_kwargs: dict[str, object]) -> None:
    engine = Engine(make_plugin_manager("scheduler"))
    started = time.process_time()
    engine.add_node(node_info(node_manifest("liar", **node_kwargs)))  # type: ignore[arg-type]
    decision = engine.schedule(make_pod("victim", {"main": {resource: 1}}))
    assert time.process_time() - started < 1.0
    assert not decision.scheduled
    [problem] = engine.nodes["liar"].problems.values()
    assert f"node liar claims {HUGE} " in problem and f"at most {MAX_DEVICES_PER_NODE} devices" in problem
