"""`kubegpu simulate`: the embedded simulator, the default way to run kubegpu with no cluster.

It reads Kubernetes Node and Pod manifests (YAML, multi-document; or JSON: one object, a `List`, or JSON lines), adds
every Node first, then processes the Pods in document order with the same engine and plugins as the custom scheduler
and the extender. A Pod whose `metadata.deletionTimestamp` is set (or whose phase is Succeeded/Failed) deletes the
earlier pod of that namespace/name and releases its devices; a Pod with `spec.nodeName` is placed on that node.

`--json` prints one object per pod document, in order (the public contract):
`{"pod", "event": "scheduled"|"unschedulable"|"deleted", "node", "reason", "devices", "annotations"}`, where
`devices` equals the `containers` of the `kubegpu.io/allocation` annotation. Without `--json` it prints a report:
placements, per-node device occupancy maps and a summary. Invalid input exits with status 2 and a message naming the
document and field, before anything is scheduled; unschedulable pods are not an error.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
import yaml

from kubegpu.core.errors import InputError
from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import NodeInfo, PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.scheduler.engine import POLICIES, Decision, Engine
from kubegpu.scheduler.report import draw_text

__all__ = ["SimulationError", "add_simulate_parser", "load_documents", "run"]

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
MAX_MAPS = 40

try:
    _YamlLoader: Any = yaml.CSafeLoader
except AttributeError:  # PyYAML built without libyaml
    _YamlLoader = yaml.SafeLoader


class SimulationError(InputError):
    """Invalid simulator input; the message names the file, the document and the field."""


@dataclass(frozen=True, slots=True)
class PodEvent:
    where: str
    request: PodRequest
    deleting: bool


def _read_documents(path: Path) -> Iterator[tuple[str, Any]]:
    """(label, document) pairs of one file; `label` is `file#N` (N counts documents from 1)."""
    try:
        text = path.read_text() if str(path) != "-" else sys.stdin.read()
    except OSError as exc:
        raise SimulationError(f"{path}: cannot read ({exc.strerror})") from None
    stripped = text.lstrip()
    documents: list[Any]
    if stripped.startswith(("{", "[")):
        try:
            documents = [orjson.loads(text)]
        except orjson.JSONDecodeError:
            documents = []
            for number, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    documents.append(orjson.loads(line))
                except orjson.JSONDecodeError as exc:
                    raise SimulationError(f"{path}: line {number}: not valid JSON ({exc})") from None
    else:
        try:
            documents = [d for d in yaml.load_all(text, Loader=_YamlLoader) if d is not None]
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            raise SimulationError(f"{path}:{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    number = 0
    for document in documents:
        items = document if isinstance(document, list) else [document]
        for item in items:
            if isinstance(item, dict) and item.get("kind") == "List":
                inner = item.get("items")
                if not isinstance(inner, list):
                    number += 1
                    raise SimulationError(f"{path}#{number}: items: a List needs an items array")
                for element in inner:
                    number += 1
                    yield f"{path}#{number}", element
            else:
                number += 1
                yield f"{path}#{number}", item


def load_documents(paths: list[Path]) -> tuple[list[NodeInfo], list[PodEvent]]:
    """Parse and validate every document up front, so bad input fails before anything is scheduled."""
    nodes: list[NodeInfo] = []
    pods: list[PodEvent] = []
    seen_nodes: set[str] = set()
    for path in paths:
        for label, document in _read_documents(path):
            if not isinstance(document, dict):
                raise SimulationError(f"{label}: expected a Node or Pod object, got {type(document).__name__}")
            kind = document.get("kind")
            try:
                if kind == "Node":
                    info = node_info(document)
                    if info.name in seen_nodes:
                        raise SimulationError(f"{label}: metadata.name: node {info.name!r} is defined twice")
                    seen_nodes.add(info.name)
                    nodes.append(info)
                elif kind == "Pod":
                    request, deleting = pod_request(document)
                    deleting = deleting or request.phase in FINISHED_PHASES
                    pods.append(PodEvent(label, request, deleting))
                else:
                    raise SimulationError(f"{label}: kind: expected Node, Pod or List, got {kind!r}")
            except SimulationError:
                raise
            except InputError as exc:
                raise SimulationError(f"{label}: {exc}") from None
    return nodes, pods


def _event(decision: Decision) -> dict[str, Any]:
    return {
        "pod": decision.pod,
        "event": "scheduled" if decision.scheduled else "unschedulable",
        "node": decision.node,
        "reason": decision.reason,
        "devices": decision.allocation.containers if decision.allocation is not None else {},
        "annotations": decision.annotations,
    }


def _process(engine: Engine, pods: list[PodEvent], latencies: list[float]) -> Iterator[dict[str, Any]]:
    clock = time.perf_counter
    live: set[str] = set()
    for event in pods:
        request = event.request
        started = clock()
        if event.deleting:
            released = engine.release(request.key)
            latencies.append(clock() - started)
            live.discard(request.key)
            yield {
                "pod": request.key,
                "event": "deleted",
                "node": released.node if released else None,
                "reason": None if released else "no scheduled pod of that name to delete",
                "devices": released.allocation.containers if released and released.allocation else {},
                "annotations": {},
            }
            continue
        if request.key in live:
            raise SimulationError(
                f"{event.where}: metadata.name: pod {request.key} is already scheduled; delete it first "
                "(a Pod document with metadata.deletionTimestamp)"
            )
        decision = engine.schedule(request)
        latencies.append(clock() - started)
        if decision.scheduled:
            live.add(request.key)
        yield _event(decision)


def _percentile(values: list[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _report(engine: Engine, events: list[dict[str, Any]], out: IO[str], elapsed: float) -> None:
    write = out.write
    placed = [e for e in events if e["event"] == "scheduled"]
    write(
        f"kubegpu simulate: {len(engine.nodes)} nodes, {len(events)} pod documents, "
        f"policy {engine.policy}, {elapsed:.2f}s\n\n"
    )
    write("PLACEMENTS\n")
    write(f"  {'POD':40} {'EVENT':14} {'NODE':24} DEVICES\n")
    for e in events:
        devices = "; ".join(
            f"{c}: " + ", ".join(f"{r.split('/')[-1]}={','.join(ids)}" for r, ids in res.items())
            for c, res in e["devices"].items()
        )
        write(f"  {e['pod']:40} {e['event']:14} {e['node'] or '-':24} {devices or '-'}\n")
    write("\nDEVICE OCCUPANCY\n")
    families: dict[str, Counter[str]] = {}
    fragmentation: Counter[str] = Counter()
    shown = 0
    busy = [n for n in engine.nodes if engine.nodes[n].states]
    for name in busy:
        pictures = engine.describe(name)
        for picture in pictures:
            tally = families.setdefault(picture.family, Counter())
            tally["total"] += picture.total
            tally["free"] += picture.free
            tally["used"] += sum(1 for c in picture.cells if c.used > 0)
            fragmentation[picture.family] += max(0, picture.free - picture.largest_fit)
        if pictures and shown < MAX_MAPS and (engine.nodes[name].pods or len(busy) <= MAX_MAPS):
            shown += 1
            write(f"  {name} ({len(engine.nodes[name].pods)} pods)\n")
            for picture in pictures:
                for line in draw_text(picture):
                    write(line + "\n")
    if len(busy) > shown:
        write(f"  ... {len(busy) - shown} more nodes with devices not drawn (use --json for every placement)\n")
    write("\nSUMMARY\n")
    write(
        f"  scheduled {len(placed)}, unschedulable {sum(1 for e in events if e['event'] == 'unschedulable')}, "
        f"deleted {sum(1 for e in events if e['event'] == 'deleted')}\n"
    )
    for family, tally in sorted(families.items()):
        total = tally["total"] or 1
        write(
            f"  {family}: {tally['used']}/{tally['total']} devices in use ({100 * tally['used'] / total:.0f}%), "
            f"{tally['free']} free, {fragmentation[family]} stranded (free but outside the largest request that "
            "still fits its node)\n"
        )
    reasons = Counter(e["reason"] for e in events if e["event"] == "unschedulable")
    if reasons:
        write("  unschedulable pods by reason:\n")
        for reason, count in reasons.most_common():
            write(f"    {count:5d}  {reason}\n")


def run(args: argparse.Namespace) -> int:
    try:
        nodes, pods = load_documents([Path(f) for f in args.files])
    except SimulationError as exc:
        print(f"kubegpu simulate: invalid input: {exc}", file=sys.stderr)
        return 2
    plugins = make_plugin_manager("scheduler")
    for failure in plugins.failures:
        print(f"kubegpu simulate: warning: {failure}", file=sys.stderr)
    engine = Engine(plugins, policy=args.policy)
    started = time.perf_counter()
    for info in nodes:
        engine.add_node(info)
    latencies: list[float] = []
    out = sys.stdout
    events: list[dict[str, Any]] = []
    try:
        if args.json:
            buffer = out.buffer
            chunk: list[bytes] = []
            for event in _process(engine, pods, latencies):
                if args.html:
                    events.append(event)
                chunk.append(orjson.dumps(event))
                if len(chunk) >= 1000:
                    buffer.write(b"\n".join(chunk) + b"\n")
                    chunk.clear()
            if chunk:
                buffer.write(b"\n".join(chunk) + b"\n")
            buffer.flush()
        else:
            events = list(_process(engine, pods, latencies))
    except SimulationError as exc:
        out.flush()
        print(f"kubegpu simulate: invalid input: {exc}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - started
    if not args.json:
        _report(engine, events, out, elapsed)
    if args.html:
        from kubegpu.scheduler.html import write_html
        from kubegpu.scheduler.report import simulation_report

        write_html(simulation_report(engine, events, args.files), args.html)
    if args.stats:
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(
            orjson.dumps(
                {
                    "nodes": len(nodes),
                    "pod_documents": len(pods),
                    "seconds": round(elapsed, 4),
                    "pods_per_second": round(len(pods) / elapsed, 1) if elapsed else None,
                    "p50_ms": round(_percentile(latencies, 0.50) * 1000, 4),
                    "p99_ms": round(_percentile(latencies, 0.99) * 1000, 4),
                    "peak_rss_mib": round(peak_kib / 1024, 1),
                }
            ).decode(),
            file=sys.stderr,
        )
    return 0


def add_simulate_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "simulate",
        help="schedule Node and Pod manifests offline with the real engine and plugins",
        description="Schedule Node and Pod manifests offline with the same engine and plugins as the scheduler. "
        "Nodes are added first; pods are processed in document order; a pod with metadata.deletionTimestamp "
        "deletes the earlier pod of that name.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML (multi-document) or JSON / JSON lines")
    parser.add_argument("--json", action="store_true", help="print one JSON object per pod document")
    parser.add_argument("--policy", choices=POLICIES, default="binpack", help="node preference (default binpack)")
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report of the devices to FILE")
    parser.add_argument(
        "--stats", action="store_true", help="print throughput, p50/p99 decision latency and peak memory to stderr"
    )
    parser.set_defaults(func=run)
    return parser
