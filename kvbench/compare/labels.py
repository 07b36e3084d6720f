"""How a compared metric reads: the catalogue's words for its key, with the unit its values are
shown in (``ttft_p50_s`` -> ``TTFT p50 (ms)``, values in milliseconds).

The summary's key stays the metric's identity (tolerance globs, the verdict line, the Parquet and
CSV tables); these words are only what a person reads in the table and the figure. A key the
catalogue lacks reads as itself, its values as stored.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

from kvbench.metrics.catalogue import BY_KEY, METRICS, SETTINGS

#: seconds shown as milliseconds (the catalogue's ``ms``) are shown in seconds instead where a value
#: reaches this many: five digits of milliseconds is where a reader starts counting digits
SECONDS_FROM_S = 10.0
_SETTING_KEYS = {m.key for m in SETTINGS}
_UNIT = re.compile(r"\s*\(([^()]*)\)$")


@dataclass(frozen=True)
class Shown:
    """A metric as read: its words (unit included) and the factor from stored to shown values."""

    label: str
    scale: float = 1.0

    def value(self, value: Any) -> Any:
        """``value`` in the shown unit; a flag, a text or a missing value as it is."""
        if self.scale == 1 or isinstance(value, bool) or not isinstance(value, Real):
            return value
        if isinstance(value, Integral):  # ints stay exact ints: a count or byte total never rounds
            return int(value) * int(self.scale) if float(self.scale).is_integer() else float(value) * self.scale
        return float(value) * self.scale


def _parents() -> dict[str, str]:
    """Each indented (sub-item) label's key -> the words of the unindented label above it."""
    parents, parent = {}, ""
    for m in METRICS:
        if m.label.startswith(" "):
            parents[m.key] = parent
        else:
            parent = _UNIT.sub("", m.label)
    return parents


_PARENTS = _parents()


def _words_and_unit(key: str) -> tuple[str, str | None]:
    m = BY_KEY[key]
    label = m.label.strip()
    found = _UNIT.search(label)
    unit = found.group(1) if found else None
    words = _UNIT.sub("", label)
    if key in _SETTING_KEYS:
        return words, unit
    if m.phrase:  # a line of shared values says it in full ("preemptions by swap"): it reads alone
        return m.phrase.replace("{}", "").strip(), unit
    if m.label.startswith(" "):
        # a sub-item is named by what sets it apart from the line above it in a run's list
        # ("  by recompute" under "preemptions"): alone, it needs that line's words
        if m.legend:
            return m.legend, unit
        if words.startswith("by "):
            return f"{_PARENTS.get(key, '')} {words}".strip(), unit
    return words, unit


def shown(key: str, values: tuple[Any, ...] = ()) -> Shown:
    """How ``key`` reads; ``values`` (BASE's and HEAD's) pick seconds over milliseconds for long times."""
    if key not in BY_KEY:
        return Shown(key)
    m = BY_KEY[key]
    words, unit = _words_and_unit(key)
    scale = 1.0
    if m.show == "ms":
        numbers = [abs(float(v)) for v in values if isinstance(v, Real) and not isinstance(v, bool)]
        long = any(v >= SECONDS_FROM_S for v in numbers if not math.isnan(v))
        unit, scale = ("s", 1.0) if long else ("ms", 1e3)
    elif m.show == "pct":
        scale = 100.0
    elif m.show == "bytes":
        unit = "bytes"
    return Shown(f"{words} ({unit})" if unit else words, scale)
