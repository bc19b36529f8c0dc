"""Benchmark: the extender's `/filter` for the members of one gang, bound one by one as kube-scheduler binds them.

A PodGroup of N members (8 GPUs each, `minMember: N`) on N 8-GPU nodes in racks of 64; every member exists, then
each is asked `/filter` over every node, bound to the first node passed (the extender's bind verb's reservation,
then the informer's report of the bound pod). Prints the time per member's `/filter`; the first member's call (the
gang's plan) is shown apart.

    .venv/bin/python benchmarks/extender_gang_bench.py [--members 1000 4000] [--sample 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import orjson

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.extender import ExtenderServer

GPU = "nvidia.com/gpu"
RACK = "example.com/rack"


class Writer:
    """The API writer's call the bind verb makes: the Binding, accepted (the last one kept)."""

    binding: dict[str, Any] = {}

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.binding = body
        return {}


def extender(members: int) -> tuple[ExtenderServer, list[dict[str, Any]], list[str]]:
    engine = Engine(make_plugin_manager("scheduler"), signing_key=b"k" * 32)
    engine.set_topology([RACK])
    server = ExtenderServer(engine, None, Writer())  # type: ignore[arg-type]
    names = [f"r{i // 64}-n{i % 64}" for i in range(members)]
    server.mirror.on_nodes(
        "SYNC", [node_manifest(n, labels={RACK: n.split("-")[0]}, allocatable={GPU: 8}) for n in names]
    )
    group = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
             "metadata": {"name": "train", "namespace": "ml", "uid": "pg", "resourceVersion": "1"},
             "spec": {"minMember": members}}  # fmt: skip
    server.mirror.on_podgroups("SYNC", [group])
    pods = []
    for i in range(members):
        pod = pod_manifest(f"train-{i}", {"main": {GPU: 8}}, namespace="ml")
        pod["metadata"].update(uid=f"uid-{i}", resourceVersion="1", labels={"scheduling.x-k8s.io/pod-group": "train"})
        server.mirror.on_pods("ADDED", pod)
        pods.append(pod)
    return server, pods, names


async def bind_one_by_one(
    server: ExtenderServer, pods: list[dict[str, Any]], names: list[str], count: int
) -> list[float]:
    """The first `count` members filtered and bound (the extender's bind verb, then the informer's report of the
    bound pod); the seconds each `/filter` took."""
    seconds = []
    for pod in pods[:count]:
        started = time.perf_counter()
        answer = server.filter(orjson.dumps({"Pod": pod, "NodeNames": names}))
        seconds.append(time.perf_counter() - started)
        passed = answer["NodeNames"]
        assert passed, answer["FailedNodes"].get(names[0])
        meta = pod["metadata"]
        binding = {"PodName": meta["name"], "PodNamespace": "ml", "PodUID": meta["uid"], "Node": passed[-1]}
        error = (await server.bind(orjson.dumps(binding)))["Error"]
        assert not error, error
        bound = orjson.loads(orjson.dumps(pod))
        annotations = server.binder.writer.binding["metadata"].get("annotations", {})  # type: ignore[attr-defined]
        bound["metadata"].update(resourceVersion="2", annotations=annotations)
        bound["spec"]["nodeName"] = passed[-1]
        server.mirror.on_pods("MODIFIED", bound)
    return seconds


def ordinary_filter(server: ExtenderServer, names: list[str], rounds: int = 20) -> float:
    """The mean time of `/filter` over `names` for a pod of no gang (what the node list alone costs)."""
    pod = pod_manifest("alone", {"main": {GPU: 8}}, namespace="ml")
    pod["metadata"].update(uid="uid-alone", resourceVersion="1")
    server.mirror.on_pods("ADDED", pod)
    body = orjson.dumps({"Pod": pod, "NodeNames": names})
    server.filter(body)
    started = time.perf_counter()
    for _ in range(rounds):
        server.filter(body)
    return (time.perf_counter() - started) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--sample", type=int, default=200, help="members bound per size (the rest extrapolated)")
    args = parser.parse_args()
    for members in args.members:
        server, pods, names = extender(members)
        seconds = asyncio.run(bind_one_by_one(server, pods, names, min(args.sample, members)))
        rest = seconds[1:]
        per = sum(rest) / len(rest)
        median = statistics.median(rest)
        alone = ordinary_filter(server, names)
        total = seconds[0] + per * (members - 1)
        print(
            f"{members} members: first /filter {seconds[0]:.3f} s, then {per * 1000:.2f} ms per member "
            f"(median {median * 1000:.2f} ms, max {max(rest) * 1000:.2f} ms; "
            f"a pod of no gang over the same {len(names)} nodes: {alone * 1000:.2f} ms); "
            f"all {members} members: ~{total:.1f} s"
        )


if __name__ == "__main__":
    main()
