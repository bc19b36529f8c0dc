"""A HAMi cluster without GPU Feature Discovery: HAMi's device plugin offers `nvidia.com/gpu` = GPUs x its split count
and describes each physical GPU in `hami.io/node-nvidia-register`, nothing else. kubegpu read such a node as one
whole GPU per share slot: 40 GPUs for 4 split 10 ways, every share refused (`node(s) offer whole GPUs only`) and
whole-GPU pods given GPU ids the node does not have (`7` of its 4). The nodes here are shaped as HAMi's device
plugin writes them, in its older entry format and its newer JSON."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.cli import main
from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.engine import Engine

REGISTER = "hami.io/node-nvidia-register"
HANDSHAKE = "hami.io/node-handshake"
V100 = "NVIDIA-Tesla V100-PCIE-32GB"  # HAMi's type: "NVIDIA-" and NVML's name
A100 = "NVIDIA-NVIDIA A100-SXM4-80GB"
T4 = "NVIDIA-Tesla T4"


def legacy(gpus: int, kind: str = V100, mib: int = 32768, unhealthy: tuple[int, ...] = ()) -> str:
    """The older releases' annotation: `uuid,split count,MiB,cores,type,numa,healthy`, each entry ended by `:`."""
    return "".join(
        f"GPU-{i:08d}-5c87-89ac-b1a6-7b53aa24b0ec,10,{mib},100,{kind},0,{str(i not in unhealthy).lower()}:"
        for i in range(gpus)
    )


def json_register(gpus: int, kind: str = A100, mib: int = 81920, unhealthy: tuple[int, ...] = ()) -> str:
    """The newer releases' JSON, as Go's encoding/json writes it with omitempty: no `index` for GPU 0, no `health`
    for a GPU that is not healthy, no `numa` of 0; listed out of index order."""
    entries = []
    for i in reversed(range(gpus)):
        entry: dict[str, Any] = {"id": f"GPU-{i:08d}-aaaa", "count": 10, "devmem": mib, "devcore": 100, "type": kind}
        if i:
            entry["index"] = i
        if i not in unhealthy:
            entry["health"] = True
        entry["mode"] = "hami-core"
        entries.append(entry)
    return json.dumps(entries, separators=(",", ":"))


def reported() -> str:
    """The handshake as HAMi's device plugin answers it (Go's time.Time.String())."""
    return f"Reported {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S}.434037031 +0000 UTC m=+1104711.777756895"


def requesting(age: timedelta) -> str:
    """The handshake as HAMi's scheduler writes it, `age` ago."""
    return f"Requesting_{datetime.now(timezone.utc) - age:%Y-%m-%d %H:%M:%S}"


def hami_node(
    name: str, register: str, *, gpus: int = 4, handshake: str | None = None, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A Node as HAMi's device plugin leaves it without GFD: `nvidia.com/gpu` = healthy GPUs x 10, its annotations."""
    annotations = {REGISTER: register, HANDSHAKE: handshake if handshake is not None else reported()}
    return node_manifest(name, labels=labels, annotations=annotations, allocatable={"nvidia.com/gpu": gpus * 10})


def engine_of(*nodes: dict[str, Any]) -> Engine:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    for node in nodes:
        engine.add_node(node_info(node))
    return engine


def pod(name: str, limits: dict[str, str], annotations: dict[str, str] | None = None) -> PodRequest:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]}
    meta = {"name": name, "namespace": "ns", "uid": name, "annotations": annotations or {}}
    return pod_request({"kind": "Pod", "metadata": meta, "spec": spec})[0]


WHOLE = {"nvidia.com/gpu": "1"}
SHARE = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30", "nvidia.com/gpumem": "20000"}


def gpus_given(engine: Engine, count: int) -> tuple[list[str], str | None]:
    """Whole-GPU pods one by one: the GPU ids they were given, and the reason the first refused one got."""
    given = []
    for i in range(count):
        placed = engine.schedule(pod(f"whole-{i}", WHOLE))
        if not placed.scheduled:
            return given, placed.reason
        assert placed.allocation is not None
        given.extend(placed.allocation.containers["main"]["nvidia.com/gpu"])
    return given, None


@pytest.mark.parametrize("register", [legacy(4, unhealthy=(2,)), json_register(4, unhealthy=(2,))], ids=["old", "json"])
def test_whole_gpu_pods_get_the_healthy_physical_gpus_and_no_id_past_them(register: str) -> None:
    given, refused = gpus_given(engine_of(hami_node("hami", register)), 5)
    assert sorted(given) == ["0", "1", "3"]  # GPU 2 registered unhealthy; before: 0..4 of "40 GPUs"
    assert refused is not None and "Insufficient nvidia.com/gpu" in refused


@pytest.mark.parametrize("register", [legacy(4), json_register(4, mib=32768)], ids=["old", "json"])
def test_shares_are_placed_by_each_gpus_registered_memory_and_split(register: str) -> None:
    engine = engine_of(hami_node("hami", register))
    placed = engine.schedule(pod("share", SHARE))
    assert placed.scheduled, placed.reason  # before: "node(s) offer whole GPUs only"
    assert placed.allocation is not None
    assert list(placed.allocation.shares["main"]["nvidia.com/gpumem"].values()) == [20000]  # MiB: memory known
    too_big = engine.schedule(pod("big", {**SHARE, "nvidia.com/gpumem": "40000"}))
    assert "node(s) have GPUs of 32768 MiB; the pod asks 40000 MiB" in (too_big.reason or "")
    # Ten shares per GPU (HAMi's split count): 40 on the node, as its kubelet admits, and no 41st.
    tiny = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "1", "nvidia.com/gpumem": "100"}
    placed_on = [engine.schedule(pod(f"t{i}", tiny)).allocation for i in range(39)]
    per_gpu = [sum(a is not None and gpu in a.shares["main"]["nvidia.com/gpu"] for a in placed_on) for gpu in "0123"]
    assert sorted(per_gpu) == [9, 10, 10, 10]  # and the first share's GPU
    assert not engine.schedule(pod("t-last", tiny)).scheduled


def test_gpu_types_are_read_from_the_registration() -> None:
    engine = engine_of(hami_node("t4", legacy(2, T4, 15360), gpus=2), hami_node("a100", json_register(4)))
    assert engine.schedule(pod("a", SHARE, {"nvidia.com/use-gputype": "A100"})).node == "a100"
    assert engine.schedule(pod("t", {**SHARE, "nvidia.com/gpumem": "2000"}, {"nvidia.com/use-gputype": "T4"})).node == (
        "t4"
    )
    placed = engine.schedule(pod("m", WHOLE, {"nvidia-gpu-scheduler/gpu.model": "NVIDIA A100-SXM4-80GB"}))
    assert placed.node == "a100" and placed.allocation is not None
    assert placed.allocation.plugins["nvidia"]["model"] == "NVIDIA A100-SXM4-80GB"  # HAMi's "NVIDIA-" prefix dropped


def test_nodes_alike_but_for_their_registration_are_not_one_class() -> None:
    """Two nodes with the same labels and allocatable: a refusal on the T4 node ("no GPU of type A100") settled
    the A100 node too, as nodes alike are settled by one unresolvable answer."""
    engine = engine_of(hami_node("a-t4", legacy(4, T4, 15360)), hami_node("b-a100", legacy(4, A100, 81920)))
    placed = engine.schedule(pod("a", WHOLE, {"nvidia.com/use-gputype": "A100"}))
    assert placed.node == "b-a100", placed.reason


STALE = requesting(timedelta(minutes=2))  # stays stale: a fresh request is made in its test, when it runs


@pytest.mark.parametrize(
    ("register", "handshake", "reason"),
    [
        (legacy(4), STALE, "HAMi's device plugin has not answered the handshake requested at"),
        (legacy(4), "Deleted_2026.01.01 10:00:00", "HAMi's scheduler marked the node's devices deleted"),
        (legacy(4), "Requesting_yesterday", "HAMi's handshake request has no time HAMi can read"),
        ("GPU-1,10,32768,100,NVIDIA-Tesla T4,0:", None, "entry 1 has 6 fields, 7 or 9 are HAMi's"),
        ("GPU-1,ten,32768,100,NVIDIA-Tesla T4,0,true:", None, "is not uuid,count,MiB,cores,type,numa,healthy"),
        ('[{"id": "GPU-1", "devmem": "32768"}]', None, "not a list of HAMi's devices (0.devmem: Input should be"),
        ("[{", None, "not a list of HAMi's devices"),
        ("junk", None, "neither a JSON list nor entries ended by ':'"),
        (legacy(65), None, "65 entries, more than the 64 GPUs read"),
        (json_register(65), None, "lists 65 GPUs, more than the 64 read"),
        ("x" * 70000, None, "is 70000 characters long, more than the 65536 read"),
    ],
    ids=[
        "stale",
        "deleted",
        "unreadable-time",
        "fields",
        "number",
        "json-type",
        "json",
        "junk",
        "many",
        "many-json",
        "long",
    ],
)
def test_a_registration_not_to_be_read_leaves_the_node_as_without_it_and_says_why(
    register: str, handshake: str | None, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        engine = engine_of(hami_node("hami", register, handshake=handshake))
    lines = [r.getMessage() for r in caplog.records if "HAMi's GPU registration is not read" in r.getMessage()]
    assert len(lines) == 1 and reason in lines[0] and lines[0].startswith("node hami: "), lines
    assert len(lines[0]) <= 600
    refused = engine.schedule(pod("share", SHARE))
    assert "offer whole GPUs only" in (refused.reason or "")  # as the node read before: its allocatable alone


def test_a_handshake_requested_moments_ago_or_answered_is_read() -> None:
    for handshake in (requesting(timedelta(seconds=5)), reported(), ""):
        assert engine_of(hami_node("hami", legacy(4), handshake=handshake)).schedule(pod("s", SHARE)).scheduled


def test_the_handshakes_rewrites_log_once_and_wake_no_pending_pod(caplog: pytest.LogCaptureFixture) -> None:
    """HAMi's device plugin rewrites its handshake every 30 seconds: each rewrite is a node change."""
    engine = engine_of()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            engine.add_node(node_info(hami_node("hami", legacy(4), handshake=STALE, labels={"rewrite": reported()})))
    assert sum("is not read" in r.getMessage() for r in caplog.records) == 1
    before = node_info(hami_node("hami", legacy(4, unhealthy=(1,)), handshake="Reported 2026-01-01 10:00:00 +0000 UTC"))
    rewritten = node_info(hami_node("hami", legacy(4, unhealthy=(1,))))
    assert engine.node_change_may_help(before, rewritten) is None
    healed = node_info(hami_node("hami", legacy(4)))
    assert engine.node_change_may_help(rewritten, healed) == "what a plugin reads of the node"
    assert engine.node_change_may_help(node_info(hami_node("hami", legacy(4), handshake=STALE)), rewritten) is not None


def gfd(count: int, product: str = "Tesla-V100-PCIE-32GB", mib: str = "32768") -> dict[str, str]:
    return {"nvidia.com/gpu.count": str(count), "nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": mib}


def test_with_gfds_labels_agreeing_the_registration_says_which_gpu_is_unhealthy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        engine = engine_of(hami_node("hami", legacy(4, unhealthy=(0,)), labels=gfd(4)))
    assert not caplog.records
    given, _ = gpus_given(engine, 5)
    assert sorted(given) == ["1", "2", "3"]


@pytest.mark.parametrize(
    ("labels", "said"),
    [
        (gfd(2), "GFD counts 2 GPU(s), HAMi registers 4"),
        (gfd(4, "Tesla-T4"), "GFD's model Tesla-T4, HAMi's Tesla V100-PCIE-32GB"),
        (gfd(4, mib="16384"), "GFD's memory 16384 MiB, HAMi's 32768 MiB"),
    ],
)
def test_where_gfd_and_the_registration_disagree_gfd_is_believed_and_the_log_says_so(
    labels: dict[str, str], said: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        engine = engine_of(hami_node("hami", legacy(4, unhealthy=(0,)), labels=labels))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"node hami: GPU Feature Discovery's labels are believed over HAMi's GPU registration, which disagrees ({said})"
    ]
    given, _ = gpus_given(engine, 5)
    assert "0" in given  # GFD says nothing of health: the registration's is not read either


def test_a_node_named_by_a_tenant_is_logged_escaped(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        engine_of(hami_node("hami", "GPU-1,1,1,1,\x1b[31mred,0:"))
    assert "\x1b" not in caplog.records[0].getMessage()


def test_kubegpu_simulate_reads_a_hami_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = hami_node("hami", legacy(4, unhealthy=(3,)), handshake="")
    pods = [pod_manifest(f"whole-{i}", {"main": {"nvidia.com/gpu": 1}}) for i in range(4)]
    pods.append(pod_manifest("share", {"main": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000}}))
    path = tmp_path / "hami.yaml"
    path.write_text(yaml.safe_dump_all([node, *pods]))
    main(["simulate", "--json", str(path)])
    events = {e["pod"]: e for e in map(json.loads, capsys.readouterr().out.split("\n")[:-1])}
    placed = [events[f"default/whole-{i}"] for i in range(4)]
    assert [e["event"] for e in placed] == ["scheduled"] * 3 + ["unschedulable"]
    assert sorted(e["devices"]["main"]["nvidia.com/gpu"][0] for e in placed[:3]) == ["0", "1", "2"]
    assert events["default/share"]["event"] == "unschedulable"  # three GPUs held whole, the fourth unhealthy
    main(["simulate", str(path)])
    assert "0#  1#  2#  3x" in capsys.readouterr().out  # four GPUs, the unhealthy one marked; before: 40 cells


@pytest.mark.parametrize(
    "annotation", ["nvidia.com/use-gputype", "nvidia.com/nouse-gputype", "nvidia-gpu-scheduler/gpu.model"]
)
def test_a_gpu_type_named_beside_mig_devices_is_refused_not_left_unread(annotation: str) -> None:
    """A MIG pod naming a GPU type was placed on a MIG device of any GPU: the MIG books do not know models."""
    mig = node_manifest(
        "mig",
        labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/mig-3g.40gb.count": "2"},
        allocatable={"nvidia.com/mig-3g.40gb": 2},
    )
    engine = engine_of(mig)
    assert engine.schedule(pod("plain", {"nvidia.com/mig-3g.40gb": "1"})).node == "mig"
    refused = engine.schedule(pod("typed", {"nvidia.com/mig-3g.40gb": "1"}, {annotation: "H100"}))
    assert not refused.scheduled
    assert f"annotation {annotation} does not choose among MIG devices (nvidia.com/mig-3g.40gb)" in (
        refused.reason or ""
    )
    assert "nodeSelector on nvidia.com/gpu.product" in (refused.reason or "")


def test_gpumem_written_as_a_byte_quantity_is_refused_with_a_hint_at_mib() -> None:
    """`nvidia.com/gpumem: 1Gi` is 1073741824 MiB, as HAMi reads it too: the refusal named the number alone."""
    refused = engine_of(hami_node("hami", legacy(4))).schedule(pod("gi", {**SHARE, "nvidia.com/gpumem": "1Gi"}))
    assert refused.reason == (
        "0/1 nodes are available: 1 node(s) have GPUs of 32768 MiB; the pod asks 1073741824 MiB of nvidia.com/gpumem "
        "per GPU (nvidia.com/gpumem counts MiB, as in HAMi: a quantity such as 1Gi is read as 1073741824 MiB; write "
        "1024 for 1 GiB)."
    )
    plain = engine_of(hami_node("hami", legacy(4))).schedule(pod("gi", {**SHARE, "nvidia.com/gpumem": "40000"}))
    assert "counts MiB" not in (plain.reason or "")


def test_a_handshake_going_stale_with_no_node_update_is_read_so_at_the_next_recheck(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """HAMi's scheduler requested the handshake 50 s ago and its device plugin never answers: no Node update comes.
    A minute after the request HAMi holds the node's devices invalid; the engine's next recheck of the plugins'
    digests builds the node again and the registration is no longer read (before: read, and its GPUs' shares
    given, until something else changed the Node)."""
    engine = engine_of(hami_node("hami", legacy(4), handshake=requesting(timedelta(seconds=50))))
    assert engine.schedule(pod("before", SHARE)).scheduled
    assert engine.recheck_digests() == []  # nothing changed yet: nothing built again
    later = datetime.now(timezone.utc) + timedelta(seconds=15)

    class Later(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return later

    monkeypatch.setattr(nvidia, "datetime", Later)
    with caplog.at_level(logging.WARNING):
        assert engine.recheck_digests() == ["hami"]
    assert "has not answered the handshake" in caplog.text
    refused = engine.schedule(pod("after", SHARE))  # the node's GPUs as allocatable alone says: no shares
    assert not refused.scheduled, refused
    assert engine.recheck_digests() == []  # stale stays stale: built once
