"""The step table's summary, added up a batch of rows at a time.

A run that streams its step table to its files (a million requests write millions of rows) never
holds the table, yet its summary must be the one the whole table gives, to the last bit: every sum
here is the exactly rounded sum of all its values (what ``math.fsum`` over the whole column gives),
however the rows were split into batches. :func:`kvbench.metrics.summary.summarize` computes a held
table's summary through the same class, so the two can never drift apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from kvbench.core.ledger import LEDGER_FIELDS
from kvbench.metrics.kv_kinds import kind_peaks

#: the ledger parts held by sequences, block-granular: what a serving engine's usage gauge counts
#: as used (vLLM: 1 - free blocks / all blocks, where cached-but-evictable blocks count as free).
#: The other parts (external, free, and cached when the allocator caches prefixes) are not held.
ALLOCATED_FIELDS = ("token_bytes", "reserved_future_bytes", "internal_bytes")
#: step times summed over the run
TIME_TOTALS = ("swap_s", "recompute_s", "copy_s", "prefill_s", "decode_s")
#: the KV-cache group kinds a model with several groups reports (``<kind>_group_bytes`` columns)
GROUP_KINDS = ("full", "window", "state")
#: the ledger's parts a summary reports only where the run ever held them: a model without
#: linear-attention layers has no state (and its summaries keep their keys)
OPTIONAL_PARTS = ("state_bytes",)


class ExactSum:
    """A float sum added to a batch at a time, always the exactly rounded sum of every value added.

    ``math.fsum`` keeps the exact sum of its inputs as a few non-overlapping floats (Shewchuk's
    partials) and rounds once at the end, but it does not hand the partials over. They are recovered
    here from ``fsum`` itself: ``s0 = fsum(xs)`` is the exact sum rounded; ``fsum(xs + [-s0])`` is
    what that rounding left out, rounded again; and so on until nothing is left out. The floats kept
    add up exactly to everything added so far, so the final ``fsum`` of them is ``fsum`` of every
    value, bit for bit. Each step removes 52 bits or more of what is left, so a batch takes a few
    passes over its values (at most about 40 between the largest double and the smallest)."""

    __slots__ = ("_terms",)

    def __init__(self) -> None:
        self._terms: list[float] = []

    def add(self, values: np.ndarray) -> None:
        if not len(values):
            return
        items = self._terms + values.tolist()
        total = math.fsum(items)
        terms = [total]
        while math.isfinite(total):  # (a NaN or an infinity is its own sum: nothing to carry)
            items.append(-total)
            total = math.fsum(items)
            if total == 0.0:  # a non-zero exact remainder is at least the smallest subnormal
                break
            terms.append(total)
        self._terms = terms

    def value(self) -> float:
        return math.fsum(self._terms)


def _weighted_mean(products: ExactSum, weights: ExactSum) -> float:
    # each product is exactly rounded by IEEE 754 and the sums exactly: machine-independent
    total = weights.value()
    return products.value() / total if total > 0 else math.nan


class StepTotals:
    """What the summary needs of a step table, added a batch of rows (a column name -> values
    mapping, every column of the table) at a time; :meth:`summary` gives the same dict whether the
    table came in one batch or in many. Definitions: :func:`kvbench.metrics.summary.summarize`."""

    def __init__(self, budget_bytes: int, kv_bytes_per_token: int, kv_kinds: Mapping[str, int] | None = None) -> None:
        """``kv_kinds``: the model's per-token bytes of each token-holding layer kind (and the state
        per request), :func:`kvbench.metrics.kv_kinds.kv_kinds`; given, the summary reports each
        kind's peak bytes (``peak_<kind>_bytes``)."""
        self.budget_bytes = budget_bytes
        self.kv_bytes_per_token = kv_bytes_per_token
        self.kv_kinds = dict(kv_kinds) if kv_kinds else None
        self.num_rows = 0
        self.num_steps = 0
        self.peak_running: float | None = None
        self.min_running_saturated: float | None = None
        self._sums: dict[str, ExactSum] = {}
        self._ints: dict[str, int] = {}
        self._peaks: dict[str, int] = {}
        self._groups: tuple[str, ...] = ()
        self._maps_pages = False

    def _sum(self, key: str, values: np.ndarray) -> None:
        self._sums.setdefault(key, ExactSum()).add(values)

    def add(self, steps: Mapping[str, np.ndarray]) -> None:
        if self.num_rows == 0:  # the first batch says which optional columns the table has
            self._groups = tuple(kind for kind in GROUP_KINDS if f"{kind}_group_bytes" in steps)
            self._maps_pages = "pages_mapped" in steps
        rows = len(steps["duration_s"])
        if not rows:
            return
        self.num_rows += rows
        budget = self.budget_bytes

        def col(name: str) -> np.ndarray:
            return np.asarray(steps[name], dtype=np.float64)

        duration_s = col("duration_s")
        num_running = col("num_running")
        saturated = np.asarray(steps["saturated"], dtype=bool)
        self.num_steps += int(np.asarray(steps["num_steps"], dtype=np.int64).sum())
        self.peak_running = max(self.peak_running or 0.0, float(num_running.max()))
        if saturated.any():
            low = float(num_running[saturated].min())
            self.min_running_saturated = (
                low if self.min_running_saturated is None else min(self.min_running_saturated, low)
            )
        block_utilization = sum(col(field) for field in ALLOCATED_FIELDS) / budget
        tail_tokens = (col("reserved_future_bytes") + col("internal_bytes")) / self.kv_bytes_per_token
        has_seqs = num_running > 0
        # per step with sequences running (the others have no tail), the tail waste per sequence
        tail_per_seq = tail_tokens[has_seqs] / num_running[has_seqs]
        tail_s = duration_s[has_seqs]
        shares = {field: col(field) / budget for field in LEDGER_FIELDS if field in steps}  # (older tables: six)
        shares.update({f"{kind}_group": col(f"{kind}_group_bytes") / budget for kind in self._groups})
        # each period's rows, of the table and of the steps with sequences (None: all of them)
        for period, period_rows, tail_rows in (("saturated", saturated, saturated[has_seqs]), ("all", None, None)):

            def pick(values: np.ndarray, mask: np.ndarray | None = period_rows) -> np.ndarray:
                return values if mask is None else values[mask]

            weights = pick(duration_s)
            self._sum(f"duration_s/{period}", weights)
            self._sum(f"running/{period}", pick(num_running) * weights)
            self._sum(f"block_utilization/{period}", pick(block_utilization) * weights)
            for name, share in shares.items():
                self._sum(f"{name}/{period}", pick(share) * weights)
            tail_weights = pick(tail_s, tail_rows)
            self._sum(f"tail_s/{period}", tail_weights)
            self._sum(f"tail/{period}", pick(tail_per_seq, tail_rows) * tail_weights)
        for name in ("kv_read_bytes", *TIME_TOTALS):
            self._sum(name, col(name))
        ints = ["num_copies", "copy_bytes"] + (["pages_mapped"] if self._maps_pages else [])
        for name in ints:
            self._ints[name] = self._ints.get(name, 0) + int(np.asarray(steps[name], dtype=np.int64).sum())
        if self._maps_pages:
            self._sum("page_map_s", col("page_map_s"))
            self._sum("page_map_added_s", col("page_map_added_s"))
        for name in ("token_bytes_max", "allocated_bytes_max", "num_shared_blocks", "unshared_bytes_max"):
            peak = int(np.asarray(steps[name], dtype=np.int64).max())
            self._peaks[name] = max(self._peaks.get(name, peak), peak)
        if self.kv_kinds is not None or "state_bytes" in steps:
            self._add_kind_peaks(steps)

    def _add_kind_peaks(self, steps: Mapping[str, np.ndarray]) -> None:
        """The most each kind held at a row: the states, what sequences held besides them (a
        decode span's states do not change, so its allocated peak less its states is its KV's),
        and each group kind's bytes."""
        state = np.asarray(steps.get("state_bytes", np.zeros(1)), dtype=np.int64)
        held = np.asarray(steps["allocated_bytes_max"], dtype=np.int64) - state
        peaks = {"state_bytes": state, "kv_held_bytes": held}
        peaks.update({f"{kind}_group_bytes": np.asarray(steps[f"{kind}_group_bytes"]) for kind in self._groups})
        for name, values in peaks.items():
            peak = int(values.max())
            self._peaks[name] = max(self._peaks.get(name, peak), peak)

    def _value(self, key: str) -> float:
        found = self._sums.get(key)
        return found.value() if found is not None else 0.0

    def _mean(self, key: str, period: str) -> float:
        return _weighted_mean(
            self._sums.get(f"{key}/{period}", ExactSum()), self._sums.get(f"duration_s/{period}", ExactSum())
        )

    def summary(self) -> dict[str, float | int | str]:
        """The summary's step keys, in the order the summary lists them."""
        saturated_s = self._value("duration_s/saturated")
        total_s = self._value("duration_s/all")
        # the breakdown is meant for the saturated regime; a run that never got there still gets one
        period = "saturated" if saturated_s > 0 else "all"
        out: dict[str, float | int | str] = {
            "num_steps": self.num_steps,
            "peak_concurrency": int(self.peak_running) if self.num_rows else 0,
            "mean_concurrency": self._mean("running", "all"),
            "mean_concurrency_saturated": self._mean("running", "saturated"),
            # the sustained floor: what memory holds while it binds (the peak can be an over-admission
            # transient that preemption then cuts back); NaN, like the other "(sat.)" figures, when
            # memory never binds
            "min_concurrency_saturated": (
                int(self.min_running_saturated) if self.min_running_saturated is not None else math.nan
            ),
            # utilization is the token states' share of the budget: the ledger's token_bytes share
            "utilization_mean": self._mean("token_bytes", "all"),
            "utilization_saturated": self._mean("token_bytes", "saturated"),
            "block_utilization_mean": self._mean("block_utilization", "all"),
            "block_utilization_saturated": self._mean("block_utilization", "saturated"),
            "saturated_s": saturated_s,
            "saturated_fraction": saturated_s / total_s if total_s > 0 else math.nan,
            "breakdown_period": period,
        }
        for field in LEDGER_FIELDS:
            if field not in OPTIONAL_PARTS or self._peaks.get(field, 0) > 0:
                out[f"frac_{field.removesuffix('_bytes')}"] = self._mean(field, period)
        tail_tokens = _weighted_mean(
            self._sums.get(f"tail/{period}", ExactSum()), self._sums.get(f"tail_s/{period}", ExactSum())
        )
        out["mean_tail_waste_tokens_per_seq"] = tail_tokens
        out["mean_tail_waste_bytes_per_seq"] = tail_tokens * self.kv_bytes_per_token
        # achieved KV read bandwidth over the time steps took (the kernel's share of the roofline)
        out["kv_read_bytes_per_s"] = self._value("kv_read_bytes") / total_s if total_s > 0 else math.nan
        for key in TIME_TOTALS:
            out[key] = self._value(key)
        out["preemption_cost_s"] = out["swap_s"] + out["recompute_s"]
        out["num_copies"] = self._ints.get("num_copies", 0)
        out["copy_bytes"] = self._ints.get("copy_bytes", 0)
        for kind in self._groups:  # a model with several KV-cache groups: the held bytes by kind
            out[f"frac_{kind}_group"] = self._mean(f"{kind}_group", period)
        if self._maps_pages:  # an allocator that maps pages on demand (vAttention)
            out["pages_mapped"] = self._ints.get("pages_mapped", 0)
            out["page_map_s"] = self._value("page_map_s")
            out["page_map_added_s"] = self._value("page_map_added_s")
            out["page_map_added_share"] = out["page_map_added_s"] / total_s if total_s else math.nan
        # the most KV held at any step: token states, and everything allocated to sequences
        out["peak_token_bytes"] = self._peaks.get("token_bytes_max", 0)
        out["peak_allocated_bytes"] = self._peaks.get("allocated_bytes_max", 0)
        # sharing (copy-on-write fan-out, prefix-cache hits): what the same sequences would hold with
        # no block shared, at its peak, and how many times the allocated peak that is
        out["peak_shared_blocks"] = self._peaks.get("num_shared_blocks", 0)
        out["peak_unshared_bytes"] = self._peaks.get("unshared_bytes_max", 0)
        peak_allocated_bytes = out["peak_allocated_bytes"]
        out["sharing_saving"] = out["peak_unshared_bytes"] / peak_allocated_bytes if peak_allocated_bytes else math.nan
        if self.kv_kinds is not None:
            out.update(kind_peaks(self.kv_kinds, self._peaks))
        return out
