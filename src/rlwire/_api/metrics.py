"""Prometheus metrics from per-step figures; :mod:`rlwire.metrics` is its face."""

from __future__ import annotations

from typing import Any

from rlwire._api.stats import ReceiveStats, SendStats
from rlwire._core.errors import ConfigError

__all__ = ["Metrics"]

#: Seconds buckets from a millisecond to a minute: steps take tens of ms to seconds.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SEND_PHASES = ("encode", "compress", "write", "commit", "wait", "total")
_RECEIVE_PHASES = ("wait", "read", "decompress", "decode", "total")


class Metrics:
    """Counters and histograms of sends and receives, in one Prometheus registry.

    Args:
        registry: the ``prometheus_client.CollectorRegistry`` to register in (default:
            the process-wide ``REGISTRY``); create one :class:`Metrics` per registry.
        namespace: the prefix of every metric name.

    Metrics: ``<ns>_sent_steps_total``, ``<ns>_sent_bytes_total``,
    ``<ns>_sent_sidecar_bytes_total``, ``<ns>_send_seconds{phase}`` (encode, compress,
    write, commit, wait, total), ``<ns>_send_loop_lag_seconds``,
    ``<ns>_received_steps_total{rank}``, ``<ns>_received_bytes_total{rank}`` and
    ``<ns>_receive_seconds{phase}`` (wait, read, decompress, decode, total).

    Raises:
        ConfigError: ``prometheus-client`` is not installed.
    """

    def __init__(self, registry: Any = None, namespace: str = "rlwire") -> None:
        try:
            import prometheus_client as prom
        except ImportError:
            raise ConfigError(
                "rlwire.metrics needs prometheus-client: pip install 'rlwire[metrics]'"
            ) from None
        reg = prom.REGISTRY if registry is None else registry
        common: dict[str, Any] = {"namespace": namespace, "registry": reg}
        self.sent_steps = prom.Counter("sent_steps", "Steps sent", **common)
        self.sent_bytes = prom.Counter("sent_bytes", "Bytes sent, all ranks", **common)
        self.sent_sidecar_bytes = prom.Counter(
            "sent_sidecar_bytes", "Bytes sent in sidecars, all ranks", **common
        )
        self.send_seconds = prom.Histogram(
            "send_seconds", "Seconds per send, by phase", ["phase"], buckets=_BUCKETS, **common
        )
        self.send_loop_lag = prom.Histogram(
            "send_loop_lag_seconds",
            "Worst delay of the event loop in resuming a send",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
            **common,
        )
        self.received_steps = prom.Counter("received_steps", "Steps received", ["rank"], **common)
        self.received_bytes = prom.Counter("received_bytes", "Bytes received", ["rank"], **common)
        self.receive_seconds = prom.Histogram(
            "receive_seconds",
            "Seconds per receive, by phase",
            ["phase"],
            buckets=_BUCKETS,
            **common,
        )

    def observe_send(self, stats: SendStats) -> None:
        """Count one send; use as ``open_sender(..., on_stats=metrics.observe_send)``."""
        self.sent_steps.inc()
        self.sent_bytes.inc(stats.bytes)
        self.sent_sidecar_bytes.inc(stats.sidecar_bytes)
        for phase in _SEND_PHASES:
            self.send_seconds.labels(phase).observe(getattr(stats, f"{phase}_seconds"))
        self.send_loop_lag.observe(stats.worst_loop_lag_seconds)

    def observe_receive(self, stats: ReceiveStats | None) -> None:
        """Count one receive, e.g. ``metrics.observe_receive(receiver.last_stats)``
        after each ``receive`` (``None``, before the first, is ignored); after a
        ``parts()`` loop it counts the step, inside it each part."""
        if stats is None:
            return
        rank = str(stats.rank)
        self.received_steps.labels(rank).inc()
        self.received_bytes.labels(rank).inc(stats.bytes)
        for phase in _RECEIVE_PHASES:
            self.receive_seconds.labels(phase).observe(getattr(stats, f"{phase}_seconds"))
