"""Where a silicon row's measured TPOT sits among the step prices a closed-loop client allows.

A closed-loop client of ``b`` requests, each of ``isl`` prompt and ``osl`` output tokens, runs
between two extremes, both priced on the row's own profiled clock (the engine's measured kernel
tables, :func:`kvbench.validation.silicon.replay`):

* **lock-step**: every request of a wave arrives together, is prefilled together and decodes
  together, so no prompt is ever computed while a request of the wave is decoding. Its TPOT is the
  pure decode step of ``b`` sequences at their mean context ``isl + osl / 2``: ``decode_ms``.
  No schedule gives a smaller TPOT: every request's tokens after its first come from decode steps
  of at least its own batch (a row whose measured TPOT is below this is the measurement's, not a
  price kvbench can reach: another definition of TPOT, a prefix cache, or a smaller batch than
  recorded);
* **desynchronised**: arrivals are spread evenly over a request's life, the steady state of a
  long closed loop, so every decode step also computes its share of the prompts that arrive
  meanwhile: ``b x isl / osl`` prompt tokens a step (a chunked-prefill engine mixes them into
  the decode steps). Its step is ``mixed_ms``.

A measured TPOT between the two says how synchronised the client kept its requests (a short
benchmark of a few waves stays near lock-step, a long one drifts towards the steady state); one
above ``mixed_ms`` is a step kvbench under-prices (a kernel, a collective or host work per step).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.errors import ConfigError

#: a row's position against the two bounds (:func:`classify`)
BELOW, BETWEEN, ABOVE = "below lock-step", "between", "above steady state"


@dataclass(frozen=True)
class StepBounds:
    """One row's two step prices, in milliseconds."""

    decode_ms: float  #: lock-step: a pure decode step of the batch at its mean context
    mixed_ms: float  #: steady state: the same step with its share of the prompts arriving meanwhile
    prompt_tokens_per_step: int  #: that share, ``batch x isl / osl`` (at most the step's token budget)


def step_bounds(row, cost, max_num_batched_tokens: int) -> StepBounds:
    """The two bounds of one aggregated row on ``cost`` (the row's profiled cost model, from
    ``kvbench.api.build(silicon.replay(row, "profiled").overrides).cost``). ``batch_size`` is per
    attention-DP rank, as the replay's engine runs it."""
    if row["mode"] != "agg":
        raise ConfigError(f"silicon row {row['id']}: step bounds are for aggregated rows (mode=agg)")
    batch, isl, osl = int(row["batch_size"]), int(row["isl"]), int(row["osl"])
    context_tokens = isl + osl // 2
    kv_read_tokens = batch * context_tokens
    _, decode_s = cost.step_times_s([], batch, kv_read_tokens)
    # the prompt tokens a step computes in the steady state, capped by what one step may batch
    prompt_tokens = min(max_num_batched_tokens - batch, round(batch * isl / max(osl - 1, 1)))
    chunks = [(prompt_tokens, isl // 2)] if prompt_tokens > 0 else []
    chunk_times_s, mixed_decode_s = cost.step_times_s(chunks, batch, kv_read_tokens)
    return StepBounds(decode_s * 1e3, (sum(chunk_times_s) + mixed_decode_s) * 1e3, max(prompt_tokens, 0))


def classify(measured_ms: float, bounds: StepBounds) -> str:
    """:data:`BELOW`, :data:`BETWEEN` or :data:`ABOVE`: where ``measured_ms`` lies."""
    if measured_ms < bounds.decode_ms:
        return BELOW
    if measured_ms <= bounds.mixed_ms:
        return BETWEEN
    return ABOVE
