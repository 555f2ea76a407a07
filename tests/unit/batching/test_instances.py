"""Instance groups -> instances, and recognising a counts-only config change."""

import pytest

from trident.batching.instances import InstanceSpec, counts_only_change, instance_specs
from trident.batching.rate_limiter import Needs
from trident.config import complete_defaults
from trident.config_validation import validate_config
from trident.errors import TritonError
from trident.protocol.pbtxt import parse_pbtxt


def specs(text, gpus=0):
    return instance_specs(complete_defaults(parse_pbtxt(text), "m", gpu_count=gpus))


def test_groups_and_counts():
    got = specs('name: "m" backend: "python" instance_group [ { count: 2 kind: KIND_CPU }, '
                '{ name: "extra" kind: KIND_AUTO rate_limiter { resources [ { name: "R" count: 1 } ] } } ]')
    assert [(s.name, s.group, s.kind, s.device) for s in got] == [
        ("m_0_0", "m_0", "KIND_CPU", 0), ("m_0_1", "m_0", "KIND_CPU", 0), ("extra_0", "extra", "KIND_CPU", 0)]
    assert got[2].needs == Needs({("R", 0): 1})
    assert specs('name: "m" backend: "python"') == [InstanceSpec("m_0", "m", "KIND_CPU", 0, Needs())]


def test_gpu_groups_place_count_instances_per_gpu():
    got = specs('name: "m" backend: "python" instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0, 1 ] } ]', gpus=2)
    assert [(s.name, s.device) for s in got] == [("m_0_0", 0), ("m_0_1", 0), ("m_0_2", 1), ("m_0_3", 1)]


def test_kind_gpu_without_gpus_fails_validation(tmp_path):
    config = complete_defaults(parse_pbtxt('name: "m" backend: "python" instance_group [ { kind: KIND_GPU } ]'), "m")
    with pytest.raises(TritonError, match="has kind KIND_GPU but no GPUs are available"):
        validate_config(config, "m", tmp_path)


def test_counts_only_change():
    base = parse_pbtxt('name: "m" instance_group [ { name: "a" count: 1 }, { name: "b" count: 2 } ]')
    more = parse_pbtxt('name: "m" instance_group [ { name: "a" count: 3 }, { name: "b" count: 2 } ]')
    assert counts_only_change(base, more) and counts_only_change(more, base)
    assert not counts_only_change(base, base)  # no change at all
    other = parse_pbtxt('name: "m" max_batch_size: 4 instance_group [ { name: "a" count: 3 }, { name: "b" count: 2 } ]')
    assert not counts_only_change(base, other)
    fewer_groups = parse_pbtxt('name: "m" instance_group [ { name: "a" count: 3 } ]')
    assert not counts_only_change(base, fewer_groups)
    kind = parse_pbtxt('name: "m" instance_group [ { name: "a" count: 3 kind: KIND_CPU }, { name: "b" count: 2 } ]')
    assert not counts_only_change(base, kind)
