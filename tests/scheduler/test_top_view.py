"""`kubegpu top`'s view of a cluster, fed with the objects the API server would list: which allocations it draws."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from rich.console import Console

from kubegpu.core.annotations import (
    ALLOCATION_KEY,
    DEVICES_KEY,
    decode_allocation,
    encode_allocation,
    encode_devices,
    merge_allocations,
    sign_allocation,
)
from kubegpu.core.models import DeviceInfo, DeviceInventory, NodeDevices, PluginAllocation
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.core.text import MAX_TEXT_CHARS
from kubegpu.scheduler.report import report_json
from kubegpu.scheduler.top import ClusterView, render_terminal

KEY = b"k" * 32
TRN1 = {"node.kubernetes.io/instance-type": "trn1.32xlarge"}
NEURON_16 = {"aws.amazon.com/neurondevice": 16}
MODEL = "nvidia-gpu-scheduler/gpu.model"


def bound_pod(name: str, devices: list[str], *, key: bytes | None = KEY, node: str = "trn1-a") -> dict[str, Any]:
    pod = pod_manifest(name, {"main": {"aws.amazon.com/neurondevice": len(devices)}})
    pod["metadata"]["uid"] = f"uid-{name}"
    record = merge_allocations(
        node,
        f"uid-{name}",
        [PluginAllocation(plugin="neuron", containers={"main": {"aws.amazon.com/neurondevice": devices}})],
    )
    if key is not None:
        record = sign_allocation(record, key)
    pod["metadata"]["annotations"] = {ALLOCATION_KEY: encode_allocation(record)}
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return pod


def holders(view: ClusterView) -> dict[str, list[str]]:
    (node,) = report_json(view.report())["nodes"]
    return {c["id"]: c["holders"] for picture in node["devices"] for c in picture["cells"] if c["holders"]}


def view_of(pods: list[dict[str, Any]], key: bytes | None = KEY) -> ClusterView:
    view = ClusterView(make_plugin_manager("scheduler"), key)
    view.sync_pods(pods)  # pods before their node, as two informers may deliver them
    view.sync_nodes([node_manifest("trn1-a", labels=TRN1, allocatable=NEURON_16)])
    return view


def test_verified_allocations_are_drawn_and_forged_ones_are_listed_as_not_shown() -> None:
    view = view_of([bound_pod("good", ["0", "1", "2", "3"]), bound_pod("forged", ["4", "5", "6", "7"], key=b"x" * 32)])
    assert holders(view) == {str(i): ["default/good"] for i in range(4)}
    report = view.report()
    assert report.unverified == {}
    assert report.problems == ("default/forged: allocation not shown: its signature does not verify with the key file",)


def test_without_a_key_every_allocation_is_drawn_and_marked_unverified() -> None:
    view = view_of([bound_pod("unsigned", ["8", "9", "10", "11"], key=None)], key=None)
    assert holders(view) == {str(i): ["default/unsigned"] for i in range(8, 12)}
    assert set(view.report().unverified) == {"default/unsigned"}


def test_a_deleted_pod_frees_its_devices() -> None:
    pod = bound_pod("gone", ["0", "1", "2", "3"])
    view = view_of([pod])
    view.apply_pod("DELETED", pod)
    assert holders(view) == {}


def test_a_pending_pod_shows_its_latest_failed_scheduling_event_then_its_condition() -> None:
    view = view_of([])
    pod = pod_manifest("waits", {"main": {"aws.amazon.com/neurondevice": 7}}, scheduler_name="kubegpu")
    pod["metadata"]["uid"] = "uid-waits"
    view.apply_pod("ADDED", pod)
    assert view.report().pending[0].reason == "waiting for scheduler kubegpu (no FailedScheduling event yet)"
    pod["status"] = {"conditions": [{"type": "PodScheduled", "status": "False", "message": "from the condition"}]}
    view.apply_pod("MODIFIED", pod)
    assert view.report().pending[0].reason == "from the condition"
    for version, message in ((5, "newer"), (3, "older")):
        view.apply_event(
            "ADDED",
            {
                "metadata": {"resourceVersion": str(version)},
                "reason": "FailedScheduling",
                "message": message,
                "involvedObject": {"kind": "Pod", "namespace": "default", "name": "waits", "uid": "uid-waits"},
            },
        )
    assert view.report().pending[0].reason == "newer"


def test_a_gang_member_waiting_at_permit_shows_what_its_gang_waits_for_until_a_newer_failure() -> None:
    # It holds a place and waits for the rest of its gang: the scheduler says so with a Normal `WaitingForGang`
    # Event, no FailedScheduling and no condition. `top` read neither and showed "no FailedScheduling event yet",
    # or an older failure ("gang ml/blue is partly held") that was no longer why it waited.
    view = view_of([])
    pod = pod_manifest("w-0", {"main": {"aws.amazon.com/neurondevice": 7}}, namespace="ml", scheduler_name="kubegpu")
    pod["metadata"]["uid"] = "uid-w-0"
    view.apply_pod("ADDED", pod)

    def event(version: int, reason: str, message: str) -> None:
        involved = {"kind": "Pod", "namespace": "ml", "name": "w-0", "uid": "uid-w-0"}
        view.apply_event("ADDED", {"metadata": {"resourceVersion": str(version)}, "reason": reason,
                                   "type": "Normal", "message": message, "involvedObject": involved})  # fmt: skip

    event(3, "FailedScheduling", "Coscheduling: gang ml/w: gang ml/blue is partly held; one gang waits at a time")
    waiting = "waiting at Permit: Coscheduling: gang ml/w: 2 of minMember 4 members hold places (up to 60s)"
    event(4, "WaitingForGang", waiting + CLEAR_SCREEN)
    assert view.report().pending[0].reason == waiting + "\\x1b[2J\\x1b[H", "escaped, as a tenant may write it"
    event(9, "FailedScheduling", "gang ml/w timed out after 60s waiting at Permit")
    assert view.report().pending[0].reason == "gang ml/w timed out after 60s waiting at Permit"
    event(7, "WaitingForGang", "an older wait")
    assert view.report().pending[0].reason == "gang ml/w timed out after 60s waiting at Permit"


# -- what a tenant or a node writes, on the operator's terminal ------------------------------------------------------

CLEAR_SCREEN = "\x1b[2J\x1b[H"
CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07"  # OSC 52: "put this in the operator's clipboard"
HOSTILE_MODEL = f"[/] [blink]blinking[/blink] {CLIPBOARD}{CLEAR_SCREEN}\rforged\u202eesrever\x9b2J"
SGR = re.compile(r"\x1b\[([0-9;]*)m")


def terminal_output(view: ClusterView) -> str:
    """What `kubegpu top` writes to a colour terminal 200 columns wide."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="standard", width=200)
    console.print(render_terminal(view.report()))
    return out.getvalue()


def assert_inert(output: str) -> None:
    """Nothing but rich's own colours reaches the terminal: no other escape, no control character, no blinking."""
    for match in SGR.finditer(output):
        assert not {"5", "6"} & set(match.group(1).split(";")), f"blinking text: {match.group(0)!r}"
    rest = SGR.sub("", output)
    forbidden = [c for c in rest if not c.isprintable() and c != "\n"]
    assert not forbidden, f"control characters reach the terminal: {sorted(set(forbidden))!r}"


def lying_node() -> dict[str, Any]:
    """A p4d node whose advertised inventory names its GPUs with terminal escapes, rich markup and 10,000 characters."""
    ids = [CLEAR_SCREEN + "0", "[blink]1", CLIPBOARD, "\u202e3", "x" * 10_000, "5", "6", "7"]
    inventory = DeviceInventory(plugin="nvidia", devices=[DeviceInfo(id=i, model="A100") for i in ids])
    return node_manifest(
        "p4d-a",
        labels={"node.kubernetes.io/instance-type": "p4d.24xlarge"},
        annotations={DEVICES_KEY: encode_devices(NodeDevices(inventories={"nvidia": inventory}))},
        allocatable={"nvidia.com/gpu": 8},
    )


def test_a_tenants_and_a_nodes_text_is_shown_escaped_and_bounded_never_obeyed() -> None:
    view = view_of([])
    view.sync_nodes([lying_node(), node_manifest("trn1-a", labels=TRN1, allocatable=NEURON_16)])
    # A pending pod whose refusal quotes its annotation (the PodScheduled condition), another told by an Event.
    waiting = pod_manifest("model", {"main": {"nvidia.com/gpu": 1}}, annotations={MODEL: HOSTILE_MODEL})
    waiting["metadata"]["uid"] = "uid-model"
    message = f'0/2 nodes are available: 2 node(s) have no GPU of model "{HOSTILE_MODEL}".'
    waiting["status"] = {"conditions": [{"type": "PodScheduled", "status": "False", "message": message}]}
    view.apply_pod("ADDED", waiting)
    told = pod_manifest("told", {"main": {"nvidia.com/gpu": 1}})
    view.apply_pod("ADDED", told)
    view.apply_event(
        "ADDED",
        {
            "metadata": {"resourceVersion": "7"},
            "reason": "FailedScheduling",
            "message": HOSTILE_MODEL * 5000,
            "involvedObject": {"kind": "Pod", "namespace": "default", "name": "told"},
        },
    )
    # A bound pod whose allocation names a 100 KB node full of escapes: listed as not shown, in a bounded line.
    squatter = bound_pod("squatter", ["0"], node="trn1-a")
    record = decode_allocation(squatter["metadata"]["annotations"][ALLOCATION_KEY])
    forged = record.model_copy(update={"node": (CLEAR_SCREEN + CLIPBOARD + "[blink]n") * 4000})
    squatter["metadata"]["annotations"][ALLOCATION_KEY] = encode_allocation(forged)
    view.apply_pod("ADDED", squatter)

    output = terminal_output(view)  # before: rich.errors.MarkupError on "[/]"
    assert_inert(output)
    assert "[blink]blinking[/blink]" in output and "\\x1b]52;c;" in output and "\\x1b[2J" in output
    assert "\\u202e" in output and "\\x9b2J" in output and "\\rforged" in output
    assert "default/squatter: allocation not shown" in output
    assert "more characters)" in output
    assert len(output) < 30_000, f"{len(output)} characters on the terminal"
    report = view.report()
    assert all(len(p.reason) <= MAX_TEXT_CHARS for p in report.pending)
    assert all(len(p) <= MAX_TEXT_CHARS for p in report.problems)


# -- without the key file ---------------------------------------------------------------------------------------


def forged_stamp(pod: dict[str, Any]) -> dict[str, Any]:
    record = decode_allocation(pod["metadata"]["annotations"][ALLOCATION_KEY])
    pod["metadata"]["annotations"][ALLOCATION_KEY] = encode_allocation(record.model_copy(update={"issued": 2**63 - 1}))
    return pod


@pytest.mark.parametrize("squatter_first", [True, False], ids=["squatter-listed-first", "holder-listed-first"])
def test_without_a_key_a_forged_stamp_never_hides_the_pod_that_holds_the_devices(squatter_first: bool) -> None:
    holder = bound_pod("holder", ["0", "1", "2", "3"], key=None)
    squatter = forged_stamp(bound_pod("squatter", ["0", "1"], key=None))
    view = view_of([squatter, holder] if squatter_first else [holder, squatter], key=None)
    report = view.report()
    drawn = holders(view)
    # The holder is drawn on its devices or listed with the squatter's claim: never gone from both.
    holder_drawn = all(drawn.get(d) == ["default/holder"] for d in "0123")
    holder_listed = any(p.startswith("default/holder:") and "default/squatter" in p for p in report.problems)
    assert holder_drawn or holder_listed, (drawn, report.problems)
    if not squatter_first:
        assert holder_drawn  # what was drawn first stays: an unverified stamp displaces nothing
        assert any(p.startswith("default/squatter:") and "default/holder" in p for p in report.problems)
    # The squatter's stamp is never what settles it.
    assert set(report.unverified) >= {"default/holder"} if holder_drawn else {"default/squatter"}
    text = SGR.sub("", terminal_output(view))
    assert "cannot verify" in text


def test_without_a_key_a_claim_not_drawn_is_drawn_once_the_pod_drawn_in_its_place_leaves() -> None:
    holder = bound_pod("holder", ["0", "1", "2", "3"], key=None)
    squatter = forged_stamp(bound_pod("squatter", ["0", "1"], key=None))
    view = view_of([squatter, holder], key=None)
    view.apply_pod("DELETED", squatter)
    assert holders(view) == {d: ["default/holder"] for d in "0123"}
    assert view.report().problems == ()


def failed_scheduling(pod: str, version: int, message: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{pod}.{version}", "namespace": "default", "resourceVersion": str(version)},
        "reason": "FailedScheduling",
        "message": message,
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": pod, "uid": f"uid-{pod}"},
    }


def test_a_long_watch_keeps_no_failure_of_a_pod_gone_nor_a_problem_of_a_node_gone() -> None:
    # `top --watch` kept the last FailedScheduling message of every pod name it ever saw fail, its Event expired and
    # the pod deleted (a tenant's pods of new names failing all day: a KiB each, for as long as `top` ran), and kept
    # listing a deleted node's unreadable inventory as not shown.
    view = view_of([])
    for number in range(300):
        pod = pod_manifest(f"churn-{number}", {"main": {"aws.amazon.com/neurondevice": 99}}, scheduler_name="kubegpu")
        pod["metadata"]["uid"] = f"uid-churn-{number}"
        event = failed_scheduling(f"churn-{number}", number + 1, "x" * 1000)
        view.apply_pod("ADDED", pod)
        view.apply_event("ADDED", event)
        assert view.report().pending[0].reason == "x" * 1000
        view.apply_pod("DELETED", pod)
        view.apply_event("DELETED", event)  # the Event's time to live ran out
    assert view.report().pending == ()
    for number in range(300):  # Events that come after their pod is gone, and expire
        view.apply_event("ADDED", failed_scheduling(f"late-{number}", 1000 + number, "y" * 1000))
        view.apply_event("DELETED", failed_scheduling(f"late-{number}", 1000 + number, "y" * 1000))
    assert len(view.failures) == 0, f"{len(view.failures)} failures kept of pods gone"
    broken = node_manifest("broken", labels=TRN1, allocatable=NEURON_16)
    broken["metadata"]["annotations"] = {"kubegpu.io/devices": "{not json"}
    view.apply_node("ADDED", broken)
    assert any(p.startswith("node broken: inventory ignored") for p in view.report().problems)
    view.apply_node("DELETED", broken)
    assert view.report().problems == (), view.report().problems


@pytest.mark.parametrize("width", [80, 200])
def test_a_pod_of_a_long_name_leaves_room_for_every_pending_pods_reason(width: int) -> None:
    # A namespace of 63 characters and a pod name of 253 are valid; the pending table kept pod names on one line,
    # so that column took the terminal's whole width and no pending pod's reason was shown, the tenant's or anyone's.
    view = view_of([])
    for namespace, name in (("n" * 63, "a" * 253), ("default", "small")):
        pod = pod_manifest(name, {"main": {"aws.amazon.com/neurondevice": 99}}, scheduler_name="kubegpu")
        pod["metadata"].update(namespace=namespace, uid=f"uid-{name[:5]}")
        condition = {"type": "PodScheduled", "status": "False", "message": f"reason of {name[:5]}"}
        pod["status"] = {"conditions": [condition]}
        view.apply_pod("ADDED", pod)
    output = io.StringIO()
    Console(file=output, width=width, color_system=None).print(render_terminal(view.report()))
    lines = output.getvalue().splitlines()
    assert any("default/small" in line and "reason of small" in line for line in lines), "\n".join(lines[-12:])
    assert max(len(line) for line in lines) <= width


def test_a_family_of_shared_gpus_shows_the_capacity_held_not_the_gpus_touched() -> None:
    """Two pods hold 60 % and 62 % of two T4s, one each: both GPUs are in use, and the family's utilisation is the
    61 % of its capacity they hold, as the FGD paper and `kubegpu simulate --trace-...` count it. It read 100 % (every
    GPU touched), so a cluster of half-used shared GPUs looked full. A whole GPU still counts whole."""
    from kubegpu.core.manifests import node_info, pod_request
    from kubegpu.scheduler.engine import Engine
    from kubegpu.scheduler.report import build_report

    gpu, cores, memory = "nvidia.com/gpu", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage"
    engine = Engine(make_plugin_manager("scheduler"))
    allocatable = {gpu: 20, cores: 200, memory: 200}
    labels = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "T4"}
    engine.add_node(node_info(node_manifest("gpu-a", labels=labels, allocatable=allocatable)))
    for name, share in (("a", 60), ("b", 62)):
        request, _ = pod_request(pod_manifest(name, {"main": {gpu: 1, cores: share, memory: share}}))
        assert engine.schedule(request).scheduled
    (family,) = build_report(engine, title="t", source="s").families
    assert (family.total, family.used, family.free) == (2, 2, 0)
    assert family.utilisation == pytest.approx(0.61)
    output = io.StringIO()
    Console(file=output, width=160, color_system=None).print(
        render_terminal(build_report(engine, title="t", source="s"))
    )
    assert re.search(r"nvidia\S*\s+2\s+2\s+61%\s", output.getvalue()), output.getvalue()
    assert report_json(build_report(engine, title="t", source="s"))["families"][0]["held"] == pytest.approx(1.22)

    whole, _ = pod_request(pod_manifest("whole", {"main": {gpu: 1}}))
    engine.release("default/b")
    assert engine.schedule(whole).scheduled
    (family,) = build_report(engine, title="t", source="s").families
    assert family.utilisation == pytest.approx(0.8)  # 60 % of one GPU and the other whole


def test_each_pod_sharing_a_gpu_is_shown_with_its_part_of_it() -> None:
    """Three pods share two A100s (40 GiB): 30 % of GPU 0's compute with 4,000 MiB, 40 % with 30,000 MiB beside it,
    and 50 % of GPU 1's compute. The map showed both GPUs partly held and the pods' colours, never who holds how much;
    now the legend, the JSON and the HTML report say each pod's part (of the dimension the GPU's use is counted in:
    GPU 0 is 83 % used by its memory, so the first pod's part is its 10 % of the memory)."""
    from kubegpu.core.manifests import node_info, pod_request
    from kubegpu.scheduler.engine import Engine
    from kubegpu.scheduler.html import render_html
    from kubegpu.scheduler.report import build_report

    gpu, cores, memory = "nvidia.com/gpu", "nvidia.com/gpucores", "nvidia.com/gpumem"
    engine = Engine(make_plugin_manager("scheduler"))
    labels = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "A100", "nvidia.com/gpu.memory": "40960"}
    engine.add_node(node_info(node_manifest("gpu-a", labels=labels, allocatable={gpu: 20, cores: 200})))
    for name, ask in (("a", (30, 4000)), ("c", (40, 30000)), ("b", (50, 8000))):
        request, _ = pod_request(pod_manifest(name, {"main": {gpu: 1, cores: ask[0], memory: ask[1]}}))
        assert engine.schedule(request).scheduled
    report = build_report(engine, title="t", source="s")

    shares = {c["id"]: c["shares"] for picture in report_json(report)["nodes"][0]["devices"] for c in picture["cells"]}
    (first,) = [gpu_id for gpu_id, parts in shares.items() if "default/a" in parts]
    (other,) = set(shares) - {first}
    assert shares[first] == {"default/a": 0.0977, "default/c": 0.7324}
    assert shares[other] == {"default/b": 0.5}
    output = io.StringIO()
    Console(file=output, width=160, color_system=None).print(render_terminal(report))
    assert f"default/a · nvidia {first} 10%" in output.getvalue(), output.getvalue()
    assert f"default/b · nvidia {other} 50%" in output.getvalue()
    page = render_html(report)
    assert "default/a 10%, default/c 73%" in page
    bands = [float(h) for h in re.findall(r'class="lvl" x="[^"]*" y="[^"]*" width="[^"]*" height="([^"]*)"', page)]
    assert len(bands) == 3 and max(bands) / min(bands) > 7  # 73 % against 10 %: not one band each alike


def test_the_parts_of_a_gpu_shared_in_thirds_add_up_to_the_gpu() -> None:
    """Three pods each take a third of an A100's memory (13,653 of 40,960 MiB): the GPU is full, and each part read
    33 %, three times, in the legend, the simulator's map and the HTML report. The parts now add up to the 100 %
    the GPU is used: one of them reads 34 %."""
    from kubegpu.core.manifests import node_info, pod_request
    from kubegpu.scheduler.engine import Engine
    from kubegpu.scheduler.html import render_html
    from kubegpu.scheduler.report import build_report, draw_text

    gpu, cores, memory = "nvidia.com/gpu", "nvidia.com/gpucores", "nvidia.com/gpumem"
    engine = Engine(make_plugin_manager("scheduler"))
    labels = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "A100", "nvidia.com/gpu.memory": "40960"}
    engine.add_node(node_info(node_manifest("gpu-a", labels=labels, allocatable={gpu: 10, cores: 100})))
    for name in ("a", "b", "c"):
        request, _ = pod_request(pod_manifest(name, {"main": {gpu: 1, cores: 10, memory: 13653}}))
        assert engine.schedule(request).scheduled
    report = build_report(engine, title="t", source="s")

    output = io.StringIO()
    Console(file=output, width=160, color_system=None).print(render_terminal(report))
    legend = sorted(int(p) for p in re.findall(r"default/[abc] · nvidia \S+ (\d+)%", output.getvalue()))
    assert legend == [33, 33, 34], output.getvalue()
    (picture,) = report.nodes[0].pictures
    (line,) = [line for line in draw_text(picture) if "default/a" in line]
    assert sorted(int(p) for p in re.findall(r"default/[abc] (\d+)%", line)) == [33, 33, 34], line
    tips = re.findall(r"default/[abc] (\d+)%", render_html(report))
    assert sum(int(p) for p in tips) == 100, tips


def test_a_device_shared_by_forty_thousand_pods_is_drawn_in_one_pass() -> None:
    """A plugin may describe a device with any number of sharers (a tenant's pods, each with its part): the HTML
    report stacked each band on the sum of the ones below it, summed again for every band, so a cell of 40,000
    sharers took 6.7 s to draw (and a node of such cells hours). Now one pass; the bands still stack, each as tall as
    its part, up to the used fraction."""
    import time

    from kubegpu.core.kit import WholeDevicePlugin, label_devices
    from kubegpu.core.manifests import node_info
    from kubegpu.core.models import DeviceCell, NodeInfo, Occupancy
    from kubegpu.core.scheduler_hooks import hookimpl
    from kubegpu.scheduler.engine import Engine
    from kubegpu.scheduler.html import render_html
    from kubegpu.scheduler.report import build_report

    sharers = [f"tenant/pod-{i}" for i in range(40_000)]
    parts = {pod: (0.5 if at == 0 else 0.5 / (len(sharers) - 1)) for at, pod in enumerate(sharers)}

    class Shared(WholeDevicePlugin):
        resources = ("cards.example/card",)

        def devices(self, node: NodeInfo) -> tuple[list[DeviceInfo], None] | None:
            return label_devices(node.labels, "cards.example/card.count", "card"), None

        @hookimpl
        def kubegpu_scheduler_describe(self, state: Any) -> list[Occupancy]:
            return [Occupancy(family="cards", cells=[DeviceCell(id="card0", holders=sharers, used=1.0, shares=parts)])]

    engine = Engine(make_plugin_manager("scheduler", plugins=[("cards", Shared())], autoload=False))
    labels = {"cards.example/card.count": "1"}
    engine.add_node(node_info(node_manifest("cards-0", labels=labels, allocatable={"cards.example/card": 1})))
    report = build_report(engine, title="t", source="s")

    began = time.perf_counter()
    page = render_html(report)
    took = time.perf_counter() - began

    bands = re.findall(r'class="lvl" x="[^"]*" y="([^"]*)" width="[^"]*" height="([^"]*)"', page)
    assert len(bands) == 40_000
    (first, half), (second, rest) = ((float(y), float(h)) for y, h in bands[:2])
    assert second - first == pytest.approx(half, abs=0.1), "the next band begins where the first ends"
    assert half > 1000 * rest, "the first pod's half, as tall as its part"
    assert took < 1.0, f"{took:.1f} s to draw one device"


def test_ten_thousand_pending_pods_and_a_thousand_allocations_not_shown_fit_on_a_screen() -> None:
    """A 5,000-node cluster may have 10,000 pods pending, and a tenant may bind a thousand pods with forged
    allocations: `top` drew a row for every pending pod and a line for every allocation not shown (24,000 lines,
    2 s of rich per redraw, on every change with `--watch`), so the terminal scrolled past everything else. Now the
    first rows, the reasons most pods wait for with how many wait for each, and how many more there are."""
    view = view_of([bound_pod(f"forged-{n}", [str(n % 16)], key=b"x" * 32) for n in range(1000)])
    for number in range(10_000):
        name = f"wait-{number:05d}"
        pod = pod_manifest(name, {"main": {"aws.amazon.com/neurondevice": 99}}, scheduler_name="kubegpu")
        pod["metadata"]["uid"] = f"uid-{name}"
        view.apply_pod("ADDED", pod)
        reason = "too many devices" if number % 10 else f"a reason of its own: {number}"
        view.apply_event("ADDED", failed_scheduling(name, number + 1, reason))
    report = view.report()
    assert len(report.pending) == 10_000 and len(report.problems) == 1000  # --json and --html still list them all

    output = io.StringIO()
    Console(file=output, width=200, color_system=None).print(render_terminal(report))
    lines = output.getvalue().splitlines()
    assert len(lines) < 120, f"{len(lines)} lines on the terminal"
    assert re.search(r"^\s*9000\s+too many devices\s*$", output.getvalue(), re.M), "\n".join(lines[:30])
    assert any(re.search(r"^\s*\d+\s+\d+ other reasons\s*$", line) for line in lines)
    assert "… 9970 more pending pods" in output.getvalue()
    assert "… 980 more not shown" in output.getvalue()
    assert sum(1 for line in lines if line.startswith("not shown: default/forged-")) == 20


@pytest.mark.parametrize("seed", range(6))
def test_a_report_drawn_again_after_each_change_matches_one_drawn_afresh(seed: int) -> None:
    """`top --watch` keeps each node's picture between redraws and describes again only the nodes the engine says
    changed (`NodeViews`), where it described all 5,000 nodes on every change (a second per redraw). Held against a
    report drawn afresh from the same engine after every step of a random watch: nodes added, relabelled, shrunk,
    deleted; pods bound (before or after their node), moved, deleted."""
    import random

    from kubegpu.scheduler.report import build_report

    rng = random.Random(seed)
    view = ClusterView(make_plugin_manager("scheduler"), KEY)
    nodes = [f"trn1-{n}" for n in range(4)]
    held: set[int] = set()
    for step in range(120):
        node = rng.choice(nodes)
        action = rng.random()
        if action < 0.2:
            kind = rng.choice(["trn1.32xlarge", "trn1n.32xlarge"])
            count = rng.choice([16, 16, 8])
            labels = {"node.kubernetes.io/instance-type": kind}
            view.apply_node(
                "MODIFIED", node_manifest(node, labels=labels, allocatable={"aws.amazon.com/neurondevice": count})
            )
        elif action < 0.25:
            view.apply_node("DELETED", node_manifest(node))
        elif action < 0.75:
            first = rng.randrange(0, 16, 4)
            pod = bound_pod(f"p{rng.randrange(12)}", [str(d) for d in range(first, first + 4)], node=node)
            view.apply_pod("MODIFIED", pod)
        else:
            view.apply_pod("DELETED", bound_pod(f"p{rng.randrange(12)}", ["0"], node=node))
        drawn = report_json(view.report())
        afresh = report_json(build_report(view.engine, title=drawn["title"], source=drawn["source"]))
        assert (drawn["nodes"], drawn["families"]) == (afresh["nodes"], afresh["families"]), f"step {step}"
        held.add(sum(1 for n in drawn["nodes"] for p in n["devices"] for c in p["cells"] if c["holders"]))
        assert set(view.views.current(view.engine)) == set(view.engine.node_names()), "a node gone is forgotten"
    assert max(held) >= 8, "pods were drawn on the devices they hold"


def test_a_redraw_after_one_pod_leaves_describes_only_its_node() -> None:
    """What a redraw costs after a change: one node described (about 0.06 s for a report of 5,000 nodes and 10,000
    pending pods, where describing every node took 1 s)."""
    view = ClusterView(make_plugin_manager("scheduler"), KEY)
    view.sync_nodes([node_manifest(f"trn1-{n:03d}", labels=TRN1, allocatable=NEURON_16) for n in range(200)])
    pods = [bound_pod(f"p{n}", ["0", "1", "2", "3"], node=f"trn1-{n:03d}") for n in range(200)]
    view.sync_pods(pods)
    assert len(view.report().nodes) == 200
    described: list[str] = []
    describe = view.engine.describe
    view.engine.describe = lambda name: described.append(name) or describe(name)  # type: ignore[method-assign]
    view.apply_pod("DELETED", pods[7])
    report = view.report()
    assert described == ["trn1-007"]
    assert holders_of(report, "trn1-007") == {} and holders_of(report, "trn1-008") == {
        str(d): ["default/p8"] for d in range(4)
    }


def holders_of(report: Any, node: str) -> dict[str, list[str]]:
    (entry,) = [n for n in report_json(report)["nodes"] if n["name"] == node]
    return {c["id"]: c["holders"] for picture in entry["devices"] for c in picture["cells"] if c["holders"]}
