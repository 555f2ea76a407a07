"""trident.restricted: tritonserver's --http-restricted-api / --grpc-restricted-protocol syntax."""

from __future__ import annotations

import pytest

from trident.options import ServerOptions
from trident.restricted import (
    CATEGORIES,
    GRPC_HEADER_PREFIX,
    Restriction,
    Restrictions,
    grpc_restrictions,
    http_restrictions,
)


def test_groups_share_one_header_and_unnamed_groups_stay_open():
    r = Restrictions.parse(["model-repository,statistics:Admin-Key=s3cret", "trace:t=v"], "--http-restricted-api")
    assert r.get("model-repository") == r.get("statistics") == Restriction("admin-key", "s3cret")
    assert r.get("trace") == Restriction("t", "v")
    assert r.get("inference") is None and r.get("health") is None
    assert bool(r) and not Restrictions()


def test_grpc_keys_get_tritons_prefix():
    options = ServerOptions(grpc_restricted_protocol=["inference:k=v"], http_restricted_api=["inference:k=v"])
    assert grpc_restrictions(options).get("inference") == Restriction(GRPC_HEADER_PREFIX + "k", "v")
    assert http_restrictions(options).get("inference") == Restriction("k", "v")


def test_every_triton_group_is_known():
    spec = ",".join(CATEGORIES) + ":k=v"
    r = Restrictions.parse([spec], "--http-restricted-api")
    assert all(r.get(c) is not None for c in CATEGORIES)


@pytest.mark.parametrize("spec, message", [
    ("bogus:k=v", "unknown restricted api 'bogus'"),
    ("health", "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got health"),
    ("health:k", "option format is"),
    ("health:k=", "option format is"),
    ("health:=v", "option format is"),
    (":k=v", "option format is"),
    ("health,,inference:k=v", "unknown restricted api ''"),
])
def test_malformed_values_are_refused_with_tritons_messages(spec, message):
    with pytest.raises(ValueError) as e:
        Restrictions.parse([spec], "--http-restricted-api")
    assert message in str(e.value)


def test_a_group_in_two_values_is_refused():
    with pytest.raises(ValueError) as e:
        Restrictions.parse(["health:k=v", "inference,health:k2=v"], "--grpc-restricted-protocol")
    assert str(e.value) == "restricted api 'health' can not be specified in multiple config groups"


def test_values_compare_exactly():
    r = Restriction("k", "s3cret")
    assert r.allows("s3cret") and r.allows(b"s3cret")
    assert not r.allows(None) and not r.allows("") and not r.allows("S3CRET") and not r.allows("s3cret ")
