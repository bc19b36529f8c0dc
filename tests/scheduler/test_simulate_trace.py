"""`kubegpu simulate --trace-nodes NODES.csv --trace-pods PODS.csv`: replaying a GPU cluster trace in Alibaba's
openb format, as the FGD paper's experiment or as a timeline, and reading its allocation curve in text, JSON and the
HTML report. Every trace here is written by the test (the suite runs without ../shared)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubegpu.cli import main
from kubegpu.core.manifests import pod_request
from kubegpu.scheduler import traces

from .chromium import Chromium, ChromiumMissing
from .test_html_report import elements

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
)
SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "html-report"


def write_trace(
    folder: Path, nodes: Iterable[str], pods: Iterable[str], *, node_header: str = NODE_HEADER
) -> tuple[Path, Path]:
    """Write a node list and a pod list (CSV rows without the header) into `folder`."""
    node_path, pod_path = folder / "nodes.csv", folder / "pods.csv"
    node_path.write_text("\n".join([node_header, *nodes]) + "\n")
    pod_path.write_text("\n".join([POD_HEADER, *pods]) + "\n")
    return node_path, pod_path


def pod_row(name: str, gpus: int, milli: int | str, created: int = 0, deleted: int | str = "", spec: str = "") -> str:
    return f"{name},1000,1024,{gpus},{milli},{spec},LS,Running,{created},{deleted},{created}"


def four_nodes_of_two_gpus() -> list[str]:
    return [f"n{i},32000,131072,2,V100M16" for i in range(4)]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["simulate", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def replay_json(capsys: pytest.CaptureFixture[str], nodes: Path, pods: Path, *argv: str) -> dict[str, Any]:
    code, out, err = run(capsys, "--trace-nodes", str(nodes), "--trace-pods", str(pods), "--json", *argv)
    assert code == 0, err
    document: dict[str, Any] = json.loads(out)
    return document


# ---------------------------------------------------------------------------------------------------------------
# The experiment and the timeline
# ---------------------------------------------------------------------------------------------------------------


def test_half_gpu_shares_fill_every_gpu_and_the_curve_reaches_100_percent_at_100_arrived(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Eight GPUs and pods asking half a GPU each: two share every GPU, so the sixteenth pod fills the cluster
    # exactly when the pods have asked for all of it; the five copies that follow (to 130 %) find no room.
    nodes, pods = write_trace(tmp_path, four_nodes_of_two_gpus(), [pod_row(f"half-{i}", 1, 500) for i in range(16)])
    summary = replay_json(capsys, nodes, pods, "--inflate", "1.3", "--seed", "7")
    assert (summary["mode"], summary["gpus"], summary["pods"]) == ("experiment", 8, 21)
    assert (summary["scheduled"], summary["failed"], summary["deleted"]) == (16, 5, 0)
    assert summary["allocatedAtFull"] == 100.0
    curve = {point["arrived"]: point["allocated"] for point in summary["curve"]}
    assert curve[50] == 50.0 and curve[100] == 100.0 and max(curve) == 131 and curve[131] == 100.0

    code, out, err = run(capsys, "--trace-nodes", str(nodes), "--trace-pods", str(pods))
    assert code == 0, err
    assert "ALLOCATION CURVE" in out and "allocated at arrived 100%: 100.0%" in out
    assert "21 pods arrived, 16 scheduled, 5 failed" in out
    assert "     50%      50.0% #########################" in out


def test_the_experiment_inflates_to_the_target_share_in_the_seeds_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [pod_row(f"whole-{i}", 1, 1000) for i in range(3)] + [pod_row(f"quarter-{i}", 1, 250) for i in range(4)]
    nodes, pods = write_trace(tmp_path, four_nodes_of_two_gpus(), rows)
    first = replay_json(capsys, nodes, pods, "--inflate", "2", "--seed", "1")
    again = replay_json(capsys, nodes, pods, "--inflate", "2", "--seed", "1")
    other = replay_json(capsys, nodes, pods, "--inflate", "0.5", "--seed", "1")
    assert first == again, "one seed, one replay"
    assert max(p["arrived"] for p in first["curve"]) >= 200 > max(p["arrived"] for p in first["curve"]) - 13
    assert other["pods"] == 7, "below the trace's own share nothing is copied"
    assert first["scheduled"] <= 8 * 4 and first["curve"][-1]["allocated"] <= 100.0


def test_the_timeline_deletes_each_pod_at_its_deletion_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # One GPU: the first pod holds it from 0 to 10; the second (at 5) finds it taken; the third, created at 10, the
    # second the first leaves, gets it and leaves at 11; a cpu-only pod "deleted" before its creation leaves at once.
    nodes, pods = write_trace(
        tmp_path,
        ["solo,32000,131072,1,T4"],
        [
            pod_row("first", 1, 1000, created=0, deleted=10),
            pod_row("second", 1, 1000, created=5, deleted=20),
            pod_row("third", 1, 1000, created=10, deleted=11),
            pod_row("blink", 0, 0, created=12, deleted=3),
        ],
    )
    summary = replay_json(capsys, nodes, pods, "--timeline")
    assert (summary["mode"], summary["pods"], summary["scheduled"], summary["failed"]) == ("timeline", 4, 3, 1)
    assert summary["deleted"] == 3
    # Arrived 100 % (first), 200 % (second, failed), 300 % twice: the third (holding it) and the cpu-only pod,
    # after the third has left (allocated 0): a mean of 50.
    assert [(p["arrived"], p["allocated"]) for p in summary["curve"]] == [(100, 100.0), (200, 100.0), (300, 50.0)]
    assert summary["allocatedAtFull"] == 100.0


def test_a_share_asks_its_thousandths_rounded_up_so_two_pods_above_half_never_share_one_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # HAMi counts a share's compute and memory in whole percent. 505 thousandths asked as 50 % let two such pods
    # onto one GPU, and the curve said 101 % of the capacity was allocated; asked as 51 %, the second finds no room.
    nodes, pods = write_trace(
        tmp_path, ["solo,32000,131072,1,T4"], [pod_row("a", 1, 505, created=0), pod_row("b", 1, 505, created=1)]
    )
    summary = replay_json(capsys, nodes, pods, "--timeline")
    assert (summary["scheduled"], summary["failed"]) == (1, 1)
    assert [(p["arrived"], p["allocated"]) for p in summary["curve"]] == [(50, 50.5), (101, 50.5)]
    limits = traces.pod_document(traces.TracePod("c", 1000, 1024, 1, 5, ()), "c")["spec"]["containers"][0]  # type: ignore[index]
    assert limits["resources"]["limits"]["nvidia.com/gpucores"] == "1"


def test_an_experiments_copies_never_take_the_name_of_a_trace_pod(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A trace may name a pod `p-copy1`: the first copy of `p` took that name, and the engine refused it as a pod
    # already placed, a failure the cluster had room for. Three pods of 300 fit one GPU: p, p-copy1 and a copy.
    nodes, pods = write_trace(tmp_path, ["solo,32000,131072,1,T4"], [pod_row("p", 1, 300), pod_row("p-copy1", 1, 300)])
    nodes_list, pod_list = traces.read_nodes(nodes), traces.read_pods(pods)
    from kubegpu.core.plugin_manager import make_plugin_manager
    from kubegpu.scheduler.engine import Engine

    result = traces.replay(Engine(make_plugin_manager("scheduler")), nodes_list, pod_list, "experiment", inflate=1.2)
    names = [str(event["pod"]) for event in result.events]
    assert len(names) == len(set(names)) == result.pods == 4
    assert result.scheduled == 3 and "already holds" not in str([event.get("reason") for event in result.events])


# ---------------------------------------------------------------------------------------------------------------
# Bad input: a clear error naming file:line and the column, nothing scheduled
# ---------------------------------------------------------------------------------------------------------------

GOOD_NODE = "n0,32000,131072,2,V100M16"


@pytest.mark.parametrize(
    ("node_rows", "pod_rows", "expected"),
    [
        ([GOOD_NODE, "n1,lots,131072,2,V100M16"], [], "nodes.csv:3: cpu_milli: 'lots' is not a whole number"),
        ([GOOD_NODE, "n1,-5,131072,2,V100M16"], [], "nodes.csv:3: cpu_milli: '-5' is not a whole number"),
        ([GOOD_NODE, "n1,32000,131072,5000,V100M16"], [], "nodes.csv:3: gpu: 5000 is outside 0..1024"),
        ([GOOD_NODE, "n0,32000,131072,2,T4"], [], "nodes.csv:3: sn: node 'n0' is listed twice (first at"),
        ([GOOD_NODE, "n1,32000"], [], "nodes.csv:3: 2 fields, the header names 5"),
        ([GOOD_NODE, "\x1b[31mred,32000,131072,2,T4"], [], "nodes.csv:3: sn: '\\x1b[31mred' is not a name"),
        ([GOOD_NODE, '"n1,32000,131072,2,T4'], [], "nodes.csv:3: not valid CSV"),
        ([GOOD_NODE], [pod_row("p", 1, 1500)], "pods.csv:2: gpu_milli: 1500 is outside 0..1000"),
        ([GOOD_NODE], [pod_row("p", 2, 500)], "pods.csv:2: gpu_milli: 500 for a pod asking 2 GPUs"),
        ([GOOD_NODE], [pod_row("p", 1, 0)], "pods.csv:2: gpu_milli: 0 for a pod asking 1 GPU(s)"),
        ([GOOD_NODE], [pod_row("p", 1, 500), pod_row("c", 0, "n/a")], "pods.csv:3: gpu_milli: 'n/a' is not a whole"),
        ([GOOD_NODE], [pod_row("p", 1, 500), pod_row("p", 1, 500)], "pods.csv:3: name: pod 'p' is listed twice"),
        ([GOOD_NODE], [pod_row("p" * 300, 1, 500)], "pods.csv:2: name: 300 characters (at most 253)"),
        (
            [GOOD_NODE],
            [pod_row("p", 1, 500, created=10**16)],
            "pods.csv:2: creation_time: 10000000000000000 is outside",
        ),
        (
            [GOOD_NODE],
            ["p,1000,8796093022208,1,500,,LS,Running,0,,0"],
            "pods.csv:2: memory_mib: 8796093022208 is outside 0..8796093022207",
        ),
        (
            [GOOD_NODE, "n1,32000,999999999999999,2,T4"],
            [],
            "nodes.csv:3: memory_mib: 999999999999999 is outside 0..8796093022207",
        ),
        (
            [GOOD_NODE, "n1,32000,131072,2,V100/SXM2"],
            [],
            "nodes.csv:3: model: 'V100/SXM2' is not a GPU model kubegpu can match (its spaces made dashes",
        ),
        (
            [GOOD_NODE],
            [pod_row("p", 1, 500, spec="T4|A100 (80GB)")],
            "pods.csv:2: gpu_spec: 'A100 (80GB)' is not a GPU model kubegpu can match",
        ),
        ([GOOD_NODE, "n1,32000,131072,2," + "A" * 64], [], f"nodes.csv:3: model: '{'A' * 26}…{'A' * 13}' is not a"),
        (
            [GOOD_NODE, "n1,32000,131072,2,</p><script>alert(2)</script>"],
            [],
            "nodes.csv:3: model: '</p><script>alert(2)</script>' is not a GPU model",
        ),
    ],
    ids=[
        "word-for-number",
        "negative",
        "too-many-gpus",
        "node-twice",
        "short-row",
        "escape-in-name",
        "unclosed-quote",
        "milli-over-1000",
        "multi-gpu-share",
        "gpu-without-milli",
        "cpu-only-milli-no-number",
        "pod-twice",
        "long-name",
        "huge-time",
        "pod-memory-past-int64-bytes",
        "node-memory-past-int64-bytes",
        "node-model-not-a-label-value",
        "pod-model-not-a-label-value",
        "model-too-long",
        "model-with-markup",
    ],
)
def test_a_malformed_row_exits_2_naming_the_file_line_and_column(
    node_rows: list[str], pod_rows: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = write_trace(tmp_path, node_rows, pod_rows or [pod_row("p", 1, 500)])
    code, out, err = run(capsys, "--trace-nodes", str(nodes), "--trace-pods", str(pods), "--timeline")
    assert code == 2 and out == ""
    assert err.startswith("kubegpu simulate: invalid trace: ") and expected in err, err
    assert "\x1b" not in err, "the terminal never gets an escape sequence from the file"


def test_a_row_the_engine_cannot_take_stops_the_replay_naming_the_pod_not_with_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reader's bounds keep every row a manifest the engine reads; were one to slip through (a bound loosened
    # here), the replay says which pod, as it does for a node.
    monkeypatch.setattr(traces, "MAX_MEMORY_MIB", traces.MAX_VALUE)
    nodes, pods = write_trace(tmp_path, [GOOD_NODE], ["big,1000,999999999999999,1,500,,LS,Running,0,,0"])
    code, out, err = run(capsys, "--trace-nodes", str(nodes), "--trace-pods", str(pods))
    assert code == 2 and out == ""
    assert err.startswith("kubegpu simulate: invalid trace: pod big: Pod.spec.containers[0].resources.limits.memory")


def test_a_gpu_model_written_with_spaces_matches_in_both_files_as_gfd_labels_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`V100 SXM2` is no label value; GPU Feature Discovery labels such a product with dashes, and so does the replay,
    in the node list and in the pods' `gpu_spec` alike, so the pods that ask for the model find its nodes."""
    nodes, pods = write_trace(
        tmp_path,
        ["v100,32000,131072,2,V100 SXM2", "t4,32000,131072,1,T4"],
        [pod_row("a", 1, 1000, spec="V100 SXM2"), pod_row("b", 1, 500, spec="T4|V100 SXM2"), pod_row("c", 1, 500)],
    )
    summary = replay_json(capsys, nodes, pods, "--timeline")
    assert (summary["scheduled"], summary["failed"]) == (3, 0)


def test_a_header_without_a_needed_column_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_trace(
        tmp_path, ["n0,32000,2,V100"], [pod_row("p", 1, 500)], node_header="sn,cpu_milli,gpu,model"
    )
    code, _, err = run(capsys, "--trace-nodes", str(nodes), "--trace-pods", str(pods))
    assert code == 2 and "nodes.csv:1: the header lacks column memory_mib" in err


def test_the_timeline_needs_the_time_columns_the_experiment_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(f"{NODE_HEADER}\n{GOOD_NODE}\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,1000,1024,1,500,\n")
    code, _, err = run(capsys, "--trace-nodes", str(nodes), "--trace-pods", str(pods), "--timeline")
    assert code == 2 and "pods.csv:1: the header lacks column creation_time, deletion_time" in err
    assert replay_json(capsys, nodes, pods)["scheduled"] >= 1


@pytest.mark.parametrize(
    ("limit", "value", "expected"),
    [
        ("MAX_ROWS", 3, "pods.csv:5: more than 3 rows"),
        ("MAX_TRACE_BYTES", 200, "pods.csv: larger than"),
        ("MAX_LINES", 5, "pods.csv:6: more than 5 lines"),
    ],
    ids=["rows", "bytes", "lines"],
)
def test_a_trace_past_the_bounds_is_refused_before_it_is_read_whole(
    limit: str, value: int, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.setattr(traces, limit, value)
    nodes, pods = write_trace(tmp_path, [GOOD_NODE], [pod_row(f"p{i}", 1, 500) for i in range(10)])
    code, _, err = run(capsys, "--trace-nodes", str(nodes), "--trace-pods", str(pods))
    assert code == 2 and expected in err, err


@pytest.mark.parametrize(
    ("header", "rows", "expected"),
    [
        (POD_HEADER + ",x" * 1_000_000, [pod_row("p", 1, 500)], "pods.csv:1: a line longer than 65536 characters"),
        (POD_HEADER, [pod_row("p", 1, 500) + "," * 70_000], "pods.csv:2: a line longer than 65536 characters"),
        (POD_HEADER, [pod_row("p", 1, 500), "\n" * 2_000_000], "pods.csv:2000001: more than 2000000 lines"),
        # Short lines joined into one header by quoted line ends: 60 MiB of them made 21 million columns, 1.7 GB.
        (
            POD_HEADER + ',"q\n' + ('q",' + "ab," * 20_000 + '"q\n') * 40 + 'q"',
            [pod_row("p", 1, 500)],
            "pods.csv:3: a row (its quoted line ends joining lines) longer than 65536 characters",
        ),
    ],
    ids=["million-columns", "wide-row", "empty-lines", "columns-in-quoted-lines"],
)
def test_a_line_of_megabytes_or_millions_of_lines_are_refused_before_they_are_cut_into_fields(
    header: str, rows: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A header of a million short columns is 2 MB of file and was about 60 MB as Python's strings and lists (64 MiB
    # of it took 2 GB and 11 s); a line is refused at its length, read at most that far (T148).
    nodes, pods = write_trace(tmp_path, [GOOD_NODE], [])
    pods.write_text("\n".join([header, *rows]) + "\n")
    code, out, err = run(capsys, "--trace-nodes", str(nodes), "--trace-pods", str(pods))
    assert code == 2 and out == "" and expected in err, err


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (["n{i},1000,1024,1024,A10"] * 98, "nodes.csv:99: gpu: the trace's nodes have more than 100000 GPUs"),
        (["n{i},1000,1024,0,"] * 50_000 + ["last,32000,131072,2,V100M16"], "nodes.csv:50002: more than 50000 nodes"),
    ],
    ids=["gpus", "nodes"],
)
def test_a_node_list_that_would_build_more_than_a_cluster_is_refused_at_the_row_that_crosses(
    rows: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each node row costs the engine 1.7 KB, and 270 KB with 1024 GPUs: a 15 MB node list of 1,000,000 rows of
    # 1024 GPUs asked for 270 GB and minutes before the first pod, under the 64 MiB and 1,000,000-row bounds.
    nodes, pods = write_trace(tmp_path, [row.format(i=i) for i, row in enumerate(rows)], [pod_row("p", 1, 500)])
    code, out, err = run(capsys, "--trace-nodes", str(nodes), "--trace-pods", str(pods))
    assert code == 2 and out == "" and expected in err, err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--trace-nodes", "{nodes}"], "a trace is two files"),
        (["--trace-nodes", "{nodes}", "--trace-pods", "{pods}", "extra.yaml"], "no manifest FILE beside them"),
        (["--trace-nodes", "{nodes}", "--trace-pods", "{pods}", "--inflate", "0"], "--inflate: 0.0 is outside"),
        (["--trace-nodes", "{nodes}", "--trace-pods", "{missing}"], "missing.csv: cannot read"),
        ([], "give manifest FILEs, or a trace"),
        (["--trace-nodes", "{nodes}", "--trace-pods", "{pods}", "--seed", "-5"], "--seed: '-5' is not a whole number"),
        (["--trace-nodes", "{nodes}", "--trace-pods", "{pods}", "--seed", "4_2"], "'4_2' is not a whole number"),
        (["--trace-nodes", "{nodes}", "--trace-pods", "{pods}", "--seed", "\u0664\u0662"], "is not a whole number"),
        (["--trace-nodes", "{nodes}", "--trace-pods", "{pods}", "--seed", str(2**64)], "is outside 0..2**64-1"),
        (["--trace-nodes", "{nodes}", "--trace-pods", "{pods}", "--seed", "4.2"], "'4.2' is not a whole number"),
    ],
    ids=[
        "one-file",
        "manifests-too",
        "no-inflation",
        "missing-file",
        "nothing",
        "negative-seed",
        "underscored-seed",
        "arabic-indic-seed",
        "huge-seed",
        "float-seed",
    ],
)
def test_arguments_that_make_no_replay_exit_2_saying_what_to_give(
    argv: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = write_trace(tmp_path, [GOOD_NODE], [pod_row("p", 1, 500)])
    paths = {"nodes": str(nodes), "pods": str(pods), "missing": str(tmp_path / "missing.csv")}
    try:
        code, _, err = run(capsys, *(a.format(**paths) for a in argv))
    except SystemExit as stop:  # argparse's own refusal
        code, err = int(str(stop.code)), capsys.readouterr().err
    assert code == 2 and expected in err, err
    assert "Traceback" not in err


def test_trace_file_names_of_any_bytes_are_shown_escaped_in_the_text_json_and_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A file's name is bytes: one that is no UTF-8 (a lone surrogate in Python) stopped --json and --html with a
    # traceback after the replay, and an escape or a bidi override reached the page as it was.
    nodes, pods = write_trace(tmp_path, [GOOD_NODE], [pod_row("p", 1, 500)])
    odd = tmp_path / os.fsdecode(b"pods\xff\x1b[31m\xe2\x80\xae<b>.csv")
    pods.rename(odd)
    page_path = tmp_path / "trace.html"
    summary = replay_json(capsys, nodes, odd, "--html", str(page_path))
    assert summary["trace"]["pods"].endswith("pods\\udcff\\x1b[31m\\u202e<b>.csv")
    page = page_path.read_text()
    assert "pods\\udcff\\x1b[31m\\u202e&lt;b&gt;.csv" in page and "\x1b" not in page and "\u202e" not in page
    code, out, _ = run(capsys, "--trace-nodes", str(nodes), "--trace-pods", str(odd))
    assert code == 0 and out.startswith("kubegpu simulate: pods\\udcff\\x1b[31m\\u202e<b>.csv on nodes.csv")


# ---------------------------------------------------------------------------------------------------------------
# The HTML report: the curve as a picture, names from the trace as text
# ---------------------------------------------------------------------------------------------------------------

HOSTILE_NODE = '"><img src=x onerror=alert(1)>'
HOSTILE_POD = "<svg onload=alert(3)>"


def hostile_trace(folder: Path) -> tuple[Path, Path]:
    # The csv module quotes nothing here: the fields hold no comma or quote the CSV reader would need escaped. A GPU
    # model carries no markup: one that is no label value is refused at its row (`model-with-markup` above).
    return write_trace(
        folder,
        [f"{HOSTILE_NODE.replace(chr(34), '')},32000,131072,2,V100M16", "plain,32000,131072,2,V100M16"],
        [pod_row(HOSTILE_POD, 1, 500), *(pod_row(f"p{i}", 1, 1000) for i in range(4))],
    )


def test_the_page_draws_the_curve_and_escapes_every_name_from_the_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = hostile_trace(tmp_path)
    page_path = tmp_path / "trace.html"
    summary = replay_json(capsys, nodes, pods, "--html", str(page_path))
    page = page_path.read_text()
    tags = elements(page)
    (polyline,) = [dict(attrs) for tag, attrs in tags if tag == "polyline"]
    assert polyline["class"] == "alloc" and int(polyline["data-points"] or 0) == len(summary["curve"])
    assert len((polyline["points"] or "").split()) == len(summary["curve"])
    assert [tag for tag, _ in tags if tag in ("script", "img")] == ["script"]
    assert [(tag, name) for tag, attrs in tags for name, _ in attrs if name.startswith("on")] == []


def test_a_curve_asked_far_past_the_capacity_draws_a_score_of_ticks_not_millions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A timeline's asked share has no ceiling: 300 pods of 1024 GPUs on one GPU ask 30,720,000 % of it, and the
    # chart drew a tick every 100 % (307,201 labels, 15 MB of page; 5,000 such rows made 280 MB and 1.2 GB).
    nodes, pods = write_trace(
        tmp_path, ["solo,32000,131072,1,T4"], [pod_row(f"p{i}", 1024, 1000, created=i) for i in range(300)]
    )
    page_path = tmp_path / "trace.html"
    summary = replay_json(capsys, nodes, pods, "--timeline", "--html", str(page_path))
    assert summary["curve"][-1]["arrived"] == 30_720_000
    ticks = [dict(attrs) for tag, attrs in elements(page_path.read_text()) if tag == "text"]
    labels = [int(str(t["x"]).split(".")[0]) for t in ticks if t.get("class") == "xtick"]
    assert 5 <= len(labels) <= 21 and labels == sorted(labels)
    assert page_path.stat().st_size < 100_000
    # They asked for all of it and more: the first pod alone asked 102,400 %, so no arrival rounds to 100 %.
    leapt = "no pod's arrival made the GPU capacity asked for 100% (it leapt from 0% to 102400%)"
    assert f'<p class="headline">{leapt.replace(chr(39), "&#x27;")}</p>' in page_path.read_text()
    code, out, _ = run(capsys, "--trace-nodes", str(nodes), "--trace-pods", str(pods), "--timeline")
    assert code == 0 and f"  {leapt}\n" in out and "never asked" not in out


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    try:
        chromium = Chromium()
    except ChromiumMissing as exc:
        pytest.fail(str(exc))
    with chromium:
        yield chromium


CHART = """
(function () {
  var line = document.querySelector("#curve polyline.alloc");
  var box = line.getBoundingClientRect();
  var dot = document.querySelector("#curve circle.at-full");
  return {width: box.width, height: box.height, points: line.points.numberOfItems,
          headline: document.querySelector("#curve .headline").textContent, dot: dot ? dot.getAttribute("cy") : null};
})()
"""


def test_the_curve_opens_in_chromium_and_hostile_names_run_no_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], browser: Chromium
) -> None:
    nodes, pods = hostile_trace(tmp_path)
    page_path = tmp_path / "trace.html"
    summary = replay_json(capsys, nodes, pods, "--html", str(page_path), "--inflate", "1.5")
    mark = len(browser.events)
    browser.open(page_path.as_uri())
    assert browser.errors(mark) == [] and browser.dialogs(mark) == []
    chart = browser.evaluate(CHART)
    assert chart["points"] == len(summary["curve"]) and chart["width"] > 300 and chart["height"] > 50
    assert chart["headline"].startswith(f"{summary['allocatedAtFull']:.1f}% of the GPU capacity allocated")
    assert chart["dot"] is not None
    assert browser.evaluate('document.querySelectorAll("script, img").length') == 1
    text = browser.evaluate("document.body.textContent")
    assert HOSTILE_NODE.replace('"', "") in text and HOSTILE_POD in text
    screenshot = browser.screenshot(SCREENSHOTS / "trace-curve.png")
    assert screenshot.stat().st_size > 10_000


def test_requests_remembered_per_shape_equal_each_pod_parsed_afresh() -> None:
    # The replay parses one manifest per shape and renames it for the other pods of that shape (`_Requests`); a
    # fresh parse of every pod's own manifest is the oracle.
    shapes = [(1000, 1024, 1, 500, ()), (8000, 65536, 2, 1000, ("V100M16", "V100M32")), (4000, 2048, 0, 0, ())]
    remembered = traces._Requests()
    for i in range(30):
        cpu, memory, gpus, milli, models = shapes[i % len(shapes)]
        pod = traces.TracePod(f"pod-{i}", cpu, memory, gpus, milli, models)
        fresh, _ = pod_request(traces.pod_document(pod, f"pod-{i}"))
        assert remembered.get(pod, f"pod-{i}") == fresh


# ---------------------------------------------------------------------------------------------------------------
# The garbage collector during a replay
# ---------------------------------------------------------------------------------------------------------------


def test_a_replay_lets_the_collector_pass_over_young_objects_only_and_gives_its_thresholds_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each full pass of the collector walks every memo of the engine (millions of objects on openb, none of them
    # garbage): `kubegpu simulate` replays a trace as it runs manifests, its oldest generation never collected by
    # the collector's own rule, the thresholds as they were afterwards.
    import gc

    from kubegpu.scheduler import simulate

    nodes, pods = write_trace(tmp_path, four_nodes_of_two_gpus(), [pod_row(f"p{i}", 1, 300) for i in range(8)])
    seen: list[tuple[int, int, int]] = []
    replay = traces.replay

    def observed(*args: Any, **kwargs: Any) -> traces.ReplayResult:
        seen.append(gc.get_threshold())
        return replay(*args, **kwargs)

    monkeypatch.setattr(traces, "replay", observed)
    found = gc.get_threshold()
    document = replay_json(capsys, nodes, pods, "--inflate", "1.0")
    assert document["scheduled"] == 4 * 2 * 3  # three shares of 300 on each GPU of the four nodes
    assert [threshold[2] for threshold in seen] == [simulate.NO_FULL_COLLECTION]
    assert gc.get_threshold() == found
