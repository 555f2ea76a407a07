"""Triton's ``tritonfrontend`` package over trident: network front ends for an in-process server.

``from trident.tritonfrontend import KServeHttp, KServeGrpc, Metrics`` and Triton's documented
example runs::

    server = tritonserver.Server(model_repository="/models").start(wait_until_ready=True)
    http_service = KServeHttp(server, KServeHttp.Options(port=8000))
    http_service.start()          # or: with KServeHttp(server) as http_service: ...
    ...                           # tritonclient, curl, Prometheus; and server.model(...).infer(...)
    http_service.stop()
    server.stop()

Each front end is trident's own (the one ``trident serve`` runs: ``serve_http_fast``,
``serve_grpc``, ``serve_metrics``), started on the in-process server's event loop, under its
nursery: ``start()`` returns once it listens (its bound port in ``.port``: ``port=0`` picks a
free one), ``stop()`` stops it (HTTP finishes its in-flight requests first, gRPC sends GOAWAY
and drains its calls, both within the server's ``exit_timeout``); ``Server.stop()`` stops those
still running. The application keeps using the server in-process meanwhile. ``KServeHttp.Server``
(and the others' ``.Server``) is the same class, for code written against the 24.08 spelling.

Options map to the ``trident serve`` flags of the same meaning (``restricted_features``, a
:class:`RestrictedFeatures` of :class:`FeatureGroup` s of :class:`Feature` s, to
``--http-restricted-api`` / ``--grpc-restricted-protocol``); the thread counts and gRPC's
``infer_allocation_pool_size`` have none (the front ends run on the event loop) and are logged
as ignored, as ``trident serve`` logs its ``--http-thread-count``.
"""

from __future__ import annotations

from trident.tritonfrontend._front_ends import KServeGrpc, KServeHttp, Metrics
from trident.tritonfrontend._restricted import Feature, FeatureGroup, RestrictedFeatures

__all__ = ["Feature", "FeatureGroup", "KServeGrpc", "KServeHttp", "Metrics", "RestrictedFeatures"]
