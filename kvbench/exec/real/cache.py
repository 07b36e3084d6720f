"""The KV cache of a real run: per layer, key and value tensors ``[num_blocks, block_size, H_kv, D]``
(the layout every kernel plugin reads, :mod:`kvbench.kernels.layout`) whose blocks are the
allocator's block ids, and a host store for swapped-out sequences."""

from __future__ import annotations

import torch


class KVCache:
    """Blocks of ``block_size_tokens`` slots, addressed by the allocator's block tables.

    The allocator's capacity is ``capacity_blocks``; the tensors are grown on demand up to it
    (doubling), because a run's budget is often far more than it touches (the default hardware's
    tens of GB), and the allocators hand out low block ids first. A block id past the capacity is
    an allocator bug and raises.
    """

    def __init__(
        self,
        num_layers: int,
        block_size_tokens: int,
        num_kv_heads: int,
        head_dim: int,
        capacity_blocks: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
    ) -> None:
        self.block_size_tokens = block_size_tokens
        self.capacity_blocks = capacity_blocks
        self._shape = (num_layers, 0, block_size_tokens, num_kv_heads, head_dim)
        self.key = torch.zeros(self._shape, dtype=dtype, device=device)
        self.value = torch.zeros(self._shape, dtype=dtype, device=device)
        #: seq_id -> (keys, values) ``[L, n_blocks, block, H_kv, D]`` held in host memory while swapped out
        self.host: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def num_blocks(self) -> int:
        return self.key.shape[1]

    def ensure(self, max_block_id: int) -> None:
        """Make block ``max_block_id`` addressable."""
        if max_block_id < self.num_blocks:
            return
        if max_block_id >= self.capacity_blocks:
            raise RuntimeError(
                f"block id {max_block_id} is past the allocator's capacity of {self.capacity_blocks} blocks"
            )
        new = min(self.capacity_blocks, max(2 * self.num_blocks, max_block_id + 1, 16))
        pad = list(self._shape)
        pad[1] = new - self.num_blocks
        self.key = torch.cat([self.key, self.key.new_zeros(pad)], dim=1)
        self.value = torch.cat([self.value, self.value.new_zeros(pad)], dim=1)

    def layer(self, layer_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.key[layer_index], self.value[layer_index]

    def _slots(self, table: list[int], start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(start, stop)
        blocks = torch.tensor(table, dtype=torch.long)[positions // self.block_size_tokens]
        return blocks.to(self.key.device), (positions % self.block_size_tokens).to(self.key.device)

    def write(
        self,
        layer_index: int,
        table: list[int],
        start: int,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> None:
        """Positions ``start..start + len(keys)`` of a sequence (keys/values ``[n, H_kv, D]``)."""
        blocks, rows = self._slots(table, start, start + keys.shape[0])
        self.key[layer_index, blocks, rows] = keys
        self.value[layer_index, blocks, rows] = values

    def read(self, layer_index: int, table: list[int], num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A sequence's first ``num_tokens`` positions, ``[num_tokens, H_kv, D]`` each."""
        blocks, rows = self._slots(table, 0, num_tokens)
        return self.key[layer_index, blocks, rows], self.value[layer_index, blocks, rows]

    def copy_blocks(self, src_block_id: int, dst_block_id: int, num_blocks: int) -> None:
        """A device copy (copy-on-write, or a contiguous fork): every layer's blocks."""
        self.ensure(max(src_block_id, dst_block_id) + num_blocks - 1)
        src = slice(src_block_id, src_block_id + num_blocks)
        dst = slice(dst_block_id, dst_block_id + num_blocks)
        self.key[:, dst] = self.key[:, src]
        self.value[:, dst] = self.value[:, src]

    def copy_positions(self, src_table: list[int], dst_table: list[int], num_tokens: int) -> None:
        """A sequence's first ``num_tokens`` positions into another's slots, every layer."""
        src_blocks, src_rows = self._slots(src_table, 0, num_tokens)
        dst_blocks, dst_rows = self._slots(dst_table, 0, num_tokens)
        self.key[:, dst_blocks, dst_rows] = self.key[:, src_blocks, src_rows]
        self.value[:, dst_blocks, dst_rows] = self.value[:, src_blocks, src_rows]

    def swap_out(self, seq_id: int, table: list[int]) -> None:
        """Copy the blocks of ``table`` to host memory (pinned on a GPU, for asynchronous copies back)."""
        index = torch.tensor(table, dtype=torch.long, device=self.key.device)
        keys, values = self.key[:, index], self.value[:, index]
        if self.key.is_cuda:
            keys, values = keys.cpu().pin_memory(), values.cpu().pin_memory()
        self.host[seq_id] = (keys, values)

    def swap_in(self, seq_id: int, table: list[int]) -> None:
        """Back into the blocks of ``table`` (the same length as at swap-out: the same tokens)."""
        keys, values = self.host.pop(seq_id)
        if keys.shape[1] != len(table):
            raise RuntimeError(f"sequence {seq_id} swapped out {keys.shape[1]} blocks and back into {len(table)}")
        self.ensure(max(table))
        index = torch.tensor(table, dtype=torch.long, device=self.key.device)
        self.key[:, index] = keys.to(self.key.device, non_blocking=True)
        self.value[:, index] = values.to(self.key.device, non_blocking=True)
