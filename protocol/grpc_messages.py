"""Typed snapshots of the server's state as the gRPC API's protobuf messages (sans-IO).

The core answers metadata, statistics and the repository index as the frozen dataclasses of
:mod:`trident.types`; the gRPC front end encodes them here, the HTTP front end as JSON with
:mod:`trident.protocol.kserve` (``*_json``).
"""

from __future__ import annotations

from collections.abc import Sequence

from trident.protocol.generated import inference as pb
from trident.types import Duration, IndexEntry, ModelMetadata, ModelStatistics, ServerMetadata, TensorMetadata


def server_metadata(meta: ServerMetadata) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(name=meta.name, version=meta.version, extensions=list(meta.extensions))


def _tensors(items: Sequence[TensorMetadata]) -> list[pb.ModelMetadataResponseTensorMetadata]:
    return [pb.ModelMetadataResponseTensorMetadata(name=t.name, datatype=t.datatype, shape=list(t.shape))
            for t in items]


def model_metadata(meta: ModelMetadata) -> pb.ModelMetadataResponse:
    return pb.ModelMetadataResponse(name=meta.name, versions=list(meta.versions), platform=meta.platform,
                                    inputs=_tensors(meta.inputs), outputs=_tensors(meta.outputs))


def _duration(d: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def statistics_entry(s: ModelStatistics) -> pb.ModelStatistics:
    """One model version's statistics as inference.ModelStatistics."""
    return pb.ModelStatistics(
        name=s.name,
        version=s.version,
        last_inference=s.last_inference,
        inference_count=s.inference_count,
        execution_count=s.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(s.success), fail=_duration(s.fail), queue=_duration(s.queue),
            compute_input=_duration(s.compute_input), compute_infer=_duration(s.compute_infer),
            compute_output=_duration(s.compute_output), cache_hit=_duration(s.cache_hit),
            cache_miss=_duration(s.cache_miss),
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=b.batch_size, compute_input=_duration(b.compute_input),
                compute_infer=_duration(b.compute_infer), compute_output=_duration(b.compute_output),
            )
            for b in s.batch_stats
        ],
    )


def statistics(entries: Sequence[ModelStatistics]) -> pb.ModelStatisticsResponse:
    return pb.ModelStatisticsResponse(model_stats=[statistics_entry(s) for s in entries])


def repository_index(entries: Sequence[IndexEntry]) -> pb.RepositoryIndexResponse:
    return pb.RepositoryIndexResponse(models=[
        pb.RepositoryIndexResponseModelIndex(name=e.name, version=e.version, state=e.state, reason=e.reason)
        for e in entries])
