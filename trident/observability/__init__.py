"""Observability: statistics, metrics, logging and tracing.

Modules: :mod:`.stats` (per-version statistics and their snapshots), :mod:`.model_metrics`
(per-model latency summaries and histograms), :mod:`.metrics` (the Prometheus endpoint),
:mod:`.host_metrics` (CPU and GPU gauges), :mod:`.logs` (Triton's log formats and JSON, the
settings, the request each line names), :mod:`.trace` and :mod:`.tracing` (trace settings, the
W3C trace context, request traces, OpenTelemetry).
"""
