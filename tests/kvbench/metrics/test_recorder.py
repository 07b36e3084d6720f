"""The recorder merges quiet steps into one row whose time-weighted means stay exact."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from toy import request

from kvbench.core.ledger import LEDGER_FIELDS, MemoryLedger
from kvbench.core.sequence import SequenceGroup
from kvbench.core.step import AdmissionRefusal, Mechanism, Preemption, PrefillChunk, StepPlan, StepResult
from kvbench.memory.allocator import KVCopy, Refusal, Transfer
from kvbench.metrics.recorder import STEP_COLUMNS, Recorder, _add_span

BUDGET = 1000


def ledger(token: int, free: int) -> MemoryLedger:
    return MemoryLedger(BUDGET, token, 100, 50, 0, free)


def quiet(step: int, start_s: float, token: int, refused: SequenceGroup | None = None) -> StepPlan:
    plan = StepPlan(
        step,
        start_s,
        decodes=[object(), object()],
        kv_read_tokens=10,
        ledger=ledger(token, 850 - token),
        num_running=2,
        num_waiting=1 if refused else 0,
    )
    if refused:
        plan.refusal = AdmissionRefusal(refused, Refusal.NO_MEMORY, 400, 100, 100)
    return plan


def one_step(plan: StepPlan, duration_s: float) -> StepResult:
    return StepResult(plan.start_s, (duration_s,), plan.start_s + duration_s, decode_s=duration_s)


def test_quiet_steps_become_one_row_with_time_weighted_ledger_means():
    recorder = Recorder(kv_bytes_per_token=1)
    durations = [0.5, 0.25, 0.25]
    start = 0.0
    for step, (duration, token) in enumerate(zip(durations, [100, 200, 300])):
        plan = quiet(step, start, token)
        recorder.record(plan, one_step(plan, duration), any_seq_finished=step == 2)
        start += duration
    after = quiet(3, start, 400)  # the batch changed after a finish: a new row
    recorder.record(after, one_step(after, 1.0), any_seq_finished=False)
    steps = recorder.finish([]).steps
    assert steps["num_steps"].tolist() == [3, 1] and steps["step"].tolist() == [0, 3]
    first = steps.iloc[0]
    assert first["duration_s"] == 1.0 and first["decode_s"] == 1.0
    assert first["token_bytes"] == (100 * 0.5 + 200 * 0.25 + 300 * 0.25) / 1.0
    assert first["free_bytes"] == (750 * 0.5 + 650 * 0.25 + 550 * 0.25) / 1.0
    assert first["token_bytes_max"] == 300 and first["allocated_bytes_max"] == 300 + 150
    assert first["kv_read_bytes"] == 3 * 10 and first["num_computed_tokens"] == 3 * 2
    assert steps.iloc[1]["token_bytes"] == 400


def test_a_run_of_steps_recorded_at_once_writes_the_same_row_as_step_by_step():
    by_step, at_once = Recorder(1), Recorder(1)
    durations = np.array([0.3, 0.1, 0.7])
    starts = [0.0, 0.3, 0.4]
    for step, token in enumerate([100, 200, 300]):
        plan = quiet(step, starts[step], token)
        plan.kv_read_tokens = 10 + 2 * step
        by_step.record(plan, one_step(plan, durations[step]), any_seq_finished=False)
    span = quiet(0, 0.0, 100)
    span.num_steps = 3
    # every ledger part, as the engine writes them (a part added to the ledger is in the span too)
    span.span_ledgers = {
        name: np.array([getattr(ledger(t, 850 - t), name) for t in (200, 300)]) for name in LEDGER_FIELDS
    }
    end_s = float(np.cumsum(np.concatenate(([0.0], durations)))[-1])
    at_once.record(
        span, StepResult(0.0, durations, end_s, decode_s=float(np.cumsum(durations)[-1])), any_seq_finished=False
    )
    a, b = by_step.finish([]).steps, at_once.finish([]).steps
    assert a.equals(b)


def test_a_refusal_lasting_several_quiet_steps_is_one_refusal_row():
    recorder = Recorder(1)
    head = SequenceGroup(request(7, 8, 4), first_seq_id=0)
    for step in range(4):
        plan = quiet(step, float(step), 100, refused=head)
        recorder.record(plan, one_step(plan, 1.0), any_seq_finished=False)
    record = recorder.finish([])
    assert record.refusals[["step", "num_steps", "request_id", "reason"]].values.tolist() == [[0, 4, 7, "no_memory"]]
    assert record.steps["saturated"].tolist() == [True]


def test_a_step_that_is_not_quiet_is_never_merged():
    recorder = Recorder(1)
    plan = quiet(0, 0.0, 100)
    recorder.record(plan, one_step(plan, 1.0), any_seq_finished=False)
    busy = quiet(1, 1.0, 100)
    busy.copies = [KVCopy(3, 4, 1, 16)]  # a copy-on-write makes a step an event
    recorder.record(busy, StepResult(1.0, (1.0,), 2.0), any_seq_finished=False)
    assert recorder.finish([]).steps["num_steps"].tolist() == [1, 1]


def test_the_step_table_keeps_one_schema_in_machine_numbers():
    """Rows are stored as 8-byte numbers (a long run writes hundreds of thousands): counts as
    int64, times, amounts read and ledger means as float64, the saturated flag as bool."""
    from kvbench.metrics.recorder import FLOAT_STEP_COLUMNS, STEP_COLUMNS

    recorder = Recorder(1)
    plan = quiet(0, 0.0, 100)
    recorder.record(plan, one_step(plan, 0.5), any_seq_finished=False)
    steps = recorder.finish().steps
    assert list(steps.columns) == list(STEP_COLUMNS)
    for name in STEP_COLUMNS:
        expected = "bool" if name == "saturated" else "float64" if name in FLOAT_STEP_COLUMNS else "int64"
        assert str(steps[name].dtype) == expected, name
    assert steps["token_bytes"].tolist() == [100.0] and steps["saturated"].tolist() == [False]


def test_every_step_column_holds_its_own_value():
    """One hand-built step with a value in every column, distinct wherever one step allows (a few
    small counts repeat, and a one-step row's maxima are its ledger's): a row's values are kept by
    position, so a column written in another's place would show here."""
    swapped, recomputed = SequenceGroup(request(5, 64, 8), 50), SequenceGroup(request(6, 64, 8), 60)
    first, second = SequenceGroup(request(7, 64, 8), 70).seqs[0], SequenceGroup(request(8, 64, 8), 80).seqs[0]
    led = MemoryLedger(10_000, 1_100, 1_300, 1_700, 1_900, 2_300, 2_900, (), 3_100)
    plan = StepPlan(
        7,
        1.5,
        # three chunks of two sequences: 41 new tokens, 5 of them recomputed
        prefills=[PrefillChunk(first, 11, 0, 2), PrefillChunk(first, 13, 11, 3), PrefillChunk(second, 17, 0, 0)],
        decodes=[object(), object(), object()],
        kv_read_tokens=19,
        forks=[(object(), object())] * 4,
        copies=[KVCopy(0, 1, 1, 37)],
        swap_out=[Transfer(59, 1)],
        swap_in=[Transfer(43, 1)],
        swap_in_request_ids=[9],
        preemptions=[
            Preemption(swapped, 64, Mechanism.SWAP, False, 59),
            Preemption(recomputed, 64, Mechanism.RECOMPUTE, True),
        ],
        ledger=led,
        num_shared_blocks=47,
        shared_bytes_saved=53,
        num_running=23,
        num_waiting=29,
        num_swapped=31,
    )
    result = StepResult(
        1.5, (1.25,), 2.75, prefill_s=0.125, decode_s=0.25, swap_s=0.375, copy_s=0.5, recompute_s=0.0625
    )
    recorder = Recorder(kv_bytes_per_token=2)
    recorder.record(plan, result, any_seq_finished=False)
    row = recorder.finish([]).steps.iloc[0].to_dict()

    allocated = 1_100 + 1_300 + 1_700 + 3_100  # the state is held by sequences too
    expected = {
        "step": 7,
        "num_steps": 1,
        "start_s": 1.5,
        "duration_s": 1.25,
        "num_running": 23,
        "num_decode_seqs": 3,
        "num_prefill_seqs": 2,
        "num_prefill_tokens": 41,
        "num_waiting": 29,
        "num_swapped": 31,
        "saturated": True,
        "num_preemptions": 2,
        "num_swap_preemptions": 1,
        "num_swap_fallbacks": 1,
        "num_forks": 4,
        "num_copies": 1,
        "copy_bytes": 37,
        "swap_out_bytes": 59,
        "swap_in_bytes": 43,
        "prefill_s": 0.125,
        "decode_s": 0.25,
        "swap_s": 0.375,
        "copy_s": 0.5,
        "recompute_s": 0.0625,
        "kv_read_bytes": 38.0,  # 19 slots x 2 bytes
        "num_computed_tokens": 41 + 3,  # the prefills' new tokens and one per decode
        "num_recomputed_tokens": 5,
        "token_bytes": 1_100,
        "reserved_future_bytes": 1_300,
        "internal_bytes": 1_700,
        "external_bytes": 1_900,
        "free_bytes": 2_300,
        "cached_bytes": 2_900,
        "state_bytes": 3_100,
        "token_bytes_max": 1_100,
        "allocated_bytes_max": allocated,
        "num_shared_blocks": 47,
        "unshared_bytes_max": allocated + 53,
    }
    assert set(expected) == set(STEP_COLUMNS)  # a new column is added here too
    assert list(row) == list(STEP_COLUMNS)
    assert row == expected


SPAN_PARTS = ("a", "zero", "b")


@given(
    st.lists(st.floats(1e-6, 1.0), min_size=1, max_size=40),
    st.lists(st.floats(0.0, 1e12), min_size=3, max_size=3),
    st.integers(0, 2**40),
)
def test_a_span_adds_each_part_step_by_step_and_a_part_at_zero_leaves_its_total(step_s, totals, value):
    n = len(step_s)
    spans = {"a": [value + i for i in range(n)], "zero": [0] * n, "b": [value] * n}
    expected = []
    for total, name in zip(totals, SPAN_PARTS):  # the definition: total + value x step time, step by step
        for v, d in zip(spans[name], step_s):
            total += v * d
        expected.append(total)
    got = _add_span(list(totals), spans, step_s, SPAN_PARTS)
    assert [x.hex() for x in got] == [x.hex() for x in expected]  # to the bit
    assert got[1] == totals[1]
