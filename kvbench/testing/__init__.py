"""Conformance suites a plugin's own tests reuse (they need pytest and hypothesis).

    from kvbench.testing import AllocatorConformance, CachingAllocatorConformance, SchedulingConformance

Every built-in plugin passes the same suites; see each class's docstring for the fixtures to override.
"""

from kvbench.testing.allocators import (
    AllocatorConformance,
    CachingAllocatorConformance,
    check_invariants,
    check_ledger,
    run_operations,
)
from kvbench.testing.schedulers import SchedulingConformance, build_engine, check_run, limit_steps

__all__ = [
    "AllocatorConformance",
    "CachingAllocatorConformance",
    "SchedulingConformance",
    "build_engine",
    "check_invariants",
    "check_ledger",
    "check_run",
    "limit_steps",
    "run_operations",
]
