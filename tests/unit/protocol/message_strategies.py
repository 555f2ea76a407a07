"""Hypothesis strategies for any betterproto2 message, built from its field metadata.

Shared by the pbtxt and JSON round-trip tests. NaN is left out (it is not equal to itself
inside lists); infinities, negative zero, unknown enum numbers, every Unicode string and
every integer of the field's range are in.
"""

from __future__ import annotations

from typing import Any

import betterproto2
from hypothesis import strategies as st

from trident.protocol.msgmeta import FieldInfo, message_info

MAX_DEPTH = 6

_INT_BOUNDS = {
    betterproto2.TYPE_INT32: (-(2**31), 2**31 - 1),
    betterproto2.TYPE_UINT32: (0, 2**32 - 1),
    betterproto2.TYPE_INT64: (-(2**63), 2**63 - 1),
    betterproto2.TYPE_UINT64: (0, 2**64 - 1),
}


def scalars(field: FieldInfo) -> st.SearchStrategy[Any]:
    ptype = field.proto_type
    if ptype == betterproto2.TYPE_STRING:
        return st.text(max_size=10)
    if ptype == betterproto2.TYPE_BYTES:
        return st.binary(max_size=8)
    if ptype == betterproto2.TYPE_BOOL:
        return st.booleans()
    if ptype == betterproto2.TYPE_ENUM:
        known = st.sampled_from(list(field.py_type))
        unknown = st.integers(-3, 40).map(field.py_type)
        return st.one_of(known, unknown)
    if ptype == betterproto2.TYPE_FLOAT:
        return st.floats(width=32, allow_nan=False)
    if ptype == betterproto2.TYPE_DOUBLE:
        return st.floats(allow_nan=False)
    lo, hi = _INT_BOUNDS[ptype]
    return st.integers(lo, hi)


def _element(field: FieldInfo, depth: int) -> st.SearchStrategy[Any]:
    if field.proto_type == betterproto2.TYPE_MESSAGE:
        return messages(field.py_type, depth + 1)
    return scalars(field)


def _value(field: FieldInfo, depth: int) -> st.SearchStrategy[Any]:
    if field.map_key is not None:
        assert field.map_value is not None
        return st.dictionaries(scalars(field.map_key), _element(field.map_value, depth), max_size=2)
    if field.repeated:
        return st.lists(_element(field, depth), max_size=2 if field.is_message else 3)
    return _element(field, depth)


@st.composite
def messages(draw: st.DrawFn, cls: type[betterproto2.Message], depth: int = 0) -> Any:
    """A random ``cls`` message: each field set or left at its default, one member per oneof."""
    info = message_info(cls)
    message = cls()
    groups_done: set[str] = set()
    for field in info.fields:
        nested = field.is_message and (field.map_value is None or field.map_value.is_message)
        if nested and depth >= MAX_DEPTH:
            continue
        if field.group is not None:
            if field.group in groups_done:
                continue
            groups_done.add(field.group)
            choice = draw(st.sampled_from((None, *info.oneofs[field.group])))
            if choice is not None:
                setattr(message, choice.attr, draw(_value(choice, depth)))
            continue
        if draw(st.booleans()):
            setattr(message, field.attr, draw(_value(field, depth)))
    return message
