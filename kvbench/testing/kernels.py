"""The decode-kernel conformance suite: shapes every kernel plugin must get right, and how close.

Each :class:`DecodeCase` is small (Triton's CPU interpreter runs it in well under a second) and
targets one way a paged kernel goes wrong: 1-token sequences, sequences that exactly fill their last
block, ragged batches, GQA (including a group size that is not a power of two), a head dim that is
not a power of two (80), the smallest and largest block sizes (8, 256), the contiguous layout (one
block per sequence), and sequences long enough to need several tiles and splits. Caches come from
:func:`~kvbench.kernels.layout.make_paged_case` with every unused row set to NaN, so a kernel that
reads past a sequence's end returns NaN instead of passing.

A plugin's tests call :func:`assert_matches_reference` with its ``decode`` for every case and dtype
(see ``tests/plugins/kernels/``); an outside kernel plugin can do the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.kernels.layout import PagedCase, make_paged_case


@dataclass(frozen=True)
class DecodeCase:
    name: str
    seq_lens: tuple[int, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int

    def build(self, dtype: torch.dtype, device="cpu", seed: int = 0) -> PagedCase:
        return make_paged_case(
            list(self.seq_lens),
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.block_size,
            dtype,
            device,
            seed=seed,
        )


DECODE_CASES = (
    # MHA, smallest block: a 1-token sequence, one exactly full block, a ragged one
    DecodeCase("mha_d64_block8", (1, 8, 23), num_heads=4, num_kv_heads=4, head_dim=64, block_size=8),
    # GQA group 4, head dim 128, two exactly full blocks
    DecodeCase("gqa4_d128_block16", (32, 17, 5), num_heads=8, num_kv_heads=2, head_dim=128, block_size=16),
    # GQA group 3 (not a power of two) with head dim 80 (not a power of two)
    DecodeCase("gqa3_d80_block16", (17, 1, 48), num_heads=6, num_kv_heads=2, head_dim=80, block_size=16),
    # the largest block: 1 token, exactly one full block, and a second, partial block
    DecodeCase("gqa4_d64_block256", (1, 256, 300), num_heads=4, num_kv_heads=1, head_dim=64, block_size=256),
    # contiguous layout: one block per sequence, as large as the longest sequence
    DecodeCase("contiguous_d64", (64, 7, 40), num_heads=4, num_kv_heads=2, head_dim=64, block_size=64),
    # long enough for several tiles and splits per sequence next to a short one
    DecodeCase("long_ragged_d64_block8", (333, 9), num_heads=4, num_kv_heads=2, head_dim=64, block_size=8),
)

#: (atol, rtol) per dtype against the float32 reference: outputs are averages of N(0, 1) value rows,
#: so a few units in the last place of the output dtype
TOLERANCES = {
    torch.float32: (2e-5, 1e-5),
    torch.float16: (3e-3, 3e-3),
    torch.bfloat16: (2e-2, 2e-2),
}
DTYPES = tuple(TOLERANCES)


def assert_matches_reference(decode, case: DecodeCase, dtype: torch.dtype, device="cpu") -> None:
    """``decode(query, key_cache, value_cache, block_tables, seq_lens)`` must match the torch reference."""
    from kvbench.kernels.reference import paged_decode_reference

    paged = case.build(dtype, device)
    out = decode(*paged.args)
    expected = paged_decode_reference(*paged.args)
    assert out.shape == expected.shape and out.dtype == dtype, (
        f"{case.name}: got {tuple(out.shape)} {out.dtype}, expected {tuple(expected.shape)} {dtype}"
    )
    bad = ~torch.isfinite(out)
    assert not bad.any(), (
        f"{case.name}: {int(bad.sum())} non-finite outputs: the kernel read a NaN-poisoned cache row "
        "(past a sequence's end, or through a padding entry of the block table)"
    )
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out.float(), expected.float(), atol=atol, rtol=rtol, msg=lambda m: f"{case.name}: {m}")
