"""NOT an upstream file: stands in for nano-vllm's nanovllm/config.py, which imports transformers and
whose __post_init__ needs a model directory (it reads the Hugging Face config for max_model_len).

The scheduler and block manager read only the five fields below; they keep upstream's names and
defaults. Upstream's __post_init__ also asserts ``kvcache_block_size % 256 == 0`` (the block size
its flash-attn paged KV cache takes); that check is made by the driver,
kvbench/validation/peers/nano_vllm.py, not here.
"""

from dataclasses import dataclass


@dataclass(slots=True)
class Config:
    max_num_batched_tokens: int = 16384
    max_num_seqs: int = 512
    eos: int = -1
    kvcache_block_size: int = 256
    num_kvcache_blocks: int = -1
