"""A toy model and machine whose step times can be worked out by hand, for scenario tests.

Numbers chosen so that hand arithmetic stays exact:

- KV per token = 2 (K, V) x 1 layer x 1 head x 8 dims x 1 byte = 16 bytes; weights 500 bytes;
- a decode step reading R KV tokens takes (500 + 16 R) / 1000 s;
- a prefill chunk of c tokens over p cached takes (2 x 500 c + 4 x 8 c (p + c)) / 2000 = 0.5 c + 0.016 c (p + c) s;
- a swap of b bytes in r copies takes b / 160 + 0.5 r s each way; a device copy of b bytes 2 b / 1000 s.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.core.request import Request
from kvbench.core.step import StepPlan
from kvbench.metrics.recorder import RunRecord
from kvbench.specs.hardware import HardwareSpec
from kvbench.specs.model import ModelSpec

TOY_MODEL = ModelSpec("toy", num_layers=1, num_heads=1, num_kv_heads=1, head_dim=8, dtype_bytes=1, num_params=500)
TOY_KV_BYTES = TOY_MODEL.kv_bytes_per_token


def toy_hardware(budget_tokens: int, host_swap_bytes: int = 10**6) -> HardwareSpec:
    return HardwareSpec(
        name="toy",
        hbm_bytes=1e9,
        hbm_bandwidth_bytes_per_s=1000,
        dense_flops_per_s=2000,
        prefill_flops_efficiency=1.0,
        host_link_bytes_per_s=160,
        host_transfer_overhead_s=0.5,
        host_swap_bytes=host_swap_bytes,
        kv_budget_bytes=budget_tokens * TOY_KV_BYTES,
    )


def decode_s(kv_read_tokens: int) -> float:
    return (500 + 16 * kv_read_tokens) / 1000


def prefill_s(new_tokens: int, context_tokens: int = 0) -> float:
    return (1000 * new_tokens + 32 * new_tokens * (context_tokens + new_tokens)) / 2000


def swap_s(num_bytes: int, num_runs: int) -> float:
    return num_bytes / 160 + 0.5 * num_runs


@dataclass
class ToyRun:
    record: RunRecord
    plans: list[StepPlan]  # every plan the scheduler made, in order (a span's first step stands for it)
    engine: object

    def row(self, step: int) -> dict:
        """The step-table row whose span starts at ``step``."""
        steps = self.record.steps
        return steps[steps["step"] == step].iloc[0].to_dict()

    def request(self, request_id: int) -> dict:
        requests = self.record.requests
        return requests[requests["request_id"] == request_id].iloc[0].to_dict()


def paged(budget_tokens: int, block_size_tokens: int = 8):
    from kvbench_plugins.allocators.paged import PagedAllocator, PagedConfig

    return PagedAllocator(
        PagedConfig(block_size_tokens), budget_bytes=budget_tokens * TOY_KV_BYTES, kv_bytes_per_token=TOY_KV_BYTES
    )


def naive(budget_tokens: int, s_max_tokens: int):
    from kvbench_plugins.allocators.naive import NaiveAllocator, NaiveConfig

    return NaiveAllocator(
        NaiveConfig(s_max_tokens), budget_bytes=budget_tokens * TOY_KV_BYTES, kv_bytes_per_token=TOY_KV_BYTES
    )


def request(
    request_id: int,
    prompt: int,
    output: int,
    *,
    arrival_s: float = 0.0,
    branches: int = 1,
    s_max: int | None = None,
    priority: int = 0,
) -> Request:
    return Request(request_id, arrival_s, prompt, s_max or prompt + output, (output,) * branches, priority=priority)


#: every option of the scheduler's config at a plain value, spelled out: a test that builds its
#: scheduler from these does not move when a default or an engine preset changes
PLAIN_SCHEDULER_OPTIONS = dict(
    max_num_seqs=8,
    max_num_batched_tokens=64,
    watermark_fraction=0.0,
    watermark_in_blocks=False,
    full_prompt_admission=False,
    long_prefill_token_threshold=8,
    step_seq_cap=False,
    decodes_in_budget=False,
    head_only_chunking=False,
)


def scheduled(run) -> list[dict[int, int]]:
    """Each step's tokens per request, as the differential check compares them."""
    steps = []
    for plan in run.plans:
        tokens: dict[int, int] = {}
        for chunk in plan.prefills:
            tokens[chunk.seq.group.request_id] = tokens.get(chunk.seq.group.request_id, 0) + chunk.num_new_tokens
        for seq in plan.decodes:
            tokens[seq.group.request_id] = tokens.get(seq.group.request_id, 0) + 1
        steps.append(tokens)
    return steps
