"""`kubegpu simulate --html FILE`: the page a platform engineer opens to see where devices are free, who holds them
and why pods wait. The browser tests open it in headless Chromium (scripts/test.sh installs Debian's chromium); they
fail, never skip, when it is missing."""

from __future__ import annotations

import argparse
import json
import os
import stat
import time
from collections import Counter
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.html import render_html, write_html
from kubegpu.scheduler.report import build_report
from kubegpu.scheduler.simulate import add_simulate_parser, load_documents

from .chromium import Chromium, ChromiumMissing
from .report_workload import large_cluster, large_report

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "clusters").glob("*.yaml"))
SCREENSHOTS = ROOT / "build" / "html-report"
PYTHON_GOAL, BROWSER_GOAL = 2.0, 5.0


def simulate(*argv: str, capsys: pytest.CaptureFixture[str] | None = None) -> list[dict[str, Any]]:
    """Run `kubegpu simulate ARGV --json` through its own argument parser; the JSON events."""
    parser = argparse.ArgumentParser(prog="kubegpu")
    add_simulate_parser(parser.add_subparsers())
    args = parser.parse_args(["simulate", "--json", *argv])
    assert args.func(args) == 0
    assert capsys is not None
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def devices_in(path: Path) -> int:
    """The devices the engine knows after adding the file's nodes (independent of the page)."""
    nodes, _ = load_documents([path])
    engine = Engine(make_plugin_manager("scheduler"))
    for info in nodes:
        engine.add_node(info)
    return sum(len(p.cells) for name in engine.nodes for p in engine.describe(name))


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def elements(page: str) -> list[tuple[str, list[tuple[str, str | None]]]]:
    parser = _Elements()
    parser.feed(page)
    return parser.tags


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    try:
        chromium = Chromium()
    except ChromiumMissing as exc:
        pytest.fail(str(exc))
    with chromium:
        yield chromium


# ---------------------------------------------------------------------------------------------------------------
# The page itself
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_the_page_is_self_contained_and_draws_one_shape_per_device(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page_path = tmp_path / "report.html"
    simulate("--html", str(page_path), str(example), capsys=capsys)
    page = page_path.read_text()
    tags = elements(page)
    assert sum(1 for tag, attrs in tags if tag == "rect" and "dev" in (dict(attrs).get("class") or "").split()) == (
        devices_in(example)
    )
    assert [tag for tag, _ in tags if tag in ("link", "img", "iframe", "object")] == []
    assert all(dict(attrs).get("src") is None for _, attrs in tags), "no external script or image"
    assert "@import" not in page and "url(" not in page and "http://" not in page and "https://" not in page


def test_pending_pods_are_listed_with_the_schedulers_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page_path = tmp_path / "neuron.html"
    events = simulate("--html", str(page_path), str(ROOT / "examples/clusters/neuron.yaml"), capsys=capsys)
    refused = [e for e in events if e["event"] == "unschedulable"]
    assert refused, "the example has a pod that stays pending"
    page = page_path.read_text()
    for event in refused:
        assert f"<td>{event['pod']}</td><td>{event['reason']}</td>" in page.replace("&#x27;", "'")


HOSTILE_POD = "<script>alert('pod')</script>"
HOSTILE_NODE = '"><img src=x onerror=alert(1)>'
HOSTILE_MODEL = "</td><script>alert('reason')</script>"


def hostile_cluster(path: Path) -> Path:
    documents = [
        {
            "kind": "Node",
            "metadata": {
                "name": HOSTILE_NODE,
                "labels": {
                    "node.kubernetes.io/instance-type": "p3.16xlarge<svg onload=alert(2)>",
                    "nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB",
                    "nvidia.com/gpu.count": "8",
                },
            },
            "status": {"allocatable": {"cpu": "64", "memory": "100Gi", "pods": "110", "nvidia.com/gpu": "8"}},
        },
        {
            "kind": "Pod",
            "metadata": {"name": HOSTILE_POD, "namespace": "x\"onmouseover='alert(3)'"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
        },
        {
            "kind": "Pod",
            "metadata": {"name": "waits", "annotations": {"nvidia-gpu-scheduler/gpu.model": HOSTILE_MODEL}},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        },
    ]
    path.write_text("\n".join(json.dumps(d) for d in documents) + "\n")
    return path


def test_names_and_reasons_from_the_input_cannot_inject_markup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page_path = tmp_path / "hostile.html"
    events = simulate("--html", str(page_path), str(hostile_cluster(tmp_path / "hostile.jsonl")), capsys=capsys)
    assert [e["event"] for e in events] == ["scheduled", "unschedulable"]
    assert HOSTILE_MODEL in events[1]["reason"]
    tags = elements(page_path.read_text())
    assert [tag for tag, _ in tags if tag in ("script", "img", "svg") and tag != "svg"] == ["script"]
    handlers = [(tag, name) for tag, attrs in tags for name, _ in attrs if name.startswith("on")]
    assert handlers == [], "no event-handler attribute may come from the input"


def test_writing_into_a_shared_folder_follows_no_planted_link(tmp_path: Path) -> None:
    # Someone else who may write to the folder plants links where a writer might put its temporary file (the name
    # the writer used to build from its pid, and any other name) and at the report's own name.
    shared, victim = tmp_path / "shared", tmp_path / "victim.txt"
    shared.mkdir()
    victim.write_text("precious")
    planted = [shared / f".top.html.{os.getpid()}.tmp", shared / ".top.html.k3j9x2.tmp", shared / "top.html"]
    for link in planted:
        link.symlink_to(victim)
    engine = Engine(make_plugin_manager("scheduler"))
    write_html(build_report(engine, title="t", source="s"), shared / "top.html")
    assert victim.read_text() == "precious"
    report = shared / "top.html"
    assert report.is_file() and not report.is_symlink() and "<html" in report.read_text()
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(report.stat().st_mode) == 0o666 & ~umask, "the mode of any new file, not mkstemp's 0600"
    assert all(link.is_symlink() for link in planted[:2]), "the planted links are left alone"
    assert sorted(p.name for p in shared.iterdir()) == sorted(p.name for p in planted)


# ---------------------------------------------------------------------------------------------------------------
# In the browser
# ---------------------------------------------------------------------------------------------------------------

HELD_DEVICES = """
new Promise(function (resolve) {
  var r = document.querySelector("rect.dev.held, rect.dev.partly");
  r.scrollIntoView({block: "center"});
  // Nodes off screen are not rendered (content-visibility): measure once the scrolled-to node has been drawn.
  requestAnimationFrame(function () { requestAnimationFrame(function () {
    var b = r.getBoundingClientRect();
    resolve([{tip: r.getAttribute("data-tip"), x: b.left + b.width / 2, y: b.top + b.height / 2}]);
  }); });
})
"""


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_the_report_opens_in_chromium_and_hovering_a_held_device_names_its_pod(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], browser: Chromium
) -> None:
    page_path = tmp_path / f"{example.stem}.html"
    events = simulate("--html", str(page_path), str(example), capsys=capsys)
    mark = len(browser.events)
    browser.open(page_path.as_uri())
    assert browser.errors(mark) == [] and browser.dialogs(mark) == []
    assert browser.evaluate('document.querySelectorAll("rect.dev").length') == devices_in(example)

    (held,) = browser.evaluate(HELD_DEVICES)
    browser.hover(held["x"], held["y"])
    shown = browser.evaluate('document.getElementById("tip").hidden ? "" : document.getElementById("tip").textContent')
    assert shown == held["tip"]
    node, device = shown.split(" · ")[0], shown.split(": ")[0].split()[-1]
    holders = {
        e["pod"]
        for e in events
        if e["event"] == "scheduled"
        and e["node"] == node
        and any(device in ids for resources in e["devices"].values() for ids in resources.values())
    }
    assert holders and any(f"by {pod}" in shown for pod in holders), (shown, holders)
    screenshot = browser.screenshot(SCREENSHOTS / f"{example.stem}.png")
    assert screenshot.stat().st_size > 10_000


def test_a_hostile_report_runs_no_script_in_chromium(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], browser: Chromium
) -> None:
    page_path = tmp_path / "hostile.html"
    simulate("--html", str(page_path), str(hostile_cluster(tmp_path / "hostile.jsonl")), capsys=capsys)
    mark = len(browser.events)
    browser.open(page_path.as_uri())
    (held,) = browser.evaluate(HELD_DEVICES)
    browser.hover(held["x"], held["y"])
    assert browser.dialogs(mark) == [] and browser.errors(mark) == []
    assert browser.evaluate('document.querySelectorAll("script, img").length') == 1
    text = browser.evaluate("document.body.textContent")
    assert HOSTILE_POD in text and HOSTILE_NODE in text and HOSTILE_MODEL in text
    assert HOSTILE_POD in browser.evaluate('document.getElementById("tip").textContent')


@pytest.mark.slow
def test_a_1000_node_3000_pod_report_renders_in_2s_of_python_and_opens_in_5s(
    tmp_path: Path, browser: Chromium, record_property: Any
) -> None:
    engine, pending = large_cluster(1000, 3000)
    started = time.perf_counter()
    page = render_html(large_report(engine, pending))
    python_seconds = time.perf_counter() - started
    path = tmp_path / "large.html"
    path.write_text(page)
    mark = len(browser.events)
    browser_seconds = browser.open(path.as_uri())
    devices = browser.evaluate('document.querySelectorAll("rect.dev").length')
    figures = (
        f"1000 nodes, 3000 pods, {devices} devices, {len(page) / 1e6:.1f} MB: Python {python_seconds:.2f}s "
        f"(goal {PYTHON_GOAL:.0f}s), Chromium load {browser_seconds:.2f}s (goal {BROWSER_GOAL:.0f}s)"
    )
    print(figures)
    record_property("report_figures", figures)
    assert browser.errors(mark) == []
    assert devices == build_report(engine, title="", source="").devices
    assert python_seconds < PYTHON_GOAL, figures
    assert browser_seconds < BROWSER_GOAL, figures


DEVICE_TEXT = """Array.from(document.querySelectorAll("rect.dev")).map(function (r) {
  return [r.getAttribute("data-tip"), r.nextElementSibling.textContent];
})"""


def test_a_nodes_device_ids_show_escaped_and_bounded_in_chromium(tmp_path: Path, browser: Chromium) -> None:
    """A node with nodes/status rights advertises what it likes as device ids: a right-to-left override that turns
    what follows around, a line separator, a terminal escape, 100,000 characters. `kubegpu top --html` showed them
    as they were (HTML-escaped only): the page read its text reversed and carried the id three times, 300 KB for one
    device. Now as the terminal shows them: escaped, the square's label at most 12 characters, the tip at most
    1024."""
    from kubegpu.core.annotations import DEVICES_KEY, encode_devices
    from kubegpu.core.models import DeviceInfo, DeviceInventory, NodeDevices
    from kubegpu.core.testing import node_manifest
    from kubegpu.core.text import MAX_TEXT_CHARS
    from kubegpu.scheduler.report import MAX_CELL_ID_CHARS
    from kubegpu.scheduler.top import ClusterView

    ids = ["\u202e0gpu", "1\u2028ab", "\x1b[2J2", "x" * 100_000, "4", "5", "6", "7"]
    inventory = DeviceInventory(plugin="nvidia", devices=[DeviceInfo(id=i, model="A100") for i in ids])
    node = node_manifest(
        "p4d-lies",
        annotations={DEVICES_KEY: encode_devices(NodeDevices(inventories={"nvidia": inventory}))},
        allocatable={"nvidia.com/gpu": 8},
    )
    view = ClusterView(make_plugin_manager("scheduler"), None)
    view.sync_nodes([node])
    page_path = tmp_path / "top.html"
    write_html(view.report(), page_path)
    assert page_path.stat().st_size < 40_000, f"{page_path.stat().st_size} bytes for 8 devices"

    mark = len(browser.events)
    browser.open(page_path.as_uri())
    assert browser.errors(mark) == [] and browser.dialogs(mark) == []
    shown = browser.evaluate(DEVICE_TEXT)
    assert len(shown) == 8
    for tip, label in shown:
        assert tip.isprintable() and label.isprintable(), (tip[:80], label)
        assert len(tip) <= MAX_TEXT_CHARS and len(label) <= MAX_CELL_ID_CHARS, (len(tip), label)
    labels = [label for _, label in shown]
    assert "\\u202e0gpu" in labels and "1\\u2028ab" in labels and "\\x1b[2J2" in labels
    (long_tip,) = [tip for tip, label in shown if label.startswith("xxx")]
    assert long_tip.endswith("more characters)")
    text = browser.evaluate("document.body.textContent")
    assert not {"\u202e", "\u2028", "\x1b"} & set(text)


def test_a_trace_of_a_hundred_thousand_pods_makes_a_page_of_a_few_megabytes(tmp_path: Path, browser: Chromium) -> None:
    """A replay of 100,000 pods on the openb cluster left 90,475 pending, each with its own 1 KB reason (each node's
    free GPUs named): the page listed every one and every reason, 41 MB, most of it one collapsed table. Now at most
    1000 rows per list, the reasons still counted over every pod, and how many more there are."""
    from kubegpu.scheduler.report import PendingPod

    engine = Engine(make_plugin_manager("scheduler"))
    reasons = [
        f"0/1213 nodes are available: reason {n % 3000}: " + "1 GPU 0 has 4% compute free, " * 33 for n in range(3000)
    ]
    pending = [
        PendingPod(f"trace/pod-{n:06d}", reasons[n % 3000] if n % 4 else "Insufficient cpu") for n in range(40_000)
    ]
    page_path = tmp_path / "trace.html"
    write_html(build_report(engine, title="trace", source="s", pending=pending), page_path)
    size = page_path.stat().st_size
    assert size < 4_000_000, f"{size / 1e6:.1f} MB"

    mark = len(browser.events)
    browser.open(page_path.as_uri())
    assert browser.errors(mark) == []
    assert browser.evaluate('document.querySelector("#pending h2").textContent') == "Pending pods (40000)"
    counted = browser.evaluate('document.querySelector("table.reasons td").parentElement.textContent')
    assert counted == "10000Insufficient cpu"
    assert browser.evaluate('document.querySelectorAll("table.pods tbody tr").length') == 1000
    more = browser.evaluate('Array.from(document.querySelectorAll("#pending p.more")).map(p => p.textContent)')
    ranked = Counter(p.reason for p in pending).most_common()  # 2251 reasons: 8 shown, 1000 more listed
    left = f"{len(ranked) - 8 - 1000} more reasons, {sum(n for _, n in ranked[8 + 1000 :])} pods"
    assert more == [f"… {left} not listed here", "… 39000 more pending pods not listed here"]
