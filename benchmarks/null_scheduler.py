"""The cheapest scheduler there can be, for scheduler_bench.py's floor.

It decides nothing: one LIST of the pods (pages of 500, as kubegpu's informer reads them), then a Binding for each
pending pod naming `--scheduler-name`, to the nodes in turn, posted through the same asynchronous client, connection
count and rate limiter as `kubegpu scheduler`. No engine, no plugins, no watches, no state. Timed like the real
schedulers (launch to last Binding), it is what any scheduler written in Python pays on this machine for starting,
reading the pods and writing the Bindings: no implementation can pass it.

    python benchmarks/null_scheduler.py --kubeconfig PATH [--scheduler-name kubegpu] [--binders 16] [--qps 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from typing import Any

from kubegpu.kube.client import ApiError, AsyncKubeClient, KubeClient


async def bind_all(writer: AsyncKubeClient, pods: list[dict[str, Any]], nodes: list[str], in_flight: int) -> int:
    gate = asyncio.Semaphore(in_flight)
    failed = 0

    async def bind(pod: dict[str, Any], node: str) -> None:
        nonlocal failed
        meta = pod["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": meta.get("uid")},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        async with gate:
            try:
                await writer.post(f"/api/v1/namespaces/{namespace}/pods/{name}/binding", binding)
            except ApiError:
                failed += 1

    await asyncio.gather(*(bind(pod, node) for pod, node in zip(pods, itertools.cycle(nodes))))
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--scheduler-name", default="kubegpu")
    parser.add_argument("--binders", type=int, default=16, help="Bindings in flight at once (kubegpu's --binders)")
    parser.add_argument("--qps", type=float, default=1000.0, help="client QPS and burst (kubegpu's)")
    args = parser.parse_args()
    client = KubeClient.from_kubeconfig(args.kubeconfig, qps=args.qps, burst=int(args.qps))
    writer = AsyncKubeClient(client.credentials, client.limiter, connections=args.binders)
    nodes = [node["metadata"]["name"] for node in client.list("/api/v1/nodes")[0]]
    pods = [
        pod
        for pod in client.list("/api/v1/pods")[0]
        if (pod.get("spec") or {}).get("schedulerName") == args.scheduler_name
        and not (pod.get("spec") or {}).get("nodeName")
    ]
    failed = writer.submit(bind_all(writer, pods, nodes, args.binders)).result()
    writer.close()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
