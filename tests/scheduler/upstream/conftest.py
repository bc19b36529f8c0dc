"""The upstream tables' report: after a run that collected them, how many of each kube-scheduler plugin's transcribed
rows kubegpu holds, which differ (strict xfail, the difference named), which are skipped, and which its module names
as not expressible (`NOT_EXPRESSIBLE`).

A row is one upstream test case (its id `TestX/case name`, less any `[xfail: ...]` note); a row run both against the
plugin alone and against the engine counts once, as its worst outcome. `KUBEGPU_UPSTREAM_REPORT=markdown` prints the
table as docs/framework.md holds it (`scripts/upstream_report.py` runs the tables that way).
"""

from __future__ import annotations

import importlib
import os
from collections import defaultdict

import pytest

# Each table module and the kube-scheduler plugin (or component) whose tests it transcribes.
PLUGINS = {
    "test_defaultpreemption": "DefaultPreemption",
    "test_generic_scheduler": "generic scheduler (core)",
    "test_imagelocality": "ImageLocality",
    "test_interpodaffinity_filtering": "InterPodAffinity",
    "test_interpodaffinity_scoring": "InterPodAffinity",
    "test_nodeaffinity": "NodeAffinity",
    "test_nodename": "NodeName",
    "test_nodeports": "NodePorts",
    "test_noderesources_balanced_allocation": "NodeResourcesBalancedAllocation",
    "test_noderesources_fit": "NodeResourcesFit",
    "test_noderesources_least_allocated": "NodeResourcesLeastAllocated",
    "test_noderesources_most_allocated": "NodeResourcesMostAllocated",
    "test_nodeunschedulable": "NodeUnschedulable",
    "test_podtopologyspread_filtering": "PodTopologySpread",
    "test_podtopologyspread_policies": "PodTopologySpread",
    "test_podtopologyspread_scoring": "PodTopologySpread",
    "test_tainttoleration": "TaintToleration",
    "test_volumebinding": "VolumeBinding",
}
RANK = {"held": 0, "skipped": 1, "xfail": 2, "failed": 3}
_rows: dict[tuple[str, str], str] = {}


def _row(item_id: str) -> tuple[str, str] | None:
    """(module, upstream case) of a test id `path/test_x.py::test_y[TestX/case [xfail: ...]]`; None for a test
    that is no upstream row (not parametrized by one)."""
    path, _, rest = item_id.partition("::")
    module = path.rsplit("/", 1)[-1].removesuffix(".py")
    if module not in PLUGINS or "[" not in rest:
        return None
    case = rest[rest.index("[") + 1 : -1]
    case = case.split(" [xfail:", 1)[0]
    return module, case


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    row = _row(report.nodeid)
    if row is None or (report.when != "call" and not (report.when == "setup" and report.skipped)):
        return
    if hasattr(report, "wasxfail"):
        outcome = "xfail" if report.skipped else "failed"  # a strict xfail that passed fails
    elif report.skipped:
        outcome = "skipped"
    elif report.failed:
        outcome = "failed"
    else:
        outcome = "held"
    if RANK[outcome] >= RANK[_rows.get(row, "held")]:
        _rows[row] = outcome


def table() -> list[tuple[str, int, int, int, int, int]]:
    """(plugin, held, strict xfail, skipped, not expressible, failed) per plugin, from the rows this run saw."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    modules = set()
    for (module, _), outcome in _rows.items():
        modules.add(module)
        column = {"held": 0, "xfail": 1, "skipped": 2, "failed": 4}[outcome]
        counts[PLUGINS[module]][column] += 1
    for module in modules:
        left_out = getattr(importlib.import_module(f"{__package__}.{module}"), "NOT_EXPRESSIBLE", {})
        counts[PLUGINS[module]][3] += len(left_out)
    return [(plugin, *values) for plugin, values in sorted(counts.items())]  # type: ignore[misc]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    rows = table()
    if not rows:
        return
    markdown = os.environ.get("KUBEGPU_UPSTREAM_REPORT") == "markdown"
    write = terminalreporter.write_line
    if markdown:
        write("| kube-scheduler plugin | held | differs (strict xfail) | skipped | not expressible |")
        write("|---|---|---|---|---|")
    else:
        terminalreporter.section("kube-scheduler 1.20's test tables, rows per plugin")
        write(f"{'plugin':34} {'held':>5} {'xfail':>6} {'skip':>5} {'n/e':>5} {'fail':>5}")
    totals = [0, 0, 0, 0, 0]
    for plugin, *values in rows:
        totals = [t + v for t, v in zip(totals, values, strict=True)]
        if markdown:
            write(f"| {plugin} | {values[0]} | {values[1]} | {values[2]} | {values[3]} |")
        else:
            write(f"{plugin:34} {values[0]:5} {values[1]:6} {values[2]:5} {values[3]:5} {values[4]:5}")
    if markdown:
        write(f"| **all** | **{totals[0]}** | **{totals[1]}** | **{totals[2]}** | **{totals[3]}** |")
    else:
        write(f"{'all':34} {totals[0]:5} {totals[1]:6} {totals[2]:5} {totals[3]:5} {totals[4]:5}")
