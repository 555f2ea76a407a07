"""``trident analyze``'s plots (matplotlib, headless): throughput against concurrency and latency
percentiles against throughput, one line per config, the Pareto front and the choice marked.
Raises :class:`~trident.perf.wire.PerfError` when matplotlib is not installed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trident.perf.wire import PerfError

__all__ = ["plot_model"]


def plot_model(folder: Path, model: str, points: Sequence[Any], front: Sequence[Any], best: Any | None,
               budget_ms: float | None) -> None:
    """Write ``throughput_vs_concurrency.png`` and ``latency_vs_throughput.png`` into ``folder``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PerfError("trident analyze needs matplotlib for its plots: pip install 'trident-inference[analyze]'") \
            from None
    by_config: dict[str, list[Any]] = {}
    for p in points:
        by_config.setdefault(p.candidate, []).append(p)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=80)
    for name, pts in by_config.items():
        pts = sorted(pts, key=lambda p: p.concurrency)
        ax.plot([p.concurrency for p in pts], [p.throughput for p in pts], marker="o", label=name)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("infer/sec")
    ax.set_title(f"{model}: throughput vs concurrency")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(folder / "throughput_vs_concurrency.png")
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=80)
    for name, pts in by_config.items():
        pts = sorted(pts, key=lambda p: p.throughput)
        line = ax.plot([p.throughput for p in pts], [p.p99_us / 1000 for p in pts], marker="o", label=f"{name} p99")
        ax.plot([p.throughput for p in pts], [p.p50_us / 1000 for p in pts], linestyle="--", color=line[0].get_color(),
                alpha=0.6)
    ax.plot([p.throughput for p in front], [p.p99_us / 1000 for p in front], color="black", linewidth=2,
            label="Pareto front (p99)")
    if best is not None:
        ax.scatter([best.throughput], [best.p99_us / 1000], s=120, facecolors="none", edgecolors="red", label="chosen")
    if budget_ms is not None:
        ax.axhline(budget_ms, color="red", linestyle=":", label="latency budget")
    ax.set_xlabel("infer/sec")
    ax.set_ylabel("latency ms (p99 solid, p50 dashed)")
    ax.set_title(f"{model}: latency vs throughput")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(folder / "latency_vs_throughput.png")
    plt.close(fig)
