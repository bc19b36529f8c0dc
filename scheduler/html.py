"""The HTML device report: one self-contained page (inline CSS, SVG and a few lines of script, no external asset)
drawn from a `Report`, for `kubegpu simulate --html FILE` and `kubegpu top --html FILE`.

Each node gets an SVG picture per device family in its real topology, from the plugins' `Occupancy.topology` and
`links`: a torus as a grid with its wrap-around links, a ring as a row closed by an arc, an NVLink hybrid cube-mesh as
a cube whose faces carry the quads' diagonals, an NVSwitch machine as GPUs around a switch, cards side by side.
Every device is one `rect.dev` shape, coloured by its holder (the node's holder colours, see `report.py`); a partly
held device fills to its used fraction. Hovering a device names it, its state and its holders (a tooltip fed from
the shape's `data-tip`). Tables list the pending pods with their reasons and the utilisation and stranded devices
of each family; a filter box narrows the nodes by node or pod name. After a trace replay (`kubegpu simulate
--trace-nodes ... --trace-pods ...`) an SVG chart draws the allocation curve: GPU capacity allocated against GPU
capacity asked for, with the allocation at 100 % asked.

Everything that comes from a manifest or the cluster (node, pod and device names, reasons, labels, plugin names) is
shown as `safe_text` makes it (control characters, bidi overrides and line separators written as escapes, at most
`MAX_TEXT_CHARS` characters; a device id in its square at most `MAX_CELL_ID_CHARS`), then HTML-escaped, attributes
included, so a hostile name renders as text, in its order, and a node's 10,000-character device id costs a line.
Each list (pending pods, their reasons, allocations not shown, DRA claims, gangs not placed) shows at most
`MAX_ROWS` rows and says how many more there are: a trace of 100,000 pods, 90,000 of them refused, made a 41 MB
page of one collapsed table; `kubegpu top --json` lists every one. Pictures of the same shape share their link
paths (computed once per shape), and nodes off screen are left unrendered by the browser until scrolled to
(`content-visibility`), so a thousand-node report stays quick to write and to open.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from functools import lru_cache
from html import escape
from itertools import accumulate
from pathlib import Path

from kubegpu.core.errors import shorten
from kubegpu.core.models import DeviceCell, Occupancy
from kubegpu.core.text import safe_text
from kubegpu.scheduler.report import MAX_CELL_ID_CHARS, NodeView, Report, cell_state, shape_name, share_percents

__all__ = ["render_html", "write_html"]

SIZE = 34  # a device's square
PITCH = 56  # distance between neighbouring devices
MARGIN = 26  # room around the devices for wrap-around arcs and the switch
Point = tuple[float, float]
MAX_ROWS = 1000  # rows of one list; the others are counted

_STATE_WORDS = {"held": "held", "partly": "partly held", "free": "free", "unhealthy": "unhealthy"}


# ---------------------------------------------------------------------------------------------------------------
# Shapes: where each device sits and how the links run (computed once per shape)
# ---------------------------------------------------------------------------------------------------------------


@lru_cache(maxsize=256)
def _skeleton(
    topology: str, layout: str, columns: int, count: int, links: tuple[tuple[int, int], ...]
) -> tuple[tuple[Point, ...], str, str, str, float, float]:
    """(device centres, link path, wrap-around path, extra SVG, width, height) for one shape of picture."""
    extra = ""
    wraps: list[str] = []
    width: float
    height: float
    if topology == "cube-mesh" and count == 8:
        # Front face 0 1 / 2 3, back face 4 5 / 6 7 up and to the right: the cube of DGX-1's hybrid cube-mesh.
        face = ((0, 1), (1, 1), (0, 2), (1, 2))
        depth = (PITCH * 0.9, -PITCH * 0.75)
        size = PITCH * 1.7
        points = [(MARGIN + SIZE / 2 + c * size, MARGIN + (r - 1) * size + SIZE / 2 - depth[1]) for c, r in face]
        points += [(x + depth[0], y + depth[1]) for x, y in points]
    elif topology == "cube-mesh" and count == 4:
        size = PITCH * 1.5
        points = [
            (MARGIN + SIZE / 2 + c * size, MARGIN + SIZE / 2 + r * size) for c, r in ((0, 0), (1, 0), (0, 1), (1, 1))
        ]
    elif topology == "nvswitch":
        per_row = count if count <= 4 else -(-count // 2)
        rows = 1 if count <= 4 else 2
        gap = PITCH * 1.4
        points = [
            (MARGIN + SIZE / 2 + (i % per_row) * PITCH, MARGIN + SIZE / 2 + (i // per_row) * gap) for i in range(count)
        ]
        left = MARGIN - 6
        right = MARGIN + (per_row - 1) * PITCH + SIZE + 6
        bar_y = MARGIN + SIZE + (gap - SIZE) / 2 - 7 if rows == 2 else MARGIN + SIZE + 22
        extra = (
            f'<rect class="switch" x="{left:.0f}" y="{bar_y:.0f}" width="{right - left:.0f}" height="14" rx="3"/>'
            f'<text class="sw" x="{(left + right) / 2:.0f}" y="{bar_y + 10.5:.0f}">NVSwitch</text>'
        )
        spokes = []
        for x, y in points:
            edge = y + SIZE / 2 if y < bar_y else y - SIZE / 2
            target = bar_y if y < bar_y else bar_y + 14
            spokes.append(f"M{x:.0f} {edge:.0f}V{target:.0f}")
        links_path = "".join(spokes)
        width = right + MARGIN - 6
        height = max(p[1] for p in points) + SIZE / 2 + (MARGIN if rows == 2 else 40)
        return tuple(points), links_path, "", extra, width, height
    else:
        if layout == "grid" and columns:
            per_row = columns
        elif layout == "ring":
            per_row = count or 1
        else:
            per_row = min(count, 8) or 1
        points = [
            (MARGIN + SIZE / 2 + (i % per_row) * PITCH, MARGIN + SIZE / 2 + (i // per_row) * PITCH)
            for i in range(count)
        ]
    direct: list[str] = []
    for a, b in links:
        if not (0 <= a < count and 0 <= b < count):
            continue
        (x1, y1), (x2, y2) = points[a], points[b]
        if topology in ("torus", "ring") and abs(x1 - x2) + abs(y1 - y2) > PITCH * 1.01:
            wraps.append(_wrap_arc((x1, y1), (x2, y2), ring=topology == "ring"))
        else:
            direct.append(f"M{x1:.0f} {y1:.0f}L{x2:.0f} {y2:.0f}")
    width = max((p[0] for p in points), default=0) + SIZE / 2 + MARGIN
    height = max((p[1] for p in points), default=0) + SIZE / 2 + MARGIN
    if topology == "ring" and wraps:
        height += 8
    return tuple(points), "".join(direct), "".join(wraps), extra, width, height


def _wrap_arc(a: Point, b: Point, *, ring: bool) -> str:
    """A wrap-around link drawn outside the devices it joins: under a ring, over a torus row, left of a torus
    column."""
    (x1, y1), (x2, y2) = sorted((a, b))
    if y1 == y2:
        edge = y1 + SIZE / 2 if ring else y1 - SIZE / 2 + 4
        bend = edge + 26 if ring else edge - 22
        return f"M{x1:.0f} {edge:.0f}C{x1 - 30:.0f} {bend:.0f} {x2 + 30:.0f} {bend:.0f} {x2:.0f} {edge:.0f}"
    top, bottom = min(y1, y2), max(y1, y2)
    x = x1 - SIZE / 2 + 4
    return f"M{x:.0f} {top:.0f}C{x - 30:.0f} {top - 24:.0f} {x - 30:.0f} {bottom + 24:.0f} {x:.0f} {bottom:.0f}"


# ---------------------------------------------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------------------------------------------


def _device(
    cell: DeviceCell,
    point: Point,
    node: str,
    family: str,
    colours: dict[str, str],
    unverified: dict[str, str],
    quote: Callable[[str], str],
) -> str:
    state = cell_state(cell)
    x, y = point[0] - SIZE / 2, point[1] - SIZE / 2
    holders = cell.holders
    tip = f"{node} · {family} {cell.id}: {_STATE_WORDS[state]}"
    if state == "partly":
        tip += f" ({cell.used:.0%})"
    if holders:
        named = [f"{h} (unverified: {unverified[h]})" if h in unverified else h for h in holders]
        if cell.shares:
            percents = share_percents(cell.shares)
            named = [f"{n} {percents[h]}%" if h in percents else n for n, h in zip(named, holders, strict=True)]
        tip += " by " + ", ".join(named)
    fill = ""
    levels = ""
    if state == "held" and len(holders) == 1:
        fill = f' style="fill:{colours.get(holders[0], "#888")}"'
    elif holders and state in ("held", "partly"):
        # Fill up to the used fraction, one band per holder: as tall as its share where the plugin says it, else
        # the holders alike.
        height = SIZE * min(1.0, cell.used)
        parts = [cell.shares.get(h, 0.0) for h in holders] if cell.shares else [1.0] * len(holders)
        whole = sum(parts) or 1.0
        bands = [height * part / whole for part in parts]
        tops = [y + SIZE - height + below for below in accumulate(bands[:-1], initial=0.0)]  # one pass, any holders
        levels = "".join(
            f'<rect class="lvl" x="{x:.0f}" y="{top:.1f}" width="{SIZE}" height="{band:.1f}" '
            f'style="fill:{colours.get(h, "#888")}"/>'
            for h, top, band in zip(holders, tops, bands, strict=True)
            if band > 0
        )
    mark = ""
    if state == "unhealthy":
        mark = f'<path class="bad" d="M{x + 8:.0f} {y + 8:.0f}l18 18m0 -18l-18 18"/>'
    return (
        f'<rect class="dev {state}" x="{x:.0f}" y="{y:.0f}" width="{SIZE}" height="{SIZE}" rx="5"{fill} '
        f'data-tip="{quote(tip)}"/>{levels}{mark}'
        f'<text x="{point[0]:.0f}" y="{point[1] + 4:.0f}">{quote(shorten(cell.id, MAX_CELL_ID_CHARS))}</text>'
    )


def _picture(node: NodeView, picture: Occupancy, unverified: dict[str, str], quote: Callable[[str], str]) -> str:
    links = tuple((a, b) for a, b in picture.links)
    shape = _skeleton(picture.topology, picture.layout, picture.columns, len(picture.cells), links)
    points, links_path, wrap_path, extra, width, height = shape
    family = quote(picture.family)
    colours = dict(node.colours)
    parts = [
        f"<figure><figcaption>{family} · {quote(shape_name(picture))} · {picture.free}/{picture.total} free"
        f"{f' · {picture.free - picture.largest_fit} stranded' if picture.free > picture.largest_fit else ''}"
        f'</figcaption><svg class="map" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" '
        f'role="img" aria-label="{family} devices of {quote(node.name)}">',
        extra,
    ]
    if links_path:
        parts.append(f'<path class="link" d="{links_path}"/>')
    if wrap_path:
        parts.append(f'<path class="wrap" d="{wrap_path}"/>')
    name = node.name
    parts.extend(
        _device(cell, point, name, picture.family, colours, unverified, quote)
        for cell, point in zip(picture.cells, points, strict=False)
    )
    parts.append("</svg></figure>")
    return "".join(parts)


def _node(node: NodeView, unverified: dict[str, str], quote: Callable[[str], str]) -> str:
    holders = node.holders()
    search = escape(" ".join([node.name, *holders]).lower(), quote=True)  # not shown: never cut, finds any pod
    kind = f"{quote(node.instance_type)} · " if node.instance_type else ""
    pictures = "".join(_picture(node, p, unverified, quote) for p in node.pictures)
    legend = "".join(
        f'<li><i style="background:{colour}"></i>{quote(pod)}{" <b>unverified</b>" if pod in unverified else ""}</li>'
        for pod, colour in node.colours.items()
    )
    return (
        f'<article class="node" data-search="{search}"><h3>{quote(node.name)} '
        f"<small>{kind}{node.pods} pod{'s' if node.pods != 1 else ''}</small></h3>"
        f'<div class="pics">{pictures}</div>{f"<ul class=holders>{legend}</ul>" if legend else ""}</article>'
    )


# ---------------------------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------------------------


def _families(report: Report, quote: Callable[[str], str]) -> str:
    if not report.families:
        return "<p>No devices.</p>"
    rows = "".join(
        f"<tr><td>{quote(f.family)}</td><td>{f.total}</td><td>{f.used}</td>"
        f'<td><span class="bar"><span style="width:{100 * f.utilisation:.1f}%"></span></span> '
        f"{100 * f.utilisation:.0f}%</td><td>{f.free}</td><td>{f.stranded}</td></tr>"
        for f in report.families
    )
    return (
        "<table><thead><tr><th>family</th><th>devices</th><th>in use</th><th>utilisation</th><th>free</th>"
        '<th title="free devices outside the largest request that still fits their node">stranded</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>"
    )


def _claims(report: Report, quote: Callable[[str], str]) -> str:
    """DRA claims and the devices allocated to them, one row per claim (none: no section)."""
    if not report.claims:
        return ""
    rows = "".join(
        f"<tr><td>{quote(pod)}</td><td>{quote(claim)}</td><td>{quote(node)}</td><td>{quote(', '.join(found))}</td></tr>"
        for pod, claim, node, found in report.claims[:MAX_ROWS]
    )
    table = (
        "<table class=pods><thead><tr><th>pod</th><th>claim</th><th>node</th><th>devices</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>{_more(len(report.claims), 'claims')}"
    )
    if len(report.claims) > 50:
        table = f"<details><summary>every claim ({len(report.claims)})</summary>{table}</details>"
    return f'<section id="claims"><h2>DRA claims ({len(report.claims)})</h2>{table}</section>'


def _pending(report: Report, quote: Callable[[str], str]) -> str:
    if not report.pending:
        return "<p>No pod is waiting.</p>"
    reasons = Counter(p.reason for p in report.pending)
    summary = ""
    if len(reasons) < len(report.pending):  # some reason is shared: count pods per reason first
        ranked = reasons.most_common()
        counted = [f"<tr><td>{n}</td><td>{quote(r)}</td></tr>" for r, n in ranked[: 8 + MAX_ROWS]]
        head = "<table class=reasons><thead><tr><th>pods</th><th>reason</th></tr></thead><tbody>"
        summary = f"{head}{''.join(counted[:8])}</tbody></table>"
        if len(ranked) > 8:
            left = sum(n for _, n in ranked[8 + MAX_ROWS :])
            summary += (
                f"<details><summary>{len(ranked) - 8} more reasons</summary>"
                f"{head}{''.join(counted[8:])}</tbody></table>{_more(len(ranked) - 8, 'reasons', left)}</details>"
            )
    rows = "".join(f"<tr><td>{quote(p.pod)}</td><td>{quote(p.reason)}</td></tr>" for p in report.pending[:MAX_ROWS])
    table = (
        "<table class=pods><thead><tr><th>pod</th><th>reason</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>{_more(len(report.pending), 'pending pods')}"
    )
    if len(report.pending) > 50:
        table = f"<details><summary>the pending pods ({len(report.pending)})</summary>{table}</details>"
    return summary + table


def _unverified(report: Report, quote: Callable[[str], str]) -> str:
    if not report.unverified and not report.problems:
        return ""
    unverified = list(report.unverified.items())
    rows = "".join(f"<tr><td>{quote(pod)}</td><td>{quote(why)}</td></tr>" for pod, why in unverified[:MAX_ROWS])
    problems = "".join(f"<li>{quote(p)}</li>" for p in report.problems[:MAX_ROWS])
    return (
        '<section id="unverified"><h2>Allocations not verified</h2>'
        + (f"<table><thead><tr><th>pod</th><th>why</th></tr></thead><tbody>{rows}</tbody></table>" if rows else "")
        + _more(len(unverified), "unverified allocations")
        + (f"<ul>{problems}</ul>" if problems else "")
        + _more(len(report.problems), "allocations not shown")
        + "</section>"
    )


def _more(listed: int, what: str, pods: int | None = None) -> str:
    """After a list cut at `MAX_ROWS`: how many of its `listed` entries are left out (and the pods they count)."""
    if listed <= MAX_ROWS:
        return ""
    counted = f", {pods} pods" if pods is not None else ""
    return f'<p class="more">… {listed - MAX_ROWS} more {what}{counted} not listed here</p>'


_CSS = """
:root{--free:#f4f6f8;--line:#9aa5b1;--ink:#1f2933;--muted:#616e7c;--bad:#c62828}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--ink);
background:#fff}header{padding:18px 28px 8px;border-bottom:1px solid #e4e7eb}h1{font-size:20px;margin:0 0 2px}
h2{font-size:16px;margin:22px 0 8px}.src{color:var(--muted);margin:0}main{padding:0 28px 40px}
.stats{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0 4px}.stat{border:1px solid #e4e7eb;border-radius:8px;
padding:6px 14px}.stat b{display:block;font-size:20px}table{border-collapse:collapse;margin:4px 0 8px}
th,td{text-align:left;padding:4px 12px 4px 0;border-bottom:1px solid #eef0f2;vertical-align:top}
th{color:var(--muted);font-weight:600}td{overflow-wrap:anywhere}.pods td:first-child{white-space:nowrap}
.bar{display:inline-block;width:120px;height:10px;background:#e4e7eb;border-radius:5px;overflow:hidden;
vertical-align:middle}.bar span{display:block;height:100%;background:#3e7bd6}
.tools{display:flex;gap:18px;align-items:center;flex-wrap:wrap;margin:6px 0 12px}
#filter{padding:6px 10px;border:1px solid #cbd2d9;border-radius:6px;min-width:260px;font:inherit}
.legend{display:flex;gap:14px;color:var(--muted)}.legend i{display:inline-block;width:14px;height:14px;
border-radius:3px;border:1px solid var(--line);vertical-align:-2px;margin-right:4px}
.nodes{display:flex;flex-wrap:wrap;gap:14px}.node{border:1px solid #e4e7eb;border-radius:10px;padding:8px 12px;
content-visibility:auto;contain-intrinsic-size:auto 300px auto 260px}.node h3{font-size:14px;margin:0}
.node small{color:var(--muted);font-weight:400}.pics{display:flex;gap:12px;flex-wrap:wrap}
figure{margin:4px 0}figcaption{color:var(--muted);font-size:12px}
.holders{list-style:none;margin:2px 0 0;padding:0;font-size:12px;max-width:420px}.holders li{overflow-wrap:anywhere}
.holders i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:5px}
.holders b{color:var(--bad);font-weight:600}
svg.map text{font-size:11px;text-anchor:middle;pointer-events:none;fill:#1f2933}
.dev{stroke:#52606d;stroke-width:1;fill:var(--free);cursor:default}.dev.held{stroke:#1f2933}
.dev.unhealthy{fill:#d9d9d9;stroke:var(--bad)}.dev:hover{stroke-width:2.5}
.lvl,.bad{pointer-events:none}.bad{stroke:var(--bad);stroke-width:2}
.link{stroke:var(--line);stroke-width:2;fill:none}.wrap{stroke:var(--line);stroke-width:1.5;fill:none;
stroke-dasharray:4 3}.switch{fill:#52606d}svg.map text.sw{fill:#fff;font-size:9px}
svg.chart text{font-size:11px;fill:#616e7c}svg.chart .ytick{text-anchor:end}svg.chart .xtick,
svg.chart .xlabel{text-anchor:middle}svg.chart .ylabel{text-anchor:middle}.grid{stroke:#eef0f2}.axis{stroke:#9aa5b1;
fill:none}.ideal{stroke:#9aa5b1;stroke-dasharray:5 4;fill:none}.full{stroke:#cbd2d9;stroke-dasharray:2 3}
.alloc{stroke:#3e7bd6;stroke-width:2;fill:none}.at-full{fill:#c62828}.headline{font-weight:600;margin:4px 0}
#tip{position:fixed;z-index:10;max-width:420px;background:#1f2933;color:#fff;padding:5px 8px;border-radius:5px;
font-size:12px;pointer-events:none;overflow-wrap:anywhere}.more{color:var(--muted);margin:2px 0 8px}
"""

_SCRIPT = """
(function () {
  var tip = document.getElementById("tip");
  document.addEventListener("mouseover", function (e) {
    var t = e.target.closest ? e.target.closest("[data-tip]") : null;
    if (!t) { tip.hidden = true; return; }
    tip.textContent = t.getAttribute("data-tip");
    tip.hidden = false;
  });
  document.addEventListener("mousemove", function (e) {
    if (tip.hidden) return;
    var x = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 4);
    tip.style.left = x + "px";
    tip.style.top = (e.clientY + 16) + "px";
  });
  var filter = document.getElementById("filter");
  if (filter) filter.addEventListener("input", function () {
    var q = filter.value.trim().toLowerCase();
    var nodes = document.querySelectorAll("article.node");
    for (var i = 0; i < nodes.length; i++) {
      nodes[i].hidden = q !== "" && nodes[i].getAttribute("data-search").indexOf(q) < 0;
    }
  });
})();
"""


def _gangs(report: Report, quote: Callable[[str], str]) -> str:
    """The domains that hold gangs (racks, NVLink cliques) with their gangs, and the gangs left unplaced."""
    if not report.domains and not report.unplaced_gangs:
        return ""
    level = quote(report.domains[0].level) if report.domains else ""
    rows = "".join(
        f"<tr><td>{quote(d.name)}</td><td>{d.nodes}</td><td>"
        + ", ".join(f"{quote(gang)} ({count})" for gang, count in d.gangs)
        + "</td></tr>"
        for d in report.domains
    )
    table = (
        f"<table class=pods><thead><tr><th>{level}</th><th>nodes</th><th>gangs (members)</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )
    if not report.domains:  # no gang placed: no domains to list, only the gangs left out and why
        table = ""
    unplaced = "".join(
        f"<tr><td>{quote(g.pod)}</td><td>{quote(g.reason)}</td></tr>" for g in report.unplaced_gangs[:MAX_ROWS]
    )
    if unplaced:
        table += (
            "<h3>Gangs not placed</h3><table class=pods><thead><tr><th>gang</th><th>reason</th></tr></thead>"
            f"<tbody>{unplaced}</tbody></table>{_more(len(report.unplaced_gangs), 'gangs not placed')}"
        )
    title = f"Gangs by {level}" if level else "Gangs (none placed)"
    return f'<section id="gangs"><h2>{title}</h2>{table}</section>'


CHART_WIDTH, CHART_HEIGHT = 600, 320
_PLOT = (52.0, 16.0, 580.0, 284.0)  # left, top, right, bottom of the plotting area


def _curve(report: Report, quote: Callable[[str], str]) -> str:
    """A trace replay's allocation curve as an inline SVG chart: allocated share (y) against arrived share (x), the
    line where every pod would be placed dashed, the arrived 100 % mark with the allocation there."""
    curve = report.curve
    if curve is None or not curve.points:
        return ""
    left, top, right, bottom = _PLOT
    x_max = max(100, curve.points[-1][0])
    x_max = -(-x_max // 10) * 10

    def x(value: float) -> float:
        return left + (right - left) * value / x_max

    def y(value: float) -> float:
        return bottom - (bottom - top) * min(value, 100.0) / 100

    grid = []
    for value in range(0, 101, 20):
        grid.append(f'<path class="grid" d="M{left:.0f} {y(value):.1f}H{right:.0f}"/>')
        grid.append(f'<text class="ytick" x="{left - 6:.0f}" y="{y(value) + 4:.1f}">{value}%</text>')
    # At most about twenty labels however far the pods asked past the capacity: a timeline's asked share has no
    # ceiling (300 pods of 1024 GPUs on one GPU ask 30,720,000 %), and a label every 100 % made millions (T147).
    step = 10 if x_max <= 150 else 20 if x_max <= 300 else 50 if x_max <= 1000 else 100
    while x_max > 20 * step:
        step *= 5 if str(step)[0] == "2" else 2  # 100, 200, 1000, 2000, 10000, ...
    for value in range(0, x_max + 1, step):
        grid.append(f'<text class="xtick" x="{x(value):.1f}" y="{bottom + 16:.0f}">{value}%</text>')
    line = " ".join(f"{x(a):.1f},{y(v):.1f}" for a, v in curve.points)
    ideal = f"M{x(0):.1f} {y(0):.1f}L{x(100):.1f} {y(100):.1f}H{x(x_max):.1f}"
    full = ""
    headline = quote(curve.unreached)
    if curve.at_full is not None:
        headline = f"{curve.at_full:.1f}% of the GPU capacity allocated when the pods have asked for 100%"
        full = (
            f'<path class="full" d="M{x(100):.1f} {top:.0f}V{bottom:.0f}"/>'
            f'<circle class="at-full" cx="{x(100):.1f}" cy="{y(curve.at_full):.1f}" r="4">'
            f"<title>{curve.at_full:.1f}% allocated at 100% arrived</title></circle>"
        )
    return (
        f'<section id="curve"><h2>Allocation curve</h2><p class="src">{quote(curve.caption)}</p>'
        f'<p class="headline">{headline}</p>'
        f'<svg class="chart" width="{CHART_WIDTH}" height="{CHART_HEIGHT}" viewBox="0 0 {CHART_WIDTH} {CHART_HEIGHT}" '
        f'role="img" aria-label="GPU capacity allocated against GPU capacity asked for">'
        + "".join(grid)
        + f'<path class="axis" d="M{left:.0f} {top:.0f}V{bottom:.0f}H{right:.0f}"/>'
        f'<path class="ideal" d="{ideal}"><title>every pod placed</title></path>{full}'
        f'<polyline class="alloc" points="{line}" data-points="{len(curve.points)}"/>'
        f'<text class="xlabel" x="{(left + right) / 2:.0f}" y="{CHART_HEIGHT - 4}">GPU capacity asked for by the '
        "pods arrived</text>"
        f'<text class="ylabel" transform="translate(12 {(top + bottom) / 2:.0f}) rotate(-90)">allocated</text>'
        "</svg></section>"
    )


def render_html(report: Report, *, generated: float | None = None) -> str:
    """The whole page for `report`."""
    quote = _quoter()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(generated if generated is not None else time.time()))
    unverified = dict(report.unverified)
    in_use = sum(f.used for f in report.families)
    stats = [
        ("nodes", f"{report.nodes_total}"),
        ("nodes with devices", f"{len(report.nodes)}"),
        ("devices", f"{report.devices}"),
        ("in use", f"{in_use}"),
        ("pending pods", f"{len(report.pending)}"),
        *((quote(k), f"{v}") for k, v in report.counts.items()),
    ]
    nodes = "".join(_node(node, unverified, quote) for node in report.nodes)
    parts: Sequence[str] = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>kubegpu · {quote(report.title)}</title><style>{_CSS}</style></head>",
        f'<body data-devices="{report.devices}"><header><h1>kubegpu · {quote(report.title)}</h1>',
        f'<p class="src">{quote(report.source)} · {stamp}</p><div class="stats">',
        "".join(f'<div class="stat"><b>{v}</b>{k}</div>' for k, v in stats),
        "</div></header><main>",
        _curve(report, quote),
        f'<section id="families"><h2>Devices per family</h2>{_families(report, quote)}</section>',
        f'<section id="pending"><h2>Pending pods ({len(report.pending)})</h2>{_pending(report, quote)}</section>',
        _gangs(report, quote),
        _unverified(report, quote),
        _claims(report, quote),
        '<section id="nodes"><h2>Nodes</h2><div class="tools">',
        '<input id="filter" type="search" placeholder="filter by node or pod name" aria-label="filter nodes">',
        '<span class="legend"><span><i style="background:#3e7bd6"></i>held (colour per pod)</span>',
        '<span><i style="background:linear-gradient(#f4f6f8 50%,#3e7bd6 50%)"></i>partly held</span>',
        '<span><i></i>free</span><span><i style="background:#d9d9d9;border-color:#c62828"></i>unhealthy</span>',
        "<span>hover a device for its holder</span></span></div>",
        f'<div class="nodes">{nodes}</div></section></main>',
        f'<div id="tip" role="tooltip" hidden></div><script>{_SCRIPT}</script></body></html>\n',
    )
    return "".join(parts)


def _quoter() -> Callable[[str], str]:
    """Text to show: `safe_text` (escaped, at most `MAX_TEXT_CHARS`), then `html.escape` (quotes included),
    remembered for the names that repeat on every device of a node."""
    cache: dict[str, str] = {}

    def quote(text: str) -> str:
        done = cache.get(text)
        if done is None:
            done = escape(safe_text(text), quote=True)
            if len(cache) < 100_000:
                cache[text] = done
        return done

    return quote


def write_html(report: Report, path: str | Path) -> None:
    """Write the page atomically (a watcher reloading the file never sees half of it).

    The page is written to a new file of a random name next to the target (`tempfile.mkstemp`: created exclusively,
    so a link planted in a folder others may write to is never followed), then renamed over the target, which
    replaces a link planted there rather than writing through it. The page gets the mode a new file would (0666
    less the umask), not mkstemp's 0600."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = render_html(report)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), 0o666 & ~_umask())
            handle.write(text)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it: set, then restore at once
    os.umask(mask)
    return mask
