"""The latency objectives of a run (``slo.*``).

A module of its own so that the config schema (:mod:`kvbench.app.config`) can type ``slo`` without
importing :mod:`kvbench.metrics.summary`, which needs pandas: ``kvbench --help`` and config
validation stay fast.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.errors import require


@dataclass
class SloConfig:
    """Latency objectives; a request counts toward goodput only if it meets every one given."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def validate(self) -> None:
        for key in ("ttft_s", "tpot_s", "e2e_s"):
            value = getattr(self, key)
            require(value is None or value > 0, f"slo.{key}", value, "use a positive number of seconds or null")
