"""`kubegpu extender`: kube-scheduler's HTTP extender protocol in front of the same engine and plugins.

Many clusters (EKS among them) cannot replace the default scheduler; kube-scheduler can still delegate device
decisions to an extender (`urlPrefix` `http(s)://HOST:PORT`, verbs `filter`, `prioritize`, `bind`, `preempt`). The
cluster state comes from the same informers as the custom scheduler (`SchedulerService` with pod queueing off), so
`nodeCacheCapable: true` works; a full `Nodes` list works too.

* `/filter` (ExtenderArgs -> ExtenderFilterResult): the engine's filter per candidate node; nodes that devices in use
  block go to `FailedNodes`, nodes that can never take the pod (a trn1 asked for 7 devices) to
  `FailedAndUnresolvableNodes`; kube-scheduler puts these messages in its FailedScheduling event.
* `/prioritize` (ExtenderArgs -> HostPriorityList): the engine's score (plugin topology score plus binpack/spread)
  scaled to kube-scheduler's 0..10; hosts scoring 0 are left out of the list (kube-scheduler counts them as 0).

  Both remember their answers node by node for each pod shape; between two calls only the nodes the engine reports
  as changed (usually just the one the last pod was bound to) are asked again.
* `/bind` (ExtenderBindingArgs -> ExtenderBindingResult): re-checks the fit and reserves the devices atomically
  under the engine lock, then creates the Binding carrying the signed `kubegpu.io/allocation` and plugin
  annotations in its metadata (the API server copies them onto the pod in the same write, guarded by the pod's
  UID), and rolls the reservation back on any failure.
* `/preempt` (ExtenderPreemptionArgs -> ExtenderPreemptionResult): keeps only candidate nodes where evicting the
  proposed victims would free a valid device set for the pod.
* `GET /apis/kubegpu/v1/nodes` and `/apis/kubegpu/v1/pods` (`?watch=true` streams changes as JSON lines): each node's
  devices and who holds them.

Bad input never takes the server down: malformed JSON, a body of the wrong shape or over the size limit get a 4xx
with a JSON message naming the problem; a pod the protocol can answer about (an unknown node, an invalid quantity)
gets a 200 whose `Error` explains, where the protocol has that field.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import ssl
import threading
from collections import deque
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, TypeVar
from urllib.parse import parse_qs

import httptools
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kubegpu.core.errors import InputError, describe_validation_error
from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.process import configure_logging, read_key
from kubegpu.core.status import Code
from kubegpu.scheduler.custom import SchedulerService, write_placement
from kubegpu.scheduler.engine import POLICIES, Engine, Plan
from kubegpu.scheduler.kube import ApiError, AsyncKubeClient, KubeClient, new_event_loop

__all__ = ["ExtenderServer", "add_extender_parser"]

log = logging.getLogger("kubegpu.extender")

T = TypeVar("T")

MAX_BODY = 64 * 1024 * 1024
MAX_EXTENDER_PRIORITY = 10
MAX_ENGINE_SCORE = 200.0


# -- protocol bodies (kube-scheduler sends Go field names, without JSON tags) ------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _NodeList(_Body):
    items: list[dict[str, Any]] = Field(default_factory=list)


class ExtenderArgs(_Body):
    Pod: dict[str, Any]
    Nodes: _NodeList | None = None
    NodeNames: list[str] | None = None


class BindingArgs(_Body):
    PodName: str = Field(min_length=1)
    PodNamespace: str = Field(min_length=1)
    PodUID: str = ""
    Node: str = Field(min_length=1)


class _MetaPod(_Body):
    UID: str


class _MetaVictims(_Body):
    Pods: list[_MetaPod] = Field(default_factory=list)
    NumPDBViolations: int = 0


class _Victims(_Body):
    Pods: list[dict[str, Any]] = Field(default_factory=list)
    NumPDBViolations: int = 0


class PreemptionArgs(_Body):
    Pod: dict[str, Any]
    NodeNameToVictims: dict[str, _Victims] | None = None
    NodeNameToMetaVictims: dict[str, _MetaVictims] | None = None


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


def _parse(model: type[_Body], body: bytes) -> Any:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise BadRequest(400, f"the body must be a JSON object ({model.__name__}), not {type(document).__name__}")
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise BadRequest(400, describe_validation_error(exc, model.__name__)) from None


@dataclass(slots=True)
class _Answers:
    """The filter and score answers for one pod shape (one plan signature), node by node, as of engine change
    `generation`. kube-scheduler asks about the same few hundred nodes for every replica of a workload, and between
    two of its calls only the node it bound changed: the engine names the changed nodes, and only they are redone.
    The answers are kept as sets so that a call over hundreds of names costs a few set operations."""

    generation: int
    passing: set[str] = field(default_factory=set)
    failing: dict[str, str] = field(default_factory=dict)  # the reason, for nodes that do not pass
    unresolvable: set[str] = field(default_factory=set)
    scored: dict[str, orjson.Fragment] = field(default_factory=dict)  # encoded HostPriority, for scores above 0
    unscored: set[str] = field(default_factory=set)  # nodes known to score 0

    def forget(self, names: set[str]) -> None:
        self.passing -= names
        self.unresolvable -= names
        self.unscored -= names
        for name in names & self.failing.keys():
            del self.failing[name]
        for name in names & self.scored.keys():
            del self.scored[name]


MAX_SHAPES = 256  # pod shapes whose answers are kept
UNKNOWN_NODE = "node(s) unknown to kubegpu (not in its node cache yet)"


class ExtenderServer:
    """The protocol logic, independent of the HTTP server that carries it."""

    def __init__(self, service: SchedulerService) -> None:
        self.service = service
        self.engine: Engine = service.engine
        self._answers: dict[tuple[object, ...], _Answers] = {}

    def _pod(self, document: dict[str, Any]) -> PodRequest:
        """The pod kube-scheduler asks about: the informer's parse of it when UID and resourceVersion match (filter and
        prioritize ask about a pending pod the informer has already read), else parsed from the document."""
        meta = document.get("metadata")
        if isinstance(meta, dict) and meta.get("resourceVersion"):
            known = self.service.unbound.get(f"{meta.get('namespace', 'default')}/{meta.get('name')}")
            if known is not None and known[0] == str(meta["resourceVersion"]) and known[1].uid == meta.get("uid"):
                return known[1]
        try:
            request, _ = pod_request(document)
        except InputError as exc:
            raise _PodError(str(exc)) from None
        return request

    def _candidates(self, args: ExtenderArgs) -> list[str]:
        if args.NodeNames is not None:
            return args.NodeNames
        names = []
        for item in args.Nodes.items if args.Nodes else []:
            name = (item.get("metadata") or {}).get("name")
            if not name:
                continue
            names.append(name)
            if name not in self.engine.nodes:
                try:  # a node the informer has not delivered yet: take kube-scheduler's copy
                    self.engine.add_node(node_info(item))
                except InputError as exc:
                    log.warning("node in the request ignored: %s", exc, extra={"node": name})
        return names

    def _answered(self, pod: PodRequest, plan: Plan, wanted: set[str]) -> _Answers:
        """The pod shape's answers, with every node of `wanted` decided (call with the service lock held)."""
        answers = self._answers.pop(plan.signature, None)  # re-inserted last: the dict is kept in LRU order
        if answers is not None:
            changed = self.engine.changed_since(answers.generation)
            if changed is None:
                answers = None
            else:
                answers.forget(changed)
        if answers is None:
            answers = _Answers(self.engine.generation)
            if len(self._answers) >= MAX_SHAPES:
                del self._answers[next(iter(self._answers))]
        answers.generation = self.engine.generation
        self._answers[plan.signature] = answers
        settled: dict[int, str] = {}
        for name in wanted - answers.passing - answers.failing.keys():
            record = self.engine.nodes.get(name)
            if record is None:
                answers.failing[name] = UNKNOWN_NODE
                answers.unresolvable.add(name)
                continue
            # One unresolvable answer settles every node of the class (a trn1 refusing 7 devices refuses them all).
            known = settled.get(record.klass)
            if known is not None:
                answers.failing[name] = known
                answers.unresolvable.add(name)
                continue
            status = self.engine.check(record, pod, plan)
            if status.ok:
                answers.passing.add(name)
            else:
                answers.failing[name] = status.message
                if status.code is Code.UNRESOLVABLE:
                    answers.unresolvable.add(name)
                    settled[record.klass] = status.message
        return answers

    def filter(self, body: bytes) -> dict[str, Any]:
        args: ExtenderArgs = _parse(ExtenderArgs, body)
        try:
            pod = self._pod(args.Pod)
        except _PodError as exc:
            return {"NodeNames": None, "Nodes": None, "FailedNodes": {}, "Error": f"invalid pod: {exc}"}
        with self.service.lock:
            names = self._candidates(args)
            wanted = set(names)
            answers = self._answered(pod, self.engine.plan(pod), wanted)
            failing = answers.failing
            if failing.keys().isdisjoint(wanted):
                passed, failed = names, {}  # the usual case: every candidate passes
            else:
                passed = [name for name in names if name not in failing]
                failed = {name: failing[name] for name in names if name in failing}
            unresolvable = {name: reason for name, reason in failed.items() if name in answers.unresolvable}
        # Unresolvable nodes are listed in FailedNodes too: schedulers before 1.21 read only FailedNodes; newer ones
        # let FailedAndUnresolvableNodes take precedence and skip preemption there.
        result: dict[str, Any] = {"FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
        if args.NodeNames is not None:
            result["NodeNames"] = passed
        else:
            keep = set(passed)
            items = [n for n in (args.Nodes.items if args.Nodes else []) if n.get("metadata", {}).get("name") in keep]
            result["Nodes"] = {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items}
        return result

    def prioritize(self, body: bytes) -> list[orjson.Fragment]:
        """Hosts that score 0 are left out: kube-scheduler counts a host missing from the list as 0, and with binpack
        every empty node scores 0, so the list names just the partly used nodes instead of every candidate."""
        args: ExtenderArgs = _parse(ExtenderArgs, body)
        try:
            pod = self._pod(args.Pod)
        except _PodError as exc:
            raise BadRequest(422, f"invalid pod: {exc}") from None
        with self.service.lock:
            wanted = set(self._candidates(args))
            plan = self.engine.plan(pod)
            answers = self._answered(pod, plan, wanted)
            scored = answers.scored
            for name in wanted - scored.keys() - answers.unscored:
                score = 0
                if name in answers.passing:
                    raw = self.engine.score_node(name, pod, plan)
                    score = round(MAX_EXTENDER_PRIORITY * min(raw, MAX_ENGINE_SCORE) / MAX_ENGINE_SCORE)
                if score:
                    scored[name] = orjson.Fragment(orjson.dumps({"Host": name, "Score": score}))
                else:
                    answers.unscored.add(name)
            return [scored[name] for name in sorted(wanted & scored.keys())]

    async def _on_writer(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run an API call on the writer's event loop: directly when the HTTP server shares it (as `run` sets it up),
        else handed over to it."""
        writer = self.service.writer
        if asyncio.get_running_loop() is writer.loop:
            return await coroutine
        return await asyncio.wrap_future(writer.submit(coroutine))

    async def _pending(self, key: str, uid: str) -> tuple[str, PodRequest]:
        """The pod to bind and its resourceVersion: from the informer's cache, else from the API server."""
        with self.service.lock:
            cached = self.service.unbound.get(key)
        if cached is not None and (not uid or cached[1].uid == uid):
            return cached
        namespace, name = key.split("/", 1)
        obj = await self._on_writer(self.service.writer.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}"))
        if uid and (obj.get("metadata") or {}).get("uid") != uid:
            raise _PodError(f"it has another UID than the one to bind ({uid}); it was recreated")
        return str((obj.get("metadata") or {}).get("resourceVersion", "")), self._pod(obj)

    async def bind(self, body: bytes) -> dict[str, Any]:
        args: BindingArgs = _parse(BindingArgs, body)
        key = f"{args.PodNamespace}/{args.PodName}"
        try:
            _, pod = await self._pending(key, args.PodUID)
        except (ApiError, _PodError) as exc:
            return {"Error": f"pod {key}: {exc}"}
        with self.service.lock:
            held = self.engine.pods.get(key)
            if held is not None and held.request.uid == pod.uid:
                if held.node == args.Node:
                    return {"Error": ""}  # already bound here (a retried bind)
                return {"Error": f"pod {key} already holds devices on {held.node}"}
            if args.Node not in self.engine.nodes:
                return {"Error": f"node {args.Node} is unknown to kubegpu"}
            decision = self.engine.reserve(pod, args.Node)
        if not decision.scheduled:
            return {"Error": f"pod {key} no longer fits node {args.Node}: {decision.reason}"}
        try:
            await self._on_writer(write_placement(self.service.writer, pod, decision))
        except ApiError as exc:
            with self.service.lock:
                held = self.engine.pods.get(key)
                if held is not None and held.request.uid == pod.uid:
                    self.engine.release(key)
            self.service.metrics.bind_errors.inc()
            log.warning("binding failed; reservation rolled back", extra={"pod": key, "node": args.Node, "error": exc})
            return {"Error": f"binding {key} to {args.Node} failed: {exc}"}
        log.info(
            "bound",
            extra={
                "pod": key,
                "node": args.Node,
                "devices": decision.allocation.containers if decision.allocation else None,
            },
        )
        return {"Error": ""}

    def preempt(self, body: bytes) -> dict[str, Any]:
        args: PreemptionArgs = _parse(PreemptionArgs, body)
        try:
            pod = self._pod(args.Pod)
        except _PodError as exc:
            raise BadRequest(422, f"invalid pod: {exc}") from None
        proposals: dict[str, tuple[list[str], int]] = {}
        if args.NodeNameToMetaVictims is not None:
            for node, meta in args.NodeNameToMetaVictims.items():
                proposals[node] = ([p.UID for p in meta.Pods], meta.NumPDBViolations)
        for node, victims in (args.NodeNameToVictims or {}).items():
            uids = [str((p.get("metadata") or {}).get("uid", "")) for p in victims.Pods]
            proposals[node] = (uids, victims.NumPDBViolations)
        kept: dict[str, Any] = {}
        with self.service.lock:
            by_uid = {record.request.uid: key for key, record in self.engine.pods.items()}
            for node, (uids, violations) in proposals.items():
                if node not in self.engine.nodes:
                    continue
                keys = [by_uid[u] for u in uids if u in by_uid and self.engine.pods[by_uid[u]].node == node]
                with self.engine.pods_removed(keys):
                    fits = self.engine.filter_node(node, pod).ok
                if fits:
                    kept[node] = {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": violations}
        return {"NodeNameToMetaVictims": kept}

    # -- the monitoring API -----------------------------------------------------------------------------------------

    def node_views(self) -> dict[str, dict[str, Any]]:
        with self.service.lock:
            views = {}
            for name, record in self.engine.nodes.items():
                if not record.states:
                    continue
                views[name] = {
                    "name": name,
                    "devices": [o.model_dump(mode="json") for o in self.engine.describe(name)],
                    "pods": sorted(record.pods),
                }
            return views

    def pod_views(self) -> dict[str, dict[str, Any]]:
        with self.service.lock:
            return {
                key: {
                    "pod": key,
                    "uid": record.request.uid,
                    "node": record.node,
                    "devices": record.allocation.containers if record.allocation else {},
                }
                for key, record in self.engine.pods.items()
                if record.allocation is not None
            }


class _PodError(Exception):
    pass


Waiting = Coroutine[Any, Any, tuple[int, Any]] | AsyncGenerator[bytes, None]  # an answer that is not ready at once
Answer = tuple[int, Any] | Waiting


class HttpServer:
    """The extender's HTTP(S) server: HTTP/1.1 keep-alive connections parsed by httptools (llhttp, in C).

    kube-scheduler waits for filter and prioritize before it moves on to the next pod, so they are answered right
    where their request completes, on the event loop, with no task or framework in between (they only touch the
    engine, briefly, under its lock). bind awaits its API write; the connection reads its next request after the
    answer. Given the API writer's loop, the server runs on it, so a bind's write needs no hand-over between threads.
    """

    def __init__(
        self,
        server: ExtenderServer,
        listen: str,
        tls: ssl.SSLContext | None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.server = server
        self.verbs: dict[str, Callable[[bytes], Any]] = {
            "filter": server.filter,
            "prioritize": server.prioritize,
            "preempt": server.preempt,
        }
        self.views = {"/apis/kubegpu/v1/nodes": server.node_views, "/apis/kubegpu/v1/pods": server.pod_views}
        self.connections: set[_Connection] = set()
        host, _, port = listen.rpartition(":")
        self.own_loop = loop is None
        self.loop = loop or new_event_loop()
        if self.own_loop:
            threading.Thread(target=self.loop.run_forever, name="extender-http", daemon=True).start()
        self.listener = asyncio.run_coroutine_threadsafe(
            self.loop.create_server(lambda: _Connection(self), host or "0.0.0.0", int(port), ssl=tls), self.loop
        ).result()
        self.address = tuple(self.listener.sockets[0].getsockname()[:2])  # the bound port, for a --listen of port 0

    def answer(self, method: bytes, target: bytes, body: bytes) -> Answer:
        """A request's status and JSON document; for the answers that wait, a coroutine (bind) or a stream (watch)."""
        try:
            url = httptools.parse_url(target)
        except httptools.HttpParserInvalidURLError:
            return 400, {"error": f"invalid request target {target[:200].decode(errors='replace')!r}"}
        path = url.path.decode(errors="replace").rstrip("/") or "/"
        if method == b"POST":
            verb = path.rsplit("/", 1)[-1]
            if verb == "bind":
                return self._bind(body)
            handler = self.verbs.get(verb)
            if handler is None:
                return 404, {"error": f"unknown verb {verb!r}; use filter, prioritize, bind or preempt"}
            return self._call(verb, handler, body)
        if method != b"GET":
            return 405, {"error": f"method {method.decode(errors='replace')} is not allowed; use POST or GET"}
        if path == "/healthz":  # the event loop answers and the informers' consumer keeps beating
            healthy = self.server.service.healthy()
            return (200, {"status": "ok"}) if healthy else (503, {"status": "the event consumer is stuck"})
        if path == "/readyz":  # ready once the informers have listed nodes and pods
            ready = self.server.service.ready()
            return (200, {"status": "ready"}) if ready else (503, {"status": "syncing nodes and pods"})
        view = self.views.get(path)
        if view is None:
            return 404, {"error": f"unknown path {path!r}"}
        query = parse_qs((url.query or b"").decode(errors="replace"))
        if query.get("watch", ["false"])[-1].lower() in ("true", "1"):
            return self._watch(view)
        return 200, {"items": list(view().values())}

    @staticmethod
    def _call(verb: str, handler: Callable[[bytes], Any], body: bytes) -> tuple[int, Any]:
        try:
            return 200, handler(body)
        except Exception as exc:
            return HttpServer._failed(verb, exc)

    async def _bind(self, body: bytes) -> tuple[int, Any]:
        try:
            return 200, await self.server.bind(body)
        except Exception as exc:
            return self._failed("bind", exc)

    @staticmethod
    def _failed(verb: str, exc: Exception) -> tuple[int, Any]:
        """A verb's exception as an answer: a 4xx with a JSON message, never a 5xx or a traceback."""
        if isinstance(exc, BadRequest):
            return exc.status, {"error": str(exc)}
        log.exception("%s failed", verb)
        return 400, {"error": f"could not process the request: {type(exc).__name__}: {exc}"}

    async def _watch(self, view: Callable[[], dict[str, dict[str, Any]]]) -> AsyncGenerator[bytes, None]:
        """`{"type": ADDED|MODIFIED|DELETED, "object"}` lines, as a Kubernetes watch streams them."""
        previous: dict[str, Any] = {}
        while not self.server.service.stop.is_set():
            current = view()
            lines = []
            for name, obj in current.items():
                if name not in previous:
                    lines.append({"type": "ADDED", "object": obj})
                elif previous[name] != obj:
                    lines.append({"type": "MODIFIED", "object": obj})
            lines.extend({"type": "DELETED", "object": obj} for n, obj in previous.items() if n not in current)
            if lines:
                yield b"".join(orjson.dumps(line) + b"\n" for line in lines)
            previous = current
            await asyncio.sleep(0.5)

    def shutdown(self) -> None:
        async def close() -> None:
            self.listener.close()
            for connection in list(self.connections):
                connection.close()
            await self.listener.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=10)
        if self.own_loop:
            self.loop.call_soon_threadsafe(self.loop.stop)


class _Connection(asyncio.Protocol):
    """One client connection. Requests are answered in order: while an answer waits (bind), reading pauses, and a
    request that arrived with the previous one waits its turn. A request the server cannot read (malformed HTTP, a
    body over the limit) gets its 4xx and the connection is closed; nothing else is affected."""

    def __init__(self, http: HttpServer) -> None:
        self.http = http
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.target = b""
        self.expect_continue = False
        self.body: list[bytes] = []
        self.size = 0
        self.queue: deque[tuple[bytes, bytes, bytes, bool]] = deque()
        self.waiting: asyncio.Task[None] | None = None
        self.closing = False

    # -- the transport ---------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms Nagle wait on small answers
        self.http.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._refuse(400, f"malformed HTTP request: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.closing = True
        if self.waiting is not None:
            self.waiting.cancel()
        self.http.connections.discard(self)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- the parser (httptools calls these while feed_data runs) ---------------------------------------------------

    def on_message_begin(self) -> None:
        self.target, self.expect_continue, self.body, self.size = b"", False, [], 0

    def on_url(self, url: bytes) -> None:
        self.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"content-length" and value.strip().isdigit() and int(value) > MAX_BODY:
            self._refuse(413, f"the body is {int(value)} bytes; the limit is {MAX_BODY}")
        elif lowered == b"expect" and value.strip().lower() == b"100-continue":
            self.expect_continue = True

    def on_headers_complete(self) -> None:
        if self.expect_continue and not self.closing and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > MAX_BODY:
            self._refuse(413, f"the body is over the limit of {MAX_BODY} bytes")
        elif not self.closing:
            self.body.append(chunk)

    def on_message_complete(self) -> None:
        if self.closing:
            return
        method = self.parser.get_method()
        self.queue.append((method, self.target, b"".join(self.body), self.parser.should_keep_alive()))
        self.body = []
        if self.waiting is None:
            self._next()

    # -- answers ---------------------------------------------------------------------------------------------------

    def _next(self) -> None:
        while self.queue and self.waiting is None and not self.closing:
            method, target, body, keep_alive = self.queue.popleft()
            answer = self.http.answer(method, target, body)
            if isinstance(answer, tuple):
                self._respond(*answer, keep_alive=keep_alive)
            else:
                self.waiting = asyncio.get_running_loop().create_task(self._wait(answer, keep_alive))

    async def _wait(self, answer: Waiting, keep_alive: bool) -> None:
        try:
            if isinstance(answer, AsyncGenerator):
                # A watch streams until the client leaves; reading goes on so that its leaving is noticed.
                self._send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                try:
                    async for data in answer:
                        self._send(b"%x\r\n%s\r\n" % (len(data), data))
                    self._send(b"0\r\n\r\n")
                finally:
                    await answer.aclose()
            else:
                if self.transport is not None:
                    self.transport.pause_reading()
                try:
                    status, document = await answer
                finally:
                    if self.transport is not None:
                        self.transport.resume_reading()
                self._respond(status, document, keep_alive=keep_alive)
        except ConnectionResetError:
            return  # the client went away; nothing is left to answer
        self.waiting = None
        self._next()

    def _respond(self, status: int, document: Any, *, keep_alive: bool) -> None:
        payload = orjson.dumps(document)
        head = b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % (
            status,
            HTTPStatus(status).phrase.encode(),
            len(payload),
        )
        if not keep_alive:
            self.closing = True
            self._send(head + b"Connection: close\r\n\r\n" + payload)
            self.close()
        else:
            self._send(head + b"\r\n" + payload)

    def _send(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the client went away")
        self.transport.write(data)

    def _refuse(self, status: int, message: str) -> None:
        """Answer a request that cannot be read, and close: the rest of the stream cannot be trusted."""
        if self.closing:
            return
        self.queue.clear()
        if self.waiting is not None:
            self.waiting.cancel()
            self.waiting = None
        self._respond(status, {"error": message}, keep_alive=False)


def tls_context(cert: str | None, key: str | None, client_ca: str | None) -> ssl.SSLContext | None:
    if not cert:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if client_ca:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("kubegpu extender: --tls-cert and --tls-key go together")
    if args.client_ca and not args.tls_cert:
        raise SystemExit("kubegpu extender: --client-ca needs --tls-cert and --tls-key")
    key = read_key(args.allocation_key_file)
    plugins = make_plugin_manager("scheduler")
    for failure in plugins.failures:
        log.error("%s", failure)
    client = KubeClient.from_kubeconfig(args.kubeconfig, qps=args.kube_api_qps, burst=args.kube_api_burst)
    writer = AsyncKubeClient(client.credentials, client.limiter, connections=32)
    engine = Engine(plugins, policy=args.policy, signing_key=key)
    service = SchedulerService(client, writer, engine, name="", key=key, queue_pods=False)
    extender = ExtenderServer(service)
    httpd = HttpServer(extender, args.listen, tls_context(args.tls_cert, args.tls_key, args.client_ca), writer.loop)
    scheme = "https" if args.tls_cert else "http"
    log.info("kubegpu extender serving on %s://%s:%d", scheme, *httpd.address)

    def terminate(signum: int, _frame: Any) -> None:
        log.info("received signal %d, shutting down", signum)
        service.stop.set()

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    threading.Thread(target=service.start_informers, name="informers", daemon=True).start()
    service.run_loop()
    httpd.shutdown()
    writer.close()
    return 0


def add_extender_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "extender",
        help="the HTTP scheduler-extender behind kube-scheduler",
        description="Serve kube-scheduler's extender protocol (filter, prioritize, bind, preempt) with kubegpu's "
        "engine and plugins, for clusters whose default scheduler cannot be replaced.",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    parser.add_argument("--listen", default="0.0.0.0:8888", help="HOST:PORT to serve (default 0.0.0.0:8888)")
    parser.add_argument("--allocation-key-file", required=True, help="HMAC key shared with the CRI shim")
    parser.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key", help="the certificate's private key (PEM)")
    parser.add_argument("--client-ca", help="require client certificates signed by this CA (PEM)")
    parser.add_argument("--policy", choices=POLICIES, default="binpack", help="node preference (default binpack)")
    parser.add_argument("--kube-api-qps", type=float, default=50.0, help="API requests a second (default 50)")
    parser.add_argument("--kube-api-burst", type=int, default=100, help="API request burst (default 100)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run)
    return parser
