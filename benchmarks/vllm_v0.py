"""vLLM v0's scheduling as the benchmarks run it, the configuration Vidur simulates: paged blocks
of 16 tokens, prefill first, at most 4,096 batched tokens a step, recompute preemption."""

from __future__ import annotations


def vllm_v0_scheduling(max_num_seqs: int = 128) -> list[str]:
    """The kvbench overrides of vLLM v0's scheduling with at most ``max_num_seqs`` sequences a step
    (128, vLLM's default)."""
    return [
        "scheduler=prefill_first",
        "allocator=paged",
        "allocator.block_size_tokens=16",
        "scheduler.max_num_batched_tokens=4096",
        "preemption=recompute",
        f"scheduler.max_num_seqs={max_num_seqs}",
    ]
