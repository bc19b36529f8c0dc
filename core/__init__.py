"""kubegpu's core: the data model, the two hook specifications, the annotation codec and the plugin manager.

Nothing here knows about a particular device family or front-end; plugins and front-ends depend on this package.
"""

from kubegpu.core.annotations import (
    ALLOCATION_KEY,
    DEVICES_KEY,
    AllocationRecord,
    AnnotationError,
    decode_allocation,
    decode_devices,
    encode_allocation,
    encode_devices,
    sign_allocation,
    verify_allocation,
)
from kubegpu.core.errors import InputError
from kubegpu.core.models import (
    Advertisement,
    ContainerAllocation,
    ContainerEdit,
    ContainerRequest,
    DeviceInfo,
    DeviceInventory,
    NodeDevices,
    NodeInfo,
    Occupancy,
    PluginAllocation,
    PodRequest,
)
from kubegpu.core.plugin_manager import KubegpuPluginManager, PluginHookError, make_plugin_manager
from kubegpu.core.status import Code, Status

__all__ = [
    "ALLOCATION_KEY",
    "DEVICES_KEY",
    "Advertisement",
    "AllocationRecord",
    "AnnotationError",
    "Code",
    "ContainerAllocation",
    "ContainerEdit",
    "ContainerRequest",
    "DeviceInfo",
    "DeviceInventory",
    "InputError",
    "KubegpuPluginManager",
    "NodeDevices",
    "NodeInfo",
    "Occupancy",
    "PluginAllocation",
    "PluginHookError",
    "PodRequest",
    "Status",
    "decode_allocation",
    "decode_devices",
    "encode_allocation",
    "encode_devices",
    "make_plugin_manager",
    "sign_allocation",
    "verify_allocation",
]
