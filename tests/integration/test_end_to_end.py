"""The whole path, as a node sees it: the real `kubegpu scheduler` binds a Neuron pod on the real API server, and the
kubelet's CRI calls for that pod go through the real `kubegpu crishim` to a real containerd. Inside the running
container exactly the allocated `/dev/neuronN` devices exist, with `AWS_NEURON_VISIBLE_DEVICES` naming them; the same
annotations moved to another node's shim are refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from kubegpu.core.annotations import ALLOCATION_KEY, decode_allocation

from .cluster import Cluster
from .containerd import (
    Cri,
    container_config,
    host_network_sandbox,
    make_char_devices,
    running_containerd,
    start_shim_process,
)
from .test_scheduler import TRN1, wait_bound


def test_a_pod_bound_by_the_scheduler_gets_exactly_its_devices_through_the_shim(
    cluster: Cluster, namespace: str, start_scheduler: Any, key_file: Path, tmp_path: Path
) -> None:
    cluster.create_ready_node("trn1-e2e", labels=TRN1, allocatable={"aws.amazon.com/neurondevice": 16})
    start_scheduler("kubegpu", "--no-leader-elect")
    cluster.create_pod(namespace, "filler", {"main": {"aws.amazon.com/neurondevice": 4}}, scheduler="kubegpu")
    wait_bound(cluster, namespace, 1)
    cluster.create_pod(namespace, "train", {"main": {"aws.amazon.com/neurondevice": 4}}, scheduler="kubegpu")
    pod = wait_bound(cluster, namespace, 2)["train"]
    annotations = pod["metadata"]["annotations"]
    allocated = decode_allocation(annotations[ALLOCATION_KEY]).containers["main"]["aws.amazon.com/neurondevice"]
    assert len(allocated) == 4

    dev_root = tmp_path / "dev"
    make_char_devices(dev_root, [f"neuron{i}" for i in range(16)])
    with running_containerd() as containerd:
        shim = start_shim_process(
            socket=tmp_path / "cri.sock", runtime_endpoint=containerd.endpoint, node_name="trn1-e2e",
            key_file=key_file, dev_root=dev_root, log=tmp_path / "shim.log",
        )  # fmt: skip
        kubelet = Cri(shim.endpoint)
        try:
            sandbox = host_network_sandbox(
                "train", pod["metadata"]["uid"], namespace=namespace, annotations=annotations, log_directory=tmp_path
            )
            sandbox_id = kubelet.run_pod(sandbox)
            # A vendor device plugin had put every device into the request; only the allocated ones may stay.
            everything = [(str(dev_root / f"neuron{i}"), f"/dev/neuron{i}") for i in range(16)]
            container = kubelet.create(sandbox_id, container_config("main", devices=everything), sandbox)
            kubelet.start(container)
            devices = sorted(n for n in kubelet.exec(container, "ls", "/dev").split() if n.startswith("neuron"))
            assert devices == sorted(f"neuron{i}" for i in allocated)
            env = dict(line.split("=", 1) for line in kubelet.exec(container, "env").splitlines() if "=" in line)
            assert env["AWS_NEURON_VISIBLE_DEVICES"] == ",".join(allocated)
            kubelet.remove_pod(sandbox_id)
        finally:
            kubelet.close()
            shim.terminate()

        # The same pod's annotations presented on another node are refused before anything is created.
        elsewhere = start_shim_process(
            socket=tmp_path / "other.sock", runtime_endpoint=containerd.endpoint, node_name="trn1-other",
            key_file=key_file, dev_root=dev_root, log=tmp_path / "other.log",
        )  # fmt: skip
        kubelet = Cri(elsewhere.endpoint)
        try:
            sandbox = host_network_sandbox(
                "train", pod["metadata"]["uid"], namespace=namespace, annotations=annotations, log_directory=tmp_path
            )
            sandbox_id = kubelet.run_pod(sandbox)
            with pytest.raises(grpc.RpcError) as refused:
                kubelet.create(sandbox_id, container_config("main"), sandbox)
            assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "node" in (refused.value.details() or "")
            assert kubelet.containers(sandbox_id) == []
            kubelet.remove_pod(sandbox_id)
        finally:
            kubelet.close()
            elsewhere.terminate()
