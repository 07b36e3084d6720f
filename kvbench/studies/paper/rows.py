"""One reproduced number: what the source claims, what kvbench's closed form gives, what a
kvbench run gives, and the verdict.

The verdict is computed, never typed: a numeric claim *matches* when kvbench's closed form lies
within the claim's own printed precision (half a unit in its last digit, or ``claim_tol``), and
*differs* otherwise, in which case the row must say why (``why``: units, rounding, an assumption
the source made, or an error). A qualitative claim ("block sizes 16-128 work best") carries
``holds``, a boolean that kvbench's code computed from its runs. Where kvbench has no closed form
(``formula_value`` None), a numeric claim is judged against the run. A row whose number needs a real
GPU (``gpu_only``) shows what kvbench predicts uncalibrated and is never called confirmed.

The simulation should agree with the closed form where both measure the same thing: a row sets
``sim_tol`` (relative) for those, and ``sim_agrees`` checks it. Where the two measure different
things on purpose (a run's time-weighted mean against a closed form at full length), ``sim_tol``
stays None and ``why`` says what the run adds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

#: the verdicts a row can have
MATCHES, DIFFERS, CONFIRMED, NOT_CONFIRMED, GPU_ONLY = "matches", "differs", "confirmed", "not confirmed", "GPU only"

_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def parse_claim(text: str) -> tuple[float, int] | None:
    """The first number printed in ``text`` and its decimals ("1,586" -> (1586.0, 0),
    "15.2%" -> (15.2, 1)); None when the claim has no number."""
    found = _NUMBER.search(text)
    if found is None:
        return None
    digits = found.group().replace(",", "")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    return float(digits), decimals


@dataclass(frozen=True)
class Row:
    #: stable key, unique across the paper ("lecture.naive_utilization_4k"): tests and CSVs use it
    key: str
    #: where the source says it ("§10.2", "Table 1", "Exercise 4")
    section: str
    #: what is measured, in words
    quantity: str
    #: the unit of ``claim``, ``formula_value`` and ``simulated`` ("%", "GB", "tokens", "ms", "x")
    unit: str
    #: the source's number as printed ("15.2", "2,600", "1.7-2.7"); a claim with no number is
    #: qualitative and needs ``holds``
    claim: str
    #: kvbench's closed form with its inputs, as shown to the reader
    formula: str
    formula_value: float | None
    #: what a kvbench run (or kvbench's own allocator or cost model) gives; None: nothing to run
    simulated: float | None = None
    #: the command (or kvbench call) that produced ``simulated``
    run: str = ""
    #: why the claim differs (required when it does), or a note on how to read the row
    why: str = ""
    #: absolute tolerance for the claim; None: half a unit in the claim's last printed digit
    claim_tol: float | None = None
    #: relative tolerance within which the simulation must equal the closed form; None: the two
    #: are not expected to agree (``why`` says what the run measures instead)
    sim_tol: float | None = None
    #: a qualitative claim, checked by kvbench's code on its runs
    holds: bool | None = None
    #: the number needs a real GPU (throughput, latency of real kernels): shown, not judged
    gpu_only: bool = False

    def __post_init__(self) -> None:
        if self.claim_value is None and self.holds is None and not self.gpu_only:
            raise ValueError(f"{self.key}: the claim {self.claim!r} has no number; set holds= from a check")
        if self.verdict in (DIFFERS, NOT_CONFIRMED) and not self.why.strip():
            raise ValueError(f"{self.key}: the claim {self.claim!r} {self.verdict}: say why (why=...)")

    @property
    def claim_value(self) -> float | None:
        parsed = parse_claim(self.claim)
        return None if parsed is None else parsed[0]

    @property
    def claim_decimals(self) -> int:
        parsed = parse_claim(self.claim)
        return 0 if parsed is None else parsed[1]

    @property
    def tolerance(self) -> float:
        if self.claim_tol is not None:
            return self.claim_tol
        return 0.5 * 10.0 ** (-self.claim_decimals) * (1 + 1e-9)

    @property
    def verdict(self) -> str:
        if self.gpu_only:
            return GPU_ONLY
        if self.holds is not None:
            return CONFIRMED if self.holds else NOT_CONFIRMED
        value = self.judged_value
        if value is None or not math.isfinite(value):
            raise ValueError(
                f"{self.key}: a numeric claim needs a finite formula_value (or, with no closed form, simulated)"
            )
        return MATCHES if abs(value - self.claim_value) <= self.tolerance else DIFFERS

    @property
    def judged_value(self) -> float | None:
        """What the claim is judged against: the closed form, or the run where kvbench has no closed
        form (the formula column then says so)."""
        return self.formula_value if self.formula_value is not None else self.simulated

    @property
    def sim_agrees(self) -> bool | None:
        """Whether the run equals the closed form within ``sim_tol``; None where not expected."""
        if self.sim_tol is None or self.simulated is None or self.formula_value is None:
            return None
        return abs(self.simulated - self.formula_value) <= self.sim_tol * max(abs(self.formula_value), 1e-300)

    def record(self) -> dict:
        """The row as a flat record for the CSV and Parquet tables."""
        return {
            "key": self.key,
            "section": self.section,
            "quantity": self.quantity,
            "unit": self.unit,
            "claim": self.claim,
            "claim_value": self.claim_value,
            "formula": self.formula,
            "formula_value": self.formula_value,
            "simulated": self.simulated,
            "run": self.run,
            "judged_value": self.judged_value,
            "verdict": self.verdict,
            "sim_agrees": self.sim_agrees,
            "why": self.why,
        }
