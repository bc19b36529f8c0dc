"""Rotating the allocation key (`--allocation-verify-key-file`): what every process that reads allocations accepts
while a new key replaces the old one (docs/security.md, "The allocation key").

Before, a scheduler started with a new key read every bound pod's allocation as forged: the devices the pods ran on
were set aside by count, free to be given again, and a node whose shim had the new key refused to restart any
container of those pods. Now the scheduler side signs with `--allocation-key-file` only and accepts signatures of the
verify keys too, counting the pods that hold devices by one (`kubegpu_scheduler_pods_on_verify_keys`, so the operator
knows when the old key may go); the node side and `kubegpu top` accept them likewise.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from kubegpu import cli
from kubegpu.core.annotations import ALLOCATION_KEY, decode_allocation, verify_allocation, verifying_key
from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.process import MAX_VERIFY_KEYS, read_verify_keys
from kubegpu.core.testing import make_pod, node_manifest, pod_manifest
from kubegpu.crishim.verify import AllocationRefused, PodIdentity, verified_allocation
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.health import Metrics
from kubegpu.scheduler.top import ClusterView

from . import toy_plugin as toy
from .test_engine import toy_node
from .test_service_guards import RecordingWriter
from .test_top_view import NEURON_16, TRN1, bound_pod, holders

CARD = toy.RESOURCE
OLD, NEW, OTHER = b"o" * 32, b"n" * 32, b"x" * 32


def toy_engine(**kwargs: object) -> Engine:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("toy", toy)], autoload=False), **kwargs)  # type: ignore[arg-type]
    engine.add_node(toy_node("n1", 4))  # type: ignore[arg-type]
    return engine


def bound_under(key: bytes, *sizes: int) -> list[tuple[PodRequest, str]]:
    """Pods of `sizes` cards placed on n1 by a scheduler signing with `key`, as a restarted scheduler lists them:
    each with the annotation the Binding wrote."""
    engine = toy_engine(signing_key=key)
    placed = []
    for at, cards in enumerate(sizes):
        name = f"p{at}-{cards}"
        decision = engine.schedule(make_pod(name, {"main": {CARD: cards}}))
        assert decision.scheduled
        placed.append(
            (
                make_pod(name, {"main": {CARD: cards}}, annotations=decision.annotations),
                decision.annotations[ALLOCATION_KEY],
            )
        )
    return placed


def cards_of(annotation: str) -> set[str]:
    return set(decode_allocation(annotation).device_ids("main", CARD))


def test_a_scheduler_rotated_to_a_new_key_keeps_the_devices_the_old_key_allocated() -> None:
    ((running, annotation),) = bound_under(OLD, 2)
    engine = toy_engine(signing_key=NEW, verify_keys=[OLD])
    assert engine.admit_bound(running, "n1", decode_allocation(annotation)).ok
    assert engine.on_verify_keys == {running.key}

    placed = engine.schedule(make_pod("new", {"main": {CARD: 2}}))
    assert placed.scheduled and not cards_of(placed.annotations[ALLOCATION_KEY]) & cards_of(annotation)
    record = decode_allocation(placed.annotations[ALLOCATION_KEY])
    assert verify_allocation(record, NEW) and not verify_allocation(record, OLD), "signed with the new key only"
    assert engine.on_verify_keys == {running.key}, "a pod signed with the new key is not counted"
    assert not engine.schedule(make_pod("more", {"main": {CARD: 1}})).scheduled, "the running pod's cards stay held"

    with engine.pods_removed([running.key]):  # a preemption's what-if is no departure
        pass
    assert engine.on_verify_keys == {running.key}
    engine.release(running.key)
    assert engine.on_verify_keys == set()


def test_without_the_old_key_the_running_pods_allocation_holds_nothing() -> None:
    ((running, annotation),) = bound_under(OLD, 2)
    status = toy_engine(signing_key=NEW).admit_bound(running, "n1", decode_allocation(annotation))
    assert not status.ok and "does not verify with the scheduler's key" in status.message


def test_an_allocation_no_key_verifies_is_refused_naming_both_flags() -> None:
    ((forged, annotation),) = bound_under(OTHER, 1)
    engine = toy_engine(signing_key=NEW, verify_keys=[OLD])
    status = engine.admit_bound(forged, "n1", decode_allocation(annotation))
    assert not status.ok
    assert "--allocation-key-file and --allocation-verify-key-file" in status.message
    assert engine.on_verify_keys == set()


def test_the_metric_counts_the_pods_the_old_key_still_holds_devices_for() -> None:
    engine = toy_engine(signing_key=NEW, verify_keys=[OLD])
    metrics = Metrics()
    metrics.count_pods_on_verify_keys(engine.pods_on_verify_keys)

    def scraped() -> float:
        text = generate_latest(metrics.registry).decode()
        (line,) = [line for line in text.splitlines() if line.startswith("kubegpu_scheduler_pods_on_verify_keys ")]
        return float(line.split()[1])

    assert scraped() == 0.0
    pods = bound_under(OLD, 1, 2)
    for pod, annotation in pods:
        assert engine.admit_bound(pod, "n1", decode_allocation(annotation)).ok
    assert scraped() == 2.0
    assert engine.schedule(make_pod("new", {"main": {CARD: 1}})).scheduled
    assert scraped() == 2.0
    for pod, _ in pods:
        engine.release(pod.key)
    assert scraped() == 0.0, "the old key may go"


def test_the_old_keys_count_follows_pods_whose_node_goes_or_whose_devices_a_newer_allocation_takes() -> None:
    """Step 4 of the rotation reads the gauge: it must reach 0 once no pod needs the old key, and never read 0
    while one does. A node removed (scaled down) kept its pods counted for good, so the old key could never go; a
    what-if (preemption) set the pod aside uncounted, so a scrape in the middle of one read 0."""
    engine = toy_engine(signing_key=NEW, verify_keys=[OLD])
    ((running, annotation),) = bound_under(OLD, 2)
    assert engine.admit_bound(running, "n1", decode_allocation(annotation)).ok
    with engine.pods_removed([running.key]):
        assert engine.on_verify_keys == {running.key}, "a what-if is no departure, even while it runs"
    assert engine.on_verify_keys == {running.key}

    # A newer allocation (the new key's) naming the same cards displaces it: it holds nothing, and needs no key.
    fresh_engine = toy_engine(signing_key=NEW)
    fresh = fresh_engine.schedule(make_pod("fresh", {"main": {CARD: 4}}))
    assert fresh.scheduled
    fresh_pod = make_pod("fresh", {"main": {CARD: 4}}, annotations=fresh.annotations)
    assert engine.admit_bound(fresh_pod, "n1", decode_allocation(fresh.annotations[ALLOCATION_KEY])).ok
    assert running.key not in engine.pods
    assert engine.on_verify_keys == set()

    other = toy_engine(signing_key=NEW, verify_keys=[OLD])
    assert other.admit_bound(running, "n1", decode_allocation(annotation)).ok
    assert other.remove_node("n1") == [running.key]
    assert other.on_verify_keys == set(), "the pods of a node gone need no key"


def test_the_node_side_applies_an_allocation_either_key_signed_and_refuses_a_third() -> None:
    for key in (OLD, NEW):
        ((pod, annotation),) = bound_under(key, 1)
        identity = PodIdentity(pod.namespace, pod.name, pod.uid)
        assert verified_allocation(annotation, key=NEW, node="n1", pod=identity, also=(OLD,)).node == "n1"
    ((pod, annotation),) = bound_under(OTHER, 1)
    identity = PodIdentity(pod.namespace, pod.name, pod.uid)
    with pytest.raises(AllocationRefused, match="any of this node's keys") as refused:
        verified_allocation(annotation, key=NEW, node="n1", pod=identity, also=(OLD,))
    assert refused.value.check == "signature"
    ((pod, annotation),) = bound_under(OLD, 1)
    with pytest.raises(AllocationRefused, match="does not verify with this node's key"):
        verified_allocation(annotation, key=NEW, node="n1", pod=PodIdentity(pod.namespace, pod.name, pod.uid))


def test_verifying_key_names_the_first_key_that_verifies() -> None:
    record = decode_allocation(bound_under(OLD, 1)[0][1])
    assert verifying_key(record, (NEW, OLD)) == 1
    assert verifying_key(record, (OLD, NEW)) == 0
    assert verifying_key(record, (NEW, OTHER)) is None
    assert verifying_key(record.model_copy(update={"signature": "not hex"}), (OLD,)) is None


def test_top_draws_what_either_key_signed_and_hides_what_neither_did() -> None:
    view = ClusterView(make_plugin_manager("scheduler"), NEW, verify_keys=[OLD])
    view.sync_pods(
        [
            bound_pod("old", ["0", "1"], key=OLD),
            bound_pod("new", ["2", "3"], key=NEW),
            bound_pod("forged", ["4", "5"], key=OTHER),
        ]
    )
    view.sync_nodes([node_manifest("trn1-a", labels=TRN1, allocatable=NEURON_16)])
    assert holders(view) == {"0": ["default/old"], "1": ["default/old"], "2": ["default/new"], "3": ["default/new"]}
    assert view.report().problems == (
        "default/forged: allocation not shown: its signature does not verify with any of the key files",
    )


def write_key(path: Path, key: bytes) -> str:
    path.write_bytes(key + b"\n")
    path.chmod(0o600)
    return str(path)


def test_verify_keys_are_read_as_the_key_is_once_each_and_at_most_four(tmp_path: Path) -> None:
    old = write_key(tmp_path / "old", OLD)
    again = write_key(tmp_path / "again", OLD)
    assert read_verify_keys([old, again], NEW) == (OLD,), "a repeat is kept once"
    with pytest.raises(SystemExit, match=f"at most {MAX_VERIFY_KEYS} keys"):
        read_verify_keys([old] * (MAX_VERIFY_KEYS + 1), NEW)
    weak = write_key(tmp_path / "weak", b"short")
    with pytest.raises(SystemExit, match="at least 32 are needed"):
        read_verify_keys([weak], NEW)


COMMANDS = {
    "scheduler": [],
    "extender": ["--insecure-no-client-auth"],
    "crishim": ["--node-name", "n"],
    "device-plugin": ["--node-name", "n"],
    "top": [],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    ("verify", "refusal"),
    [
        ("same", "verify key file .*/same holds the same key as --allocation-key-file, so no other key would be "),
        ("empty", "verify key file .*/empty is empty; create one"),
        ("short", "the allocation verify key in .*/short is 5 bytes; at least 32"),
        ("directory", "allocation verify key file .*/directory is not a regular file|cannot read the allocation "
         "verify key file .*/directory"),
        ("missing", "cannot read the allocation verify key file .*/missing: No such file"),
        ("five", "--allocation-verify-key-file given 5 times; at most 4"),
    ],
)  # fmt: skip
def test_a_process_given_a_verify_key_it_cannot_use_refuses_to_start_saying_which(
    command: str, verify: str, refusal: str, tmp_path: Path
) -> None:
    """Every process that reads allocations, given a verify key file that is its own key (both flags naming the
    Secret's `next`, or `next` written with the old key's bytes), empty, short, a directory, missing, or more than
    four, exits at start naming the file and the flag, before it reads anything. Before, the process's own key was
    taken as a verify key and dropped without a word: a scheduler rolled so in step 2 accepted the new key alone and
    read every running pod's allocation as forged (T178), while the operator believed it accepted both."""
    key = write_key(tmp_path / "key", NEW)
    write_key(tmp_path / "same", NEW)
    write_key(tmp_path / "old", OLD)
    (tmp_path / "empty").write_bytes(b"")
    write_key(tmp_path / "short", b"short")
    (tmp_path / "directory").mkdir()
    files = [str(tmp_path / "old")] * 5 if verify == "five" else [str(tmp_path / verify)]
    flags = [flag for path in files for flag in ("--allocation-verify-key-file", path)]
    with pytest.raises(SystemExit, match=refusal):
        cli.main([command, *COMMANDS[command], "--allocation-key-file", key, *flags, "--kubeconfig", "/nowhere"])


@pytest.mark.parametrize("command", ["scheduler", "extender", "crishim", "device-plugin", "top"])
def test_every_process_that_reads_allocations_takes_verify_keys(command: str) -> None:
    required = {
        "scheduler": ["--allocation-key-file", "k"],
        "extender": ["--allocation-key-file", "k"],
        "crishim": ["--node-name", "n", "--allocation-key-file", "k"],
        "device-plugin": ["--node-name", "n", "--allocation-key-file", "k"],
        "top": [],
    }[command]
    argv = [command, *required, "--allocation-verify-key-file", "a", "--allocation-verify-key-file", "b"]
    args = cli.build_parser(argv).parse_args(argv)
    assert args.allocation_verify_key_file == ["a", "b"]


def toy_manifest(name: str) -> dict[str, object]:
    return node_manifest(name, labels={"toy.example/cards": "2"}, allocatable={CARD: 2})


def running_under(key: bytes, name: str, node: str, cards: int = 2) -> dict[str, object]:
    """Pod `name` as an API server lists it once a scheduler signing with `key` bound it to `node` (uid `uid-NAME`)."""
    signer = Engine(make_plugin_manager("scheduler", plugins=[("toy", toy)], autoload=False), signing_key=key)
    signer.add_node(node_info(toy_manifest(node)))
    manifest = pod_manifest(name, {"main": {CARD: cards}}, scheduler_name="kubegpu")
    manifest["metadata"].update(uid=f"uid-{name}", resourceVersion="1")
    decision = signer.schedule(pod_request(manifest, signer.plugins.qualifiers)[0])
    assert decision.scheduled
    manifest["metadata"]["annotations"] = dict(decision.annotations)
    manifest["spec"]["nodeName"] = node
    manifest["status"] = {"phase": "Running"}
    return manifest


def gauge(service: CustomScheduler) -> float:
    value = service.metrics.registry.get_sample_value("kubegpu_scheduler_pods_on_verify_keys")
    assert value is not None
    return value


def test_the_old_keys_count_takes_in_pods_bound_to_a_node_not_listed_yet_or_deleted() -> None:
    """Step 4 of the rotation drops the old key when `kubegpu_scheduler_pods_on_verify_keys` reads 0: it must not read
    0 while a running pod's allocation only the old key verifies, wherever its Node object is. A pod bound to a node
    the scheduler has not listed yet (the standby's pod watch ahead of its node watch; a Node kubegpu cannot read),
    or whose Node object was deleted while its kubelet runs on (it registers again), keeps its containers, and the
    shim verifies its allocation again at each restart. Before, such a pod was left out: the gauge read 0, the old
    key went, and the pod's next container restart was refused; and a pod met before its node was never counted
    when the node came (an `AllocationRefused` Event said its allocation named an unknown node), its cards free."""
    engine = Engine(make_plugin_manager("scheduler", plugins=[("toy", toy)], autoload=False), signing_key=NEW,
                    verify_keys=[OLD])  # fmt: skip
    service = CustomScheduler(None, RecordingWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    service.mirror.on_nodes("SYNC", [toy_manifest("n1")])
    service.mirror.on_pods("SYNC", [])
    early = running_under(OLD, "early", "n2")
    service.mirror.on_pods("ADDED", early)
    assert gauge(service) == 1.0, "a pod on the old key whose node is not listed yet needs the old key"
    assert writer.events("AllocationRefused") == []

    service.mirror.on_nodes("ADDED", toy_manifest("n2"))
    placed = engine.placement("default/early")
    assert placed is not None and placed.allocation is not None, "its node listed, the pod holds its cards"
    assert gauge(service) == 1.0
    assert list(engine.holders("n2")) == ["default/early"]

    forged = running_under(OTHER, "forged", "n3")
    service.mirror.on_pods("ADDED", forged)
    service.mirror.on_nodes("ADDED", toy_manifest("n3"))
    assert list(engine.holders("n3")) == ["default/forged"], "its kubelet admits it by count: so does the scheduler"
    (refused,) = writer.events("AllocationRefused")
    assert "verifies with none of the scheduler's keys" in refused["message"], refused["message"]
    assert gauge(service) == 1.0

    service.mirror.on_nodes("DELETED", toy_manifest("n2"))
    assert gauge(service) == 1.0, "its Node object deleted, the pod runs on and restarts on the old key"
    service.mirror.on_pods("DELETED", early)
    assert gauge(service) == 0.0, "the old key may go"


@pytest.mark.parametrize(
    ("manifest", "mounted"),
    [
        ("scheduler/deployment.yaml", "/etc/kubegpu"),
        ("extender/extender.yaml", "/etc/kubegpu/key"),
        ("kustomize/overlays/node-device-plugin/device-plugin.yaml", "/etc/kubegpu/key"),
    ],
)
def test_the_shipped_pods_mount_the_whole_secret_where_the_rotation_doc_says(manifest: str, mounted: str) -> None:
    """Step 1 of the rotation adds `next` to the Secret and names `/etc/kubegpu/next` (scheduler) or
    `/etc/kubegpu/key/next` (extender, device plugin): true only while each shipped pod mounts the whole Secret (no
    `items`, no `subPath`) at that directory and reads its key from `key` there."""
    import yaml

    path = Path(__file__).resolve().parents[2] / "examples" / "deploy" / manifest
    (workload,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] in ("Deployment", "DaemonSet")]
    spec = workload["spec"]["template"]["spec"]
    (volume,) = [v for v in spec["volumes"] if (v.get("secret") or {}).get("secretName") == "kubegpu-allocation-key"]
    assert "items" not in volume["secret"]
    (container,) = spec["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert (mount["mountPath"], mount.get("subPath")) == (mounted, None)
    assert f"--allocation-key-file={mounted}/key" in container["args"]
    assert f"{mounted}/next" in (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
