"""How far a metric may move between BASE and HEAD: specs, the rules that pick one per column.

A spec is one of::

    exact            equal, value for value (NaN equals NaN), floats to the last bit
    close            integers (counts, bytes) equal; floats within 1e-9 relative (CLOSE_REL)
    close:1e-6       integers equal; floats within 1e-6 relative
    rel:0.01         |head - base| <= 0.01 x |base|
    abs:0.5          |head - base| <= 0.5
    ratio:2          1/2 <= head / base <= 2 (either direction is suspect)
    ratio:2:lower    head / base <= 2: lower is better (a duration), so only growth fails
    ratio:2:higher   head / base >= 1/2: higher is better (a rate), so only a drop fails
    ignore           never fails (provenance, labels, numbers that cannot be compared)

Rules map fnmatch globs over summary column names to specs; the LAST rule that matches a column
wins, so a general rule comes first and its exceptions after it. The shipped defaults are in
``tolerances.yaml`` beside this module; a ``--tolerances`` file's rules come after them and
``--tol PATTERN=SPEC`` options after that.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from kvbench.errors import ConfigError

DEFAULTS_PATH = Path(__file__).with_name("tolerances.yaml")
SPEC_HELP = "specs: exact, close[:<fraction>], rel:<fraction>, abs:<amount>, ratio:<factor>[:lower|:higher], ignore"
KINDS = ("exact", "close", "rel", "abs", "ratio", "ignore")
#: ``close``'s default relative tolerance for floats. Two correct builds of kvbench differ in a
#: float's last bits where a sum is taken in another order (numpy's SIMD width, the BLAS kernel
#: picked at run time, another numpy): at most about n x 1.1e-16 relative for a sum of n terms,
#: so below 1.1e-10 for the million spans of the longest run a test makes, typically ~1e-15. The
#: smallest change a real bug made in the planted-regression campaign (docs/ci.md) is millions of
#: times larger. 1e-9 sits between the two: 10x above the worst summation noise, far below a change.
CLOSE_REL = 1e-9


@dataclass(frozen=True)
class Tolerance:
    """One parsed spec. ``amount`` is the fraction (rel), the amount (abs) or the factor (ratio)."""

    kind: str
    amount: float = 0.0
    direction: str = "both"  #: ratio only: which way of moving fails

    def __str__(self) -> str:
        if self.kind in ("exact", "ignore"):
            return self.kind
        if self.kind == "close":
            return "close" if self.amount == CLOSE_REL else f"close {self.amount:.4g}"
        if self.kind == "rel":
            return f"rel {self.amount:.4g}"
        if self.kind == "abs":
            return f"abs {self.amount:.4g}"
        if self.direction == "lower":
            return f"<=x{self.amount:.4g}"
        if self.direction == "higher":
            return f">=x{1 / self.amount:.3g}"
        return f"x{1 / self.amount:.3g}..{self.amount:.4g}"

    def accepts(self, base: Any, head: Any) -> bool:
        """Whether HEAD's value stays within this tolerance of BASE's (both present)."""
        if self.kind == "ignore" or same_value(base, head):
            return True
        if self.kind == "exact":
            return False
        try:
            b, h = float(base), float(head)
        except (TypeError, ValueError):
            return False  # a number against a non-number: a change no tolerance measures
        if math.isnan(b) or math.isnan(h):
            return False  # only one side is NaN (both: same_value above)
        if self.kind == "close":
            # a count is never noisy: any change to an integer is a change
            return not (_is_integer(base) and _is_integer(head)) and abs(h - b) <= self.amount * abs(b)
        if self.kind == "abs":
            return abs(h - b) <= self.amount
        if self.kind == "rel":
            return abs(h - b) <= self.amount * abs(b)
        return self._ratio_accepts(b, h)

    def _ratio_accepts(self, b: float, h: float) -> bool:
        if b == 0 or (b < 0) != (h < 0):
            # no ratio to a zero or across a sign change: only the harmless direction passes
            return {"lower": h <= b, "higher": h >= b, "both": False}[self.direction]
        ratio = h / b
        if self.direction == "lower":
            return ratio <= self.amount
        if self.direction == "higher":
            return ratio >= 1 / self.amount
        return 1 / self.amount <= ratio <= self.amount


def same_value(base: Any, head: Any) -> bool:
    """Exactly equal, NaN equal to NaN (ints compared as ints: no float rounding of byte counts)."""
    if _is_nan(base) and _is_nan(head):
        return True
    try:
        return bool(base == head)
    except (TypeError, ValueError):
        return False


def _is_integer(value: Any) -> bool:
    """An integer-typed value (Python or numpy int, bool): a count, never a noisy float."""
    return isinstance(value, (numbers.Integral, np.integer, np.bool_))


def _is_nan(value: Any) -> bool:
    if value is None:
        return True
    try:
        return math.isnan(value)
    except TypeError:
        return False


def _amount(text: str, spec: str, minimum: float) -> float:
    try:
        amount = float(text)
    except ValueError:
        amount = math.nan
    if not (amount >= minimum) or math.isinf(amount):
        raise ConfigError(f"tolerance {spec!r}: {text!r} is not a finite number >= {minimum:g}; {SPEC_HELP}")
    return amount


def parse_spec(spec: Any) -> Tolerance:
    """``'rel:0.01'`` -> Tolerance('rel', 0.01); a ConfigError naming the spec and the grammar otherwise."""
    if not isinstance(spec, str):
        raise ConfigError(f"tolerance {spec!r} is not a spec string (write rel:0.01, not rel: 0.01); {SPEC_HELP}")
    kind, *rest = spec.strip().split(":")
    if kind not in KINDS:
        raise ConfigError(f"tolerance {spec!r}: unknown kind {kind!r}; {SPEC_HELP}")
    if kind in ("exact", "ignore"):
        if rest:
            raise ConfigError(f"tolerance {spec!r}: {kind} takes no amount; {SPEC_HELP}")
        return Tolerance(kind)
    if kind == "close":
        if len(rest) > 1:
            raise ConfigError(f"tolerance {spec!r}: write close or close:<fraction>, e.g. close:1e-6; {SPEC_HELP}")
        return Tolerance("close", _amount(rest[0], spec, 0.0) if rest else CLOSE_REL)
    if kind in ("rel", "abs"):
        if len(rest) != 1:
            raise ConfigError(f"tolerance {spec!r}: write {kind}:<amount>, e.g. {kind}:0.01; {SPEC_HELP}")
        return Tolerance(kind, _amount(rest[0], spec, 0.0))
    if len(rest) not in (1, 2) or (len(rest) == 2 and rest[1] not in ("lower", "higher")):
        raise ConfigError(f"tolerance {spec!r}: write ratio:<factor>[:lower|:higher], e.g. ratio:2:lower; {SPEC_HELP}")
    return Tolerance("ratio", _amount(rest[0], spec, 1.0), rest[1] if len(rest) == 2 else "both")


@dataclass(frozen=True)
class Rule:
    pattern: str
    tolerance: Tolerance
    source: str  #: where the rule came from (a file, --tol): named in warnings

    def matches(self, column: str) -> bool:
        return fnmatchcase(column, self.pattern)


def rules_from_mapping(data: Any, source: str) -> list[Rule]:
    """Rules from a tolerance file's content: ``{"tolerances": {pattern: spec, ...}}``, in file order."""
    if not isinstance(data, dict) or set(data) != {"tolerances"} or not isinstance(data["tolerances"], dict):
        raise ConfigError(
            f"{source}: a tolerance file holds one mapping, tolerances: {{<glob>: <spec>, ...}} "
            f"(see {DEFAULTS_PATH.name} in kvbench/compare/)"
        )
    rules = []
    for pattern, spec in data["tolerances"].items():
        try:
            rules.append(Rule(str(pattern), parse_spec(spec), source))
        except ConfigError as exc:
            raise ConfigError(f"{source}: {pattern}: {exc}") from None
    return rules


def load_rules(path: Path) -> list[Rule]:
    """A tolerance YAML file's rules; a missing or malformed file is a ConfigError naming it."""
    from kvbench.io.textio import read_text

    text = read_text(Path(path), "--tolerances")
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise ConfigError(f"--tolerances {path}: nested too deeply; give a YAML mapping of tolerances") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise ConfigError(
            f"--tolerances {path}: not valid YAML{line}; fix it or start from kvbench/compare/{DEFAULTS_PATH.name}"
        ) from None
    return rules_from_mapping(data, str(path))


def parse_option(option: str) -> Rule:
    """``--tol 'ttft_*=rel:0.05'`` -> Rule('ttft_*', rel 0.05)."""
    pattern, sep, spec = option.partition("=")
    if not sep or not pattern.strip():
        raise ConfigError(f"--tol {option!r}: write --tol PATTERN=SPEC, e.g. --tol 'ttft_*=rel:0.05'; {SPEC_HELP}")
    try:
        return Rule(pattern.strip(), parse_spec(spec), "--tol")
    except ConfigError as exc:
        raise ConfigError(f"--tol {option!r}: {exc}") from None


def default_rules() -> list[Rule]:
    return load_rules(DEFAULTS_PATH)


def tolerance_for(column: str, rules: list[Rule]) -> Tolerance:
    """The last matching rule's tolerance; exact when none matches (the simulator is deterministic)."""
    for rule in reversed(rules):
        if rule.matches(column):
            return rule.tolerance
    return Tolerance("exact")
