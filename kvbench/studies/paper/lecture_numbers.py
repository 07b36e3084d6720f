"""The lecture's inputs and the closed forms several of its sections reuse, read from kvbench's own
objects (:mod:`kvbench.studies.paper.configs`) and from the runs on the lecture's chat workload.

The only literals are the lecture's own inputs (its batch of 199, its 20 ms SLO...), each named
here, and the overrides of the runs the sections share."""

from __future__ import annotations

from kvbench.api import Transfer
from kvbench.studies.paper.configs import built, composed
from kvbench.studies.paper.lecture_setup import GQA8, LONG, blocks_for, fill
from kvbench.studies.paper.runs import Runs

GB, MB, KIB = 1e9, 1e6, 1024
#: the lecture's batch for §10.3's waste column and §10.6's TPOT (its paged ceiling; kvbench's is 186)
LECTURE_B = 199
#: the lecture's naive concurrency ('29 of them stacked')
LECTURE_NAIVE_N = 29
#: the lecture's KV of a 640-token sequence, GB (640 x 512 decimal KB)
LECTURE_SEQ_GB = 0.328
#: the lecture's weight bytes, GB
LECTURE_WEIGHTS_GB = 13.5
#: the lecture's KV budget, GB
LECTURE_BUDGET_GB = 62.5
#: §10.6's TPOT SLO
TPOT_SLO_S = 0.020
#: bytes of one block-table entry: the lecture's 2 KB for 256 entries implies 8-byte (int64) entries
TABLE_ENTRY_BYTES = 8
#: the block sizes of the block-size sweep (the paged allocator takes powers of two from 8 to 256)
SWEEP_BLOCKS = (8, 16, 32, 64, 128, 256)


def pct(x: float) -> float:
    return 100.0 * x


def in_gb(value_bytes: float) -> float:
    return value_bytes / GB


def in_ms(seconds: float) -> float:
    return seconds * 1e3


def block_overrides(block_tokens: int) -> list[str]:
    """The paged run of the block-size sweep with blocks of ``block_tokens``."""
    return ["allocator=paged", f"allocator.block_size_tokens={block_tokens}"]


def fan_out_overrides(branches: int, prompt: int, output: int, extra=()) -> list[str]:
    """One request of ``branches`` completions off a ``prompt``-token prompt, all at t = 0."""
    return [
        f"workload.num_branches={branches}",
        f"workload.prompt_tokens={prompt}",
        f"workload.output_tokens={output}",
        f"workload.s_max_tokens={prompt + output}",
        "workload.num_requests=1",
        *LONG,
        *extra,
    ]


def ttft_overrides() -> list[str]:
    """§10.6's TTFT run: 4,096-token prompts arriving at 4 req/s."""
    return [
        *LONG,
        "workload.prompt_tokens=4096",
        "workload.output_tokens=128",
        f"workload.s_max_tokens={4096 + 128}",
        "workload.arrival=poisson",
        "workload.rate_per_s=4",
        "workload.num_requests=200",
    ]


class Numbers:
    """kvbench's inputs and the closed forms several sections reuse.

    Making one runs the four chat-workload runs (naive, per_request, paged, naive at 32K) in that
    order: the paper's runs table lists runs in the order they were first made."""

    def __init__(self, runs: Runs) -> None:
        self.runs = runs
        cfg = composed()
        self.num_requests = int(cfg.workload.num_requests)  # 1,000
        self.prompt = int(cfg.workload.prompt_tokens)  # 512
        self.output = int(cfg.workload.output_tokens)  # 128
        self.seq = self.prompt + self.output  # 640: the lecture's sequence
        self.s_max = int(cfg.workload.s_max_tokens)  # 4,096
        s = built([])
        self.block = int(s.allocator.block_size_tokens)  # 16: the allocator's (null in the config: the model's)
        self.model, self.hw, self.cost, self.budget = s.model, s.hardware, s.cost, s.budget_bytes
        self.kv = self.model.kv_bytes_per_token
        self.weights = self.model.weight_bytes
        g = built(GQA8)
        self.gqa_model, self.gqa_cost = g.model, g.cost
        self.kv_gqa = g.model.kv_bytes_per_token
        self.cost_32 = built(["hardware.host_link_bytes_per_s=32e9"]).cost
        self.cost_gqa_32 = built([*GQA8, "hardware.host_link_bytes_per_s=32e9"]).cost
        self.flops = self.hw.achieved_prefill_flops_per_s
        self.link = self.hw.host_link_bytes_per_s
        self.quad = 4 * self.model.num_layers * self.model.num_heads * self.model.head_dim  # FLOP per token^2

        # §10.2: the naive allocator
        self.naive_overrides = ["allocator=naive"]
        self.naive_n = self.budget // (self.s_max * self.kv)
        self.naive_fill = fill(self.naive_overrides, self.seq, self.s_max)
        self.naive_tokens_bytes = self.naive_n * self.seq * self.kv
        self.naive_util = self.naive_tokens_bytes / self.budget
        self.slot_bytes = self.s_max * self.kv
        # §10.3: paged, blocks of 16
        self.paged_overrides = ["allocator=paged"]
        self.blocks_total = self.budget // (self.block * self.kv)
        self.blocks_per_seq = blocks_for(self.seq, self.block)
        self.paged_n = self.blocks_total // self.blocks_per_seq
        self.paged_fill = fill(self.paged_overrides, self.seq, self.s_max)
        self.ridge = self.hw.dense_flops_per_s / self.hw.hbm_bandwidth_bytes_per_s
        # 32K S_max
        self.long_overrides = ["allocator=naive", "allocator.s_max_tokens=32768", *LONG]
        self.s_max_32k = 32768
        self.naive_32k_n = self.budget // (self.s_max_32k * self.kv)
        self.naive_32k_fill = fill(self.long_overrides, self.seq, self.s_max_32k)
        self.naive_32k_util = self.naive_32k_n * self.seq * self.kv / self.budget
        # runs on the lecture's chat workload
        self.naive_run = runs(self.naive_overrides).summary
        self.per_request_run = runs(["allocator=per_request"]).summary
        self.paged_run = runs(self.paged_overrides).summary
        self.long_run = runs(self.long_overrides).summary
        # §10.5: 4K swap and recompute
        self.kv_4k = self.s_max * self.kv
        self.swap_4k_s = 2 * self.kv_4k / self.link
        self.swap_4k_blocks_s = self.cost.swap_round_trip_s(Transfer(self.kv_4k, blocks_for(self.s_max, self.block)))
        self.recompute_4k_s = self.cost.prefill_time_s(self.s_max)
        # Lecture 2's ambient decode step: the 29 naive slots full at 4,096 tokens
        self.ambient_tpot_s = self.cost.decode_time_s(self.naive_n * self.s_max)

    def tail_tokens(self, block: int) -> float:
        """The lecture's mean unfilled tail of a sequence's last block: about half a block (none
        for 1-token blocks, which are always full)."""
        return 0.0 if block == 1 else block / 2

    def tail_waste_pct(self, block: int, batch: int = LECTURE_B) -> float:
        return pct(batch * self.tail_tokens(block) * self.kv / self.budget)

    def break_even_bandwidth(self, cost, tokens: int) -> float:
        """Link bandwidth at which a swap round trip of ``tokens`` tokens takes as long as
        recomputing their prefill: 2 * KV bytes / recompute time."""
        return 2 * tokens * cost.model.kv_bytes_per_token / cost.prefill_time_s(tokens)
