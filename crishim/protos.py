"""The kubelet's device plugin API (`v1beta1`) and PodResources API (`v1`), built at import time from descriptors.

No package on PyPI ships generated stubs for these two kubelet APIs, and kubegpu does not carry copies of the
upstream `.proto` files. The messages and services are described here in Python, from the APIs' documented field
names, numbers and types (the Kubernetes device plugin and PodResources documentation), as
`descriptor_pb2.FileDescriptorProto`s; protobuf's descriptor pool and message factory turn them into message classes.
What matters on the wire is each field's number and type; the real kubelet 1.20 in the integration tests is the proof
of compatibility.

Device plugin API, package `v1beta1`, on unix sockets under the kubelet's `device-plugins/` directory:

* `Registration.Register(RegisterRequest) -> Empty`, served by the kubelet on `device-plugins/kubelet.sock`;
* `DevicePlugin` served by the plugin on its own socket: `GetDevicePluginOptions`, `ListAndWatch` (server stream),
  `GetPreferredAllocation`, `Allocate`, `PreStartContainer`.

PodResources API, package `v1`, served by the kubelet on `pod-resources/kubelet.sock`:
`PodResourcesLister.List(ListPodResourcesRequest) -> ListPodResourcesResponse` (and `GetAllocatableResources` on
kubelets from 1.21).

`DEVICE_PLUGIN` and `POD_RESOURCES` hold the message classes by name (`DEVICE_PLUGIN["AllocateRequest"]`); the method
paths are `/v1beta1.DevicePlugin/Allocate` and so on (`method_path`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]

__all__ = [
    "DEVICE_PLUGIN",
    "DEVICE_PLUGIN_PACKAGE",
    "DEVICE_PLUGIN_VERSION",
    "HEALTHY",
    "POD_RESOURCES",
    "POD_RESOURCES_PACKAGE",
    "UNHEALTHY",
    "method_path",
]

DEVICE_PLUGIN_PACKAGE = "v1beta1"
DEVICE_PLUGIN_VERSION = "v1beta1"  # RegisterRequest.version
POD_RESOURCES_PACKAGE = "v1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

_F = descriptor_pb2.FieldDescriptorProto
STRING, BOOL, INT32, INT64, MESSAGE = _F.TYPE_STRING, _F.TYPE_BOOL, _F.TYPE_INT32, _F.TYPE_INT64, _F.TYPE_MESSAGE
ONE, MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# (name, number, type, label, message type name for TYPE_MESSAGE); a `map<string, string>` is ("map", name, number).
Field = tuple[Any, ...]


def _file(
    name: str,
    package: str,
    messages: dict[str, Sequence[Field]],
    services: dict[str, Sequence[tuple[str, str, str, bool]]],
) -> descriptor_pb2.FileDescriptorProto:
    """A proto3 file: `messages` name -> fields, `services` name -> (method, input, output, server streaming)."""
    proto = descriptor_pb2.FileDescriptorProto(name=name, package=package, syntax="proto3")
    for message_name, fields in messages.items():
        message = proto.message_type.add(name=message_name)
        for field in fields:
            if field[0] == "map":
                _map_field(message, field[1], field[2], package)
                continue
            field_name, number, kind, label, *type_name = field
            entry = message.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                entry.type_name = f".{package}.{type_name[0]}"
    for service_name, methods in services.items():
        service = proto.service.add(name=service_name)
        for method_name, request, response, streaming in methods:
            service.method.add(
                name=method_name,
                input_type=f".{package}.{request}",
                output_type=f".{package}.{response}",
                server_streaming=streaming,
            )
    return proto


def _map_field(message: descriptor_pb2.DescriptorProto, name: str, number: int, package: str) -> None:
    """`map<string, string> name = number;`, as protoc writes it: a nested `...Entry` message with map_entry set."""
    entry_name = "".join(part.capitalize() for part in name.split("_")) + "Entry"
    entry = message.nested_type.add(name=entry_name)
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=STRING, label=ONE)
    entry.field.add(name="value", number=2, type=STRING, label=ONE)
    message.field.add(
        name=name, number=number, type=MESSAGE, label=MANY, type_name=f".{package}.{message.name}.{entry_name}"
    )


_DEVICE_PLUGIN = _file(
    "kubegpu/deviceplugin/v1beta1.proto",
    DEVICE_PLUGIN_PACKAGE,
    {
        "DevicePluginOptions": [
            ("pre_start_required", 1, BOOL, ONE),
            ("get_preferred_allocation_available", 2, BOOL, ONE),
        ],
        "RegisterRequest": [
            ("version", 1, STRING, ONE),
            ("endpoint", 2, STRING, ONE),
            ("resource_name", 3, STRING, ONE),
            ("options", 4, MESSAGE, ONE, "DevicePluginOptions"),
        ],
        "Empty": [],
        "ListAndWatchResponse": [("devices", 1, MESSAGE, MANY, "Device")],
        "NUMANode": [("ID", 1, INT64, ONE)],
        "TopologyInfo": [("nodes", 1, MESSAGE, MANY, "NUMANode")],
        "Device": [("ID", 1, STRING, ONE), ("health", 2, STRING, ONE), ("topology", 3, MESSAGE, ONE, "TopologyInfo")],
        "PreStartContainerRequest": [("devices_ids", 1, STRING, MANY)],
        "PreStartContainerResponse": [],
        "ContainerPreferredAllocationRequest": [
            ("available_deviceIDs", 1, STRING, MANY),
            ("must_include_deviceIDs", 2, STRING, MANY),
            ("allocation_size", 3, INT32, ONE),
        ],
        "PreferredAllocationRequest": [("container_requests", 1, MESSAGE, MANY, "ContainerPreferredAllocationRequest")],
        "ContainerPreferredAllocationResponse": [("deviceIDs", 1, STRING, MANY)],
        "PreferredAllocationResponse": [
            ("container_responses", 1, MESSAGE, MANY, "ContainerPreferredAllocationResponse")
        ],
        "ContainerAllocateRequest": [("devicesIDs", 1, STRING, MANY)],
        "AllocateRequest": [("container_requests", 1, MESSAGE, MANY, "ContainerAllocateRequest")],
        "Mount": [("container_path", 1, STRING, ONE), ("host_path", 2, STRING, ONE), ("read_only", 3, BOOL, ONE)],
        "DeviceSpec": [
            ("container_path", 1, STRING, ONE),
            ("host_path", 2, STRING, ONE),
            ("permissions", 3, STRING, ONE),
        ],
        "CDIDevice": [("name", 1, STRING, ONE)],
        "ContainerAllocateResponse": [
            ("map", "envs", 1),
            ("mounts", 2, MESSAGE, MANY, "Mount"),
            ("devices", 3, MESSAGE, MANY, "DeviceSpec"),
            ("map", "annotations", 4),
            ("cdi_devices", 5, MESSAGE, MANY, "CDIDevice"),  # kubelets before 1.28 skip it as an unknown field
        ],
        "AllocateResponse": [("container_responses", 1, MESSAGE, MANY, "ContainerAllocateResponse")],
    },
    {
        "Registration": [("Register", "RegisterRequest", "Empty", False)],
        "DevicePlugin": [
            ("GetDevicePluginOptions", "Empty", "DevicePluginOptions", False),
            ("ListAndWatch", "Empty", "ListAndWatchResponse", True),
            ("GetPreferredAllocation", "PreferredAllocationRequest", "PreferredAllocationResponse", False),
            ("Allocate", "AllocateRequest", "AllocateResponse", False),
            ("PreStartContainer", "PreStartContainerRequest", "PreStartContainerResponse", False),
        ],
    },
)

_POD_RESOURCES = _file(
    "kubegpu/podresources/v1.proto",
    POD_RESOURCES_PACKAGE,
    {
        "ListPodResourcesRequest": [],
        "NUMANode": [("ID", 1, INT64, ONE)],
        "TopologyInfo": [("nodes", 1, MESSAGE, MANY, "NUMANode")],
        "ContainerDevices": [
            ("resource_name", 1, STRING, ONE),
            ("device_ids", 2, STRING, MANY),
            ("topology", 3, MESSAGE, ONE, "TopologyInfo"),
        ],
        "ContainerResources": [
            ("name", 1, STRING, ONE),
            ("devices", 2, MESSAGE, MANY, "ContainerDevices"),
            ("cpu_ids", 3, INT64, MANY),
        ],
        "PodResources": [
            ("name", 1, STRING, ONE),
            ("namespace", 2, STRING, ONE),
            ("containers", 3, MESSAGE, MANY, "ContainerResources"),
        ],
        "ListPodResourcesResponse": [("pod_resources", 1, MESSAGE, MANY, "PodResources")],
    },
    {"PodResourcesLister": [("List", "ListPodResourcesRequest", "ListPodResourcesResponse", False)]},
)


def _classes(proto: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """Message name -> class, from a private pool (these names must not collide with anything else loaded)."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    found = pool.FindFileByName(proto.name)
    return {name: message_factory.GetMessageClass(desc) for name, desc in found.message_types_by_name.items()}


DEVICE_PLUGIN: dict[str, Any] = _classes(_DEVICE_PLUGIN)
POD_RESOURCES: dict[str, Any] = _classes(_POD_RESOURCES)


def method_path(package: str, service: str, method: str) -> str:
    """The gRPC path of a method: `/v1beta1.DevicePlugin/Allocate`."""
    return f"/{package}.{service}/{method}"
