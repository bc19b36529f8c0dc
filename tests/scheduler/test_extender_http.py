"""The extender's HTTP/1.1 server at the byte level: keep-alive, pipelining, chunked bodies, `Expect: 100-continue`,
HTTP/1.0, and requests it cannot read. Each bad request gets its 4xx with a JSON message and the server keeps serving
everyone else. (tests/integration/test_extender.py drives it with the real kube-scheduler.)"""

from __future__ import annotations

import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, pod_manifest
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.custom import SchedulerService
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.extender import MAX_BODY, ExtenderServer, HttpServer, tls_context

from .test_properties import NODE_KINDS

POD = pod_manifest("p", {"main": {"nvidia.com/gpu": 2}}, namespace="ns")
FILTER = orjson.dumps({"Pod": POD, "NodeNames": ["p3-0", "p3-1"]})


@pytest.fixture
def server() -> Iterator[HttpServer]:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    for i in range(2):
        engine.add_node(make_node(f"p3-{i}", **NODE_KINDS["p3"]))
    service = SchedulerService(None, None, engine, name="", key=b"k" * 32, queue_pods=False)  # type: ignore[arg-type]
    http = HttpServer(ExtenderServer(service), "127.0.0.1:0", None)
    yield http
    http.shutdown()


def connect(server: HttpServer) -> socket.socket:
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


def test_keep_alive_and_pipelined_requests_are_answered_in_order(server: HttpServer) -> None:
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


def test_a_chunked_body_and_expect_continue_are_understood(server: HttpServer) -> None:
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


def test_http_1_0_gets_its_answer_and_the_connection_closes(server: HttpServer) -> None:
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
        (f"POST /filter HTTP/1.1\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n".encode(), 413, "limit"),
        (b"PUT /filter HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405, "not allowed"),
        (b"POST /sort HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 404, "unknown verb 'sort'"),
        (b"GET /nothing/here HTTP/1.1\r\n\r\n", 404, "unknown path"),
        (post("/filter", b"{not json"), 400, "not valid JSON"),
        (post("/prioritize", b'{"Pod": 3}'), 400, "Pod"),
    ],
)
def test_requests_it_cannot_serve_get_a_json_4xx_and_the_server_goes_on(
    server: HttpServer, request_bytes: bytes, status: int, words: str
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


def test_an_unreadable_request_closes_only_its_own_connection(server: HttpServer) -> None:
    with connect(server) as good, connect(server) as bad:
        bad.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n")
        assert read_response(bad, bytearray())[0] == 400
        assert closed(bad)
        good.sendall(post("/filter", FILTER))
        assert read_response(good, bytearray())[0] == 200


def test_the_watch_streams_chunks_and_ends_when_the_client_leaves(server: HttpServer) -> None:
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


def test_readiness_waits_for_the_informers_and_health_for_the_consumer(server: HttpServer) -> None:
    service = server.server.service
    with connect(server) as sock:
        buffer = bytearray()
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock, buffer)[0] == 503  # nothing listed yet
        service.nodes_synced.set()
        service.pods_synced.set()
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock, buffer)[0] == 200
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock, buffer)[0] == 200
        service.heartbeat -= 60  # the loop that consumes informer events has not beaten for a minute
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock, buffer)[0] == 503


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def tls_request(address: tuple[str, int], ca: Path, cert: Path | None = None, key: Path | None = None) -> int | None:
    """The status of GET /healthz over TLS, or None when the server refused the connection."""
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert), str(key))
    try:
        with (
            socket.create_connection(address, timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
        ):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            return read_response(sock, bytearray())[0]
    except (ssl.SSLError, ConnectionError):
        return None


def test_https_with_client_certificates_serves_only_clients_signed_by_the_ca(
    server: HttpServer, tmp_path: Path
) -> None:
    day = ("-days", "1", "-nodes")
    openssl("req", "-x509", "-newkey", "rsa:2048", *day, "-keyout", str(tmp_path / "tls.key"), "-out",
            str(tmp_path / "tls.crt"), "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1")  # fmt: skip
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", *day, "-keyout", str(tmp_path / f"{ca}.key"), "-out",
                str(tmp_path / f"{ca}.crt"), "-subj", f"/CN={ca}")  # fmt: skip
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_path / f"client-{ca}.key"), "-out",
                str(tmp_path / f"client-{ca}.csr"), "-subj", "/CN=kube-scheduler")  # fmt: skip
        openssl("x509", "-req", "-in", str(tmp_path / f"client-{ca}.csr"), "-CA", str(tmp_path / f"{ca}.crt"),
                "-CAkey", str(tmp_path / f"{ca}.key"), "-CAcreateserial", "-days", "1", "-out",
                str(tmp_path / f"client-{ca}.crt"))  # fmt: skip
    context = tls_context(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), str(tmp_path / "ca.crt"))
    https = HttpServer(server.server, "127.0.0.1:0", context)
    try:
        address, ca = https.address, tmp_path / "tls.crt"
        signed = (tmp_path / "client-ca.crt", tmp_path / "client-ca.key")
        foreign = (tmp_path / "client-other-ca.crt", tmp_path / "client-other-ca.key")
        assert tls_request(address, ca, *signed) == 200  # type: ignore[arg-type]
        assert tls_request(address, ca) is None  # no client certificate
        assert tls_request(address, ca, *foreign) is None  # signed by another CA
        assert tls_request(address, ca, *signed) == 200  # type: ignore[arg-type]  # and it goes on serving
    finally:
        https.shutdown()
