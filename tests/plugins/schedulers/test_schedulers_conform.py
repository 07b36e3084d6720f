"""Every scheduler with every preemption policy passes the scheduling conformance suite."""

from __future__ import annotations

import pytest
from kvbench_plugins.preemption.length_aware import LengthAwarePolicy
from kvbench_plugins.preemption.recompute import RecomputePolicy
from kvbench_plugins.preemption.swap import SwapPolicy
from kvbench_plugins.schedulers.chunked import ChunkedScheduler
from kvbench_plugins.schedulers.mixed import MixedScheduler
from kvbench_plugins.schedulers.prefill_first import PrefillFirstScheduler
from kvbench_plugins.schedulers.static import StaticScheduler

from kvbench.testing import SchedulingConformance


class TestEveryCombination(SchedulingConformance):
    @pytest.fixture(
        params=[MixedScheduler, PrefillFirstScheduler, ChunkedScheduler, StaticScheduler], ids=lambda c: c.name
    )
    def scheduler_class(self, request):
        return request.param

    @pytest.fixture(params=[RecomputePolicy, SwapPolicy, LengthAwarePolicy], ids=lambda c: c.name)
    def policy_class(self, request):
        return request.param
