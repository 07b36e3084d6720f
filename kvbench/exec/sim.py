"""The ``sim`` executor: a step plan priced by the cost model instead of run on a GPU."""

from __future__ import annotations

import numpy as np

from kvbench.core.step import StepPlan, StepResult
from kvbench.exec.costmodel import CostModel

#: a run of at most this many decode steps is priced in plain floats (tuples), a longer one in
#: numpy arrays: below it, making the arrays costs more than the arithmetic (the bits are the same)
SHORT_RUN_STEPS = 64


class SimExecutor:
    """Prices a plan: swaps and copies, then prefill chunks, then one decode pass (the parts add).

    A plan that stands for several decode steps is priced step by step in one computation; each
    step's time equals what pricing that step alone gives, to the last bit.
    """

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        # the roofline's own decode_times_s has a plain-float twin; a clock that overrides it does not
        self._short_runs = type(cost).decode_times_s is CostModel.decode_times_s

    def execute(self, plan: StepPlan) -> StepResult:
        cost = self.cost
        overhead_s = cost.step_overhead_s  # a calibration's fixed cost per step (0.0 uncalibrated)
        if 1 < plan.num_steps <= SHORT_RUN_STEPS and self._short_runs and plan.page_mapping is None and plan.decodes:
            return self._short_run(plan, overhead_s)
        windowed = None
        if cost.window_groups and plan.decodes:
            # each decode's first step reads its whole context (its num_computed_tokens now)
            reads = [seq.num_computed_tokens for seq in plan.decodes]
            if plan.num_steps == 1:  # (plain floats: the same bits, without building arrays)
                windowed = cost.windowed_decode_times_list_s(reads, 1)
            else:
                windowed = cost.windowed_decode_times_s(reads, plan.num_steps)
        if plan.num_steps > 1:
            # a run of quiet decode steps: nothing but decodes, so each step is its decode pass
            if windowed is not None:
                durations_s = windowed
            else:
                durations_s = cost.decode_times_s(plan.kv_read_tokens, len(plan.decodes), plan.num_steps)
            if overhead_s:
                durations_s = durations_s + overhead_s
            # the clock at every boundary, added in step order: the engine cuts the run at an arrival from it
            added_s = None
            if plan.page_mapping is not None:  # vAttention's page mapping, step by step
                mapping = plan.page_mapping
                pages = np.concatenate(([mapping.num_pages], plan.span_pages_mapped[: plan.num_steps - 1]))
                added_s = _map_added_s(pages * mapping.page_map_latency_s, durations_s, mapping.overlapped)
                durations_s = durations_s + added_s
            clock_s = np.cumsum(np.concatenate(([plan.start_s], durations_s)))
            decode_s = float(np.cumsum(durations_s)[-1])
            return StepResult(
                plan.start_s,
                durations_s,
                float(clock_s[-1]),
                decode_s=decode_s,
                clock_s=clock_s,
                page_map_added_s=added_s,
            )
        return self._priced_step(plan, overhead_s, windowed)

    def _short_run(self, plan: StepPlan, overhead_s: float) -> StepResult:
        """A short run of quiet decode steps, in plain floats: the same bits as the numpy path
        (each step's time, then the clock and the decode time added in step order)."""
        cost = self.cost
        if cost.window_groups:  # each decode's first step reads its whole context (its num_computed_tokens now)
            reads = [seq.num_computed_tokens for seq in plan.decodes]
            times_s = cost.windowed_decode_times_list_s(reads, plan.num_steps)
        else:
            times_s = cost.decode_times_list_s(plan.kv_read_tokens, len(plan.decodes), plan.num_steps)
        durations_s = _add_overhead(times_s, overhead_s)
        clock = plan.start_s
        clock_s = [clock]
        decode_s = 0.0  # added in step order in the same pass (what added_in_order does)
        for duration_s in durations_s:
            clock += duration_s
            clock_s.append(clock)
            decode_s += duration_s
        return StepResult(plan.start_s, tuple(durations_s), clock, decode_s=decode_s, clock_s=tuple(clock_s))

    def _priced_step(self, plan: StepPlan, overhead_s: float, windowed) -> StepResult:
        """One step: its transfers, prefill chunks and decode pass."""
        cost = self.cost
        prefills = plan.prefills
        chunk_times_s, decode_s = cost.step_times_s(
            [(c.num_new_tokens, c.num_context_tokens) for c in prefills] if prefills else [],
            len(plan.decodes),
            plan.kv_read_tokens,
        )
        if windowed is not None:
            decode_s = float(windowed[0])
        # NOTE: a part with nothing to price is 0.0 without its generator and sum (most steps only
        # decode, or only prefill); 0.0 is what the empty sums gave, so the total adds the same bits
        prefill_s = recompute_s = swap_s = copy_s = 0.0
        if prefills:
            prefill_s = sum(chunk_times_s, 0.0)
            recompute_s = sum(
                (t * c.num_recomputed_tokens / c.num_new_tokens for t, c in zip(chunk_times_s, prefills)), 0.0
            )
        if plan.swap_out or plan.swap_in:
            swap_s = sum(map(cost.transfer_time_s, plan.swap_out), 0.0) + sum(
                map(cost.transfer_time_s, plan.swap_in), 0.0
            )
        if plan.copies:
            copy_s = sum((cost.copy_time_s(copy.num_bytes) for copy in plan.copies), 0.0)
        duration_s = swap_s + copy_s + prefill_s + decode_s + overhead_s
        if plan.host_reloads:  # blocking reloads from the host tier: the whole batch waits for them
            duration_s += sum(map(cost.transfer_time_s, plan.host_reloads), 0.0)
        added_s = None
        if plan.page_mapping is not None:  # vAttention's page mapping: after the step's other work
            mapping = plan.page_mapping
            added_s = (float(_map_added_s(mapping.map_s, duration_s, mapping.overlapped)),)
            duration_s += added_s[0]
        return StepResult(
            plan.start_s,
            (duration_s,),
            plan.start_s + duration_s,
            prefill_s,
            chunk_times_s,
            decode_s,
            swap_s,
            copy_s,
            recompute_s,
            page_map_added_s=added_s,
        )


def _add_overhead(times_s: list[float], overhead_s: float) -> list[float]:
    return [t + overhead_s for t in times_s] if overhead_s else times_s


def _map_added_s(map_s, step_s, overlapped: bool):
    """What mapping pages adds to a step: all of it on the critical path; mapped ahead in the
    background (vAttention's overlap with compute), only the part longer than the step's own work.
    Scalars or arrays alike, element by element."""
    return np.maximum(map_s - step_s, 0.0) if overlapped else map_s * np.ones_like(step_s)
