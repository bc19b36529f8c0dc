"""kubegpu's default score weights are kube-scheduler 1.20.2's, read from the real binary.

`kube-scheduler --write-config-to` writes the configuration it would run with, its default profile spelled out
(every extension point's plugins and the score weights); no API server is needed for that. kubegpu's default profile
(`scores.Profile.default("spread")`: LeastAllocated is kube-scheduler's own policy) must weigh every score plugin as
that file does, with kubegpu's device and fragmentation scores as the additions, and every filter kube-scheduler runs
must be one the engine runs or one it declares it has nothing to do for.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from kubegpu.scheduler import scores
from kubegpu.scheduler.config import load_config

from .cluster import binary_dir, unreachable_kubeconfig


def written_file(tmp_path: Path) -> Path:
    kubeconfig = unreachable_kubeconfig(tmp_path)
    written = tmp_path / "kube-scheduler.yaml"
    subprocess.run(
        # No listener: kube-scheduler opens its default ports (10251, 10259) before writing, and another scheduler
        # on the machine (a test or a benchmark running beside this one) holds them.
        [
            str(binary_dir() / "kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            f"--write-config-to={written}",
            "--port=0",
            "--secure-port=0",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return written


def written_profile(tmp_path: Path) -> dict[str, Any]:
    config = yaml.safe_load(written_file(tmp_path).read_text())
    [profile] = config["profiles"]
    assert profile["schedulerName"] == "default-scheduler"
    plugins: dict[str, Any] = profile["plugins"]
    return plugins


def test_the_default_score_weights_are_kube_scheduler_1_20s(tmp_path: Path) -> None:
    plugins = written_profile(tmp_path)
    theirs = {p["name"]: p["weight"] for p in plugins["score"]["enabled"]}
    ours = dict(scores.Profile.default("spread").weights)
    assert ours.pop(scores.DEVICES) == 1  # kubegpu's own: the device plugins' topology score
    assert ours.pop(scores.FRAGMENTATION) == 5  # and the devices a pod would strand (FGD's measure)
    assert ours == theirs
    assert theirs["NodePreferAvoidPods"] == 10000 and theirs["ImageLocality"] == 1


def test_every_filter_kube_scheduler_runs_is_run_or_declared_moot(tmp_path: Path) -> None:
    plugins = written_profile(tmp_path)
    theirs = {p["name"] for p in plugins["filter"]["enabled"]}
    assert theirs <= set(scores.FILTER_PLUGINS) | scores.UNSUPPORTED_FILTERS
    # DynamicResources (DRA) arrived after 1.20 (kube-scheduler 1.26): the one filter kubegpu runs that 1.20 lacks.
    assert set(scores.FILTER_PLUGINS) - theirs == {"DynamicResources"}


def test_the_file_kube_scheduler_writes_is_read_whole_as_its_default_profile(tmp_path: Path) -> None:
    """An operator copies the file as it is into `--config`: every plugin with its weight (NodePreferAvoidPods
    10000, which kubegpu once refused above 1000), every extension point, the client settings."""
    config, policy = load_config(written_file(tmp_path))
    assert policy == "spread"  # the file enables NodeResourcesLeastAllocated
    assert config.profile.weights == scores.Profile.default("spread").weights
    assert config.profile.filters_off == frozenset()
