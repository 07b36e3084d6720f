"""Fresh allocators behind the lecture's capacities (filled until they refuse, as ``kvbench
slo-batch`` does), built from a composed config exactly as a run builds them; the specs and cost
model come from :mod:`kvbench.studies.paper.configs`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache

from kvbench.api import SeqShape, build, memory_ceiling
from kvbench.studies.paper.configs import composed

#: Llama-2-7B with grouped-query attention of 8 KV heads (the lecture's "GQA-8")
GQA8 = ("model.hf_config.num_key_value_heads=8",)
#: the long-context model the lecture's 32K numbers need (same 512 KiB per token)
LONG = ("model=llama2-7b-32k",)
#: positions for Exercise 1's 128K brochure
POS_128K = ("model.hf_config.max_position_embeddings=131072",)


@cache
def _fill(overrides: tuple[str, ...], context_tokens: int, s_max_tokens: int) -> tuple[int, float]:
    fresh = build(composed(overrides)).allocator  # a new, empty allocator every time
    return memory_ceiling(fresh, context_tokens, s_max_tokens)


def fill(overrides: Sequence[str], context_tokens: int, s_max_tokens: int) -> int:
    """How many sequences of ``context_tokens`` (declaring ``s_max_tokens``) a fresh allocator of
    ``kvbench <overrides>`` takes before it refuses (kvbench slo-batch's memory ceiling)."""
    return _fill(tuple(overrides), int(context_tokens), int(s_max_tokens))[0]


def fill_description(overrides: Sequence[str], context_tokens: int, s_max_tokens: int) -> str:
    where = " ".join(overrides) or "the defaults"
    return (
        f"kvbench.slo.batch.memory_ceiling: a fresh allocator of kvbench {where}, filled with "
        f"{context_tokens:,}-token sequences (S_max {s_max_tokens:,}) until it refuses"
    )


def fits_fan_out(overrides: Sequence[str], prompt: int, output: int, branches: int) -> bool:
    """Whether a fresh allocator admits one request of ``branches`` completions off ``prompt``."""
    allocator = build(composed(overrides)).allocator
    shape = SeqShape(
        num_tokens=prompt,
        s_max_tokens=prompt + output,
        final_kv_tokens=prompt + output - 1,
        num_branches=branches,
        prompt_tokens=prompt,
    )
    return bool(allocator.fits_in_empty(shape))


def blocks_for(tokens: int, block: int) -> int:
    return math.ceil(tokens / block)
