"""Beam search under a chunked step's token budget: the budget can leave a group's beams at
different lengths, and a beam replaced by a copy of another must never hold a cache that is not
its own length (hypothesis found the case below in CI: a beam copied from a shorter one was later
"taken back" to more tokens than the allocator held for it)."""

from __future__ import annotations

import pandas as pd
import pytest
from toy import PLAIN_SCHEDULER_OPTIONS

from kvbench.plugins import lookup
from kvbench.sched.queue import FcfsQueue
from kvbench.testing.schedulers import allocators, build_engine, check_run, make_requests

# (gap, prompt, output, branches, beam-fork probability, prefix, priority): the last request is a
# 3-beam search that the 64-token budget and the 8-token long-prefill threshold schedule in turns
ROWS = [
    (0.0, 1, 1, 1, 0.0, 0, 0),
    (0.0, 28, 9, 1, 0.0, 0, 0),
    (0.0, 25, 9, 2, 0.0, 0, 0),
    (0.0, 25, 15, 3, 0.5, 0, 0),
]


@pytest.mark.parametrize("policy", ["swap", "length_aware", "recompute"])
def test_beams_out_of_step_keep_caches_of_their_own_length(policy):
    scheduler = lookup("scheduler", "chunked")
    config = scheduler.Config(**PLAIN_SCHEDULER_OPTIONS)
    requests = make_requests(ROWS)
    tables = []
    for event_driven in (True, False):
        engine = build_engine(
            scheduler,
            lookup("preemption", policy),
            allocators(96)["paged"],
            scheduler_config=config,
            victim="lowest_priority",
            event_driven=event_driven,
            queue=FcfsQueue(),
        )
        record = engine.run(requests)
        check_run(engine, requests, record)  # every request finished, every block given back
        tables.append(record)
    for name in ("requests", "steps"):
        pd.testing.assert_frame_equal(getattr(tables[0], name), getattr(tables[1], name), check_exact=True)
