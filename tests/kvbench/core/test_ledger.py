"""The memory ledger's hand-written constructor behaves as the frozen dataclass's own would."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest

from kvbench.core.ledger import LEDGER_FIELDS, MemoryLedger


def test_the_constructor_takes_the_fields_in_order_with_their_defaults():
    params = list(inspect.signature(MemoryLedger.__init__).parameters.values())[1:]
    fields = dataclasses.fields(MemoryLedger)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields
    ]


def test_a_ledger_is_frozen_comparable_hashable_and_replaceable():
    led = MemoryLedger(100, 10, 20, 30, 5, 35)
    assert (led.cached_bytes, led.group_bytes) == (0, ())
    assert led == MemoryLedger(
        budget_bytes=100, token_bytes=10, reserved_future_bytes=20, internal_bytes=30, external_bytes=5, free_bytes=35
    )
    assert hash(led) == hash(MemoryLedger(100, 10, 20, 30, 5, 35, 0, ()))
    assert led.total_bytes == 100 and led.allocated_bytes == 60
    with pytest.raises(dataclasses.FrozenInstanceError):
        led.free_bytes = 0
    assert dataclasses.replace(led, free_bytes=30, cached_bytes=5) == MemoryLedger(100, 10, 20, 30, 5, 30, 5)
    assert pickle.loads(pickle.dumps(led)) == led
    assert repr(led).startswith("MemoryLedger(budget_bytes=100, token_bytes=10,")


def test_from_slots_prices_slots_in_bytes():
    led = MemoryLedger.from_slots(
        budget_bytes=1_000,
        kv_bytes_per_token=2,
        allocated_slots=100,
        token_slots=60,
        future_slots=30,
        external_bytes=100,
        free_bytes=700,
        group_bytes=(("full_group_bytes", 200),),
    )
    assert [getattr(led, name) for name in LEDGER_FIELDS] == [120, 60, 20, 100, 700, 0, 0]
    assert led.group_bytes == (("full_group_bytes", 200),)


def test_from_slots_splits_the_memory_held_for_states():
    # 3 live states of 70 bytes and one spare, each held in 100 bytes: the rounding is internal
    led = MemoryLedger.from_slots(
        budget_bytes=2_000,
        kv_bytes_per_token=2,
        allocated_slots=100,
        token_slots=60,
        future_slots=30,
        external_bytes=100,
        free_bytes=1_300,
        state_bytes=3 * 70,
        state_future_bytes=70,
        state_held_bytes=4 * 100,
    )
    assert led.state_bytes == 210 and led.reserved_future_bytes == 60 + 70
    assert led.internal_bytes == 20 + 4 * 30
    assert led.allocated_bytes == 200 + 400 and led.total_bytes == 2_000


def test_the_state_is_a_part_of_the_ledger_held_by_sequences():
    assert LEDGER_FIELDS[-1] == "state_bytes"
    led = MemoryLedger(100, 10, 20, 30, 5, 25, 0, (), 10)
    assert led.total_bytes == 100 and led.allocated_bytes == 70
