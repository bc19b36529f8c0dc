"""The FPGA plugin, node side: find `/dev/fpga*`, advertise the healthy cards, give a container its cards.

Discovery reads only the host root it is given, so tests run it on a fake tree (`FakeHost.add_device_file`). A
card whose device file has disappeared since discovery is unhealthy and is not advertised. The plugin owns
`/dev/fpgaN`, `FPGA_VISIBLE_DEVICES` and CDI names of kind `example.com/fpga` (`kubegpu_device_owned`): the CRI shim
removes them from every container that was not allocated cards. When it creates a container that was, the plugin
removes any `/dev/fpga*` device entries that were not allocated to it (another device plugin may have added them),
then adds the allocated cards as device nodes, `FPGA_VISIBLE_DEVICES`, CDI names and `FPGA_BITSTREAM`. The kit's
`DeviceFilesPlugin` does all of it but the bitstream.
"""

from __future__ import annotations

from kubegpu.core.kit import DeviceFilesPlugin
from kubegpu.core.models import ContainerAllocation, ContainerEdit
from kubegpu_fpga import CARD_PATTERN, COUNT_LABEL, RESOURCE

__all__ = ["BITSTREAM_ENV", "CDI_KIND", "VISIBLE_ENV", "FpgaDevice", "plugin"]

VISIBLE_ENV = "FPGA_VISIBLE_DEVICES"
BITSTREAM_ENV = "FPGA_BITSTREAM"
CDI_KIND = "example.com/fpga"


class FpgaDevice(DeviceFilesPlugin):
    resource = RESOURCE
    pattern = CARD_PATTERN.pattern
    env = VISIBLE_ENV
    cdi_kind = CDI_KIND
    model = "example-fpga"
    count_label = COUNT_LABEL

    def edit(self, allocation: ContainerAllocation, edit: ContainerEdit, ids: list[str]) -> None:
        bitstream = allocation.fields.get("bitstream")
        if isinstance(bitstream, str):
            edit.envs[BITSTREAM_ENV] = bitstream


plugin = FpgaDevice()
