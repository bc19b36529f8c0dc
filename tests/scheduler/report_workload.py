"""A large cluster for the device report's speed test and benchmark: nodes of every built-in topology, and a seeded
mix of pods scheduled by the real engine, some left pending."""

from __future__ import annotations

import random

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.report import PendingPod, Report, build_report

SHAPES = [
    ({"node.kubernetes.io/instance-type": "trn1.32xlarge"}, {"aws.amazon.com/neurondevice": 16}),
    ({"node.kubernetes.io/instance-type": "inf2.48xlarge"}, {"aws.amazon.com/neuron": 12}),
    (
        {
            "node.kubernetes.io/instance-type": "p3.16xlarge",
            "nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB",
            "nvidia.com/gpu.count": "8",
        },
        {"nvidia.com/gpu": 8},
    ),
    ({"node.kubernetes.io/instance-type": "p4d.24xlarge"}, {"nvidia.com/gpu": 8}),
    ({"gpu.intel.com/cards": "card0.card1.card2.card3"}, {"gpu.intel.com/i915": 16, "gpu.intel.com/memory.max": "64G"}),
]
REQUESTS = [
    {"aws.amazon.com/neurondevice": 1},
    {"aws.amazon.com/neurondevice": 4},
    {"aws.amazon.com/neurondevice": 8},
    {"aws.amazon.com/neuron": 3},
    {"aws.amazon.com/neuroncore": 3},
    {"nvidia.com/gpu": 1},
    {"nvidia.com/gpu": 2},
    {"nvidia.com/gpu": 4},
    {"gpu.intel.com/i915": 1, "gpu.intel.com/memory.max": "6G"},
    {"aws.amazon.com/neurondevice": 7},  # refused: a pending pod with the Neuron message
]


def large_cluster(nodes: int = 1000, pods: int = 3000, seed: int = 7) -> tuple[Engine, list[PendingPod]]:
    engine = Engine(make_plugin_manager("scheduler"))
    for i in range(nodes):
        labels, allocatable = SHAPES[i % len(SHAPES)]
        engine.add_node(make_node(f"node-{i:04d}", labels=labels, allocatable=allocatable))
    rng = random.Random(seed)
    pending = []
    for i in range(pods):
        request = make_pod(f"job-{i:04d}", {"main": rng.choice(REQUESTS)}, namespace=f"team-{i % 7}")
        decision = engine.schedule(request)
        if not decision.scheduled:
            pending.append(PendingPod(request.key, decision.reason or ""))
    return engine, pending


def large_report(engine: Engine, pending: list[PendingPod]) -> Report:
    return build_report(engine, title="1000 nodes", source="tests/scheduler/report_workload.py", pending=pending)
