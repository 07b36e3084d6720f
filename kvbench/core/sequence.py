"""Per-request state inside the engine: counters, not token lists (no per-token objects)."""

from __future__ import annotations

from kvbench.memory.allocator import SeqShape


class Sequence:
    """One request as it moves through waiting -> running -> finished, possibly several times.

    ``num_generated`` counts emitted output tokens; ``num_kv_tokens`` counts KV slots held (0 while
    waiting). A prefill of ``n`` context tokens stores ``n`` KV slots and emits one token; a decode
    step stores the previous token's KV slot and emits the next one.
    """

    __slots__ = (
        "seq_id",
        "arrival_s",
        "prompt_tokens",
        "output_tokens",
        "max_tokens",
        "num_generated",
        "num_kv_tokens",
        "num_preemptions",
        "num_recomputed_tokens",
        "boundary_s",
        "admitted_s",
        "prefill_s",
        "first_token_s",
        "finish_s",
    )

    def __init__(self, seq_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int, max_tokens: int):
        self.seq_id = seq_id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.max_tokens = max_tokens
        self.num_generated = 0
        self.num_kv_tokens = 0
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0
        self.boundary_s = -1.0  #: first step boundary at or after arrival (scheduling delay ends)
        self.admitted_s = -1.0  #: start of the step that first prefilled it
        self.prefill_s = 0.0  #: compute time of its first prefill
        self.first_token_s = -1.0
        self.finish_s = -1.0

    @property
    def final_kv_tokens(self) -> int:
        # the last emitted token is never fed back, so its KV is never stored
        return self.prompt_tokens + self.output_tokens - 1

    @property
    def context_tokens(self) -> int:
        """Tokens a (re-)prefill must process: the prompt plus everything generated so far."""
        return self.prompt_tokens + self.num_generated

    def shape(self) -> SeqShape:
        return SeqShape(self.context_tokens, self.max_tokens, self.final_kv_tokens)
