"""`kubegpu top`: the devices of a live cluster, where they are free, who holds them and why pods wait.

It reads what the scheduler and the advertisers leave in the cluster and nothing else: each Node's inventory (the
`kubegpu.io/devices` annotation, or the labels the plugins fall back to), each bound pod's `kubegpu.io/allocation`,
and for pods without a node their scheduling gates (`spec.schedulingGates`, shown as kube-scheduler words them), else
the last `FailedScheduling` Event, or `WaitingForGang` for a gang member that holds a place and waits for the rest
of its gang (else their `PodScheduled` condition). `ClusterView`
feeds these into an `Engine` of its own, exactly as a restarting scheduler rebuilds its ledger, so the pictures are
the plugins' own `Occupancy` maps, drawn like the simulator's (`report.py`): a ring as a row, a torus as a grid,
cards and GPUs as cells; `#` held, `+` partly held, `.` free, `x` unhealthy, each holder in its own colour.

With `--allocation-key-file` only allocations whose signature verifies (and that name the pod's node and UID) are
drawn; the others are listed as not shown. Without it every allocation is drawn as its pod claims it, marked
unverified, and `top` says it cannot verify them; as nothing is verified, no claim displaces another (a self-made
`issued` stamp settles nothing): of two pods claiming one device the first seen is drawn, the other listed as not
shown naming it, and drawn once the first is gone.

Everything a tenant or a node wrote (reasons quoting annotations, Event messages, device ids, an allocation's node)
reaches the terminal as `safe_text` makes it (control characters escaped, bounded) and as `rich.text.Text`, never as
rich markup, so `[/]` cannot crash `top` nor `[blink]` style it, and no escape sequence reaches the terminal. So do the
API server's words when it refuses (or a proxy's in its place), and warnings are logfmt lines on stderr, as every
kubegpu process logs them.

The terminal lists at most `MAX_PENDING_ROWS` pending pods, after the reasons most of them wait for counted (when
there are more), and at most `MAX_PROBLEM_LINES` allocations not shown, then how many more: a redraw costs the same
for 30 pending pods or 50,000, and the node maps stay on screen. Each node's picture is kept from one redraw to the
next (`report.NodeViews`) and drawn again only when the engine says the node changed: a redraw of 5,000 nodes after
one pod left takes 0.06 s, where describing every node took a second.

`--watch` lists and watches Nodes, Pods and Events with the scheduler's informers and redraws in place (rich's
`Live`) as soon as a change arrives; `--json` prints one document (a line per change with `--watch`); `--html FILE`
writes the HTML report (`html.py`), rewritten on every change with `--watch`.
"""

from __future__ import annotations

import argparse
import logging
import queue
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from kubegpu.core.annotations import ALLOCATION_KEY, AnnotationError, decode_allocation, verifying_key
from kubegpu.core.errors import InputError, shorten
from kubegpu.core.manifests import bound_pod_request, node_info, pod_request
from kubegpu.core.plugin_manager import KubegpuPluginManager, make_plugin_manager
from kubegpu.core.process import LogfmtFormatter, add_verify_key_argument
from kubegpu.core.text import safe_text
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.gates import gated_reason
from kubegpu.scheduler.report import (
    LEGEND,
    NodeView,
    NodeViews,
    PendingPod,
    Report,
    build_report,
    cell_label,
    cell_state,
    grid_rows,
    report_json,
    shape_name,
    shares_by_holder,
)

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from kubegpu.kube.client import KubeClient

__all__ = ["ClusterView", "add_top_parser", "render_terminal", "run"]

FINISHED = frozenset({"Succeeded", "Failed"})
MAX_NODES = 40  # node maps drawn in the terminal; --node, --json and --html show any node
# Pending pods, their reasons counted, and not-shown lines drawn in the terminal: a screen shows a few dozen lines,
# and drawing 10,000 pending pods took rich 2 s per redraw (`--watch` redraws on every change); --json lists every
# one.
MAX_PENDING_ROWS = 30
MAX_REASON_ROWS = 8
MAX_PROBLEM_LINES = 20
MIN_REASON_COLUMN = 32  # characters the pending pods' reasons keep, whatever the length of a pod's key
NODES, PODS, EVENTS = "/api/v1/nodes", "/api/v1/pods", "/api/v1/events"


@dataclass(slots=True)
class _Waiting:
    uid: str
    scheduler: str
    condition: str | None
    gates: tuple[str, ...] = ()


class ClusterView:
    """The cluster's devices as kubegpu sees them, kept current from list and watch events (one thread only)."""

    def __init__(
        self,
        plugins: KubegpuPluginManager,
        key: bytes | None,
        *,
        source: str = "cluster",
        verify_keys: Sequence[bytes] = (),
    ) -> None:
        self.engine = Engine(plugins)
        self.key = key
        self.keys = (key, *verify_keys) if key is not None else ()  # the key file's, then --allocation-verify-key-file
        self.source = source
        self.waiting: dict[str, _Waiting] = {}
        self.bound: dict[str, tuple[str, str, str | None]] = {}  # key -> (uid, node, allocation text) drawn
        self.failures: dict[str, tuple[int, str, str]] = {}  # pod key -> (resourceVersion, uid, message)
        self.unverified: dict[str, str] = {}
        self.hidden: dict[str, str] = {}  # allocations not drawn, and why
        self.contested: dict[str, dict[str, Any]] = {}  # without a key: pods whose claim another pod's claim blocks
        self.early: dict[str, dict[str, dict[str, Any]]] = {}  # node -> pods bound to it, seen before the node
        self.views = NodeViews()  # each node's picture, drawn again only when the node changed

    # -- nodes ------------------------------------------------------------------------------------------------

    def sync_nodes(self, items: list[dict[str, Any]]) -> None:
        seen = set()
        for obj in items:
            self.apply_node("ADDED", obj)
            seen.add((obj.get("metadata") or {}).get("name"))
        for name in [n for n in self.engine.node_names() if n not in seen]:
            self._forget_node(name)

    def apply_node(self, kind: str, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        if kind == "DELETED":
            self._forget_node(name)
            return
        try:
            info = node_info(obj)
        except InputError as exc:
            self.hidden[f"node {name}"] = f"inventory ignored: {exc}"
            annotations = dict((obj.get("metadata") or {}).get("annotations") or {})
            annotations.pop("kubegpu.io/devices", None)
            try:
                info = node_info({**obj, "metadata": {**obj["metadata"], "annotations": annotations}})
            except (InputError, KeyError):
                return
        else:
            self.hidden.pop(f"node {name}", None)
        if self.engine.node_info(name) != info:
            # add_node keeps the pods already drawn on a changed node; pods seen before their node are drawn now.
            self.engine.add_node(info)
            for obj in self.early.pop(name, {}).values():
                self.apply_pod("ADDED", obj)

    def _forget_node(self, name: str) -> None:
        self.hidden.pop(f"node {name}", None)
        for key in self.engine.remove_node(name):
            self.bound.pop(key, None)

    # -- pods -------------------------------------------------------------------------------------------------

    def sync_pods(self, items: list[dict[str, Any]]) -> None:
        live = set()
        for obj in items:
            self.apply_pod("ADDED", obj)
            live.add(_key(obj))
        for key in [k for k in {*self.bound, *self.waiting} if k not in live]:
            self._forget_pod(key)

    def apply_pod(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = _key(obj)
        phase = (obj.get("status") or {}).get("phase")
        if kind == "DELETED" or phase in FINISHED:
            self._forget_pod(key)
            self.failures.pop(key, None)  # kept for a pod that waits; an Event coming later is dropped with it
            return
        spec = obj.get("spec") or {}
        node = spec.get("nodeName")
        uid = str(meta.get("uid", ""))
        if not node:
            self._forget_pod(key)
            if meta.get("deletionTimestamp"):
                return
            conditions = (obj.get("status") or {}).get("conditions") or []
            unscheduled = [c for c in conditions if c.get("type") == "PodScheduled" and c.get("status") == "False"]
            condition = unscheduled[0].get("message") if unscheduled else None
            gates = spec.get("schedulingGates")
            names = tuple(
                str(gate.get("name")) for gate in (gates if isinstance(gates, list) else []) if isinstance(gate, dict)
            )
            scheduler = str(spec.get("schedulerName") or "default-scheduler")
            self.waiting[key] = _Waiting(uid, scheduler, condition, names)
            return
        text = (meta.get("annotations") or {}).get(ALLOCATION_KEY)
        if self.bound.get(key) == (uid, node, text) and key in self.engine.pod_keys():
            return
        self._forget_pod(key)
        if node not in self.engine.node_names():
            self.early.setdefault(node, {})[key] = obj
            return
        self.bound[key] = (uid, node, text)
        try:
            request, _ = pod_request(obj, self.engine.plugins.qualifiers)
        except InputError as exc:
            try:  # what it holds is shown all the same, as the scheduler counts it (`bound_pod_request`)
                request, _, _ = bound_pod_request(obj, self.engine.plugins.qualifiers)
            except InputError:
                self.hidden[key] = f"pod not readable: {exc}"
                return
        record = None
        if text is None:
            if any(self.engine.plugins.owner_of(r) for r in request.requested_resources()):
                self.hidden[key] = "bound without a kubegpu.io/allocation: which devices it holds is unknown"
        else:
            try:
                record = decode_allocation(text)
            except AnnotationError as exc:
                self.hidden[key] = f"allocation not shown: {exc}"
            else:
                if record.node != node or record.podUID != uid:
                    self.hidden[key] = f"allocation not shown: it names node {shorten(record.node)} and another pod UID"
                    record = None
                elif self.key is None:
                    self.unverified[key] = "no --allocation-key-file to check its signature"
                elif verifying_key(record, self.keys) is None:
                    files = "the key file" if len(self.keys) == 1 else "any of the key files"
                    self.hidden[key] = f"allocation not shown: its signature does not verify with {files}"
                    record = None
        status = self.engine.admit_bound(request, node, record)
        if not status.ok and record is not None:
            self.hidden[key] = f"allocation not shown: {status.message}"
            self.unverified.pop(key, None)
            self.engine.admit_bound(request, node, None)
            if self.key is None:
                self.contested[key] = obj  # drawn when the pod drawn in its place leaves

    def _forget_pod(self, key: str) -> None:
        for early in self.early.values():
            early.pop(key, None)
        self.waiting.pop(key, None)
        self.unverified.pop(key, None)
        self.hidden.pop(key, None)
        self.contested.pop(key, None)
        bound = self.bound.pop(key, None)
        if bound is not None:
            self.engine.release(key)
            self._retry_contested(bound[1])

    def _retry_contested(self, node: str) -> None:
        """Draw again the claims on `node` that a claim now gone may have blocked (no key: neither was verified)."""
        for key in [k for k, obj in self.contested.items() if obj["spec"].get("nodeName") == node]:
            obj = self.contested.pop(key)
            if self.bound.pop(key, None) is not None:
                self.engine.release(key)
            self.apply_pod("MODIFIED", obj)

    # -- events -----------------------------------------------------------------------------------------------

    def sync_events(self, items: list[dict[str, Any]]) -> None:
        self.failures.clear()
        for obj in items:
            self.apply_event("ADDED", obj)

    def apply_event(self, kind: str, obj: dict[str, Any]) -> None:
        """Keep a pod's latest FailedScheduling message until its pod is deleted, or that Event is while no pod of
        its name waits (an Event lives an hour): kept for every pod name that ever failed, a long `--watch` grew
        without bound. A gang member waiting at Permit for the rest of its gang is told so by a Normal
        `WaitingForGang` Event, neither a failure nor a condition: the newer of the two is why the pod waits."""
        if obj.get("reason") not in ("FailedScheduling", "WaitingForGang"):
            return
        involved = obj.get("involvedObject") or {}
        if involved.get("kind", "Pod") != "Pod":
            return
        key = f"{involved.get('namespace') or 'default'}/{involved.get('name')}"
        try:
            version = int((obj.get("metadata") or {}).get("resourceVersion") or 0)
        except ValueError:
            version = 0
        known = self.failures.get(key)
        if kind == "DELETED":
            if known is not None and known[0] == version and key not in self.waiting:
                del self.failures[key]
        elif known is None or version >= known[0]:
            self.failures[key] = (version, str(involved.get("uid") or ""), str(obj.get("message") or ""))

    # -- the snapshot -----------------------------------------------------------------------------------------

    def reason(self, key: str, waiting: _Waiting) -> str:
        """Why pod `key` waits: its scheduling gates, else its latest FailedScheduling (or WaitingForGang) Event, else
        its PodScheduled condition (text anyone with access to the namespace may have written: escaped and bounded)."""
        if waiting.gates:  # no scheduler tries a gated pod: an older failure is not why it waits now
            return safe_text(gated_reason(waiting.gates))
        failure = self.failures.get(key)
        if failure is not None and (not failure[1] or failure[1] == waiting.uid):
            return safe_text(failure[2])
        if waiting.condition:
            return safe_text(waiting.condition)
        return f"waiting for scheduler {safe_text(waiting.scheduler)} (no FailedScheduling event yet)"

    def report(self, only: str | None = None) -> Report:
        pending = [PendingPod(key, self.reason(key, w)) for key, w in sorted(self.waiting.items())]
        verification = "verified with the key file" if self.key is not None else "not verified (no key file)"
        return build_report(
            self.engine,
            title="cluster devices",
            source=f"kubegpu top {self.source} · allocations {verification}",
            pending=pending,
            counts={"bound pods": len(self.bound)},
            unverified=self.unverified,
            problems=[safe_text(f"{what}: {why}") for what, why in sorted(self.hidden.items())],
            only=only,
            verified=self.key is not None,
            memo=self.views,
        )


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


# ---------------------------------------------------------------------------------------------------------------
# The terminal
# ---------------------------------------------------------------------------------------------------------------


def _node_panel(node: NodeView, unverified: dict[str, str]) -> RenderableType:
    from rich.panel import Panel
    from rich.text import Text

    text = Text()
    for number, picture in enumerate(node.pictures):
        if number:
            text.append("\n")
        family = safe_text(picture.family)  # a plugin's word: a buggy plugin's too
        text.append(f"{family} · {shape_name(picture)} · {picture.free}/{picture.total} free", style="dim")
        width = max(4, max((len(cell_label(c)) for c in picture.cells), default=3) + 1)
        for row in grid_rows(picture):
            text.append("\n")
            for cell in row:
                state = cell_state(cell)
                label = cell_label(cell).rjust(width)
                if state == "unhealthy":
                    style = "bold red"
                elif state == "free":
                    style = "dim"
                else:
                    colour = node.colours.get(cell.holders[0], "white") if cell.holders else "white"
                    style = f"bold {colour}" if state == "held" else colour
                text.append(label, style=style)
    parts = shares_by_holder(node.pictures)
    for pod, colour in node.colours.items():
        text.append("\n■ ", style=colour)
        text.append(safe_text(pod))
        if pod in unverified:
            text.append(" (unverified)", style="yellow")
        if pod in parts:
            text.append(f" · {parts[pod]}", style="dim")
    kind = f"{safe_text(node.instance_type)} · " if node.instance_type else ""
    # Text, never markup, everywhere: names, ids and reasons come from the cluster (`safe_text` escapes the rest).
    title = Text.assemble((safe_text(node.name), "bold"), f" {kind}{node.pods} pod{'s' if node.pods != 1 else ''}")
    return Panel(text, title=title, title_align="left", expand=False)


def render_terminal(report: Report, *, max_nodes: int = MAX_NODES) -> RenderableType:
    """The terminal picture of a report: summary, device families, node maps, pending pods, what is not shown."""
    from rich.columns import Columns
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    in_use = sum(f.used for f in report.families)
    parts: list[RenderableType] = [
        Text.assemble(
            ("kubegpu top", "bold"),
            f" · {time.strftime('%H:%M:%S')} · {report.nodes_total} nodes, {report.devices} devices, "
            f"{in_use} in use, {len(report.pending)} pending · {LEGEND}",
        ),
        Text(safe_text(report.source), style="dim"),
    ]
    if not report.verified:
        parts.append(
            Text(
                "cannot verify allocations without --allocation-key-file: each is drawn as its pod claims it, and of "
                "two claims on one device the first seen is drawn, the other listed below",
                style="yellow",
            )
        )
    if report.families:
        families = Table(box=None, pad_edge=False, header_style="bold")
        for column in ("FAMILY", "DEVICES", "IN USE", "UTIL", "FREE", "STRANDED"):
            families.add_column(column, justify="left" if column == "FAMILY" else "right")
        for f in report.families:
            numbers = (str(f.total), str(f.used), f"{f.utilisation:.0%}", str(f.free), str(f.stranded))
            families.add_row(Text(safe_text(f.family)), *numbers)
        parts.append(families)
    unverified = dict(report.unverified)
    panels = [_node_panel(node, unverified) for node in report.nodes[:max_nodes]]
    if panels:
        parts.append(Columns(panels))
    if len(report.nodes) > max_nodes:
        parts.append(
            Text(f"… {len(report.nodes) - max_nodes} more nodes with devices (--node NAME, --json or --html show them)")
        )
    if len(report.pending) > MAX_PENDING_ROWS:
        parts.append(_reasons_counted(report.pending))
    if report.pending:
        pending = Table(box=None, pad_edge=False, header_style="bold", title_justify="left")
        # A pod's key may be 317 characters (a 63-character namespace, a 253-character name): kept on one line, its
        # column took the whole width and no pod's reason was shown. It folds where the reasons need the room.
        pending.add_column("PENDING POD", overflow="fold")
        pending.add_column("REASON", overflow="fold", min_width=MIN_REASON_COLUMN)
        for pod in report.pending[:MAX_PENDING_ROWS]:
            pending.add_row(Text(safe_text(pod.pod)), Text(safe_text(pod.reason)))
        parts.append(pending)
        if len(report.pending) > MAX_PENDING_ROWS:
            more = len(report.pending) - MAX_PENDING_ROWS
            parts.append(Text(f"… {more} more pending pods (--json lists every one)"))
    for problem in report.problems[:MAX_PROBLEM_LINES]:
        parts.append(Text(f"not shown: {safe_text(problem)}", style="yellow"))
    if len(report.problems) > MAX_PROBLEM_LINES:
        more = len(report.problems) - MAX_PROBLEM_LINES
        parts.append(Text(f"… {more} more not shown (--json lists every one)", style="yellow"))
    return Group(*parts)


def _reasons_counted(pending: Sequence[PendingPod]) -> RenderableType:
    """The reasons most pending pods wait for, with how many wait for each: of more pods than the terminal lists,
    what the first rows by name show says little about the rest."""
    from rich.table import Table
    from rich.text import Text

    reasons = Counter(pod.reason for pod in pending)
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("PODS", justify="right")
    table.add_column("WAIT FOR", overflow="fold", min_width=MIN_REASON_COLUMN)
    for reason, count in reasons.most_common(MAX_REASON_ROWS):
        table.add_row(str(count), Text(safe_text(reason)))
    if len(reasons) > MAX_REASON_ROWS:
        others = sum(count for _, count in reasons.most_common()[MAX_REASON_ROWS:])
        table.add_row(str(others), Text(f"{len(reasons) - MAX_REASON_ROWS} other reasons"))
    return table


# ---------------------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------------------


def _emit(view: ClusterView, args: argparse.Namespace) -> Report:
    report = view.report(args.node)
    if args.html:
        from kubegpu.scheduler.html import write_html

        write_html(report, args.html)
    return report


def _once(view: ClusterView, client: KubeClient, args: argparse.Namespace, console: Console) -> int:
    view.sync_nodes(client.list(NODES)[0])
    view.sync_pods(client.list(PODS)[0])
    view.sync_events(client.list(EVENTS)[0])
    if args.node and args.node not in view.engine.node_names():
        print(f"kubegpu top: node {args.node} not found", file=sys.stderr)
        return 1
    report = _emit(view, args)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(report_json(report), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        console.print(render_terminal(report))
    return 0


def _watch(view: ClusterView, client: KubeClient, args: argparse.Namespace, console: Console) -> int:
    from rich.live import Live
    from rich.text import Text

    from kubegpu.kube.client import Informer

    changes: queue.Queue[tuple[str, str, Any]] = queue.Queue()
    stop = threading.Event()

    def consumer(what: str) -> Callable[[str, Any], None]:
        return lambda kind, payload: changes.put((what, kind, payload))

    informers = [
        Informer(client, path, consumer(what), stop, what)
        for what, path in (("nodes", NODES), ("pods", PODS), ("events", EVENTS))
    ]
    apply = {
        "nodes": (view.sync_nodes, view.apply_node),
        "pods": (view.sync_pods, view.apply_pod),
        "events": (view.sync_events, view.apply_event),
    }
    for informer in informers:
        informer.start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    live = None if args.json else Live(Text("listing nodes, pods and events…"), console=console, auto_refresh=False)
    try:
        if live is not None:
            live.start()
        while not stop.is_set():
            try:
                item = changes.get(timeout=0.2)
            except queue.Empty:
                continue
            while True:
                what, kind, payload = item
                sync, one = apply[what]
                if kind == "SYNC":
                    sync(payload)
                else:
                    one(kind, payload)
                try:
                    item = changes.get_nowait()
                except queue.Empty:
                    break
            if not all(i.synced.is_set() for i in informers):
                continue
            report = _emit(view, args)
            if live is None:
                sys.stdout.buffer.write(orjson.dumps(report_json(report)) + b"\n")
                sys.stdout.flush()
            else:
                live.update(render_terminal(report), refresh=True)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        if live is not None:
            live.stop()
    return 0


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from kubegpu.core.process import read_key, read_verify_keys
    from kubegpu.kube.client import ApiError, KubeClient

    _log_to_stderr()
    key = read_key(args.allocation_key_file) if args.allocation_key_file else None
    if args.allocation_verify_key_file and key is None:
        raise SystemExit("kubegpu top: --allocation-verify-key-file needs --allocation-key-file")
    verify_keys = read_verify_keys(args.allocation_verify_key_file, key) if key is not None else ()
    client = KubeClient.from_kubeconfig(args.kubeconfig)
    plugins = make_plugin_manager("scheduler")
    view = ClusterView(plugins, key, source=client.host, verify_keys=verify_keys)
    console = Console()
    try:
        return _watch(view, client, args, console) if args.watch else _once(view, client, args, console)
    except ApiError as exc:  # the server's words (or a proxy's in its place): shown as any text top did not write
        print(f"kubegpu top: {safe_text(str(exc))}", file=sys.stderr)
        return 1


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """The standard error as it is at each record: rich's `Live` replaces it while it redraws, to print a line above
    the picture rather than through it."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def _log_to_stderr() -> None:
    """Warnings (an informer refused, a plugin failing or slow) as the other kubegpu processes log them: logfmt lines,
    the server's and the plugins' words escaped and bounded. Unconfigured, Python printed them as they were, so a
    message could forge a line of its own or reach the terminal with its escape sequences."""
    handler = _Stderr(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)


def add_top_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "top",
        help="show the devices of a live cluster: free, held (by which pod), unhealthy; pending pods and why",
        description="Draw every node's devices from the live cluster (node inventories, pod allocations) with the "
        "pods holding them, and the pending pods with their last scheduling failure.",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster credentials)")
    parser.add_argument("--node", metavar="NAME", help="show only this node")
    parser.add_argument("--watch", action="store_true", help="keep watching and redraw on every change")
    parser.add_argument("--json", action="store_true", help="print JSON (one line per change with --watch)")
    parser.add_argument("--html", metavar="FILE", help="write the HTML report to FILE (on every change with --watch)")
    parser.add_argument(
        "--allocation-key-file",
        metavar="PATH",
        help="the scheduler's HMAC key: draw only allocations whose signature verifies (without it, all are marked "
        "unverified)",
    )
    add_verify_key_argument(parser)
    parser.set_defaults(func=run)
    return parser
