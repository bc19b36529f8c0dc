"""kubegpu's HTTP/1.1 server: httptools (llhttp, in C) on an asyncio event loop, every resource a client can hold
bounded. It carries the extender's verbs and monitoring API, and both live front-ends' `/metrics`, `/healthz` and
`/readyz` (`health.py`).

kube-scheduler waits for filter and prioritize before it moves on to the next pod, so the server hands a completed
request straight to its `answer` function, on the event loop, with no task or framework in between; only answers
that wait (a bind's API write, a watch stream) become tasks. Because one event loop serves every connection, no
client may make it wait for long or hold memory without bound:

* the request line and headers are limited in size and count (431; 414 for a long request target), and must arrive
  within `header_timeout` of the first byte (a slowloris client is closed with 408); a body must arrive within
  `body_timeout`; a connection idle between requests is closed after `idle_timeout`;
* a body is limited per request (413) and all bodies being read or waiting for their answer (an answer that waits
  included) share one budget across connections (503 past it), so many clients cannot add up to more memory than
  one is allowed;
* a connection whose client does not read its answers (the transport's buffer passed its high-water mark) stops
  being read, and answers to what it already sent wait too; a client pipelining requests gets at most `max_queued`
  read ahead, and a batch of answers at a time, so other connections keep their turn on the loop;
* at most `max_connections` connections are served at once (503 to the next); a TLS handshake must end within
  `header_timeout`.

Authentication is TLS's: with a client CA the server asks every client for a certificate, and the identity of a
verified one (its subject's CN) reaches `answer`; which paths need one is the caller's decision.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

import httptools
import orjson

from kubegpu.kube.client import new_event_loop

__all__ = ["Answer", "HttpServer", "Limits", "Text", "Waiting", "tls_context"]

log = logging.getLogger("kubegpu.http")

Waiting = Coroutine[Any, Any, tuple[int, Any]] | AsyncGenerator[bytes, None]  # an answer that is not ready at once
Answer = tuple[int, Any] | Waiting
# method, request target, body, the client's verified identity (None: no client certificate) -> the answer
Handler = Callable[[bytes, bytes, bytes, str | None], Answer]

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True, slots=True)
class Text:
    """A document that is not JSON (an answer's document is encoded with orjson otherwise): Prometheus' exposition
    format, for one."""

    body: bytes
    content_type: bytes = b"text/plain; charset=utf-8"


@dataclass(frozen=True)
class Limits:
    """What one client, and all of them together, may hold of the server.

    The body limit: with `nodeCacheCapable: true` (the shipped configuration) kube-scheduler sends node names, about
    150 KiB for 5000 nodes. Without it, ExtenderArgs carries every feasible Node object: 4-15 KiB each (the kubelet
    reports up to 50 images), and kube-scheduler 1.20 passes on about max(100, 5000 / 10) nodes by default at 5000
    (percentageOfNodesToScore), 7.5 MiB at most; 32 MiB still holds 2000 nodes of 15 KiB, or all 5000 at 6 KiB.
    The budget lets four such bodies be read at once; kube-scheduler sends one at a time.
    """

    max_head: int = 16 * KiB  # request line and headers together, in bytes (431)
    max_headers: int = 100  # header fields (431)
    max_target: int = 8 * KiB  # the request target, in bytes (414)
    max_body: int = 32 * MiB  # one request's body (413)
    body_budget: int = 128 * MiB  # all bodies being read or waiting for their answer, across connections (503)
    max_connections: int = 1024  # connections served at once (503 to the next one)
    max_queued: int = 32  # pipelined requests read ahead of their answers before reading pauses
    batch: int = 4  # pipelined answers per turn of the loop before the other connections get theirs
    header_timeout: float = 10.0  # seconds from a request's first byte (or the connection's start) to its last header
    body_timeout: float = 60.0  # seconds from the last header to the end of the body
    idle_timeout: float = 60.0  # seconds a connection may wait between requests, or leave its answers unread
    write_high_water: int = 256 * KiB  # unsent answer bytes above which the connection is no longer read
    watch_backlog: int = 8 * MiB  # unsent watch bytes above which a watcher is dropped (it must list again)


class _Budget:
    """Bytes of request bodies held at once, across all connections."""

    def __init__(self, total: int) -> None:
        self.available = total

    def take(self, size: int) -> bool:
        if size > self.available:
            return False
        self.available -= size
        return True

    def give(self, size: int) -> None:
        self.available += size


class _Refused(Exception):
    """Raised inside a parser callback after the request was answered with its 4xx, to stop parsing the rest."""


class HttpServer:
    """Listen on `listen` (HOST:PORT; port 0 picks one, see `address`) and serve `handler`'s answers.

    Given an event loop (the API writer's, as `kubegpu extender` runs it), the server runs on it, so a bind's API
    write needs no hand-over between threads; else it starts its own loop thread."""

    def __init__(
        self,
        handler: Handler,
        listen: str,
        tls: ssl.SSLContext | None,
        loop: asyncio.AbstractEventLoop | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.handler = handler
        self.limits = limits or Limits()
        self.budget = _Budget(self.limits.body_budget)
        self.connections: set[_Connection] = set()
        self.refused_connections = 0
        self._last_refusal_log = 0.0
        # Deadlines are checked by one sweep for all connections: a request costs no timer of its own.
        timeouts = (self.limits.header_timeout, self.limits.body_timeout, self.limits.idle_timeout)
        self.sweep_interval = min(1.0, max(0.05, min(timeouts) / 8))
        self._sweeper: asyncio.TimerHandle | None = None
        host, _, port = listen.rpartition(":")
        self.own_loop = loop is None
        self.loop = loop or new_event_loop()
        if self.own_loop:
            threading.Thread(target=self.loop.run_forever, name="http", daemon=True).start()
        options: dict[str, Any] = {"ssl": tls}
        if tls is not None:
            options["ssl_handshake_timeout"] = self.limits.header_timeout
        self.listener = asyncio.run_coroutine_threadsafe(
            self.loop.create_server(lambda: _Connection(self), host or "0.0.0.0", int(port), **options), self.loop
        ).result()
        self.address = tuple(self.listener.sockets[0].getsockname()[:2])  # the bound port, for a --listen of port 0
        self.loop.call_soon_threadsafe(self._sweep)

    def _sweep(self) -> None:
        now = self.loop.time()
        for connection in [c for c in self.connections if c.deadline is not None and c.deadline <= now]:
            connection.expired()
        self._sweeper = self.loop.call_later(self.sweep_interval, self._sweep)

    def admit(self, connection: _Connection) -> bool:
        if len(self.connections) >= self.limits.max_connections:
            self.refused_connections += 1
            now = time.monotonic()
            if now - self._last_refusal_log > 10:
                self._last_refusal_log = now
                log.warning(
                    "connection refused: %d connections are open (the limit); %d refused so far",
                    len(self.connections),
                    self.refused_connections,
                )
            return False
        self.connections.add(connection)
        return True

    def shutdown(self) -> None:
        async def close() -> None:
            if self._sweeper is not None:
                self._sweeper.cancel()
            self.listener.close()
            for connection in list(self.connections):
                connection.close()
            await self.listener.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=10)
        if self.own_loop:
            self.loop.call_soon_threadsafe(self.loop.stop)


# A connection is in one of these phases; the deadline that runs depends on it.
_HEAD, _BODY, _BETWEEN = "head", "body", "between"
SLICE = 4 * KiB  # received bytes are parsed this much at a time, so that parsing can stop between requests


class _Connection(asyncio.Protocol):
    """One client connection. Requests are answered in order: while an answer waits (bind), reading pauses, and a
    request that arrived with the previous one waits its turn. A request the server cannot read (malformed HTTP,
    over a limit) gets its 4xx and the connection is closed; nothing else is affected.

    Received bytes are parsed a slice at a time and each completed request answered right after the slice that
    completed it. Parsing stops while `max_queued` requests wait for their answers, or when this connection has had
    its batch of answers for this turn of the loop; the rest waits in `pending` (one read at most), with reading
    paused, and is parsed once the answers catch up."""

    def __init__(self, http: HttpServer) -> None:
        self.http = http
        self.limits = http.limits
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.identity: str | None = None
        self.phase = _HEAD
        self.deadline: float | None = None  # when the server closes the connection, unless something happens
        self.expiry: str | None = None  # the 408's message at the deadline; None: close without an answer
        self.pending = b""  # received, not parsed yet
        self.feeding = False
        # the request being read
        self.target = b""
        self.head_size = 0
        self.headers = 0
        self.progress = 0  # parser callbacks so far: a slice that makes none is part of an unfinished header
        self.unseen = 0  # bytes fed since the last progress (httptools buffers an unfinished header field)
        self.length: int | None = None
        self.expect_continue = False
        self.body: list[bytes] = []
        self.size = 0
        self.reserved = 0  # of the body budget, for the request being read
        # the requests read and not yet answered: method, target, body, keep-alive, budget reserved
        self.queue: deque[tuple[bytes, bytes, bytes, bool, int]] = deque()
        self.waiting: asyncio.Task[None] | None = None
        self.held = 0  # of the body budget, for the answer `waiting` is for
        self.watching = False
        self.write_paused = False
        self.read_paused = False
        self.scheduled = False  # this connection's next batch of answers is on the loop's ready queue
        self.closing = False

    # -- the transport ---------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports are not registered as asyncio's
        self.transport = transport
        if not self.http.admit(self):
            self.closing = True
            transport.write(_head(503, b"Connection: close\r\n", b'{"error":"too many connections; retry later"}'))
            transport.close()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms Nagle wait on small answers
        transport.set_write_buffer_limits(high=self.limits.write_high_water)
        self.identity = _identity(transport.get_extra_info("peercert"))
        self._arm(self.limits.header_timeout, "the request headers did not arrive in time")

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if self.watching:
            # A watch never ends by itself, so nothing sent after it can be answered.
            self.close()
            return
        self.pending = self.pending + data if self.pending else data
        self._feed(self.limits.batch)

    def pause_writing(self) -> None:
        """The client is not reading its answers: stop reading its requests until it does."""
        self.write_paused = True
        self._update_reading()
        self._idle()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.phase == _BETWEEN:
            self._disarm()
        self._proceed()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.closing = True
        self._disarm()
        if self.waiting is not None:
            self.waiting.cancel()
        self.http.connections.discard(self)
        self.http.budget.give(self.reserved + self.held + sum(entry[4] for entry in self.queue))
        self.reserved = self.held = 0
        self.queue.clear()
        self.pending = b""

    def close(self) -> None:
        """Close after the answers already written, or at once when the client is not reading them."""
        self.closing = True
        if self.transport is None:
            return
        if self.write_paused:
            self.transport.abort()
            return
        self.transport.close()
        # A client that stops reading now would hold the connection open: a deadline for the last answer too.
        self._arm(self.limits.header_timeout, None)

    def expired(self) -> None:
        """The deadline passed (the server's sweep calls this)."""
        self.deadline = None
        if self.closing:
            if self.transport is not None:
                self.transport.abort()
        elif self.expiry is None:
            self.close()
        else:
            self._refuse(408, self.expiry)

    def _update_reading(self) -> None:
        if self.transport is None or self.closing:
            return
        pause = self.write_paused or bool(self.pending) or (self.waiting is not None and not self.watching)
        pause = pause or len(self.queue) >= self.limits.max_queued
        if pause != self.read_paused:
            self.read_paused = pause
            if pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def _idle(self) -> None:
        """Between requests, with no answer under way, the connection has `idle_timeout` to send the next one (or
        to read the answers it left unread)."""
        if self.closing or self.phase != _BETWEEN or self.waiting is not None:
            return
        if self.write_paused or not (self.queue or self.pending):
            self._arm(self.limits.idle_timeout, None)

    def _arm(self, seconds: float, expiry: str | None) -> None:
        self.deadline = self.http.loop.time() + seconds
        self.expiry = expiry

    def _disarm(self) -> None:
        self.deadline = None

    # -- parsing -----------------------------------------------------------------------------------------------------

    def _feed(self, allowance: int) -> None:
        """Parse `pending` and answer what completes, up to `allowance` answers in this turn of the loop."""
        if self.feeding:  # called back from inside the parser: the outer call goes on
            return
        self.feeding = True
        data, offset = self.pending, 0
        try:
            while offset < len(data) and not self.closing and not self.scheduled:
                if len(self.queue) >= self.limits.max_queued:
                    break
                piece = data[offset : offset + SLICE]
                offset += len(piece)
                progress = self.progress
                try:
                    self.parser.feed_data(piece)
                except httptools.HttpParserUpgrade:
                    self._refuse(400, "protocol upgrades are not supported")
                    return
                except httptools.HttpParserError as exc:
                    if not isinstance(exc.__context__, _Refused):
                        self._refuse(400, f"malformed HTTP request: {exc}")
                    return
                if self.phase == _HEAD and self.progress == progress:
                    # Nothing completed in this slice: httptools holds it as part of a header it has not finished.
                    self.unseen += len(piece)
                    if self.unseen > self.limits.max_head:
                        self._refuse(431, f"the request headers are over the limit of {self.limits.max_head} bytes")
                        return
                else:
                    self.unseen = 0
                allowance = self._next(allowance)
        finally:
            self.feeding = False
            self.pending = data[offset:] if offset < len(data) and not self.closing else b""
        self._update_reading()
        self._idle()

    # -- the parser's callbacks (httptools calls these while feed_data runs) ----------------------------------------

    def on_message_begin(self) -> None:
        if self.closing:  # pipelined after a request that closes the connection
            raise _Refused
        if self.phase != _HEAD:  # the connection's first request keeps the deadline set when it was made
            self.phase = _HEAD
            self._arm(self.limits.header_timeout, "the request headers did not arrive in time")
        self.target, self.head_size, self.headers, self.unseen = b"", 0, 0, 0
        self.length, self.expect_continue, self.body, self.size = None, False, [], 0

    def on_url(self, url: bytes) -> None:
        self.progress += 1
        self.target += url
        if len(self.target) > self.limits.max_target:
            self._refuse(414, f"the request target is over the limit of {self.limits.max_target} bytes")
            raise _Refused

    def on_header(self, name: bytes, value: bytes) -> None:
        self.progress += 1
        self.headers += 1
        self.head_size += len(name) + len(value) + 4
        if self.headers > self.limits.max_headers:
            self._refuse(431, f"the request has over {self.limits.max_headers} header fields")
            raise _Refused
        if self.head_size + len(self.target) > self.limits.max_head:
            self._refuse(431, f"the request headers are over the limit of {self.limits.max_head} bytes")
            raise _Refused
        lowered = name.lower()
        if lowered == b"content-length" and value.strip().isdigit():
            self.length = int(value)
            if self.length > self.limits.max_body:
                self._refuse(413, f"the body is {self.length} bytes; the limit is {self.limits.max_body}")
                raise _Refused
        elif lowered == b"expect" and value.strip().lower() == b"100-continue":
            self.expect_continue = True

    def on_headers_complete(self) -> None:
        self.phase = _BODY
        self.progress += 1
        self._arm(self.limits.body_timeout, "the request body did not arrive in time")
        if self.length and not self._reserve(self.length):
            raise _Refused
        if self.expect_continue and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limits.max_body:
            self._refuse(413, f"the body is over the limit of {self.limits.max_body} bytes")
            raise _Refused
        if self.size > self.reserved and not self._reserve(max(self.size - self.reserved, 64 * KiB)):
            raise _Refused  # a chunked body, taken from the budget as it comes
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        self.phase = _BETWEEN
        self._disarm()
        method = self.parser.get_method()
        self.queue.append((method, self.target, b"".join(self.body), self.parser.should_keep_alive(), self.reserved))
        self.body, self.reserved = [], 0

    def _reserve(self, size: int) -> bool:
        if self.http.budget.take(size):
            self.reserved += size
            return True
        self._refuse(503, "the server is reading too many request bodies at once; retry later", retry=True)
        return False

    # -- answers ---------------------------------------------------------------------------------------------------

    def _continue(self) -> None:
        self.scheduled = False
        self._proceed()

    def _proceed(self) -> None:
        """Answer what waits, then parse what was left unparsed, as far as this turn allows."""
        allowance = self._next(self.limits.batch)
        if not self.scheduled and self.pending:
            self._feed(allowance)
        self._update_reading()

    def _next(self, allowance: int) -> int:
        """Answer the requests read so far, at most `allowance` of them in this turn of the loop, while the client
        reads its answers. Returns the allowance left."""
        if self.scheduled:
            return 0
        while self.queue and self.waiting is None and not self.write_paused and not self.closing:
            if allowance <= 0:  # let the other connections have their turn, then go on
                self.scheduled = True
                self.http.loop.call_soon(self._continue)
                return 0
            method, target, body, keep_alive, reserved = self.queue.popleft()
            try:
                answer = self.http.handler(method, target, body, self.identity)
            except Exception as exc:  # a handler's bug costs this request a 500, never the server
                log.exception("answering %s %r failed", method.decode(errors="replace"), target[:200])
                answer = 500, {"error": f"internal error: {type(exc).__name__}"}
            allowance -= 1
            if isinstance(answer, tuple):
                self.http.budget.give(reserved)
                try:
                    self._respond(*answer, keep_alive=keep_alive)
                except ConnectionResetError:  # the client went away: nothing more to answer
                    self.close()
                    return 0
            else:
                # An answer that waits keeps its body (a verb held for the extender's first lists, a bind) until it
                # is answered, and so its share of the budget.
                self.held = reserved
                self._disarm()
                self.watching = isinstance(answer, AsyncGenerator)
                self.waiting = self.http.loop.create_task(self._wait(answer, keep_alive))
                self._update_reading()
        self._idle()
        return allowance

    async def _wait(self, answer: Waiting, keep_alive: bool) -> None:
        try:
            if isinstance(answer, AsyncGenerator):
                # A watch streams until the client leaves; reading goes on so that its leaving is noticed.
                self._send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                try:
                    async for data in answer:
                        if self.transport is not None and (
                            self.transport.get_write_buffer_size() > self.limits.watch_backlog
                        ):
                            log.warning("a watcher is not reading its stream; dropped")
                            self.close()
                            return
                        self._send(b"%x\r\n%s\r\n" % (len(data), data))
                    self._send(b"0\r\n\r\n")
                finally:
                    await answer.aclose()
            else:
                status, document = await answer
                self._respond(status, document, keep_alive=keep_alive)
        except ConnectionResetError:
            return  # the client went away; nothing is left to answer
        finally:
            self.http.budget.give(self.held)
            self.held = 0
        self.waiting = None
        self.watching = False
        self._proceed()

    def _respond(self, status: int, document: Any, *, keep_alive: bool, extra: bytes = b"") -> None:
        if isinstance(document, Text):
            payload, kind = document.body, document.content_type
        else:
            payload, kind = orjson.dumps(document), b"application/json"
        if not keep_alive:
            self._send(_head(status, extra + b"Connection: close\r\n", payload, kind))
            self.close()
        else:
            self._send(_head(status, extra, payload, kind))

    def _send(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the client went away")
        self.transport.write(data)

    def _refuse(self, status: int, message: str, *, retry: bool = False) -> None:
        """Answer a request that cannot be read, and close: the rest of the stream cannot be trusted."""
        if self.closing:
            return
        self.queue.clear()  # their budget is given back when the connection is lost
        self.pending = b""
        if self.waiting is not None:
            self.waiting.cancel()
            self.waiting = None
        try:
            self._respond(status, {"error": message}, keep_alive=False, extra=b"Retry-After: 1\r\n" if retry else b"")
        except ConnectionResetError:
            self.close()


def _head(status: int, headers: bytes, payload: bytes, kind: bytes = b"application/json") -> bytes:
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
        % (status, HTTPStatus(status).phrase.encode(), kind, len(payload), headers)
        + payload
    )


def _identity(peercert: Any) -> str | None:
    """The subject CN of a verified client certificate (or its whole subject when it has no CN), else None."""
    if not peercert:
        return None
    subject = [value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"]
    return subject[0] if subject else str(peercert.get("subject", "a client certificate"))


def tls_context(cert: str | None, key: str | None, client_ca: str | None) -> ssl.SSLContext | None:
    """HTTPS with `cert`/`key`; with `client_ca`, clients are asked for a certificate, and one not signed by that CA
    fails the handshake. A client without one still connects (the kubelet's probes have none): the caller decides
    which paths need an identity."""
    if not cert:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    if client_ca:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_OPTIONAL
    return context
