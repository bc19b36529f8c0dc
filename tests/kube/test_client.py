"""kubegpu's own API client: the informers' start-up order and the writer's warm connections, as the scheduler
relies on them when it (re)starts, and the writer's fence, which keeps a replica that stopped leading from sending
the writes it had queued."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from aiohttp import web

from kubegpu.kube.client import ApiError, AsyncKubeClient, Credentials, Fenced, Informer, KubeClient, RateLimiter


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


async def loopback_site(
    handle: Callable[[web.Request], Awaitable[web.StreamResponse]], path: str = "/{tail:.*}"
) -> tuple[web.AppRunner, int]:
    """An aiohttp server on a free loopback port answering `path` (every path by default) with `handle`, started:
    its runner and its port."""
    app = web.Application()
    app.router.add_route("*", path, handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


class LoopbackApi:
    """An aiohttp server on its own loop thread that records what reaches it; `/slow` answers after 0.5 s."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.runner, self.port = asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(5)

    async def _serve(self) -> tuple[web.AppRunner, int]:
        async def handle(request: web.Request) -> web.Response:
            self.seen.append(f"{request.method} {request.path}")
            if request.path == "/slow":
                await asyncio.sleep(0.5)
            return web.json_response({"ok": True})

        return await loopback_site(handle)

    def writer(self, limiter: RateLimiter, fence: Any, connections: int = 4) -> AsyncKubeClient:
        credentials = Credentials(f"http://127.0.0.1:{self.port}", None, None, None, False, None)
        return AsyncKubeClient(credentials, limiter, connections=connections, fence=fence)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


class Fence:
    """A deadline the test moves, as the elector moves `Leadership`'s."""

    def __init__(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds

    def __call__(self) -> float:
        return self.until - time.monotonic()


async def outcome(coroutine: Any) -> str:
    try:
        await coroutine
    except Fenced:
        return "fenced"
    return "sent"


def test_writes_still_waiting_for_the_rate_limiter_when_the_fence_runs_out_are_never_sent() -> None:
    """A backlog owed to the rate limiter (5 a second here) drains into refusals once the replica stops leading;
    reads still go."""
    api, fence = LoopbackApi(), Fence(60)
    writer = api.writer(RateLimiter(5, 1), fence)
    try:

        async def backlog() -> list[str]:
            fence.until = time.monotonic() + 0.5
            writes = [outcome(writer.post(f"/write/{n}", {"n": n})) for n in range(5)]  # due at 0, .2, .4, .6, .8 s
            return await asyncio.gather(*writes, outcome(writer.request("GET", "/read")))

        results = writer.submit(backlog()).result(5)
        assert results == ["sent", "sent", "sent", "fenced", "fenced", "sent"]
        assert sorted(api.seen) == ["GET /read", "POST /write/0", "POST /write/1", "POST /write/2"]
    finally:
        writer.close()
        api.close()


def test_drain_waits_for_the_writes_already_sent_not_for_those_the_fence_refused() -> None:
    """A leader shutting down closes its fence, then may give its Lease up only once nothing it sent can still land:
    `drain` reports a write sent before the fence closed as in flight until its answer comes, and does not wait for
    the queued writes the fence refuses."""
    api, fence = LoopbackApi(), Fence(60)
    writer = api.writer(RateLimiter(2, 1), fence)
    try:
        slow = writer.submit(writer.post("/slow", {}))  # answered after 0.5 s
        queued = writer.submit(outcome(writer.post("/queued", {})))  # owed 0.5 s to the limiter
        time.sleep(0.1)
        fence.until = -math.inf  # SIGTERM
        assert writer.drain(0.1) is None, "the slow write, sent and unanswered, was not counted"
        assert writer.drain(2) == -math.inf
        assert slow.done() and queued.result(2) == "fenced"
        assert sorted(api.seen) == ["POST /slow"]
    finally:
        writer.close()
        api.close()


def test_a_write_waiting_for_a_connection_is_sent_only_while_the_fence_holds() -> None:
    """With every connection busy, a write waits for one; it goes if the fence was moved on meanwhile (a renewal),
    and is refused unsent if the fence ran out first: aiohttp never queues it past the check."""
    api = LoopbackApi()
    renewed, lapsed = Fence(60), Fence(60)
    writers = [api.writer(RateLimiter(0, 1), fence, connections=1) for fence in (renewed, lapsed)]
    try:

        async def behind_a_slow_request(writer: AsyncKubeClient) -> tuple[str, str]:
            fence = renewed if writer.fence is renewed else lapsed
            fence.until = time.monotonic() + 0.25  # runs out while the slow request (0.5 s) holds the connection
            slow = asyncio.ensure_future(outcome(writer.post("/slow", {})))
            await asyncio.sleep(0.05)
            return await asyncio.gather(slow, outcome(writer.post("/after", {})))

        pending = [w.submit(behind_a_slow_request(w)) for w in writers]
        time.sleep(0.1)
        renewed.until = time.monotonic() + 5
        assert list(pending[0].result(5)) == ["sent", "sent"]
        assert list(pending[1].result(5)) == ["sent", "fenced"]
        assert sorted(api.seen) == ["POST /after", "POST /slow", "POST /slow"]
    finally:
        for writer in writers:
            writer.close()
        api.close()


def test_a_report_waiting_for_a_connection_lets_the_writes_that_move_pods_go_first() -> None:
    """Events and status patches wait behind deletions and Bindings for a connection (a thousand pods that fit nowhere
    kept every preemption's victims waiting behind their reports), yet get one turn in four: none waits for ever."""
    api = LoopbackApi()
    writer = api.writer(RateLimiter(0, 1), None, connections=1)
    pods = "/api/v1/namespaces/ns/pods"
    try:

        async def queued_behind_a_slow_request() -> None:
            slow = asyncio.ensure_future(writer.post("/slow", {}))
            await asyncio.sleep(0.05)  # the only connection is busy from here on
            reports = [writer.post("/apis/events.k8s.io/v1/namespaces/ns/events", {"n": n}) for n in range(2)]
            reports.append(writer.patch(f"{pods}/preemptor/status", {"status": {}}))
            moving = [writer.request("DELETE", f"{pods}/victim-{n}") for n in range(4)]
            moving.append(writer.post(f"{pods}/preemptor/binding", {}))
            await asyncio.gather(slow, *reports, *moving)

        writer.submit(queued_behind_a_slow_request()).result(10)
        assert api.seen == [
            "POST /slow",
            "DELETE /api/v1/namespaces/ns/pods/victim-0",
            "DELETE /api/v1/namespaces/ns/pods/victim-1",
            "DELETE /api/v1/namespaces/ns/pods/victim-2",
            "POST /apis/events.k8s.io/v1/namespaces/ns/events",
            "DELETE /api/v1/namespaces/ns/pods/victim-3",
            "POST /api/v1/namespaces/ns/pods/preemptor/binding",
            "POST /apis/events.k8s.io/v1/namespaces/ns/events",
            "PATCH /api/v1/namespaces/ns/pods/preemptor/status",
        ]
    finally:
        writer.close()
        api.close()


class WatchClosingApi:
    """An API server (or a proxy before it) that lists pods and ends every watch at once: with nothing sent, with
    `watch_status` (a 500 of a server shutting down), or with `watch_body` (an ERROR event)."""

    def __init__(self, watch_status: int = 200, watch_body: bytes = b"") -> None:
        self.watch_status = watch_status
        self.watch_body = watch_body
        self.watches = 0
        self.lists = 0
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.runner = asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(5)

    async def _serve(self) -> web.AppRunner:
        async def pods(request: web.Request) -> web.Response:
            if request.query.get("watch") == "true":
                self.watches += 1
                return web.Response(status=self.watch_status, body=self.watch_body, content_type="application/json")
            self.lists += 1
            return web.json_response({"items": [], "metadata": {"resourceVersion": "7"}})

        runner, self.port = await loopback_site(pods, "/api/v1/pods")
        return runner

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)


def informer_for(api: WatchClosingApi, seconds: float) -> WatchClosingApi:
    """`api` after an informer of pods has run against it for `seconds` from its first watch (a window to count the
    requests in, not a synchronisation), the informer stopped and the server closed."""
    stop = threading.Event()
    credentials = Credentials(f"http://127.0.0.1:{api.port}", None, None, None, False, None)
    informer = Informer(KubeClient(credentials), "/api/v1/pods", lambda kind, payload: None, stop, "pods")
    try:
        informer.start()
        wait_for(lambda: api.watches >= 1)
        time.sleep(seconds)
    finally:
        stop.set()
        informer.join(5)
        api.close()
    return api


def test_a_watch_the_server_ends_at_once_is_asked_again_only_after_a_backoff() -> None:
    """client-go's reflector takes a watch that ended within a second with nothing delivered for a failure and backs
    off; an informer that watched again at once sent the server (and spent the scheduler's GIL on) some hundreds of
    requests a second for as long as the server or a proxy before it kept closing the stream."""
    api = informer_for(WatchClosingApi(), 2.0)  # a window to count in: the informer runs on by itself
    assert api.watches <= 4, f"{api.watches} watches (and {api.lists} lists) in 2 s"


def test_lists_that_succeed_do_not_undo_the_backoff_of_watches_that_fail() -> None:
    """The backoff doubles while the watch fails, whether or not the list before it succeeded: with a watch that
    always answers 500 the informer listed the whole collection again every 0.5 s."""
    api = informer_for(WatchClosingApi(watch_status=500), 3.0)  # lists at 0, 0.5 and 1.5 s, the next at 3.5 s
    assert api.lists <= 4, f"{api.lists} lists (and {api.watches} watches) in 3 s"


def test_a_watch_expired_at_once_after_a_list_relists_only_after_a_backoff() -> None:
    """A watch from the version a list just gave that answers 410 Gone at once (an API server whose watch cache is
    behind the one that listed, behind a load balancer) is relisted after the backoff, as client-go's reflector
    backs off every ListAndWatch that returns: the informer listed the whole collection again at once, some
    hundreds of lists a second for as long as the server answered so."""
    gone = b'{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}\n'
    api = informer_for(WatchClosingApi(watch_body=gone), 2.0)  # lists at 0, 0.5 and 1.5 s, the next at 3.5 s
    assert api.lists <= 4, f"{api.lists} lists (and {api.watches} watches) in 2 s"


def test_an_answer_that_is_not_json_is_an_answer_lost_for_both_clients() -> None:
    """A proxy's page with status 200 (or an error page whose body is no Status) is an `ApiError`, the one failure
    callers handle: status 0 for a success that cannot be read (a write may have been made: the binder looks a
    Binding up, as after a timeout), the status itself otherwise. Before, orjson's decoding error went through
    every caller that expects `ApiError` (the leader elector's thread, the advertiser's Lease renewer, discovery)."""
    pages = {"/page": (200, b"<html>502 Bad Gateway</html>"), "/list-error": (503, b'["not", "a", "Status"]')}

    async def handle(request: web.Request) -> web.Response:
        status, body = pages[request.path]
        return web.Response(status=status, body=body, content_type="text/html")

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    runner, port = asyncio.run_coroutine_threadsafe(loopback_site(handle), loop).result(5)
    credentials = Credentials(f"http://127.0.0.1:{port}", None, None, None, False, None)
    writer = AsyncKubeClient(credentials, RateLimiter(0.0, 1))
    try:
        for ask in (
            lambda path: KubeClient(credentials).request("POST", path, body={}),
            lambda path: writer.submit(writer.request("POST", path, {})).result(5),
        ):
            with pytest.raises(ApiError) as lost:
                ask("/page")
            assert lost.value.status == 0 and "the 200 answer is not JSON" in str(lost.value)
            with pytest.raises(ApiError) as failed:
                ask("/list-error")
            assert failed.value.status == 503 and '["not", "a", "Status"]' in str(failed.value)
    finally:
        writer.close()
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
