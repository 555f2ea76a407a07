"""protocol/grpc_service.proto keeps Triton's wire contract: every message, field number, type and
RPC of tritonclient's own generated ``grpc_service.proto`` descriptor matches trident's."""

from __future__ import annotations

import betterproto2
import pytest
import tritonclient.grpc.service_pb2 as triton
from google.protobuf.descriptor import FieldDescriptor

from trident.grpc.service import SERVICE, build_methods
from trident.options import ServerOptions
from trident.protocol.generated import inference as pb
from trident.protocol.generated.grpc.health import v1 as health
from trident.server import open_server

_TYPES = {
    FieldDescriptor.TYPE_BOOL: betterproto2.TYPE_BOOL, FieldDescriptor.TYPE_INT32: betterproto2.TYPE_INT32,
    FieldDescriptor.TYPE_INT64: betterproto2.TYPE_INT64, FieldDescriptor.TYPE_UINT32: betterproto2.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64: betterproto2.TYPE_UINT64, FieldDescriptor.TYPE_FLOAT: betterproto2.TYPE_FLOAT,
    FieldDescriptor.TYPE_DOUBLE: betterproto2.TYPE_DOUBLE, FieldDescriptor.TYPE_STRING: betterproto2.TYPE_STRING,
    FieldDescriptor.TYPE_BYTES: betterproto2.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE: betterproto2.TYPE_MESSAGE,
    FieldDescriptor.TYPE_ENUM: betterproto2.TYPE_ENUM,
}


def triton_messages():
    def walk(descriptor, prefix=""):
        name = prefix + descriptor.name
        if not descriptor.GetOptions().map_entry:
            yield name, descriptor
        for nested in descriptor.nested_types:
            yield from walk(nested, name)

    for descriptor in triton.DESCRIPTOR.message_types_by_name.values():
        yield from walk(descriptor)


MESSAGES = sorted(triton_messages(), key=lambda item: item[0])


@pytest.mark.parametrize("name, descriptor", MESSAGES, ids=[n for n, _ in MESSAGES])
def test_message_fields_match_triton(name, descriptor):
    cls = getattr(pb, name)
    meta = cls._betterproto.meta_by_field_name
    assert set(meta) == {f.name for f in descriptor.fields}
    for field in descriptor.fields:
        ours = meta[field.name]
        assert ours.number == field.number, field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            assert ours.proto_type == betterproto2.TYPE_MAP
            key, value = field.message_type.fields
            assert ours.map_meta[0].proto_type == _TYPES[key.type]
            assert ours.map_meta[1].proto_type == _TYPES[value.type]
        else:
            assert ours.proto_type == _TYPES[field.type], field.name
            assert ours.repeated == field.is_repeated, field.name
        oneof = field.containing_oneof.name if field.containing_oneof else None
        assert ours.group == oneof


async def test_every_rpc_is_served(tmp_path):
    async with open_server(ServerOptions(model_repositories=[str(tmp_path)])) as server:
        served = set(build_methods(server))
    rpcs = {f"/{SERVICE}/{m.name}" for m in triton.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods}
    assert rpcs <= served
    assert "/grpc.health.v1.Health/Check" in served


def test_health_messages():
    assert health.HealthCheckRequest._betterproto.meta_by_field_name["service"].number == 1
    assert health.HealthCheckResponse._betterproto.meta_by_field_name["status"].number == 1
    assert [s.value for s in health.HealthCheckResponseServingStatus] == [0, 1, 2, 3]
