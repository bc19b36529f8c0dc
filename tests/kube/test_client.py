"""kubegpu's own API client: the informers' start-up order and the writer's warm connections, as the scheduler
relies on them when it (re)starts."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from kubegpu.kube.client import AsyncKubeClient, Credentials, Informer, RateLimiter


class SlowNodeList:
    """Stands in for `KubeClient`: the node list answers only once released; pods answer at once; watches idle."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.release = threading.Event()
        self.listed: list[str] = []

    def list(self, path: str, **_params: Any) -> tuple[list[dict[str, Any]], str]:
        self.listed.append(path)
        if path.endswith("/nodes"):
            self.release.wait(10)
        return [{"metadata": {"name": path.rsplit("/", 1)[-1]}}], "1"

    def watch(self, path: str, version: str, **_params: Any) -> Iterator[dict[str, Any]]:
        self.stop.wait(10)
        return iter(())


def wait_for(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_pods_are_listed_alongside_nodes_and_handed_over_after_them() -> None:
    stop = threading.Event()
    client = SlowNodeList(stop)
    consumed: list[tuple[str, str]] = []

    def consumer(what: str) -> Any:
        return lambda kind, payload: consumed.append((what, kind))

    nodes = Informer(client, "/api/v1/nodes", consumer("nodes"), stop, "nodes")  # type: ignore[arg-type]
    pods = Informer(client, "/api/v1/pods", consumer("pods"), stop, "pods", after=nodes.synced)  # type: ignore[arg-type]
    try:
        nodes.start()
        pods.start()
        wait_for(lambda: "/api/v1/pods" in client.listed)  # the pods' list is read while the nodes' is pending
        time.sleep(0.2)
        assert consumed == [], "the pods' list was handed over before the nodes'"
        client.release.set()
        wait_for(lambda: len(consumed) == 2)
        assert consumed == [("nodes", "SYNC"), ("pods", "SYNC")]
    finally:
        stop.set()
        client.release.set()


def test_warm_opens_the_writers_connections_before_the_first_write() -> None:
    """`warm(n)` leaves n connections open, so n writes at once open none: the first Bindings after a start do not
    wait for connection set-up."""
    peers: list[object] = []
    loop = asyncio.new_event_loop()
    started = threading.Event()
    site: list[web.TCPSite] = []

    async def handle(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        await asyncio.sleep(0.05)  # long enough that concurrent requests need connections of their own
        return web.json_response({"ok": True})

    async def serve() -> None:
        app = web.Application()
        app.router.add_get("/version", handle)
        app.router.add_post("/write", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site.append(web.TCPSite(runner, "127.0.0.1", 0))
        await site[0].start()
        started.set()

    threading.Thread(target=loop.run_forever, daemon=True).start()
    asyncio.run_coroutine_threadsafe(serve(), loop).result(5)
    started.wait(5)
    port = site[0]._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    writer = AsyncKubeClient(
        Credentials(f"http://127.0.0.1:{port}", None, None, None, False, None), RateLimiter(0, 0), connections=4
    )
    try:
        assert writer.warm(4).result(5) == 4
        warmed = set(peers)
        assert len(warmed) == 4

        async def four_writes() -> None:
            await asyncio.gather(*(writer.post("/write", {"n": n}) for n in range(4)))

        writer.submit(four_writes()).result(5)
        assert set(peers[4:]) == warmed, "the writes opened connections of their own"
    finally:
        writer.close()
        loop.call_soon_threadsafe(loop.stop)
