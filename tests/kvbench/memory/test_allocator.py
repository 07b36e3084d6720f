"""Paging is exact: whatever the allocator's placement, a kernel reading its block tables computes
the same attention as over the sequence's tokens laid out densely."""

from __future__ import annotations

import pytest
from kvbench_plugins.allocators.naive import NaiveAllocator, NaiveConfig
from kvbench_plugins.allocators.paged import PagedAllocator, PagedConfig
from kvbench_plugins.allocators.per_request import PerRequestAllocator, PerRequestConfig

from kvbench.memory.allocator import SeqShape

torch = pytest.importorskip("torch")
from kvbench_plugins.kernels.torch_ref import TorchKernel  # noqa: E402

BUDGET_TOKENS = 2048  # kv_bytes_per_token = 1: budgets in tokens
NUM_KV_HEADS, NUM_HEADS, HEAD_DIM = 2, 4, 16
ALLOCATORS = {
    "naive": lambda: NaiveAllocator(NaiveConfig(s_max_tokens=256), budget_bytes=BUDGET_TOKENS, kv_bytes_per_token=1),
    "per_request-first_fit": lambda: PerRequestAllocator(
        PerRequestConfig(reserve="declared", placement="first_fit", granule_tokens=16),
        budget_bytes=BUDGET_TOKENS,
        kv_bytes_per_token=1,
    ),
    "per_request-buddy": lambda: PerRequestAllocator(
        PerRequestConfig(reserve="pow2", placement="buddy", granule_tokens=8),
        budget_bytes=BUDGET_TOKENS,
        kv_bytes_per_token=1,
    ),
    "paged-8": lambda: PagedAllocator(
        PagedConfig(block_size_tokens=8), budget_bytes=BUDGET_TOKENS, kv_bytes_per_token=1
    ),
    "paged-64": lambda: PagedAllocator(
        PagedConfig(block_size_tokens=64), budget_bytes=BUDGET_TOKENS, kv_bytes_per_token=1
    ),
}
#: (prompt tokens, tokens appended afterwards); a fork of sequence 2 then appends 9 tokens of its own
SEQUENCES = [(1, 0), (16, 0), (30, 7), (100, 41), (64, 1)]
FORK_PARENT, FORK_CHILD, CHILD_APPENDS = 2, 99, 9


def token_kv(seq_id: int, num_tokens: int, generator: torch.Generator) -> torch.Tensor:
    """Each sequence's tokens: [num_tokens, 2 (K,V), H_kv, D], drawn once per sequence."""
    return torch.randn(num_tokens, 2, NUM_KV_HEADS, HEAD_DIM, generator=generator)


def logical_sequences() -> dict[int, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    seqs = {i: token_kv(i, p + a, g) for i, (p, a) in enumerate(SEQUENCES)}
    prefix = seqs[FORK_PARENT][: SEQUENCES[FORK_PARENT][0]]  # what the parent held when it forked
    seqs[FORK_CHILD] = torch.cat([prefix, token_kv(FORK_CHILD, CHILD_APPENDS, g)])
    return seqs


def build(alloc) -> dict[int, list[int]]:
    for i, (prompt, appended) in enumerate(SEQUENCES):
        final = prompt + appended
        branches = 2 if i == FORK_PARENT else 1  # the parent reserves its child's branch
        assert alloc.allocate(i, SeqShape(prompt, s_max_tokens=256, final_kv_tokens=final, num_branches=branches)) == 0
        if appended and i != FORK_PARENT:
            assert alloc.append(i, appended)
    # the parent forks before it grows, so parent and child diverge inside a shared block
    alloc.fork(FORK_PARENT, FORK_CHILD, child_final_kv_tokens=SEQUENCES[FORK_PARENT][0] + CHILD_APPENDS)
    for _ in range(SEQUENCES[FORK_PARENT][1]):
        assert alloc.append(FORK_PARENT)
    for _ in range(CHILD_APPENDS):
        assert alloc.append(FORK_CHILD)
    return {seq_id: alloc.block_table(seq_id) for seq_id in [*range(len(SEQUENCES)), FORK_CHILD]}


def paged_cache(alloc, tables, seqs):
    """Write every sequence's tokens where its block table says; unused rows stay NaN."""
    block = alloc.block_size_tokens
    num_blocks = BUDGET_TOKENS // block
    cache = torch.full((2, num_blocks, block, NUM_KV_HEADS, HEAD_DIM), float("nan"))
    for seq_id, kv in seqs.items():
        for t in range(len(kv)):
            cache[:, tables[seq_id][t // block], t % block] = kv[t]
    return cache


def dense_attention(query: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    keys = kv[:, 0].repeat_interleave(NUM_HEADS // NUM_KV_HEADS, dim=1)  # [T, H, D]
    values = kv[:, 1].repeat_interleave(NUM_HEADS // NUM_KV_HEADS, dim=1)
    scores = torch.einsum("hd,thd->ht", query, keys) / HEAD_DIM**0.5
    return torch.einsum("ht,thd->hd", torch.softmax(scores, dim=-1), values)


@pytest.mark.parametrize("name", ALLOCATORS)
def test_kernel_over_any_allocators_block_tables_equals_dense_attention(name):
    alloc = ALLOCATORS[name]()
    tables = build(alloc)
    seqs = logical_sequences()
    for seq_id, kv in seqs.items():
        assert alloc.num_tokens(seq_id) == len(kv)
    cache = paged_cache(alloc, tables, seqs)
    order = sorted(seqs)
    width = max(len(tables[s]) for s in order)
    block_tables = torch.tensor([tables[s] + [0] * (width - len(tables[s])) for s in order], dtype=torch.int32)
    seq_lens = torch.tensor([len(seqs[s]) for s in order])
    query = torch.randn(len(order), NUM_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(1))
    out = TorchKernel().decode(query, cache[0], cache[1], block_tables, seq_lens)
    expected = torch.stack([dense_attention(query[i], seqs[s]) for i, s in enumerate(order)])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
