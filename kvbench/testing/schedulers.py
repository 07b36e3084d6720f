"""Conformance suite for scheduler and preemption plugins: every one, built-in or third-party, must pass it.

Subclass :class:`SchedulingConformance` in a test module and override the ``scheduler_class``
and ``policy_class`` fixtures (parametrize them to test several)::

    from kvbench.testing import SchedulingConformance

    class TestMyScheduler(SchedulingConformance):
        @pytest.fixture
        def scheduler_class(self):
            return MyScheduler

The suite drives random small workloads (fan-outs and beam searches included) through the engine over tiny KV
budgets and a tiny host swap pool, so that requests are preempted over and over and swaps fall
back to recompute, on every built-in allocator, under every built-in admission queue (first come
first served, priority and shortest prompt first) and the scheduler's semantic options (whole-prompt
admission, a long-prefill cap, a per-step sequence cap, decodes in the budget, head-only chunking),
and checks: every request finishes with exactly
its output tokens, all memory and swap space is given back, the counters add up, and the
event-driven engine writes exactly the tables of the step-by-step one. :func:`build_engine` and
:func:`check_run` can be used without pytest classes too. Needs pytest and hypothesis.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.core.ledger import LEDGER_FIELDS
from kvbench.core.request import Request
from kvbench.engine import Engine
from kvbench.exec.costmodel import CostModel
from kvbench.exec.sim import SimExecutor
from kvbench.memory.allocator import Allocator
from kvbench.memory.host_pool import HostSwapPool
from kvbench.metrics.recorder import RunRecord
from kvbench.sched.preemption import VICTIMS
from kvbench.sched.queue import BUILT_IN_QUEUES, RequestQueue
from kvbench.sched.scheduler import Scheduler, SchedulerConfig
from kvbench.specs.hardware import HardwareSpec
from kvbench.specs.model import ModelSpec

#: 64 KV bytes per token (2 x 2 layers x 2 heads x 4 dims x 2 bytes); numbers chosen to be small, not realistic
TINY_MODEL = ModelSpec("tiny", num_layers=2, num_heads=2, num_kv_heads=2, head_dim=4, dtype_bytes=2, num_params=10_000)


def tiny_hardware(kv_budget_bytes: int, host_swap_bytes: int = 64 * 64) -> HardwareSpec:
    return HardwareSpec(
        name="tiny",
        hbm_bytes=1e9,
        hbm_bandwidth_bytes_per_s=1e6,
        dense_flops_per_s=1e8,
        prefill_flops_efficiency=0.5,
        host_link_bytes_per_s=1e5,
        host_transfer_overhead_s=1e-4,
        host_swap_bytes=host_swap_bytes,
        kv_budget_bytes=kv_budget_bytes,
    )


def build_engine(
    scheduler_class: type[Scheduler],
    policy_class: type,
    allocator: Allocator,
    *,
    hardware: HardwareSpec | None = None,
    scheduler_config: SchedulerConfig | None = None,
    victim: str = "newest",
    event_driven: bool = True,
    model: ModelSpec = TINY_MODEL,
    queue: RequestQueue | None = None,
) -> Engine:
    """An engine over ``allocator`` with the tiny model (or ``model``) on ``hardware``; ``queue``:
    the admission queue (first come first served when None)."""
    hardware = hardware or tiny_hardware(allocator.budget_bytes)
    cost = CostModel(model, hardware)
    scheduler = scheduler_class(
        scheduler_config or scheduler_class.Config(),
        allocator=allocator,
        policy=policy_class(policy_class.Config(victim=victim)),
        cost=cost,
        host_pool=HostSwapPool(int(hardware.host_swap_bytes)),
        queue=queue,
    )
    return Engine(scheduler, SimExecutor(cost), event_driven=event_driven)


#: steps one run of the suite's requests may plan: the built-in schedulers and policies took 250 at
#: most over 30,000 examples, so a run past this is a scheduler that has stopped making progress
MAX_STEPS = 20_000


def limit_steps(engine: Engine, max_steps: int = MAX_STEPS) -> Engine:
    """Make ``engine`` fail, rather than run for ever, once its scheduler has planned ``max_steps``
    steps: two requests that keep preempting each other never finish, and a test should say so."""
    scheduler = engine.scheduler
    schedule = scheduler.schedule
    num_steps = 0

    def counted(clock_s: float):
        nonlocal num_steps
        num_steps += 1
        if num_steps > max_steps:
            raise AssertionError(
                f"{type(scheduler).__name__} planned {max_steps:,} steps without finishing the run "
                f"(sequences running: {scheduler.num_running_seqs}): it has stopped making progress"
            )
        return schedule(clock_s)

    scheduler.schedule = counted  # the instance's attribute: the class and other engines are untouched
    return engine


def check_run(engine: Engine, requests: list[Request], record: RunRecord) -> None:
    """What every run must satisfy, whatever the policies."""
    r = record.requests
    expected = [sum(q.branch_output_tokens) for q in requests]
    assert r["num_generated"].tolist() == expected, "a request did not emit exactly its output tokens"
    assert (r["finish_s"] >= r["first_token_s"]).all() and (r["first_token_s"] > r["arrival_s"]).all()
    assert (r["admitted_s"] >= r["boundary_s"]).all() and (r["boundary_s"] >= r["arrival_s"]).all()
    preemptions = r["num_recompute_preemptions"] + r["num_swap_preemptions"]
    assert (r["num_preemptions"] == preemptions).all()
    assert (r["num_swap_fallbacks"] <= r["num_recompute_preemptions"]).all()
    assert (r["swap_out_bytes"] == r["swap_in_bytes"]).all(), "every swapped-out byte came back"
    # a recompute preemption loses positions: each is computed again or served back by a prefix cache
    lost = r["num_recomputed_tokens"] + r["recompute_cached_tokens"]
    assert ((lost > 0) == (r["num_recompute_preemptions"] > 0)).all()
    assert (r["cached_prompt_tokens"] < r["prompt_tokens"]).all() or not len(r), "a whole prompt came from the cache"
    # every position computed at least once (but prompt positions served from a prefix cache), recomputations on top
    floor = [q.prompt_tokens + sum(o - 1 for o in q.branch_output_tokens) for q in requests]
    computed_once = r["num_computed_tokens"] - r["num_recomputed_tokens"] + r["cached_prompt_tokens"]
    assert (computed_once >= np.array(floor, dtype=np.int64)).all()
    steps = record.steps
    assert steps["num_preemptions"].sum() == r["num_preemptions"].sum()
    assert steps["num_computed_tokens"].sum() == r["num_computed_tokens"].sum()
    total = steps[list(LEDGER_FIELDS)].sum(axis=1).to_numpy()
    budget = engine.scheduler.allocator.budget_bytes
    assert np.allclose(total, budget, rtol=1e-12, atol=0), "a step's ledger does not sum to the budget"
    one_step = (steps["num_steps"] == 1).to_numpy()
    assert (total[one_step] == budget).all()
    groups = [name for name in ("full_group_bytes", "window_group_bytes", "state_group_bytes") if name in steps]
    if groups:  # a model with several KV-cache groups: the ledger splits the allocated bytes by kind
        allocated = (
            steps[["token_bytes", "reserved_future_bytes", "internal_bytes", "state_bytes"]].sum(axis=1).to_numpy()
        )
        split = steps[groups].sum(axis=1).to_numpy()
        assert np.allclose(split, allocated, rtol=1e-12, atol=1.0), "the group split != allocated bytes"
        assert (split[one_step] == allocated[one_step]).all()
    assert engine.scheduler.allocator.ledger().allocated_bytes == 0, "memory was not given back"
    assert engine.scheduler.host_pool.used_bytes == 0, "swap space was not given back"


#: a small request: (arrival gap in seconds, prompt, output per branch, branches, beam-search re-fork
#: probability, which prefix of a pool of three it starts with: 4, 12 or 40 shared tokens, priority)
REQUESTS = st.lists(
    st.tuples(
        st.sampled_from([0.0, 0.0, 0.01, 0.5]),
        st.integers(1, 40),
        st.integers(1, 30),
        st.sampled_from([1, 1, 1, 2, 3]),
        st.sampled_from([0.0, 0.0, 0.5]),
        st.integers(0, 2),
        st.integers(-1, 2),
    ),
    min_size=1,
    max_size=10,
)

#: tokens per prefix-hash granule of the suite's requests, and how many granules each prefix shares
HASH_BLOCK_TOKENS = 4
SHARED_GRANULES = (1, 3, 10)


def make_requests(rows: list[tuple]) -> list[Request]:
    requests, arrival_s = [], 0.0
    for i, (gap_s, prompt, output, branches, beam, *rest) in enumerate(rows):
        arrival_s += gap_s
        hashes = ()
        prefix, priority = rest[:1], (rest[1] if len(rest) > 1 else 0)
        if prefix:  # chained ids: shared up to the prefix's length, the request's own after
            granules = -(-prompt // HASH_BLOCK_TOKENS)
            hashes = tuple(
                (prefix[0] + 1) * 1000 + g if g < SHARED_GRANULES[prefix[0]] else -(i * 1000 + g) - 1
                for g in range(granules)
            )
        requests.append(
            Request(
                i,
                arrival_s,
                prompt,
                prompt + output,
                (output,) * branches,
                beam if branches > 1 else 0.0,
                7,
                hashes,
                HASH_BLOCK_TOKENS if hashes else 0,
                priority,
            )
        )
    return requests


#: the allocators the suite runs on: a label -> its registered name and options
ALLOCATORS = {
    "paged": {"block_size_tokens": 8},
    "paged_prefix_caching": {"name": "paged", "block_size_tokens": 8, "prefix_caching": True},
    "paged_every_block_cached": {
        "name": "paged",
        "block_size_tokens": 8,
        "prefix_caching": True,
        "cache_generated_blocks": True,
    },
    "naive": {"s_max_tokens": 72},
    "per_request": {"reserve": "oracle", "placement": "first_fit", "granule_tokens": 8},
    # a model with linear-attention layers: every sequence also holds a state (TINY_STATE_BYTES)
    "naive_state": {"name": "naive", "s_max_tokens": 72},
    "per_request_state": {"name": "per_request", "reserve": "oracle", "placement": "first_fit", "granule_tokens": 8},
    "hybrid_paged_state": {"name": "hybrid_paged", "block_size_tokens": 8},
}
#: the state one sequence of the tiny model keeps where an allocator's label ends in ``_state``: a
#: little over five tokens' KV, so that it never fills its last slot, granule or block
TINY_STATE_BYTES = 5 * 64 + 3


def allocators(budget_tokens: int) -> dict[str, Allocator]:
    """One of each built-in kind over ``budget_tokens`` slots of the tiny model, found through the
    plugin registry (the core never imports a plugin)."""
    from kvbench.app.config import plugin_config
    from kvbench.plugins import lookup
    from kvbench.specs.kv_groups import FULL, STATE, KVGroup

    kv = TINY_MODEL.kv_bytes_per_token
    made = {}
    for label, options in ALLOCATORS.items():
        options = {"name": label, **options}
        cls = lookup("allocator", options["name"])
        extra = {}
        if label.endswith("_state") and options["name"] == "hybrid_paged":  # the state as its own group
            extra = {"kv_groups": (KVGroup(FULL, 2), KVGroup(STATE, 2, state_bytes=TINY_STATE_BYTES))}
        elif label.endswith("_state"):
            extra = {"state_bytes_per_request": TINY_STATE_BYTES}
        made[label] = cls(
            plugin_config(cls, options, "allocator"), budget_bytes=budget_tokens * kv, kv_bytes_per_token=kv, **extra
        )
    return made


class SchedulingConformance:
    """Tests every scheduler and preemption policy must pass. Override the two class fixtures."""

    #: hypothesis examples per allocator (keep the suite fast)
    max_examples = 30

    @pytest.fixture
    def scheduler_class(self) -> type[Scheduler]:
        """Override: the scheduler class under test."""
        raise NotImplementedError("override the scheduler_class fixture")

    @pytest.fixture
    def policy_class(self) -> type:
        """Override: the preemption-policy class under test."""
        raise NotImplementedError("override the policy_class fixture")

    @pytest.fixture
    def queue_classes(self) -> tuple[type[RequestQueue], ...]:
        """Override to test a queue plugin: the admission queues each example draws from."""
        return BUILT_IN_QUEUES

    @pytest.mark.parametrize("allocator_name", list(ALLOCATORS))
    def test_heavy_preemption_loses_no_request_and_both_loops_agree(
        self, scheduler_class, policy_class, queue_classes, allocator_name
    ):
        @settings(max_examples=self.max_examples, deadline=None)
        @given(
            rows=REQUESTS,
            budget_tokens=st.sampled_from([72, 96, 160]),
            watermark=st.sampled_from([0.0, 0.1]),
            victim=st.sampled_from(sorted(VICTIMS)),
            queue_class=st.sampled_from(list(queue_classes)),
            options=st.fixed_dictionaries(
                {
                    "watermark_in_blocks": st.booleans(),
                    "full_prompt_admission": st.booleans(),
                    "long_prefill_token_threshold": st.sampled_from([0, 0, 8]),
                    "step_seq_cap": st.booleans(),
                    "decodes_in_budget": st.booleans(),
                    "head_only_chunking": st.booleans(),
                }
            ),
        )
        def run(rows, budget_tokens, watermark, victim, queue_class, options):
            requests = make_requests(rows)
            config = scheduler_class.Config(
                max_num_seqs=8, max_num_batched_tokens=64, watermark_fraction=watermark, **options
            )
            tables = []
            for event_driven in (True, False):
                engine = build_engine(
                    scheduler_class,
                    policy_class,
                    allocators(budget_tokens)[allocator_name],
                    scheduler_config=config,
                    victim=victim,
                    event_driven=event_driven,
                    queue=queue_class(),
                )
                if not _admissible(engine, requests):
                    return
                record = limit_steps(engine).run(requests)
                check_run(engine, requests, record)
                tables.append(record)
            for name in ("requests", "steps", "refusals"):
                pd.testing.assert_frame_equal(getattr(tables[0], name), getattr(tables[1], name), check_exact=True)

        run()


def _admissible(engine: Engine, requests: list[Request]) -> bool:
    from kvbench.errors import ConfigError

    try:
        engine.scheduler.check_fits(requests)
    except ConfigError:
        return False
    return True
