"""`benchmarks/sharing_bench.py` measures what `kubegpu simulate --trace-nodes ... --trace-pods ...` does: its
replay loop runs with the cyclic collector's young generations only, as the simulator's trace path runs
(`simulate.young_collections_only`), and gives the thresholds back."""

from __future__ import annotations

import gc
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kubegpu.scheduler import simulate
from kubegpu.scheduler.traces import TraceNode, TracePod

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _bench() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # the benchmark imports its sibling `openb_family`
    try:
        spec = importlib.util.spec_from_file_location("sharing_bench", BENCHMARKS / "sharing_bench.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def test_the_replay_runs_with_young_collections_only_as_the_simulators_trace_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bench = _bench()
    nodes = [TraceNode(f"n{i}", 32000, 131072, 2, "V100M16") for i in range(4)]
    pods = [TracePod(f"p{i}", 4000, 8192, 1, 500, ()) for i in range(8)]
    seen: list[int] = []
    read = bench.pod_request

    def observed(document: Any) -> Any:
        seen.append(gc.get_threshold()[2])
        return read(document)

    monkeypatch.setattr(bench, "pod_request", observed)
    found = gc.get_threshold()
    allocated, _, tried = bench.replay(nodes, pods, 42, "fgd", 0, False)
    assert tried > 8 and allocated > 0
    assert set(seen) == {simulate.NO_FULL_COLLECTION}, f"the replay ran with the oldest threshold {set(seen)}"
    assert gc.get_threshold() == found
