"""What a device report shows, whoever draws it: the shared model behind `kubegpu simulate`, `kubegpu top` and the
HTML page.

A `Report` is a snapshot of one engine: every node with devices and the plugins' pictures of them (`Occupancy`:
cells, holders, topology and links), the pods still waiting with the reason they wait, and the utilisation and
stranded devices of each device family. The simulator builds one from its engine after the last pod document;
`kubegpu top` from an engine it feeds with the live cluster's Nodes and verified allocations. The text, terminal
and HTML renderers only read it, so the three answer "where are devices free, who holds them, why is this pod
pending" with the same numbers.

The glyphs of the text maps are the simulator's: `#` held, `+` partly held, `.` free, `x` unhealthy. Holders get a
colour per node from a fixed palette, in the order their first device appears, so two pods on one node never share
a colour (a pod holds devices on one node only). A device id is a node's word (a lying node may advertise anything):
the text maps show at most `MAX_CELL_ID_CHARS` characters of it, control characters escaped (`cell_label`).
"""

from __future__ import annotations

import colorsys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from kubegpu.core.errors import shorten
from kubegpu.core.models import DeviceCell, Occupancy
from kubegpu.core.text import safe_text
from kubegpu.scheduler.engine import Engine

__all__ = [
    "CellState",
    "CurveView",
    "FamilyUsage",
    "NodeView",
    "NodeViews",
    "PendingPod",
    "Report",
    "build_report",
    "cell_label",
    "cell_state",
    "draw_text",
    "holder_colours",
    "report_json",
    "share_percents",
    "shares_by_holder",
    "simulation_report",
]

CellState = Literal["held", "partly", "free", "unhealthy"]
MARKS: Mapping[CellState, str] = {"held": "#", "partly": "+", "free": ".", "unhealthy": "x"}
LEGEND = "# held, + partly held, . free, x unhealthy"
MAX_CELL_ID_CHARS = 12  # of a device id in a text map (real ids: "0".."15", "card3")
MAX_SHARED_LINES = 16  # shared devices listed under a text map, each with its sharers' parts
MAX_HOLDER_CHARS = 80  # of a pod's name in those lines
MAX_LISTED = 8  # sharers of one device, or shared devices of one pod, named in one line
# Twelve hues spaced for contrast, then the same hues darker: distinct colours for up to 24 holders on one node.
_HUES = (210, 30, 120, 0, 270, 180, 60, 330, 90, 240, 150, 300)


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node with devices: its name, instance type (when labelled), pods placed there and its device pictures."""

    name: str
    instance_type: str
    pods: int
    pictures: tuple[Occupancy, ...]
    colours: Mapping[str, str] = field(default_factory=dict)

    @property
    def devices(self) -> int:
        return sum(len(p.cells) for p in self.pictures)

    def holders(self) -> list[str]:
        """Every pod holding a device here, in the order of `colours` (first device first)."""
        return list(self.colours)


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A pod that has no node: its `namespace/name` and the last reason the scheduler gave (or why none did)."""

    pod: str
    reason: str


@dataclass(frozen=True, slots=True)
class FamilyUsage:
    """One device family over the cluster. `used` counts devices at least partly held; `held` sums how much of each
    device is held (a GPU 60 % shared counts 0.6), so that `utilisation` is the share of the family's capacity held,
    not of its devices touched; `stranded` the free devices outside the largest request that still fits their node."""

    family: str
    total: int
    used: int
    free: int
    stranded: int
    held: float = 0.0

    @property
    def utilisation(self) -> float:
        return self.held / self.total if self.total else 0.0


@dataclass(frozen=True, slots=True)
class DomainView:
    """One topology domain (a rack, an NVLink clique) as the gang reports draw it: its nodes and, per gang, how many
    of the gang's members run there."""

    level: str
    name: str
    nodes: int
    gangs: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class CurveView:
    """An allocation curve to draw (`kubegpu simulate --trace-...`): (arrived %, allocated %) points ascending, the
    allocated share at arrived 100 % (None when the pods never asked that much) and what the replay was."""

    points: tuple[tuple[int, float], ...]
    at_full: float | None
    caption: str
    unreached: str = "the pods never asked for all of the GPU capacity"  # said when `at_full` is None


@dataclass(frozen=True, slots=True)
class Report:
    """A snapshot to draw. `unverified` maps pods whose allocation is shown but could not be checked (or did not
    verify and is therefore not shown) to the reason; `counts` are the front-end's own tallies (scheduled, deleted);
    `verified` is False when the allocations drawn could not be verified at all (`kubegpu top` without a key)."""

    title: str
    source: str
    nodes: tuple[NodeView, ...]
    pending: tuple[PendingPod, ...]
    families: tuple[FamilyUsage, ...]
    nodes_total: int
    counts: Mapping[str, int] = field(default_factory=dict)
    unverified: Mapping[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    verified: bool = True
    domains: tuple[DomainView, ...] = ()  # the narrowest level's domains that hold gangs
    unplaced_gangs: tuple[PendingPod, ...] = ()  # gangs none of whose members holds a place, with why
    curve: CurveView | None = None  # a trace replay's allocation curve
    # DRA claims held by placed pods (the simulator's): (pod, claim, node, its devices as driver/pool/device).
    claims: tuple[tuple[str, str, str, tuple[str, ...]], ...] = ()

    @property
    def devices(self) -> int:
        return sum(n.devices for n in self.nodes)


def cell_state(cell: DeviceCell) -> CellState:
    if not cell.healthy:
        return "unhealthy"
    if cell.used >= 0.999:
        return "held"
    if cell.used > 0:
        return "partly"
    return "free"


def cell_label(cell: DeviceCell) -> str:
    """A device in a text map: its id (at most `MAX_CELL_ID_CHARS`, control characters escaped) and its state mark."""
    return f"{shorten(cell.id, MAX_CELL_ID_CHARS)}{MARKS[cell_state(cell)]}"


@lru_cache(maxsize=64)  # a node's holders take the same few dozen colours, on every redraw
def _colour(index: int) -> str:
    hue = _HUES[index % len(_HUES)]
    lightness = (0.50, 0.34, 0.66)[(index // len(_HUES)) % 3]
    red, green, blue = colorsys.hls_to_rgb(hue / 360, lightness, 0.62)
    return f"#{round(red * 255):02x}{round(green * 255):02x}{round(blue * 255):02x}"


def holder_colours(pictures: Iterable[Occupancy]) -> dict[str, str]:
    """A colour (`#rrggbb`) for every pod holding a device in `pictures`, distinct per node."""
    colours: dict[str, str] = {}
    for picture in pictures:
        for cell in picture.cells:
            for holder in cell.holders:
                if holder not in colours:
                    colours[holder] = _colour(len(colours))
    return colours


def grid_rows(picture: Occupancy) -> list[list[DeviceCell]]:
    """The cells row by row: a grid in rows of `columns`, anything else as one row."""
    columns = picture.columns if picture.layout == "grid" and picture.columns else len(picture.cells) or 1
    return [picture.cells[i : i + columns] for i in range(0, len(picture.cells), columns)]


def shape_name(picture: Occupancy) -> str:
    if picture.topology == "torus" and picture.columns:
        rows = -(-len(picture.cells) // picture.columns)
        return f"{rows}x{picture.columns} torus"
    if picture.topology in ("cube-mesh", "nvswitch"):
        return "NVLink cube-mesh" if picture.topology == "cube-mesh" else "NVSwitch"
    columns = picture.columns if picture.layout == "grid" and picture.columns else 0
    return {"ring": "ring", "grid": f"{columns}-wide grid", "cells": "cards"}[picture.layout]


def capacity_held(picture: Occupancy) -> float:
    """How many devices' worth of a picture is held: each device's used fraction, 0 to 1 (a GPU 60 % shared: 0.6)."""
    return sum(min(1.0, max(0.0, c.used)) for c in picture.cells)


def draw_text(picture: Occupancy) -> list[str]:
    """The simulator's plain-text map of one picture: a header line, then a line per row of cells, then a line per
    shared device naming each sharer's part (`DeviceCell.shares`; at most `MAX_SHARED_LINES`)."""
    width = max(4, max((len(cell_label(c)) for c in picture.cells), default=3) + 1)
    rows = grid_rows(picture)
    shape = {"ring": "ring", "grid": f"{picture.columns or len(picture.cells) or 1}-wide grid", "cells": "cards"}[
        picture.layout
    ]
    lines = [f"    {safe_text(picture.family)} ({shape}; {LEGEND})"]
    lines.extend("    " + "".join(cell_label(c).rjust(width) for c in row) for row in rows)
    shared = [c for c in picture.cells if c.shares]
    for cell in shared[:MAX_SHARED_LINES]:
        parts = [f"{safe_text(h, MAX_HOLDER_CHARS)} {part}%" for h, part in share_percents(cell.shares).items()]
        lines.append(f"      {shorten(cell.id, MAX_CELL_ID_CHARS)}: {_listed(parts)}")
    if len(shared) > MAX_SHARED_LINES:
        lines.append(f"      ... {len(shared) - MAX_SHARED_LINES} more shared")
    return lines


def share_percents(shares: Mapping[str, float]) -> dict[str, int]:
    """Each sharer's part of one device in whole percent, rounded so that the parts add up to their sum rounded
    (largest remainders first; ties by the order given): three sharers of a third each read 33 %, 33 % and 34 %
    against the device's 100 %, where rounding each alone read 33 % three times."""
    hundredths = {holder: max(0.0, part) * 100 for holder, part in shares.items()}
    percents = {holder: int(value) for holder, value in hundredths.items()}
    left = round(sum(hundredths.values())) - sum(percents.values())
    by_remainder = sorted(hundredths, key=lambda holder: hundredths[holder] - percents[holder], reverse=True)
    for holder in by_remainder[: max(0, left)]:
        percents[holder] += 1
    return percents


def shares_by_holder(pictures: Iterable[Occupancy]) -> dict[str, str]:
    """Per pod holding shares in `pictures`, what it holds of each device it shares, as `kubegpu top`'s legend says
    it: "nvidia 0 30%, 1 50%" (`DeviceCell.shares`; ids shortened, at most `MAX_LISTED` devices, then how many
    more)."""
    held: dict[str, dict[str, list[str]]] = {}
    for picture in pictures:
        for cell in picture.cells:
            for holder, part in share_percents(cell.shares).items():
                family = held.setdefault(holder, {}).setdefault(safe_text(picture.family, MAX_CELL_ID_CHARS), [])
                family.append(f"{shorten(cell.id, MAX_CELL_ID_CHARS)} {part}%")
    return {
        holder: _listed(
            [
                f"{family} {item}" if at == 0 else item
                for family, items in families.items()
                for at, item in enumerate(items)
            ]
        )
        for holder, families in held.items()
    }


def _listed(items: list[str]) -> str:
    """At most `MAX_LISTED` of `items`, comma-separated, then how many more."""
    more = f", +{len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return ", ".join(items[:MAX_LISTED]) + more


def _node_view(engine: Engine, name: str) -> NodeView | None:
    """Node `name` as reports draw it, or None when it is unknown or has no devices to draw."""
    info = engine.node_info(name)
    if info is None or not engine.has_devices(name):
        return None
    pictures = tuple(engine.describe(name))
    if not pictures:
        return None
    instance_type = info.labels.get("node.kubernetes.io/instance-type", "")
    return NodeView(name, instance_type, len(engine.holders(name)), pictures, holder_colours(pictures))


class NodeViews:
    """Each node's `NodeView`, kept from one report of an engine to the next, for a front-end that reports again
    and again (`kubegpu top --watch`, after every change): asking every plugin to describe every node took a second
    per redraw at 5,000 nodes, however few had changed.

    Key: the node's name, for one engine. Invalidated by the engine's change log (`Engine.changed_since`: a node
    added, replaced, used, freed or removed since the last report): those nodes are described again, and every node
    when the log no longer reaches back or the engine is another."""

    def __init__(self) -> None:
        self._engine: Engine | None = None
        self._generation = 0
        self._views: dict[str, NodeView | None] = {}

    def current(self, engine: Engine) -> dict[str, NodeView | None]:
        """Node name -> its view (None: nothing to draw) for every node `engine` knows, as of now."""
        changed = engine.changed_since(self._generation) if engine is self._engine else None
        if changed is None:
            self._views = {}
            changed = set(engine.node_names())
        for name in changed:
            if engine.node_info(name) is None:
                self._views.pop(name, None)
            else:
                self._views[name] = _node_view(engine, name)
        self._engine, self._generation = engine, engine.generation
        return self._views


def build_report(
    engine: Engine,
    *,
    title: str,
    source: str,
    pending: Iterable[PendingPod] = (),
    counts: Mapping[str, int] | None = None,
    unverified: Mapping[str, str] | None = None,
    problems: Iterable[str] = (),
    only: str | None = None,
    verified: bool = True,
    domains: Iterable[DomainView] = (),
    unplaced_gangs: Iterable[PendingPod] = (),
    curve: CurveView | None = None,
    memo: NodeViews | None = None,
) -> Report:
    """Snapshot `engine`: every node that has devices (or just node `only`), sorted by name, and the family totals
    over those nodes. `memo` keeps the nodes' views for the next report of the same engine (`NodeViews`)."""
    tallies: dict[str, list[int]] = {}
    held: dict[str, float] = {}
    if only is not None:
        found = _node_view(engine, only)
        views = [found] if found is not None else []
    elif memo is not None:
        known = memo.current(engine)
        views = [view for name in sorted(known) if (view := known[name]) is not None]
    else:
        views = [view for name in sorted(engine.node_names()) if (view := _node_view(engine, name)) is not None]
    for view in views:
        for picture in view.pictures:
            tally = tallies.setdefault(picture.family, [0, 0, 0, 0])
            tally[0] += picture.total
            tally[1] += sum(1 for c in picture.cells if c.used > 0)
            tally[2] += picture.free
            tally[3] += max(0, picture.free - picture.largest_fit)
            held[picture.family] = held.get(picture.family, 0.0) + capacity_held(picture)
    families = tuple(
        FamilyUsage(family, total, used, free, stranded, held[family])
        for family, (total, used, free, stranded) in sorted(tallies.items())
    )
    return Report(
        title=title,
        source=source,
        nodes=tuple(views),
        pending=tuple(pending),
        families=families,
        nodes_total=len(engine.node_names()),
        counts=dict(counts or {}),
        unverified=dict(unverified or {}),
        problems=tuple(problems),
        verified=verified,
        domains=tuple(domains),
        unplaced_gangs=tuple(unplaced_gangs),
        curve=curve,
    )


def report_json(report: Report) -> dict[str, Any]:
    """The report as one JSON-able document (`kubegpu top --json`)."""
    return {
        "title": report.title,
        "source": report.source,
        "nodes": [
            {
                "name": node.name,
                "instanceType": node.instance_type or None,
                "pods": node.pods,
                "devices": [
                    {
                        "family": picture.family,
                        "topology": picture.topology or picture.layout,
                        "total": picture.total,
                        "free": picture.free,
                        "largestFit": picture.largest_fit,
                        "cells": [
                            {
                                "id": c.id,
                                "state": cell_state(c),
                                "used": round(c.used, 4),
                                "holders": c.holders,
                                **({"shares": c.shares} if c.shares else {}),
                            }
                            for c in picture.cells
                        ],
                    }
                    for picture in node.pictures
                ],
            }
            for node in report.nodes
        ],
        "pending": [{"pod": p.pod, "reason": p.reason} for p in report.pending],
        "families": [
            {
                "family": f.family,
                "total": f.total,
                "used": f.used,
                "held": round(f.held, 4),
                "free": f.free,
                "stranded": f.stranded,
            }
            for f in report.families
        ],
        "verified": report.verified,
        "unverified": dict(report.unverified),
        "problems": list(report.problems),
        "counts": dict(report.counts),
        "nodesTotal": report.nodes_total,
    }


MAX_DOMAINS = 256  # domains drawn; the rest are counted


def gang_domains(
    engine: Engine, events: Iterable[Mapping[str, Any]]
) -> tuple[tuple[DomainView, ...], tuple[PendingPod, ...]]:
    """The domains of the narrowest topology level (`Engine.topology_levels`; nodes with none) that hold gangs,
    with each gang's members there, and the gangs left unplaced with their reason, from the simulator's events
    (a member's last event decides)."""
    last: dict[str, Mapping[str, Any]] = {}
    gang_of: dict[str, str] = {}
    for event in events:
        last[event["pod"]] = event
        if event.get("gang"):
            gang_of[event["pod"]] = str(event["gang"])
    if not gang_of:
        return (), ()
    levels = engine.topology_levels()
    level = levels[-1] if levels else "kubernetes.io/hostname"
    held: dict[str, Counter[str]] = {}
    unplaced: dict[str, str] = {}
    for pod, gang in gang_of.items():
        event = last[pod]
        placement = engine.placement(pod) if event["event"] == "scheduled" else None
        if placement is not None:
            info = engine.node_info(placement.node)
            labels = info.labels if info is not None else {}
            domain = placement.node if level == "kubernetes.io/hostname" else labels.get(level, "(none)")
            held.setdefault(domain, Counter())[gang] += 1
        elif event["event"] == "unschedulable":
            unplaced.setdefault(gang, str(event.get("reason") or "no place"))
    nodes: Counter[str] = Counter()
    if level != "kubernetes.io/hostname":
        for name in engine.node_names():
            info = engine.node_info(name)
            if info is not None:
                nodes[info.labels.get(level, "(none)")] += 1
    views = tuple(
        DomainView(level, domain, nodes.get(domain, 1), tuple(sorted(gangs.items())))
        for domain, gangs in sorted(held.items())[:MAX_DOMAINS]
    )
    placed = {gang for gangs in held.values() for gang in gangs}
    return views, tuple(PendingPod(gang, reason) for gang, reason in sorted(unplaced.items()) if gang not in placed)


def simulation_report(
    engine: Engine, events: Iterable[Mapping[str, Any]], files: Iterable[str], curve: CurveView | None = None
) -> Report:
    """The report after a simulation: `events` are the simulator's per-document events, in order (a pod's last
    event decides whether it is still pending); `curve` a trace replay's allocation curve."""
    events = list(events)
    last: dict[str, Mapping[str, Any]] = {}
    counts: Counter[str] = Counter()
    for event in events:
        last[event["pod"]] = event
        counts[event["event"]] += 1
    pending = [
        PendingPod(pod, str(event.get("reason") or "no node fits"))
        for pod, event in last.items()
        if event["event"] in ("unschedulable", "gated")
    ]
    events = list(events) if not isinstance(events, list) else events
    domains, unplaced = gang_domains(engine, events)
    claims = tuple(
        (
            pod,
            str(claim["name"]),
            str(event["node"]),
            tuple(f"{r['driver']}/{r['pool']}/{r['device']}" for r in claim["allocation"]["devices"]["results"]),
        )
        for pod, event in last.items()
        if event["event"] == "scheduled"
        for claim in (event.get("claims") or {}).values()
    )
    names = [safe_text(str(f)) for f in files]  # any bytes a file system allows: escaped (lone surrogates too)
    source = "kubegpu simulate " + " ".join(names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")
    report = build_report(
        engine,
        title="simulation of " + ", ".join(Path(n).name for n in names[:3]) + ("…" if len(names) > 3 else ""),
        source=f"{source}, policy {engine.policy}",
        pending=pending,
        counts={kind: counts[kind] for kind in ("scheduled", "unschedulable", "gated", "deleted")},
        domains=domains,
        unplaced_gangs=unplaced,
        curve=curve,
    )
    return replace(report, claims=claims)
