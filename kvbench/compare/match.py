"""Pair BASE's jobs with HEAD's by what they ran: the resolved config, less what cannot change a
number. Job numbers are not trusted: the same sweep typed in another order numbers its jobs
differently."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kvbench.compare.configs import IGNORED_KEYS, comparable, config_differences, differing_keys
from kvbench.compare.load import Job

MAX_NAMED = 3  #: unmatched jobs named in the error line


@dataclass
class Matching:
    pairs: list[tuple[Job, Job]] = field(default_factory=list)
    base_only: list[Job] = field(default_factory=list)
    head_only: list[Job] = field(default_factory=list)


def _key(config: dict[str, Any], ignored: tuple[str, ...]) -> str:
    return json.dumps(comparable(config, ignored), sort_keys=True)


def match_jobs(base: list[Job], head: list[Job], ignored: tuple[str, ...] = IGNORED_KEYS) -> Matching:
    """Pair jobs with equal comparable configs (several equal ones pair in folder order)."""
    waiting: dict[str, list[Job]] = {}
    for job in head:
        waiting.setdefault(_key(job.config, ignored), []).append(job)
    matching = Matching()
    for job in base:
        candidates = waiting.get(_key(job.config, ignored))
        if candidates:
            matching.pairs.append((job, candidates.pop(0)))
        else:
            matching.base_only.append(job)
    matched = {id(h) for _, h in matching.pairs}
    matching.head_only = [job for job in head if id(job) not in matched]
    return matching


def explain_unmatched(matching: Matching, ignored: tuple[str, ...] = IGNORED_KEYS, named: int = MAX_NAMED) -> str:
    """One line: which jobs found no partner, and how the nearest job of the other side differs
    (an unmatched one first: the likelier partner), written base -> head."""
    parts = []
    for job in matching.base_only:
        others = matching.head_only or [h for _, h in matching.pairs]
        parts.append(
            _unmatched(job, "base", "head", [config_differences(job.config, o.config, ignored) for o in others])
        )
    for job in matching.head_only:
        others = matching.base_only or [b for b, _ in matching.pairs]
        parts.append(
            _unmatched(job, "head", "base", [config_differences(o.config, job.config, ignored) for o in others])
        )
    # one line stays readable: the first few, and how many more
    return ", ".join(parts[:named]) + (
        f", and {len(parts) - named} more unmatched job(s)" if len(parts) > named else ""
    )


def _unmatched(job: Job, side: str, other_side: str, diffs: list[list[str]]) -> str:
    part = f"{side} {job.folder} ({job.label}) has no {other_side} job with its config"
    if diffs:
        nearest = min(diffs, key=len)
        shown = "; ".join(nearest[:3]) + (f"; {len(nearest) - 3} more" if len(nearest) > 3 else "")
        part += f" (nearest differs in {shown})"
    return part


def nearest_differing_keys(matching: Matching, ignored: tuple[str, ...] = IGNORED_KEYS) -> list[str]:
    """The config keys in which every unmatched job differs from its nearest job on the other side:
    what sets the two sides apart as a whole (a key only some jobs differ in, such as the allocator
    of a job the other sweep lacks, is no difference between the sides)."""
    common: list[str] | None = None
    sides = ((matching.base_only, matching.head_only or [h for _, h in matching.pairs], False),
             (matching.head_only, matching.base_only or [b for b, _ in matching.pairs], True))  # fmt: skip
    for jobs, others, flip in sides:
        for job in jobs:
            diffs = [
                differing_keys(other.config, job.config, ignored)
                if flip
                else differing_keys(job.config, other.config, ignored)
                for other in others
            ]
            nearest = min(diffs, key=len, default=[])
            common = nearest if common is None else [key for key in common if key in nearest]
    return common or []
