"""``RestrictedFeatures``: the API groups of a front end that need a header (tritonfrontend's
spelling of ``--http-restricted-api`` / ``--grpc-restricted-protocol``, see
:mod:`trident.restricted`)."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from trident.tritonserver import InvalidArgumentError


class Feature(enum.Enum):
    """The API groups a header can restrict (Triton's RestrictedCategory)."""

    HEALTH = "health"
    METADATA = "metadata"
    INFERENCE = "inference"
    SHM_MEMORY = "shared-memory"
    MODEL_CONFIG = "model-config"
    MODEL_REPOSITORY = "model-repository"
    STATISTICS = "statistics"
    TRACE = "trace"
    LOGGING = "logging"


@dataclass(frozen=True)
class FeatureGroup:
    """Features served only to requests whose header ``key`` has the value ``value`` (gRPC
    clients send it as ``triton-grpc-protocol-<key>``). Raises InvalidArgumentError for
    features that are not :class:`Feature` members."""

    key: str
    value: str
    features: list[Feature] | Feature

    def __post_init__(self) -> None:
        features = [self.features] if isinstance(self.features, Feature) else self.features
        if not isinstance(features, list) or not features:
            raise InvalidArgumentError("FeatureGroup.features needs to be a Feature or a non-empty list of Features")
        wrong = [f for f in features if not isinstance(f, Feature)]
        if wrong:
            raise InvalidArgumentError(f"Invalid features found: {wrong}. Each item in 'features' should be a "
                                       f"tritonfrontend.Feature; valid options are: {[str(f) for f in Feature]}")
        if not isinstance(self.key, str) or not self.key or not isinstance(self.value, str) or not self.value:
            raise InvalidArgumentError("FeatureGroup.key and FeatureGroup.value must be non-empty strings")
        object.__setattr__(self, "features", list(features))

    @property
    def members(self) -> list[Feature]:
        """The features, as a list."""
        return self.features if isinstance(self.features, list) else [self.features]


class RestrictedFeatures:
    """Groups of restricted features, each feature in one group at most (a front end's
    ``Options.restricted_features``)."""

    def __init__(self, groups: list[FeatureGroup] | None = None) -> None:
        self.feature_groups: list[FeatureGroup] = []
        self.features_restricted: set[Feature] = set()
        for group in groups or []:
            self.add_feature_group(group)

    def add_feature_group(self, group: FeatureGroup) -> None:
        """Raises InvalidArgumentError when one of its features is in a group already."""
        if not isinstance(group, FeatureGroup):
            raise InvalidArgumentError("group has to be of type tritonfrontend.FeatureGroup")
        taken = [str(f) for f in group.members if f in self.features_restricted]
        if taken:
            raise InvalidArgumentError(f"A given feature can only belong to one group: {', '.join(taken)} already "
                                       "belongs to an existing group")
        self.features_restricted.update(group.members)
        self.feature_groups.append(group)

    def create_feature_group(self, key: str, value: str, features: list[Feature] | Feature) -> None:
        self.add_feature_group(FeatureGroup(key, value, features))

    def has_feature(self, feature: Feature) -> bool:
        return feature in self.features_restricted

    def remove_features(self, features: list[Feature] | Feature) -> None:
        """Remove the groups holding any of ``features``. Raises InvalidArgumentError for a
        feature no group holds."""
        features = [features] if isinstance(features, Feature) else list(features)
        missing = [f for f in features if not self.has_feature(f)]
        if missing:
            raise InvalidArgumentError(f"{missing} is not present in any of the FeatureGroups and cannot be removed")
        for group in [g for g in self.feature_groups if set(features) & set(g.members)]:
            self.remove_feature_group(group)

    def remove_feature_group(self, group: FeatureGroup) -> None:
        """Raises InvalidArgumentError for a group that is not here."""
        if group not in self.feature_groups:
            raise InvalidArgumentError(f"{group} is not present in the RestrictedFeatures object")
        self.feature_groups.remove(group)
        self.features_restricted.difference_update(group.members)

    def specs(self) -> list[str]:
        """The groups as ``trident serve``'s restricted-API values: ``<api>[,...]:<key>=<value>``."""
        return [f"{','.join(f.value for f in g.members)}:{g.key}={g.value}" for g in self.feature_groups]

    def _data(self) -> list[dict[str, Any]]:
        return [{"key": g.key, "value": g.value, "features": [f.value for f in g.members]} for g in self.feature_groups]

    def __str__(self) -> str:
        return json.dumps(self._data(), indent=2)

    def __repr__(self) -> str:
        return json.dumps(self._data())
