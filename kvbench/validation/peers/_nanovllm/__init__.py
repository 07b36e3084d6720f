"""nano-vllm's scheduler, block manager and sequence, vendored (MIT; see LICENSE and README.md).

Nothing is imported here: the block manager needs xxhash and numpy, and the driver
(kvbench.validation.peers.nano_vllm) checks for them before it imports these modules.
"""
