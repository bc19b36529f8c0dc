"""A small, fast Kubernetes API client for the scheduler's hot paths, and list-then-watch informers.

The `kubernetes` package reads kubeconfigs and in-cluster credentials (host, CA, client certificates, tokens) and is
used for exactly that. Its per-call overhead (argument validation, model (de)serialisation: 16-60 ms a call on this
machine) and slow JSON decoding of large lists make it the wrong tool for the calls made per pod, so those go over a
keep-alive `urllib3` pool with orjson: GET, LIST with pagination, WATCH as a line stream, PATCH and POST.

`Informer` keeps one resource in sync: it lists (in pages), hands the full list to its consumer, then watches from the
list's resourceVersion. A `410 Gone` (the version is too old) triggers a relist; any other failure a relist after a
backoff that doubles up to 30 s, so an API server restart is survived without the caller noticing more than a pause.
A watch that the server (or a proxy before it) ends within `MIN_WATCH_SECONDS` having delivered nothing is asked
again only after that backoff, as client-go's reflector does ("very short watch"), and so is the relist after a
`410 Gone` that came within `MIN_WATCH_SECONDS` of the list; the backoff starts again from its first step only once a
watch has delivered something or lasted that long, not after a list that succeeded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlencode

import aiohttp
import orjson
import urllib3

__all__ = ["ApiError", "AsyncKubeClient", "Connections", "Fenced", "Informer", "KubeClient", "RateLimiter"]

T = TypeVar("T")

log = logging.getLogger("kubegpu.kube")

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
MIN_WATCH_SECONDS = 1.0  # a watch ended sooner with nothing delivered is a failure (client-go's "very short watch")
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 30.0
REPORT_TURN = 4  # a report waiting for a connection gets at least one in this many handed out


class ApiError(Exception):
    """An API call that failed: `status` is the HTTP status (0 when the server could not be reached, or when a success
    answer could not be read: the call may have been carried out)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        super().__init__(f"{status} {reason}: {message}" if status else message)


class Fenced(ApiError):
    """A write the asynchronous client refused to send: its fence (the replica's term as leader) ran out while the
    write waited for the rate limiter or a connection. It never reached the API server."""

    def __init__(self, method: str, path: str) -> None:
        super().__init__(0, "Fenced", f"{method} {path}: not sent, this replica's term as leader ended")


@dataclass(frozen=True)
class Credentials:
    host: str
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    verify: bool
    authorization: str | None


def load_credentials(kubeconfig: str | None) -> Credentials:
    """Credentials from a kubeconfig file, or the in-cluster service account when `kubeconfig` is None."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    # Newer clients keep the token under "BearerToken", older ones under "authorization".
    authorization = (
        configuration.get_api_key_with_prefix("BearerToken")
        or configuration.get_api_key_with_prefix("authorization")
        or None
    )
    return Credentials(
        host=configuration.host.rstrip("/"),
        ca_file=configuration.ssl_ca_cert,
        cert_file=configuration.cert_file,
        key_file=configuration.key_file,
        verify=bool(configuration.verify_ssl),
        authorization=authorization,
    )


def unverified_context() -> ssl.SSLContext:
    """A TLS client context that verifies nothing (`insecure-skip-tls-verify`), made without loading the system's
    certificate authorities, which it would never read: `ssl.create_default_context()` spent 15-30 ms of the start on
    them, and urllib3 as much again on every connection it opened without a context of its own."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class RateLimiter:
    """A token bucket, as client-go's: `qps` tokens a second, at most `burst` saved up. `qps <= 0` means no limit."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self.tokens = float(self.burst)
        self.updated = time.monotonic()
        self.lock = threading.Lock()

    def reserve(self) -> float:
        """Take a token; the seconds to wait before using it."""
        if self.qps <= 0:
            return 0.0
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.qps)
            self.updated = now
            self.tokens -= 1.0
            return -self.tokens / self.qps if self.tokens < 0 else 0.0

    def acquire(self) -> None:
        wait = self.reserve()
        if wait:
            time.sleep(wait)


class KubeClient:
    """Keep-alive JSON calls against one API server, rate-limited like client-go (watches are not limited)."""

    def __init__(
        self,
        credentials: Credentials,
        *,
        connections: int = 16,
        timeout: float = 30.0,
        qps: float = 0.0,
        burst: int = 1,
    ) -> None:
        self.credentials = credentials
        self.limiter = RateLimiter(qps, burst)
        self.host = credentials.host
        self.timeout = timeout
        options: dict[str, Any] = {"maxsize": connections, "block": False, "retries": False}
        if self.host.startswith("https"):
            options["cert_reqs"] = "CERT_REQUIRED" if credentials.verify else "CERT_NONE"
            if credentials.ca_file:
                options["ca_certs"] = credentials.ca_file
            if credentials.cert_file:
                options["cert_file"] = credentials.cert_file
                options["key_file"] = credentials.key_file
            if not credentials.verify:
                urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
                options["ssl_context"] = unverified_context()  # else urllib3 loads the system's CAs per connection
        self.pool = urllib3.PoolManager(num_pools=2, **options)
        self.headers = {"Accept": JSON, "User-Agent": "kubegpu"}
        if credentials.authorization:
            self.headers["Authorization"] = credentials.authorization

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, **kwargs: Any) -> KubeClient:
        return cls(load_credentials(kubeconfig), **kwargs)

    def _url(self, path: str, params: Mapping[str, Any] | None) -> str:
        query = f"?{urlencode({k: v for k, v in params.items() if v is not None})}" if params else ""
        return f"{self.host}{path}{query}"

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        content_type: str = JSON,
        timeout: float | None = None,
    ) -> Any:
        self.limiter.acquire()
        headers = dict(self.headers)
        payload = None
        if body is not None:
            payload = orjson.dumps(body)
            headers["Content-Type"] = content_type
        read = timeout or self.timeout
        try:
            response = self.pool.request(
                method,
                self._url(path, params),
                body=payload,
                headers=headers,
                timeout=urllib3.Timeout(connect=min(5.0, read), read=read),
            )
        except urllib3.exceptions.HTTPError as exc:
            raise ApiError(0, "Unreachable", f"{method} {path}: {exc}") from None
        return _answer(method, path, response.status, response.reason or "", response.data)

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body=body)

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body=body)

    def patch(self, path: str, body: Any, *, strategic: bool = False) -> Any:
        return self.request("PATCH", path, body=body, content_type=STRATEGIC_PATCH if strategic else MERGE_PATCH)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def list(self, path: str, *, page: int = 500, **params: Any) -> tuple[list[dict[str, Any]], str]:
        """Every item of a collection, fetched in pages, and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            document = self.get(path, limit=page, **({"continue": token} if token else {}), **params)
            items.extend(document.get("items") or [])
            metadata = document.get("metadata") or {}
            token = metadata.get("continue")
            if not token:
                return items, str(metadata.get("resourceVersion", ""))

    def watch(
        self, path: str, resource_version: str, *, timeout: int = 300, **selectors: Any
    ) -> Iterator[dict[str, Any]]:
        """Watch events (`{"type", "object"}`) from `resource_version` until the server ends the stream;
        `selectors` are query parameters such as `labelSelector`."""
        params = {
            **selectors,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout,
        }
        try:
            response = self.pool.request(
                "GET",
                self._url(path, params),
                headers=self.headers,
                preload_content=False,
                timeout=urllib3.Timeout(connect=5.0, read=timeout + 30),
            )
        except urllib3.exceptions.HTTPError as exc:
            raise ApiError(0, "Unreachable", f"WATCH {path}: {exc}") from None
        try:
            if response.status >= 400:
                raise ApiError(response.status, response.reason or "", response.read().decode(errors="replace"))
            buffer = b""
            for chunk in response.stream(65536):
                buffer += chunk
                while True:
                    newline = buffer.find(b"\n")
                    if newline < 0:
                        break
                    line, buffer = buffer[:newline], buffer[newline + 1 :]
                    if line.strip():
                        yield orjson.loads(line)
        except urllib3.exceptions.HTTPError as exc:
            raise ApiError(0, "Unreachable", f"WATCH {path}: {exc}") from None
        finally:
            response.release_conn()


def _answer(method: str, path: str, status: int, reason: str, data: bytes) -> Any:
    """The decoded JSON of an answer; `ApiError` for a failure status (with the server's reason and message when its
    body is a Status) and for a body that is not JSON (a proxy's page), so that a caller handles one kind of failure.
    An answer of a success status that cannot be read is an answer lost (status 0, as a timeout): the write may have
    been made, and a caller that must know (the binder) looks it up."""
    if status >= 400:
        message = data.decode(errors="replace")[:500]
        try:
            document = orjson.loads(data)
        except orjson.JSONDecodeError:
            document = None
        if isinstance(document, dict):
            reason, message = document.get("reason", reason), document.get("message", message)
        raise ApiError(status, str(reason), str(message))
    try:
        return orjson.loads(data) if data else None
    except orjson.JSONDecodeError as exc:
        raise ApiError(0, "InvalidAnswer", f"{method} {path}: the {status} answer is not JSON: {exc}") from None


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop (libuv: socket I/O and callbacks in C), else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def is_report(method: str, path: str) -> bool:
    """Whether a write only tells what happened (an Event, a status patch such as a condition or a nominated node),
    rather than moving a pod (a Binding, a deletion): kube-scheduler writes its Events on a client of their own."""
    return (method == "POST" and path.endswith("/events")) or (method == "PATCH" and path.endswith("/status"))


class Connections:
    """The client's connections, handed to the requests waiting for one in two lines: the writes that move pods
    first, the reports (`is_report`) after them, yet one in every `REPORT_TURN` to a waiting report, so that none
    waits for ever. First come, first served within each line. Behind a burst of reports (a thousand pods that fit
    nowhere) a victim's deletion or a Binding no longer waits for all of them."""

    def __init__(self, count: int) -> None:
        self.free = count
        self._lines: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (deque(), deque())
        self._handed = 0

    def locked(self) -> bool:
        return self.free <= 0

    async def acquire(self, report: bool = False) -> None:
        if self.free > 0:
            self.free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lines[report].append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed over just as its waiter gave up: it goes to the next one
            raise

    def release(self) -> None:
        moving, reports = self._lines
        while moving or reports:
            self._handed += 1
            turn = self._handed % REPORT_TURN == 0
            line = reports if reports and (turn or not moving) else moving
            waiter = line.popleft()
            if not waiter.done():  # else it gave up waiting (cancelled)
                waiter.set_result(None)
                return
        self.free += 1


class AsyncKubeClient:
    """The hot write path (annotation patches and Bindings): aiohttp on its own event-loop thread.

    Many bindings are in flight at once; aiohttp parses responses in C, where `http.client` spends most of a call's
    CPU in the `email` header parser, and the scheduler's CPU is shared with the API server on small machines.
    Coroutines are submitted from other threads with `submit`; the session shares the rate limiter of the sync client.

    `fence`, when given, returns the seconds this client may still send writes (`Leadership.remaining`, which the
    elector moves on with every renewal): every request but a GET reads it after it has waited for its rate-limiter
    token and for a free connection, the last waits before it is written to a socket, and is refused with `Fenced`
    if the fence has run out. A backlog of writes therefore drains into refusals, never into the API server, once the
    replica stops leading. The connections are counted (`Connections`, of the connector's size), so that aiohttp itself
    never queues a request after the check, and a report waiting for one lets the writes that move pods go first.
    Writes that passed the fence are counted until they end, so that a leader shutting down can tell when nothing it
    sent can still land (`drain`).
    """

    def __init__(
        self,
        credentials: Credentials,
        limiter: RateLimiter,
        *,
        connections: int = 64,
        fence: Callable[[], float] | None = None,
    ) -> None:
        self.credentials = credentials
        self.limiter = limiter
        self.fence = fence
        self.slots: Connections
        self.sending = 0  # writes handed to a connection and not yet ended (touched on the loop thread only)
        # When the last write ended without an answer (a timeout, a reset connection): the API server may still
        # store it.
        self.last_unanswered = -math.inf
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kube-async", daemon=True)
        self.thread.start()
        self.session: aiohttp.ClientSession = self.submit(self._open(connections)).result()

    async def _open(self, connections: int) -> aiohttp.ClientSession:
        context: ssl.SSLContext | bool = False
        if self.credentials.host.startswith("https"):
            if self.credentials.verify:
                context = ssl.create_default_context(cafile=self.credentials.ca_file)
            else:
                context = unverified_context()
            if self.credentials.cert_file:
                context.load_cert_chain(self.credentials.cert_file, self.credentials.key_file)
        headers = {"Accept": JSON, "User-Agent": "kubegpu"}
        if self.credentials.authorization:
            headers["Authorization"] = self.credentials.authorization
        self.slots = Connections(connections)
        connector = aiohttp.TCPConnector(limit=connections, ssl=context)
        return aiohttp.ClientSession(connector=connector, headers=headers, timeout=aiohttp.ClientTimeout(total=30))

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def warm(self, count: int) -> concurrent.futures.Future[int]:
        """Open `count` connections in the background (each a GET of `/version`, which every client may read), so
        that the first writes do not wait for TLS handshakes. The future's result is how many answered."""

        async def one() -> bool:
            try:
                await self.request("GET", "/version")
            except ApiError:
                return False
            return True

        async def every() -> int:
            return sum(await asyncio.gather(*(one() for _ in range(count))))

        return self.submit(every())

    async def request(self, method: str, path: str, body: Any = None, content_type: str = JSON) -> Any:
        fence = self.fence if method != "GET" else None
        wait = self.limiter.reserve()
        if wait:
            await asyncio.sleep(wait)  # the fence may move on meanwhile: it is read once the wait is over
        await self._take_slot(method, path, fence)
        write = method != "GET"
        sent = False
        try:
            if fence is not None and fence() <= 0:
                raise Fenced(method, path)
            if write:
                sent = True  # counted in the same step as the fence check: `drain` sees it or the refusal
                self.sending += 1
            async with self.session.request(
                method,
                f"{self.credentials.host}{path}",
                data=orjson.dumps(body) if body is not None else None,
                headers={"Content-Type": content_type} if body is not None else None,
            ) as response:
                data = await response.read()
                status = response.status
                reason = response.reason or ""
        except (TimeoutError, asyncio.TimeoutError, aiohttp.ClientError, asyncio.CancelledError) as exc:
            # distinct before Python 3.11
            if sent:
                self.last_unanswered = time.monotonic()
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise ApiError(0, "Unreachable", f"{method} {path}: {exc!r}") from None
        finally:
            self.slots.release()
            if sent:
                self.sending -= 1
        return _answer(method, path, status, reason, data)

    def drain(self, timeout: float) -> float | None:
        """Wait up to `timeout` seconds for every write already handed to a connection to end. Call after the fence
        has closed for good, so no write starts meanwhile. Returns the monotonic time at which the last write that
        ended without an answer ended (-inf: none did), or None when some are still in flight."""

        async def ended() -> float:
            while self.sending:
                await asyncio.sleep(0.01)
            return self.last_unanswered

        try:
            return self.submit(asyncio.wait_for(ended(), timeout)).result(timeout + 1)
        except (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError):
            return None

    async def _take_slot(self, method: str, path: str, fence: Callable[[], float] | None) -> None:
        """One of the connections, waiting no longer than the fence allows (`Fenced` once it has run out; a fence
        moved on while waiting is waited for again)."""
        report = is_report(method, path)
        if fence is None or not self.slots.locked():
            await self.slots.acquire(report)
            return
        while (left := fence()) > 0:
            try:
                await asyncio.wait_for(self.slots.acquire(report), left)
                return
            except (TimeoutError, asyncio.TimeoutError):
                pass
        raise Fenced(method, path)

    async def patch(self, path: str, body: Any, *, strategic: bool = False) -> Any:
        return await self.request("PATCH", path, body, STRATEGIC_PATCH if strategic else MERGE_PATCH)

    async def post(self, path: str, body: Any) -> Any:
        return await self.request("POST", path, body)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.submit(self.session.close()).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


Consumer = Callable[[str, Any], None]


class Informer(threading.Thread):
    """List-then-watch one collection, handing `("SYNC", items)` and `(event type, object)` to `consume` (after
    `after`, another informer's `synced`, is set, when given)."""

    def __init__(
        self,
        client: KubeClient,
        path: str,
        consume: Consumer,
        stop: threading.Event,
        name: str,
        *,
        label_selector: str | None = None,
        after: threading.Event | None = None,
    ) -> None:
        super().__init__(name=f"informer-{name}", daemon=True)
        self.client = client
        self.path = path
        self.selectors: dict[str, Any] = {"labelSelector": label_selector} if label_selector else {}
        self.consume = consume
        self.stop_event = stop
        self.kind = name
        self.synced = threading.Event()
        # Another informer whose first list the consumer must have before this one's: the list is still read at
        # once (the two lists overlap), and handed over when `after` is set.
        self.after = after
        self.backoff = FIRST_BACKOFF  # the wait before the next try after a failure; doubles up to MAX_BACKOFF

    def run(self) -> None:
        listed = 0.0  # when the last list was handed over (monotonic)
        while not self.stop_event.is_set():
            try:
                items, version = self.client.list(self.path, **self.selectors)
                while self.after is not None and not self.after.wait(0.05):
                    if self.stop_event.is_set():
                        return
                self.consume("SYNC", items)
                self.synced.set()
                listed = time.monotonic()
                while not self.stop_event.is_set():
                    version = self._watch(version)
            except _Relist:
                if time.monotonic() - listed >= MIN_WATCH_SECONDS:
                    log.info("informer %s: resource version expired, relisting", self.kind)
                else:  # the version a list just gave: relisted at once, the server would answer the same
                    log.warning(
                        "informer %s: the version just listed expired at once; relisting in %.1fs",
                        self.kind,
                        self.backoff,
                    )
                    self._back_off()
            except ApiError as exc:
                log.warning("informer %s: %s; retrying in %.1fs", self.kind, exc, self.backoff)
                self._back_off()
            except Exception:
                log.exception("informer %s failed; retrying in %.1fs", self.kind, self.backoff)
                self._back_off()

    def _back_off(self) -> None:
        self.stop_event.wait(self.backoff)
        self.backoff = min(MAX_BACKOFF, self.backoff * 2)

    def _watch(self, version: str) -> str:
        started = time.monotonic()
        delivered = False
        for event in self.client.watch(self.path, version, **self.selectors):
            if self.stop_event.is_set():
                break
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise _Relist()
                raise ApiError(int(obj.get("code") or 500), str(obj.get("reason", "")), str(obj.get("message", "")))
            delivered = True
            self.backoff = FIRST_BACKOFF  # the watch works: a later failure backs off from the first step again
            version = str((obj.get("metadata") or {}).get("resourceVersion", version))
            if kind != "BOOKMARK":
                self.consume(str(kind), obj)
        if delivered or time.monotonic() - started >= MIN_WATCH_SECONDS:
            self.backoff = FIRST_BACKOFF
        elif not self.stop_event.is_set():
            log.warning(
                "informer %s: the watch ended at once with nothing delivered; watching again in %.1fs",
                self.kind,
                self.backoff,
            )
            self._back_off()
        return version


class _Relist(Exception):
    pass


def now_rfc3339(micro: bool = False) -> str:
    """The current UTC time as Kubernetes writes it (`MicroTime` with `micro=True`)."""
    now = time.time()
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
    if micro:
        text += f".{int((now % 1) * 1_000_000):06d}"
    return text + "Z"
