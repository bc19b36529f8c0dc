"""Which placement table a MIG GPU follows when its model is none the catalog names: the H800 and the A800 (80 GB,
with the A100 80GB's and H100 80GB's profiles), or a node whose product label is missing. The profile names
decided, first table first; `1g.10gb` is a name of the A100 40GB too (two slices there, one on an 80 GB GPU), so
an 80 GB GPU laid out as seven 1g.10gb (`all-1g.10gb`) was read as an A100 40GB: from NVML its layout broke that
table (`1g.10gb cannot start at slice 1`) and from GFD's counts no layout held fourteen on two GPUs, so the node
had no MIG devices and every pod asking one was refused. The GPU's memory now picks among the tables that have
the names."""

from __future__ import annotations

import pytest

from kubegpu.core.annotations import DEVICES_KEY, encode_devices
from kubegpu.core.models import DeviceInfo, DeviceInventory, NodeDevices, NodeInfo
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.plugins.nvidia import mig
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.engine import Engine

SMALL = "nvidia.com/mig-1g.10gb"
SEVEN = ",".join(f"1g.10gb@{start}" for start in range(7))


@pytest.mark.parametrize(
    ("model", "memory", "family"),
    [
        ("NVIDIA H800", 81559, "80GB"),
        ("NVIDIA A800-SXM4-80GB", 81920, "80GB"),
        (None, 81920, "80GB"),
        ("NVIDIA A800-SXM4-40GB", 40960, "A100-40GB"),
        (None, None, "A100-40GB"),  # nothing tells: the first table with the names, as before
    ],
    ids=["h800", "a800-80", "no-model-80", "a800-40", "nothing-known"],
)
def test_the_memory_picks_among_the_tables_with_the_profile_names(
    model: str | None, memory: int | None, family: str
) -> None:
    assert mig.family_of(model, memory, ["1g.10gb"]) == family


def labelled_node() -> NodeInfo:
    labels = {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.product": "NVIDIA-H800",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/mig-1g.10gb.count": "14",
    }
    return make_node("h800", labels=labels, allocatable={SMALL: 14})


def advertised_node() -> NodeInfo:
    gpus = [
        DeviceInfo(id=str(i), model="NVIDIA H800", memory=81559 << 20, attributes={mig.LAYOUT_ATTRIBUTE: SEVEN})
        for i in range(2)
    ]
    devices = encode_devices(NodeDevices(inventories={"nvidia": DeviceInventory(plugin="nvidia", devices=gpus)}))
    return make_node("h800", annotations={DEVICES_KEY: devices}, allocatable={SMALL: 14})


@pytest.mark.parametrize("node", [labelled_node, advertised_node], ids=["gfd-labels", "kubegpu-advertise"])
def test_an_h800_laid_out_as_seven_1g_10gb_each_runs_fourteen_such_pods(node: object) -> None:
    assert callable(node)
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    engine.add_node(node())
    for n in range(14):
        decision = engine.schedule(make_pod(f"p{n}", {"main": {SMALL: 1}}))
        assert decision.scheduled, decision.reason
    assert not engine.schedule(make_pod("p14", {"main": {SMALL: 1}})).scheduled


def test_every_placement_table_has_a_memory_band() -> None:
    assert set(mig.MEMORY_MIB) == set(mig.CATALOG)
