"""One row of the benchmark table, and the targets every row is held to.

Its own module so that ``suite.py`` (which makes rows) and ``plots.py`` (which draws
them) both import it, and neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

TARGET_STALL_MS = 2.0
TARGET_PEAK_MB = 64.0


@dataclass
class Ratio:
    """One row of the table: an rlwire operation against its baseline."""

    sink: str
    backend: str
    size_gb: float
    operation: str
    rlwire_ms: float
    baseline: str
    baseline_ms: float
    ratio: float  # time ratio, or throughput ratio where ``higher_is_better``
    ratio_range: tuple[float, float]
    target: float
    higher_is_better: bool
    worst_stall_ms: float | None
    p99_stall_ms: float | None
    peak_mb: float | None
    #: The idle loop's worst gap over the same durations, in the same run, where the
    #: script measured it (bench_columns.py); stalls are then judged on the difference.
    idle_stall_ms: float | None = None

    @property
    def met_time(self) -> bool:
        return self.ratio >= self.target if self.higher_is_better else self.ratio <= self.target

    @property
    def met_stall(self) -> bool:
        if self.worst_stall_ms is None:
            return True
        return self.worst_stall_ms - (self.idle_stall_ms or 0.0) <= TARGET_STALL_MS

    @property
    def met_memory(self) -> bool | None:
        """None where no memory target applies (receives map the files they read)."""
        if self.peak_mb is None or "send" not in self.operation:
            return None
        return self.peak_mb <= TARGET_PEAK_MB

    @property
    def met(self) -> bool:
        return self.met_time and self.met_stall and self.met_memory is not False
