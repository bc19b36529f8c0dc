"""Fixtures for tests against a real kube-apiserver and etcd (see cluster.py). Every test here is `integration`.

The control plane starts once per session; each test gets its own namespace, and every node and pod is removed
after it. A scheduler under test runs as a real `kubegpu scheduler` process.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .cluster import Cluster, free_port, running_cluster, wait_for


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("k8s")) as started:
        yield started


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") + "-" + secrets.token_hex(3)
    yield cluster.create_namespace(name)
    cluster.cleanup()


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "allocation.key"
    path.write_text(secrets.token_hex(32) + "\n")
    return path


class SchedulerProcess:
    def __init__(self, args: list[str], log: Path, metrics_port: int) -> None:
        self.log = log
        self.metrics_port = metrics_port
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kubegpu", "scheduler", *args],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            env=env,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=20)

    def wait_logged(self, text: str, timeout: float = 30.0) -> None:
        wait_for(lambda: text in self.output(), timeout, f"{text!r} in the scheduler log {self.log}")


@pytest.fixture
def start_scheduler(cluster: Cluster, key_file: Path, tmp_path: Path) -> Iterator[Callable[..., SchedulerProcess]]:
    started: list[SchedulerProcess] = []

    def start(name: str, *extra: str, kubeconfig: Path | None = None) -> SchedulerProcess:
        port = free_port()
        args = [
            "--kubeconfig",
            str(kubeconfig or cluster.kubeconfig),
            "--scheduler-name",
            name,
            "--allocation-key-file",
            str(key_file),
            "--metrics-address",
            f"127.0.0.1:{port}",
            *extra,
        ]
        process = SchedulerProcess(args, tmp_path / f"scheduler-{len(started)}.log", port)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill(signal.SIGTERM)
