"""Conformance suites a plugin's own tests reuse (they need pytest and hypothesis).

    from kvbench.testing import AllocatorConformance

Every built-in plugin passes the same suites; see each class's docstring for the fixture to override.
"""

from kvbench.memory.conformance import AllocatorConformance, check_invariants, check_ledger, run_operations

__all__ = ["AllocatorConformance", "check_invariants", "check_ledger", "run_operations"]
