"""Roles: a scheduler as one worker of a disaggregated deployment (:mod:`kvbench.deploy.worker`).

With no role (``role is None``, the default) nothing here runs and the scheduler is the aggregated
engine's. A worker sets one with :meth:`RolesMixin.set_role`:

- ``prefill``: a request computes its prompt and samples one token (its prefill-side request has
  one output token), then finishes; its KV is *held*, not freed, until the transfer to the decode
  side has ended (:meth:`RolesMixin.release_kv`). Held blocks still hold tokens (the ledger's
  ``token_bytes``) and are no victim: a finished request is not running.
- ``decode``: a request arrives *prefilled*, its prompt computed elsewhere
  (:meth:`RolesMixin.expect_kv`). Its admission is the normal one (the queue's order, the
  sequence cap, the watermark) but computes nothing: it reserves the prompt's slots
  (:meth:`RolesMixin._reserve_for_kv`), which the ledger counts as ``reserved_future_bytes``
  until the KV lands. The request takes no part in steps (it is not in ``running``, so no victim
  either) until the first step boundary at or after its landing (:meth:`RolesMixin.set_landing`).
  It then runs with its prompt computed but its last position, which its first step computes
  again for the logits that sample output token 1, as a prefix-cache hit does (vLLM's decode side
  recomputes at least the last prompt token of a remote prefill); the landed positions count as
  ``cached_prompt_tokens`` (served, not computed, on this worker). From there on it is an ordinary
  running request: it decodes, may be preempted (a recompute then recomputes its prompt here) and
  finishes.
"""

from __future__ import annotations

from kvbench.core.sequence import SequenceGroup, Status
from kvbench.core.step import AdmissionRefusal, StepPlan

ROLES = ("prefill", "decode")


class RolesMixin:
    """The :class:`~kvbench.sched.scheduler.Scheduler`'s part as a prefill or decode worker. The
    class attributes are the no-role defaults (empty and immutable); :meth:`set_role` gives the
    instance its own state."""

    role: str | None = None
    #: decode: ids of pushed requests whose prompt was computed elsewhere, not admitted yet
    _prefilled: frozenset | set = frozenset()
    #: decode: admitted requests whose KV has not landed (their slots reserved), in admission order
    _reserved: dict = {}  # noqa: RUF012 (never written: set_role replaces it per instance)
    #: decode: the token bytes of each reserved request, shown as reserved future in the ledger
    _in_flight_bytes: dict = {}  # noqa: RUF012
    #: decode: when each reserved request's KV lands (known once its transfer is scheduled)
    _landing_s: dict = {}  # noqa: RUF012

    def set_role(self, role: str) -> None:
        """Make this scheduler a ``prefill`` or ``decode`` worker's (before its first step)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        if self.holds_finished:
            raise ValueError(
                f"scheduler {self.name!r} batches whole requests (it holds finished ones): it cannot be a {role} worker"
            )
        self.role = role
        self._prefilled, self._reserved, self._in_flight_bytes, self._landing_s = set(), {}, {}, {}
        #: prefill: request id -> (sequence id, KV bytes) of the finished requests whose KV is held
        self.held_kv: dict[int, tuple[int, int]] = {}
        #: what happened since the worker last took it: decode: (request id, reserved at); prefill:
        #: (finished group, its KV bytes)
        self.admitted_kv: list[tuple[int, float]] = []
        self.prefilled: list[tuple[SequenceGroup, int]] = []

    # --- prefill ---------------------------------------------------------------------------------

    def _hold_for_transfer(self, group: SequenceGroup) -> None:
        """A prefill worker's request has computed its prompt: its blocks stay until the transfer ends."""
        (seq,) = group.seqs
        kv_bytes = self.allocator.footprint([seq.seq_id]).transfer.num_bytes
        self.held_kv[group.request_id] = (seq.seq_id, kv_bytes)
        self.prefilled.append((group, kv_bytes))

    def release_kv(self, request_id: int) -> None:
        """The transfer of a held request's KV has ended: its blocks are freed."""
        seq_id, _ = self.held_kv.pop(request_id)
        self.allocator.free(seq_id)

    # --- decode ----------------------------------------------------------------------------------

    def expect_kv(self, request_id: int) -> None:
        """A pushed request's prompt was computed elsewhere: its admission reserves, not computes."""
        self._prefilled.add(request_id)

    def set_landing(self, request_id: int, at_s: float) -> None:
        """A reserved request's KV lands at ``at_s``: it runs from the first step boundary at or after."""
        if request_id not in self._reserved:
            raise ValueError(f"request {request_id} has no blocks reserved on this worker: it cannot land")
        self._landing_s[request_id] = at_s

    def next_landing_s(self) -> float | None:
        """The earliest landing scheduled and not yet taken (None: none)."""
        return min(self._landing_s.values()) if self._landing_s else None

    def num_awaiting_kv(self) -> int:
        """Requests admitted whose KV has not landed yet."""
        return len(self._reserved)

    def _reserve_for_kv(self, plan: StepPlan, group: SequenceGroup) -> bool:
        """Admit a prefilled request: reserve its prompt's slots (refused, changing nothing,
        rather than preempting anyone, keeping the watermark free unless nothing runs)."""
        (seq,) = group.seqs
        headroom = self.watermark_bytes if self.num_running_seqs else 0
        shape = group.shape(seq.prompt_tokens)
        alloc = self.allocator
        before = alloc.ledger().token_bytes
        if alloc.allocate(seq.seq_id, shape, headroom) is None:
            plan.refusal = AdmissionRefusal(
                group,
                alloc.refusal_reason(shape, headroom),
                alloc.reservation_tokens(shape) * alloc.kv_bytes_per_token,
                alloc.ledger().free_bytes,
                alloc.largest_hole_bytes(),
            )
            return False
        alloc.drain_copies()  # (a fresh sequence copies nothing; kept for symmetry with admission)
        self._in_flight_bytes[group.request_id] = alloc.ledger().token_bytes - before
        self._prefilled.discard(group.request_id)
        seq.status = Status.RUNNING
        seq.num_computed_tokens = seq.prompt_tokens
        group.status = Status.RUNNING
        group.admitted_s = plan.start_s
        plan.num_admitted += 1
        self._reserved[group.request_id] = group
        self.num_running_seqs += 1
        self.admitted_kv.append((group.request_id, plan.start_s))
        return True

    def _land_due(self, clock_s: float) -> None:
        """Reserved requests whose KV has landed by ``clock_s`` join the running ones: their last
        prompt position is computed again by their first step (see the module docstring)."""
        for request_id in [r for r, at_s in self._landing_s.items() if at_s <= clock_s]:
            del self._landing_s[request_id]
            del self._in_flight_bytes[request_id]
            group = self._reserved.pop(request_id)
            (seq,) = group.seqs
            landed = seq.prompt_tokens - 1
            self.allocator.truncate(seq.seq_id, landed)
            seq.num_computed_tokens = landed
            group.cached_prompt_tokens = landed
            self.running.append(group)

    def _ledger_in_flight(self, ledger):
        """The ledger with the reserved requests' slots as reserved future: they hold no token yet."""
        moved = sum(self._in_flight_bytes.values())
        if not moved:
            return ledger
        return type(ledger)(
            ledger.budget_bytes,
            ledger.token_bytes - moved,
            ledger.reserved_future_bytes + moved,
            ledger.internal_bytes,
            ledger.external_bytes,
            ledger.free_bytes,
            ledger.cached_bytes,
            ledger.group_bytes,
            ledger.state_bytes,
        )

    def _span_ledgers_in_flight(self, spans: dict) -> dict:
        """A projected run's ledgers, as :meth:`_ledger_in_flight` (nothing lands during a run)."""
        moved = sum(self._in_flight_bytes.values())
        if not moved:
            return spans
        spans = dict(spans)
        token, future = spans["token_bytes"], spans["reserved_future_bytes"]
        if isinstance(token, list):
            spans["token_bytes"] = [value - moved for value in token]
            spans["reserved_future_bytes"] = [value + moved for value in future]
        else:
            spans["token_bytes"] = token - moved
            spans["reserved_future_bytes"] = future + moved
        return spans
