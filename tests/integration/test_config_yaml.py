"""A KubeSchedulerConfiguration YAML file is read by kubegpu as the real kube-scheduler 1.20.2 reads it (T118, T129).

Each file is given to both: kube-scheduler with `--write-config-to` (it decodes the file, validates it, builds its
profiles, and writes the configuration it would run with; no API server is needed) and `kubegpu.scheduler.config`'s
`load_config`. Both take it or both refuse it; what both take reads the same (the scheduler name, the share of nodes
scored, InterPodAffinity's weight). The bodies are YAML 1.1 scalars go-yaml v2 resolves unlike PyYAML, `null` items
and keys, and what JSON cannot hold.
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest
import yaml

from kubegpu.scheduler.config import ConfigError, load_config

from .cluster import binary_dir, free_port, unreachable_kubeconfig

BODIES = {
    "bool-for-a-string": "profiles:\n- schedulerName: y\n",
    "number-for-a-string": "profiles:\n- schedulerName: 123\n",
    "date-for-a-string": "profiles:\n- schedulerName: 2024-01-02\n",
    "date-for-an-integer": "percentageOfNodesToScore: 2024-01-02\n",
    "leading-zero-decimal": "percentageOfNodesToScore: 08\n",
    "octal-0o": "percentageOfNodesToScore: 0o17\n",
    "octal": "percentageOfNodesToScore: 017\n",
    "hex": "percentageOfNodesToScore: 0x1F\n",
    "underscores": "percentageOfNodesToScore: 1_0\n",
    "exponent": "percentageOfNodesToScore: 1e1\n",
    "integral-float": "percentageOfNodesToScore: 16.0\n",
    "sexagesimal": "percentageOfNodesToScore: 1:10\n",
    "infinity": "enableProfiling: .inf\n",
    "null-key": "profiles:\n- plugins:\n    ~: {}\n",
    "bool-key": "y: 1\n",
    "null-profile": "profiles: [null]\n",
    "null-disabled": "profiles:\n- plugins:\n    score:\n      disabled: [null, {name: ''}]\n",
    "null-enabled": "profiles:\n- plugins:\n    score:\n      enabled: [null]\n",
    "null-plugin-config": "profiles:\n- pluginConfig: [null]\n",
    "two-unnamed-plugin-configs": "profiles:\n- pluginConfig: [null, {args: {}}]\n",
    "args-leading-zero": "profiles:\n- pluginConfig:\n  - name: InterPodAffinity\n"
    "    args: {hardPodAffinityWeight: 08}\n",
}


def kube_scheduler_reads(path: Path, tmp_path: Path) -> tuple[str | None, int, int] | str:
    """(scheduler name, percentage of nodes scored, InterPodAffinity's weight) as kube-scheduler runs with the
    file, or its refusal."""
    written = tmp_path / "written.yaml"
    done = subprocess.run(
        [str(binary_dir() / "kube-scheduler"), f"--config={path}", f"--write-config-to={written}", "--port=0",
         "--secure-port=0"],
        capture_output=True, text=True, errors="replace", timeout=60, check=False,
    )  # fmt: skip
    if done.returncode != 0 or not written.exists():
        return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
    config = yaml.safe_load(written.read_text())
    [profile] = config["profiles"]
    args = {c["name"]: c.get("args") or {} for c in profile.get("pluginConfig") or []}
    weight = args.get("InterPodAffinity", {}).get("hardPodAffinityWeight", 1)
    return profile["schedulerName"], config["percentageOfNodesToScore"], weight


def kubegpu_reads(path: Path) -> tuple[str | None, int, int] | str:
    try:
        config, _ = load_config(path)
    except ConfigError as exc:
        return str(exc)
    profile = config.profile
    name = config.scheduler_name or "default-scheduler"
    return name, profile.percentage_of_nodes_to_score or 0, profile.hard_pod_affinity_weight


def config_file(tmp_path: Path, body: str) -> Path:
    """The body in a v1beta1 file. kube-scheduler 1.20 opens its insecure port before it writes the configuration,
    where the file says (0.0.0.0:10251 by default, whatever `--port` says): a port of its own for each run, so that
    another kube-scheduler on the machine cannot make it refuse the file."""
    kubeconfig = unreachable_kubeconfig(tmp_path)
    path = tmp_path / "config.yaml"
    port = free_port()
    path.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1beta1\nkind: KubeSchedulerConfiguration\n"
        f"clientConnection: {{kubeconfig: {kubeconfig}}}\n"
        f"healthzBindAddress: 127.0.0.1:{port}\nmetricsBindAddress: 127.0.0.1:{port}\n{body}"
    )
    return path


def read_alike(path: Path, tmp_path: Path) -> None:
    theirs, ours = kube_scheduler_reads(path, tmp_path), kubegpu_reads(path)
    assert isinstance(theirs, str) == isinstance(ours, str), (
        f"{path.read_text()}\nkube-scheduler: {theirs}\nkubegpu: {ours}"
    )
    if not isinstance(theirs, str):
        assert ours == theirs, path.read_text()


@pytest.mark.parametrize("case", list(BODIES))
def test_a_yaml_file_is_taken_or_refused_and_read_as_kube_scheduler_1_20_does(case: str, tmp_path: Path) -> None:
    read_alike(config_file(tmp_path, BODIES[case]), tmp_path)


def test_random_scalars_for_a_number_and_a_string_are_read_as_kube_scheduler_1_20_reads_them(tmp_path: Path) -> None:
    """Plain scalars of digits, signs, underscores, points, exponents, base prefixes, colons and YAML 1.1's words,
    as the share of nodes scored (an integer) and as the scheduler name (a string)."""
    rng = random.Random(1)
    pieces = [*"0123456789" * 3, *"_.eE+-xXoObB:", "y", "n", "Y", "N", "on", "~", "inf", "nan"]
    scalars = {"".join(rng.choice(pieces) for _ in range(rng.randint(1, 8))) for _ in range(60)}
    for scalar in sorted(scalars):
        for body in (f"percentageOfNodesToScore: {scalar}\n", f"profiles:\n- schedulerName: {scalar}\n"):
            path = config_file(tmp_path, body)
            try:
                yaml.safe_load(path.read_text())
            except yaml.YAMLError:
                continue  # not YAML (`- `, `: ` inside): neither reads it
            read_alike(path, tmp_path)
