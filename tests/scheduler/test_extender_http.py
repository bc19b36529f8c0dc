"""The extender's HTTP/1.1 server at the byte level: keep-alive, pipelining, chunked bodies, `Expect: 100-continue`,
HTTP/1.0, and requests it cannot read. Each bad request gets its 4xx with a JSON message and the server keeps serving
everyone else. (tests/integration/test_extender.py drives it with the real kube-scheduler.)"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, pod_manifest
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.extender import LISTING_WAIT, ExtenderHttpServer, ExtenderServer
from kubegpu.scheduler.http_server import Limits, tls_context

from .test_properties import NODE_KINDS

POD = pod_manifest("p", {"main": {"nvidia.com/gpu": 2}}, namespace="ns")
FILTER = orjson.dumps({"Pod": POD, "NodeNames": ["p3-0", "p3-1"]})


@pytest.fixture
def server() -> Iterator[ExtenderHttpServer]:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    for i in range(2):
        engine.add_node(make_node(f"p3-{i}", **NODE_KINDS["p3"]))
    http = ExtenderHttpServer(ExtenderServer(engine, None, None), "127.0.0.1:0", None)  # type: ignore[arg-type]
    yield http
    http.shutdown()


def connect(server: ExtenderHttpServer) -> socket.socket:
    return socket.create_connection(server.address, timeout=5)  # type: ignore[arg-type]


def read_response(sock: socket.socket, buffer: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One response from the stream (Content-Length bodies); what follows stays in `buffer`."""
    while b"\r\n\r\n" not in buffer:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError(f"closed before a whole response; got {bytes(buffer)!r}")
        buffer += data
    head, _, _ = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    start = len(head) + 4
    while len(buffer) < start + length:
        buffer += sock.recv(65536)
    body = bytes(buffer[start : start + length])
    del buffer[: start + length]
    return status, headers, body


def post(path: str, body: bytes, *extra: str) -> bytes:
    headers = "".join(f"{h}\r\n" for h in extra)
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{headers}\r\n".encode() + body


def closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_keep_alive_and_pipelined_requests_are_answered_in_order(server: ExtenderHttpServer) -> None:
    with connect(server) as sock:
        buffer = bytearray()
        # Three requests in one write: filter, a health check, prioritize.
        sock.sendall(
            post("/filter", FILTER) + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + post("/prioritize", FILTER)
        )
        status, headers, body = read_response(sock, buffer)
        assert status == 200 and headers["content-type"] == "application/json"
        assert orjson.loads(body)["NodeNames"] == ["p3-0", "p3-1"]
        assert read_response(sock, buffer)[:1] == (200,)
        assert isinstance(orjson.loads(read_response(sock, buffer)[2]), list)
        # The same connection serves the next request too.
        sock.sendall(post("/filter", FILTER))
        assert read_response(sock, buffer)[0] == 200


def test_a_chunked_body_and_expect_continue_are_understood(server: ExtenderHttpServer) -> None:
    with connect(server) as sock:
        buffer = bytearray()
        half = len(FILTER) // 2
        chunked = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, FILTER[:half], len(FILTER) - half, FILTER[half:])
        sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
        status, _, body = read_response(sock, buffer)
        assert status == 200 and orjson.loads(body)["NodeNames"] == ["p3-0", "p3-1"]
        sock.sendall(f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {len(FILTER)}\r\n".encode())
        sock.sendall(b"Expect: 100-continue\r\n\r\n")
        assert read_response(sock, buffer)[0] == 100  # the client may now send the body
        sock.sendall(FILTER)
        assert read_response(sock, buffer)[0] == 200


def test_http_1_0_gets_its_answer_and_the_connection_closes(server: ExtenderHttpServer) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        status, headers, body = read_response(sock, bytearray())
        assert (status, orjson.loads(body)) == (200, {"status": "ok"})
        assert headers["connection"] == "close"
        assert closed(sock)


@pytest.mark.parametrize(
    ("request_bytes", "status", "words"),
    [
        (b"NONSENSE\r\n\r\n", 400, "malformed HTTP request"),
        (b"POST /filter HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400, "malformed HTTP request"),
        (f"POST /filter HTTP/1.1\r\nContent-Length: {Limits.max_body + 1}\r\n\r\n".encode(), 413, "limit"),
        (b"PUT /filter HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405, "not allowed"),
        (b"POST /sort HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 404, "unknown verb 'sort'"),
        (b"GET /nothing/here HTTP/1.1\r\n\r\n", 404, "unknown path"),
        (post("/filter", b"{not json"), 400, "not valid JSON"),
        (post("/prioritize", b'{"Pod": 3}'), 400, "Pod"),
    ],
)
def test_requests_it_cannot_serve_get_a_json_4xx_and_the_server_goes_on(
    server: ExtenderHttpServer, request_bytes: bytes, status: int, words: str
) -> None:
    with connect(server) as sock:
        sock.sendall(request_bytes)
        got, headers, body = read_response(sock, bytearray())
        assert got == status
        assert headers["content-type"] == "application/json"
        assert words in orjson.loads(body)["error"]
    with connect(server) as sock:  # everyone else is still served
        sock.sendall(post("/filter", FILTER))
        assert read_response(sock, bytearray())[0] == 200


def test_an_unreadable_request_closes_only_its_own_connection(server: ExtenderHttpServer) -> None:
    with connect(server) as good, connect(server) as bad:
        bad.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n")
        assert read_response(bad, bytearray())[0] == 400
        assert closed(bad)
        good.sendall(post("/filter", FILTER))
        assert read_response(good, bytearray())[0] == 200


def test_the_watch_streams_chunks_and_ends_when_the_client_leaves(server: ExtenderHttpServer) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /apis/kubegpu/v1/nodes?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
        buffer = bytearray()
        while b"\r\n\r\n" not in buffer:
            buffer += sock.recv(65536)
        head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
        assert b"200 OK" in head and b"Transfer-Encoding: chunked" in head
        while rest.count(b"\r\n") < 2:
            rest += sock.recv(65536)
        size, _, chunk = rest.partition(b"\r\n")
        lines = [orjson.loads(line) for line in chunk[: int(size, 16)].splitlines()]
        assert {(e["type"], e["object"]["name"]) for e in lines} == {("ADDED", "p3-0"), ("ADDED", "p3-1")}
    # The client left; its watch is gone with it and the server still answers.
    deadline = time.monotonic() + 5
    while server.connections and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not server.connections
    with connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock, bytearray())[0] == 200


def test_readiness_waits_for_the_informers_and_health_for_the_consumer(server: ExtenderHttpServer) -> None:
    mirror = server.server.mirror
    with connect(server) as sock:
        buffer = bytearray()
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock, buffer)[0] == 503  # nothing listed yet
        mirror.nodes_synced.set()
        mirror.namespaces_synced.set()
        mirror.pods_synced.set()
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock, buffer)[0] == 503  # a gang member is answered once its PodGroup is known
        mirror.podgroups_synced.set()
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock, buffer)[0] == 503  # `/preempt` answers once the budgets are known
        mirror.budgets_synced.set()
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock, buffer)[0] == 200
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock, buffer)[0] == 200
        mirror.heartbeat -= 60  # the loop that consumes informer events has not beaten for a minute
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock, buffer)[0] == 503


def start_listing(server: ExtenderHttpServer) -> list[threading.Event]:
    """The mirror as `start_informers` leaves it: the survey and every first list still to come."""
    mirror = server.server.mirror
    mirror.surveyed = threading.Event()
    return [
        mirror.surveyed,
        mirror.nodes_synced,
        mirror.pods_synced,
        mirror.namespaces_synced,
        mirror.podgroups_synced,
        mirror.budgets_synced,
    ]


def test_a_verb_asked_while_the_lists_come_in_is_answered_once_they_are(server: ExtenderHttpServer) -> None:
    """kube-scheduler parks a pod its extender answered with an error among the unschedulable ones for a minute
    (1.20) or more: a starting extender holds the question until its first lists are in, not answering 'try again'."""
    events = start_listing(server)
    with connect(server) as sock, connect(server) as probe:
        buffer = bytearray()
        sock.sendall(post("/filter", FILTER))
        time.sleep(0.3)
        probe.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")  # the server goes on answering others meanwhile
        assert read_response(probe, bytearray())[0] == 503
        for event in events:
            event.set()
        status, _, body = read_response(sock, buffer)
    answer = orjson.loads(body)
    assert status == 200 and answer["Error"] == "" and answer["NodeNames"] == ["p3-0", "p3-1"], answer


def test_a_verb_is_answered_not_ready_when_the_lists_take_longer_than_the_wait(server: ExtenderHttpServer) -> None:
    start_listing(server)[0].set()  # the survey is done; nodes, pods, PodGroups and budgets never arrive
    with connect(server) as sock:
        started = time.monotonic()
        sock.sendall(post("/filter", FILTER))
        status, _, body = read_response(sock, bytearray())
        waited = time.monotonic() - started
    assert status == 200 and "still listing the cluster (nodes, pods" in orjson.loads(body)["Error"], body
    assert LISTING_WAIT <= waited < LISTING_WAIT + 2, waited  # under kube-scheduler's 5 s extender timeout


MAKE_CERTS = Path(__file__).parents[2] / "examples" / "deploy" / "extender" / "make-certs.sh"


def make_certs(directory: Path) -> Path:
    """The shipped script's CA, serving certificate (for 127.0.0.1) and kube-scheduler client certificate."""
    subprocess.run(["sh", str(MAKE_CERTS), str(directory), "127.0.0.1"], check=True, capture_output=True)
    return directory


def tls_request(
    address: tuple[str, int], ca: Path, client: tuple[Path, Path] | None = None, request: bytes = b""
) -> int | None:
    """The status of `request` (GET /healthz) over TLS, or None when the server refused the connection."""
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(str(client[0]), str(client[1]))
    try:
        with (
            socket.create_connection(address, timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
        ):
            sock.sendall(request or b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            return read_response(sock, bytearray())[0]
    except (ssl.SSLError, ConnectionError):
        return None


BIND = post("/bind", orjson.dumps({"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "p3-0"}))
PODS = b"GET /apis/kubegpu/v1/pods HTTP/1.1\r\nHost: x\r\n\r\n"
WATCH = b"GET /apis/kubegpu/v1/nodes?watch=true HTTP/1.1\r\nHost: x\r\n\r\n"


def test_with_a_client_ca_only_the_probes_answer_a_client_without_a_certificate(
    server: ExtenderHttpServer, tmp_path: Path
) -> None:
    """Finding 3 of issue 10: anyone who reached the port could bind any pending pod to any node and list every
    namespace's pods. With --client-ca, binding, filtering and the monitoring API need a certificate that CA signed;
    the kubelet's probes (no certificate) still get /healthz and /readyz; a certificate from another CA fails the
    handshake; and the server goes on serving."""
    ours, theirs = make_certs(tmp_path / "ours"), make_certs(tmp_path / "theirs")
    context = tls_context(str(ours / "tls.crt"), str(ours / "tls.key"), str(ours / "ca.crt"))
    https = ExtenderHttpServer(server.server, "127.0.0.1:0", context)
    try:
        address, ca = https.address, ours / "ca.crt"
        scheduler = (ours / "client.crt", ours / "client.key")
        stranger = (theirs / "client.crt", theirs / "client.key")
        for request in (BIND, post("/filter", FILTER), PODS, WATCH):
            assert tls_request(address, ca, None, request) == 401, request  # no client certificate
            assert tls_request(address, ca, stranger, request) is None, request  # signed by another CA
        assert tls_request(address, ca) == 200  # the probes need no certificate
        assert tls_request(address, ca, None, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n") == 503
        # The extender's own serving certificate is no client certificate (serverAuth only).
        assert tls_request(address, ca, (ours / "tls.crt", ours / "tls.key"), PODS) is None
        assert tls_request(address, ca, scheduler, post("/filter", FILTER)) == 200
        assert tls_request(address, ca, scheduler, PODS) == 200
        assert tls_request(address, ca, scheduler, BIND) not in (None, 401)  # let in (no API server here to bind)
    finally:
        https.shutdown()


def test_without_a_client_ca_nothing_is_asked(server: ExtenderHttpServer) -> None:
    """--insecure-no-client-auth: plain HTTP, every path open (the operator chose it; the server warns at start)."""
    with connect(server) as sock:
        sock.sendall(PODS)
        assert read_response(sock, bytearray())[0] == 200


def test_the_extender_refuses_to_start_without_client_authentication(tmp_path: Path) -> None:
    """Without --client-ca the operator must say --insecure-no-client-auth; otherwise nothing is served."""
    for tls in ([], ["--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key")]):
        result = subprocess.run(
            [sys.executable, "-m", "kubegpu", "extender", "--listen", "127.0.0.1:0", "--allocation-key-file",
             str(tmp_path / "key"), *tls],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode != 0
        assert "refusing to serve without client authentication" in result.stderr, result.stderr
        assert "--insecure-no-client-auth" in result.stderr
