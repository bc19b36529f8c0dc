"""Finding 5 of issue 10: the extender's HTTP server under clients that try to hold it. Each test is a story of what
an abusive client on the network does and what kube-scheduler, on another connection, sees meanwhile: its `/filter`
answered in normal time. Loopback only, bounded loops, deadlines instead of sleeps; the timeouts are shortened
through `Limits` so that the stories take seconds."""

from __future__ import annotations

import dataclasses
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import orjson
import pytest

from kubegpu.core.manifests import pod_request
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.extender import LISTING_WAIT, ExtenderHttpServer, ExtenderServer
from kubegpu.scheduler.http_server import Limits

from .test_extender_http import FILTER, POD, closed, post, read_response, start_listing
from .test_properties import NODE_KINDS

NODES = 50
SHORT = Limits(header_timeout=1.0, body_timeout=1.0, idle_timeout=1.5)
GET_HEALTH = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def start(limits: Limits, p3: dict[str, dict[str, str]] = NODE_KINDS["p3"]) -> ExtenderHttpServer:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    for i in range(NODES):
        engine.add_node(make_node(f"p3-{i}", **p3))
    extender = ExtenderServer(engine, None, None)  # type: ignore[arg-type]
    return ExtenderHttpServer(extender, "127.0.0.1:0", None, limits=limits)


# The same server in a process of its own, for latency figures that the attacking client's threads (sharing this
# process's GIL) do not blur.
SERVER_PROCESS = """
import sys, orjson
from kubegpu.scheduler.http_server import Limits
from {module} import start
server = start(Limits(**orjson.loads(sys.argv[1])), orjson.loads(sys.argv[2]))
print(server.address[1], flush=True)
sys.stdin.read()
"""


class Remote:
    """A server process: its address, as `connect` and `FilterProbe` want it."""

    def __init__(self, limits: Limits) -> None:
        code = SERVER_PROCESS.format(module=__name__)
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, orjson.dumps(dataclasses.asdict(limits)), orjson.dumps(NODE_KINDS["p3"])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=str(Path(__file__).parents[1]),
        )
        assert self.process.stdout is not None
        self.address = ("127.0.0.1", int(self.process.stdout.readline()))

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


@pytest.fixture
def remote() -> Iterator[Callable[[Limits], Remote]]:
    started: list[Remote] = []

    def remote(limits: Limits) -> Remote:
        started.append(Remote(limits))
        return started[-1]

    yield remote
    for server in started:
        server.stop()


@pytest.fixture
def serve() -> Iterator[Callable[[Limits], ExtenderHttpServer]]:
    started: list[ExtenderHttpServer] = []

    def serve(limits: Limits = SHORT) -> ExtenderHttpServer:
        started.append(start(limits))
        return started[-1]

    yield serve
    for server in started:
        server.shutdown()


def connect(server: ExtenderHttpServer | Remote, timeout: float = 5) -> socket.socket:
    assert server.address[0] == "127.0.0.1"
    return socket.create_connection(server.address, timeout=timeout)  # type: ignore[arg-type]


def wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(0.01)


class FilterProbe:
    """kube-scheduler's view: /filter over one keep-alive connection, timed."""

    def __init__(self, server: ExtenderHttpServer | Remote) -> None:
        self.sock = connect(server)
        self.buffer = bytearray()
        self.request = post("/filter", FILTER)

    def once(self) -> float:
        started = time.perf_counter()
        self.sock.sendall(self.request)
        status, _, body = read_response(self.sock, self.buffer)
        elapsed = time.perf_counter() - started
        assert status == 200 and orjson.loads(body)["NodeNames"] == ["p3-0", "p3-1"]
        return elapsed

    def p99(self, count: int) -> float:
        return statistics.quantiles([self.once() for _ in range(count)], n=100)[98]

    def close(self) -> None:
        self.sock.close()


def read_error(sock: socket.socket) -> tuple[int, str]:
    status, _, body = read_response(sock, bytearray())
    return status, orjson.loads(body)["error"]


# -- sizes ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "status", "words"),
    [
        (b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", 431, "header fields"),
        (b"GET /healthz HTTP/1.1\r\nX-Big: " + b"y" * 20_000 + b"\r\n\r\n", 431, "headers are over"),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414, "target is over"),
    ],
    ids=["101-headers", "a-20-KiB-header", "a-9000-byte-target"],
)
def test_an_oversized_head_is_refused_and_the_server_goes_on(
    serve: Callable[[Limits], ExtenderHttpServer], head: bytes, status: int, words: str
) -> None:
    server = serve(Limits())
    with connect(server) as sock:
        sock.sendall(head)
        got, message = read_error(sock)
        assert (got, words in message) == (status, True), message
        assert closed(sock)
    probe = FilterProbe(server)
    probe.once()
    probe.close()


def test_a_header_that_never_ends_is_refused_before_it_grows() -> None:
    """A header line sent 1 KiB at a time, never finished: httptools would buffer it all; the server counts what it
    fed and refuses once the head passes 16 KiB, long before the client is done."""
    server = start(Limits())
    try:
        with connect(server) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nX-Endless: ")
            sent = 0
            refused = False
            for _ in range(1000):  # at most 1 MiB
                try:
                    sock.sendall(b"y" * 1024)
                except OSError:
                    refused = True
                    break
                sent += 1024
                sock.settimeout(0.005)
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                finally:
                    sock.settimeout(5)
                assert data.startswith(b"HTTP/1.1 431 "), data
                refused = True
                break
            assert refused and sent <= 64 * 1024, sent
    finally:
        server.shutdown()


# -- time ------------------------------------------------------------------------------------------------------------


def test_slowloris_is_closed_after_the_header_timeout_and_filter_stays_fast(
    remote: Callable[[Limits], Remote],
) -> None:
    """Eight clients each send a request head one byte every 100 ms (they would take minutes to finish), and one
    connects and sends nothing: each is answered 408 and closed about `header_timeout` (1 s here) after it started,
    while kube-scheduler's /filter on its own connection keeps its usual latency."""
    server = remote(SHORT)
    probe = FilterProbe(server)
    baseline = probe.p99(300)
    with ExitStack() as stack:
        slow = [stack.enter_context(connect(server)) for _ in range(8)]
        silent = stack.enter_context(connect(server))
        started = time.monotonic()
        head = b"POST /filter HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"z" * 10_000
        latencies = []
        open_ = set(range(len(slow)))
        for step in range(60):  # 6 s at most; the timeout is 1 s
            for i in list(open_):
                try:
                    slow[i].sendall(head[step : step + 1])
                except OSError:
                    open_.discard(i)
            latencies.extend(probe.once() for _ in range(30))
            time.sleep(0.1)  # the attacker's pace, not a synchronisation
            for i in list(open_):
                slow[i].settimeout(0)
                try:
                    data = slow[i].recv(65536)
                except BlockingIOError:
                    continue
                assert data.startswith(b"HTTP/1.1 408 ") or data == b"", data
                open_.discard(i)
            if not open_:
                break
        elapsed = time.monotonic() - started
        assert not open_, "slowloris connections still open"
        assert SHORT.header_timeout <= elapsed < SHORT.header_timeout + 1.5, elapsed
        silent.settimeout(2)
        assert read_response(silent, bytearray())[0] == 408
    during = statistics.quantiles(latencies, n=100)[98]
    print(f"/filter p99: {baseline * 1e3:.2f} ms alone, {during * 1e3:.2f} ms during slowloris")
    assert during < max(20 * baseline, 0.05) and during < 0.2, (baseline, during)  # the stall was 8.9 s
    probe.close()


def test_an_idle_keep_alive_connection_is_closed(serve: Callable[[Limits], ExtenderHttpServer]) -> None:
    server = serve(SHORT)
    with connect(server) as sock:
        sock.sendall(GET_HEALTH)
        assert read_response(sock, bytearray())[0] == 200
        started = time.monotonic()
        sock.settimeout(SHORT.idle_timeout + 2)
        assert sock.recv(1) == b""  # closed by the server, without an answer to wait for
        assert time.monotonic() - started >= SHORT.idle_timeout - 0.1
    wait_until(lambda: not server.connections, 2, "the connection forgotten")


def test_a_body_that_stops_arriving_is_closed(serve: Callable[[Limits], ExtenderHttpServer]) -> None:
    server = serve(SHORT)
    with connect(server) as sock:
        sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        sock.settimeout(SHORT.body_timeout + 2)
        assert read_response(sock, bytearray())[0] == 408
    wait_until(lambda: server.budget.available == SHORT.body_budget, 2, "the body's budget given back")


# -- memory ------------------------------------------------------------------------------------------------------------


class Flood:
    """A client that pipelines up to 100,000 filters and never reads an answer, from a thread of its own."""

    TOTAL = 100_000

    def __init__(self, server: ExtenderHttpServer | Remote) -> None:
        self.sock = connect(server)
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._send, daemon=True)
        self.thread.start()

    def _send(self) -> None:
        self.sock.settimeout(0.1)
        batch = post("/filter", FILTER) * 200
        while self.sent < self.TOTAL and not self.stop.is_set():
            try:
                self.sock.sendall(batch)
            except TimeoutError:
                continue  # the server stopped reading; the socket buffers are full
            except OSError:
                return
            self.sent += 200

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def test_a_client_that_never_reads_its_answers_does_not_slow_the_others(remote: Callable[[Limits], Remote]) -> None:
    """Once the flooding client's unread answers pass the high-water mark the server stops reading it: its requests
    wait in its own socket, and kube-scheduler's /filter on another connection keeps its usual latency."""
    server = remote(Limits())
    probe = FilterProbe(server)
    baseline = probe.p99(300)
    flood = Flood(server)
    latencies = []
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        latencies.append(probe.once())
    flood.close()
    during = statistics.quantiles(latencies, n=100)[98]
    print(f"/filter p99: {baseline * 1e3:.2f} ms alone, {during * 1e3:.2f} ms beside an unread pipeline", end=" ")
    print(f"({flood.sent} requests sent in 3 s)")
    assert flood.sent < Flood.TOTAL, "the server kept reading a client that reads nothing"
    assert during < max(20 * baseline, 0.05) and during < 0.2, (baseline, during)  # the stall was 8.9 s
    probe.close()


def test_a_client_that_never_reads_its_answers_holds_bounded_memory(
    serve: Callable[[Limits], ExtenderHttpServer],
) -> None:
    server = serve(Limits())
    flood = Flood(server)
    wait_until(lambda: any(c.write_paused for c in server.connections), 10, "the flooding connection paused")
    probe = FilterProbe(server)
    for _ in range(20):
        probe.once()
    (held,) = [c for c in server.connections if c.write_paused]
    assert held.read_paused and held.transport is not None
    buffered = held.transport.get_write_buffer_size()
    assert buffered <= Limits.write_high_water + 64 * 1024, buffered  # a few answers past the mark at most
    assert len(held.queue) <= 1000, len(held.queue)  # at most one read's worth of small requests
    flood.close()
    probe.close()
    wait_until(lambda: not server.connections, 5, "the flooding connection closed")


def test_bodies_share_one_budget(serve: Callable[[Limits], ExtenderHttpServer]) -> None:
    """Two clients together may not hold more body bytes than the budget: the second is refused with 503 and
    Retry-After while the first is still sending; once the first is answered the budget is whole again."""
    limits = Limits(max_body=768 * 1024, body_budget=1024 * 1024, header_timeout=5, body_timeout=5)
    server = serve(limits)
    big = orjson.dumps({"Pod": POD, "NodeNames": ["p3-0", *(f"pad-{i:06d}" for i in range(50_000))]})
    assert 600 * 1024 < len(big) < 768 * 1024
    with connect(server) as first, connect(server) as second:
        first.sendall(f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {len(big)}\r\n\r\n".encode() + big[:1000])
        wait_until(lambda: server.budget.available < 512 * 1024, 10, "the first body's budget taken")
        second.sendall(post("/filter", big))
        status, headers, body = read_response(second, bytearray())
        assert status == 503 and headers["retry-after"] == "1", body
        first.sendall(big[1000:])
        status, _, body = read_response(first, bytearray())
        assert status == 200 and orjson.loads(body)["NodeNames"] == ["p3-0"]
    wait_until(lambda: server.budget.available == limits.body_budget, 2, "the budget whole again")
    with connect(server) as third:
        third.sendall(post("/filter", big))
        assert read_response(third, bytearray())[0] == 200


def test_connections_beyond_the_cap_are_refused(serve: Callable[[Limits], ExtenderHttpServer]) -> None:
    server = serve(Limits(max_connections=4))
    with ExitStack() as stack:
        held = [stack.enter_context(connect(server)) for _ in range(4)]
        wait_until(lambda: len(server.connections) == 4, 2, "four connections served")
        with connect(server) as fifth:
            assert read_response(fifth, bytearray())[0] == 503
        held[0].close()
        wait_until(lambda: len(server.connections) == 3, 2, "one connection gone")
        probe = FilterProbe(server)
        probe.once()
        probe.close()


# -- watches -----------------------------------------------------------------------------------------------------------


def read_chunk(sock: socket.socket, buffer: bytearray) -> list[dict[str, object]]:
    """The events of one chunk of a chunked watch stream (the response head first, if still there)."""
    while True:
        if buffer.startswith(b"HTTP/1.1 "):
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                assert buffer.startswith(b"HTTP/1.1 200 ")
                del buffer[: end + 4]
                continue
        else:
            line_end = buffer.find(b"\r\n")
            if line_end >= 0:
                size = int(buffer[:line_end], 16)
                if len(buffer) >= line_end + 2 + size + 2:
                    chunk = bytes(buffer[line_end + 2 : line_end + 2 + size])
                    del buffer[: line_end + 2 + size + 2]
                    return [orjson.loads(line) for line in chunk.splitlines()]
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("the watch ended")
        buffer += data


def test_watchers_share_one_view_and_get_only_what_changed(
    serve: Callable[[Limits], ExtenderHttpServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 5 of issue 10: each watch re-described every node twice a second. Now five watchers cost one
    description per changed node, and each is sent just that node (and the pod that changed)."""
    server = serve(Limits())
    engine = server.server.engine
    described: list[str] = []
    describe = engine.describe
    monkeypatch.setattr(engine, "describe", lambda name: described.append(name) or describe(name))
    with ExitStack() as stack:
        nodes = [stack.enter_context(connect(server)) for _ in range(5)]
        pods = stack.enter_context(connect(server))
        buffers = [bytearray() for _ in range(6)]
        for sock in nodes:
            sock.sendall(b"GET /apis/kubegpu/v1/nodes?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
        pods.sendall(b"GET /apis/kubegpu/v1/pods?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
        for sock, buffer in zip(nodes, buffers, strict=False):
            assert len(read_chunk(sock, buffer)) == NODES  # every node ADDED, once
        assert len(described) == NODES  # described once for all five
        request = pod_request(POD)[0]
        with server.server.mirror.lock:
            assert engine.reserve(request, "p3-7").scheduled
        for sock, buffer in zip(nodes, buffers, strict=False):
            events = read_chunk(sock, buffer)
            assert [(e["type"], e["object"]["name"]) for e in events] == [("MODIFIED", "p3-7")]  # type: ignore[index]
        (event,) = read_chunk(pods, buffers[5])
        assert (event["type"], event["object"]["pod"]) == ("ADDED", "ns/p")  # type: ignore[index]
        assert described.count("p3-7") == 2 and len(described) == NODES + 1
        with server.server.mirror.lock:
            engine.release("ns/p")
        (event,) = read_chunk(pods, buffers[5])
        assert (event["type"], event["object"]["pod"]) == ("DELETED", "ns/p")  # type: ignore[index]
        for sock, buffer in zip(nodes, buffers, strict=False):
            events = read_chunk(sock, buffer)
            assert [(e["type"], e["object"]["name"]) for e in events] == [("MODIFIED", "p3-7")]  # type: ignore[index]
        assert len(described) == NODES + 2


PIPELINED = 12_000  # about 1.9 MB of answers: past both sockets' buffers once they are pinned small (below)


def test_a_long_pipeline_read_late_is_answered_whole_and_in_order(
    serve: Callable[[Limits], ExtenderHttpServer],
) -> None:
    """Pausing and resuming loses nothing: 12,000 pipelined requests, sent before the client reads any answer (so
    reading pauses, with requests left unparsed), are all answered, in order, once it reads."""
    server = serve(Limits())
    requests = [post("/filter", FILTER) if i % 3 else GET_HEALTH for i in range(PIPELINED)]
    # A small receive window, so the answers back up in the server whatever this machine's socket buffer sizes are
    # (loopback buffers of several MiB would otherwise take thousands of answers without the server ever pausing).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.settimeout(10)
    sock.connect(server.address)  # type: ignore[arg-type]
    with sock:
        # And a small send buffer on the server's side: left to the kernel, it is 3.9 MB on loopback here, which
        # takes every answer, so the server's writes never paused; reading paused only for moments (a full queue),
        # which the poll below caught alone but missed twice in whole-suite runs (30 s of waiting in vain).
        wait_until(lambda: bool(server.connections), 10, "the connection accepted")
        for connection in list(server.connections):
            assert connection.transport is not None
            connection.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
        sender = threading.Thread(target=sock.sendall, args=(b"".join(requests),), daemon=True)
        sender.start()
        wait_until(lambda: any(c.read_paused for c in server.connections), 30, "reading paused")
        buffer = bytearray()
        for i in range(PIPELINED):
            status, _, body = read_response(sock, buffer)
            assert status == 200
            assert ("NodeNames" in orjson.loads(body)) == bool(i % 3), i
        sender.join(10)


# -- while the extender still lists the cluster ------------------------------------------------------------------------


def test_a_body_held_while_the_lists_come_in_counts_against_the_budget(
    serve: Callable[[Limits], ExtenderHttpServer],
) -> None:
    """A verb asked while the extender lists the cluster keeps its body until the lists are in (up to LISTING_WAIT):
    that body stays in the shared budget, so clients asking together still hold no more than it. Before, the
    budget was given back as the verb started to wait, and 1024 connections could hold 1024 bodies of 32 MiB."""
    limits = Limits(max_body=768 * 1024, body_budget=1024 * 1024)
    server = serve(limits)
    start_listing(server)
    big = orjson.dumps({"Pod": POD, "NodeNames": ["p3-0", *(f"pad-{i:06d}" for i in range(50_000))]})
    assert 600 * 1024 < len(big) < 768 * 1024
    with connect(server) as first, connect(server) as second:
        first.sendall(post("/filter", big))
        wait_until(lambda: any(c.waiting is not None for c in server.connections), 5, "the first verb waiting")
        assert server.budget.available < limits.body_budget - 600 * 1024  # its body still counted
        second.sendall(post("/filter", big))
        status, headers, body = read_response(second, bytearray())
        assert status == 503 and headers["retry-after"] == "1", body
        assert read_response(first, bytearray())[0] == 200  # still listing, after the wait: answered as not ready
    wait_until(lambda: server.budget.available == limits.body_budget, 2, "the budget whole again")


def test_a_client_that_leaves_while_its_verb_waits_gives_its_body_back(
    serve: Callable[[Limits], ExtenderHttpServer],
) -> None:
    limits = Limits(max_body=768 * 1024, body_budget=1024 * 1024)
    server = serve(limits)
    start_listing(server)
    big = orjson.dumps({"Pod": POD, "NodeNames": ["p3-0", *(f"pad-{i:06d}" for i in range(50_000))]})
    with connect(server) as first:
        first.sendall(post("/filter", big))
        wait_until(lambda: any(c.waiting is not None for c in server.connections), 5, "the verb waiting")
    # Its leaving is noticed when the wait ends at the latest (reading pauses while an answer is under way).
    wait_until(lambda: not server.connections, LISTING_WAIT + 2, "the connection gone")
    assert server.budget.available == limits.body_budget


def test_an_extender_that_never_finishes_listing_costs_one_wait_not_one_per_pod(
    serve: Callable[[Limits], ExtenderHttpServer],
) -> None:
    """kube-scheduler asks about one pod at a time: if the lists never come (an informer refused its list), holding
    every verb for LISTING_WAIT would make every pod of the cluster wait behind each GPU pod's 2 s. The verbs asked
    while listing share one wait; once it has run out they are answered 'still listing' at once."""
    server = serve(SHORT)
    start_listing(server)[0].set()  # the survey is done; the first lists never arrive
    with connect(server) as sock:
        buffer = bytearray()
        started = time.monotonic()
        sock.sendall(post("/filter", FILTER))
        time.sleep(LISTING_WAIT / 2)
        with connect(server) as other:  # opened now: SHORT's header timeout runs from the connection's start
            other.sendall(post("/prioritize", FILTER))  # asked halfway through the first one's wait: answered with it
            status, _, body = read_response(other, bytearray())
        assert (status, body) == (200, b"[]") and time.monotonic() - started < LISTING_WAIT + 0.5, body
        status, _, body = read_response(sock, buffer)
        assert status == 200 and b"still listing the cluster" in body, body
        for verb, request, answer in (
            ("/filter", FILTER, b"still listing the cluster"),
            ("/prioritize", FILTER, b"[]"),  # no scores: kube-scheduler goes on with its own
            ("/preempt", FILTER, b'{"NodeNameToMetaVictims":{}}'),  # no node offered
            ("/bind", BIND, b"still listing the cluster"),
        ):
            started = time.monotonic()
            sock.sendall(post(verb, request))
            status, _, body = read_response(sock, buffer)
            assert time.monotonic() - started < 0.5, verb
            assert status == 200 and answer in body, body


BIND = orjson.dumps({"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "p3-0"})
