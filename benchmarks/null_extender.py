"""The cheapest extender there can be, for extender_bench.py's floor.

filter passes every node it is asked about, prioritize scores none, bind posts a plain Binding: no engine, no
plugins, no watches, no state, served by the same HTTP server as `kubegpu extender`. What kube-scheduler loses with
it is the cost of calling an HTTP extender at all (two round trips in every scheduling cycle, JSON on both sides,
the Binding from another process), which no extender can avoid.

    python benchmarks/null_extender.py --kubeconfig PATH --listen HOST:PORT
"""

from __future__ import annotations

import argparse
import signal
import threading
from types import SimpleNamespace
from typing import Any

import orjson

from kubegpu.kube.client import ApiError, AsyncKubeClient, KubeClient
from kubegpu.scheduler.extender import HttpServer


class NullExtender:
    def __init__(self, writer: AsyncKubeClient) -> None:
        self.writer = writer
        self.service = SimpleNamespace(stop=threading.Event(), ready=lambda: True, healthy=lambda: True)

    def filter(self, body: bytes) -> dict[str, Any]:
        return {"NodeNames": orjson.loads(body).get("NodeNames"), "FailedNodes": {}, "Error": ""}

    def prioritize(self, body: bytes) -> list[Any]:
        return []

    def preempt(self, body: bytes) -> dict[str, Any]:
        return {"NodeNameToMetaVictims": {}}

    async def bind(self, body: bytes) -> dict[str, Any]:
        args = orjson.loads(body)
        name, namespace = args["PodName"], args["PodNamespace"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": args.get("PodUID") or None},
            "target": {"apiVersion": "v1", "kind": "Node", "name": args["Node"]},
        }
        try:
            await self.writer.post(f"/api/v1/namespaces/{namespace}/pods/{name}/binding", binding)
        except ApiError as exc:
            return {"Error": str(exc)}
        return {"Error": ""}

    def node_views(self) -> dict[str, Any]:
        return {}

    def pod_views(self) -> dict[str, Any]:
        return {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--kube-api-qps", type=float, default=1000.0)
    args = parser.parse_args()
    client = KubeClient.from_kubeconfig(args.kubeconfig, qps=args.kube_api_qps, burst=int(args.kube_api_qps))
    writer = AsyncKubeClient(client.credentials, client.limiter, connections=32)
    null = NullExtender(writer)
    server = HttpServer(null, args.listen, None, writer.loop)  # type: ignore[arg-type]
    signal.signal(signal.SIGTERM, lambda *_: null.service.stop.set())
    null.service.stop.wait()
    server.shutdown()
    writer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
