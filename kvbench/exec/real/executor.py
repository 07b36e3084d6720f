"""The ``real`` executor: runs each step plan on a model, with the KV cache placed by the allocator.

Per step, in this order (each part timed, so the step table splits measured time as the sim does):

1. swap-outs: the victims' blocks, as their block tables were when this executor last saw them
   (the allocator has freed them already, but nothing has written since), go to host memory;
2. swap-ins: back into the blocks the allocator gave them now;
3. the plan's copies (copy-on-write of a shared last block, a contiguous fork's copy): before any
   write of this step, since the writer writes into the copy;
4. prefill chunks, one forward each, over their context read back from the cache (a recomputed
   sequence is prefilled again over the tokens it already had);
5. one batched decode forward, attention through the kernel plugin;
6. forks: a branch takes its root's tokens (and, for an allocator that does not share blocks,
   its root's KV, computed in step 4), and samples with the root;
7. greedy sampling (argmax) for every decode and every sequence in ``plan.samples``.

The step's time is measured (``time.perf_counter`` on a CPU; CUDA events on a GPU) and the
cost model's price of the same plan is kept beside it (``StepResult.predicted_s``); which device
measured it is ``measured_on`` (:mod:`.device`), which the run's summary records. The engine must
take steps one by one (``event_driven=false``): each step's tokens depend on the last.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from kvbench.core.sequence import Status
from kvbench.core.step import Mechanism, StepPlan, StepResult
from kvbench.errors import ConfigError
from kvbench.exec.real.cache import KVCache
from kvbench.exec.real.device import measured_on
from kvbench.exec.real.model import LlamaRunner
from kvbench.exec.sim import SimExecutor


def prompt_token_ids(seed: int, request_id: int, num_tokens: int, vocab_size: int) -> list[int]:
    """A request's prompt, drawn from the run's seed and its id (the same in every run of the seed)."""
    return np.random.default_rng([seed, request_id]).integers(0, vocab_size, size=num_tokens).tolist()


class _Clock:
    """Elapsed seconds between marks: CUDA events on a GPU (no host sync per mark), else perf_counter."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals_s(self) -> list[float]:
        if self.cuda:
            self.marks[-1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


class RealExecutor:
    """Executes step plans on ``model`` (a ``LlamaForCausalLM``); see the module docstring.

    ``tokens[seq_id]`` is each sequence's token ids (prompt, then generated), kept across
    preemptions so that a recompute prefills the same tokens again.
    """

    def __init__(self, model, allocator, kernel, cost, *, seed: int, requests) -> None:
        cfg = model.config
        device = next(model.parameters()).device
        if allocator.capabilities.caches_prefixes:
            raise ConfigError(
                "mode=real does not support allocator.prefix_caching=true yet: prompts are drawn "
                "per request, so cached prefixes would not hold the same tokens; turn it off"
            )
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        block = allocator.block_size_tokens
        capacity_blocks = -(-allocator.budget_bytes // (allocator.kv_bytes_per_token * block))
        dtype = next(model.parameters()).dtype
        self.cache = KVCache(
            cfg.num_hidden_layers,
            block,
            cfg.num_key_value_heads,
            head_dim,
            capacity_blocks,
            dtype,
            device,
        )
        self.runner = LlamaRunner(model, self.cache, kernel)
        self.allocator = allocator
        self.sim = SimExecutor(cost)
        self.device = device
        #: the summary's ``measured_on``: what ``kvbench calibrate`` checks before fitting these times
        self.measured_on = measured_on(device)
        self.shares_blocks = allocator.capabilities.shares_blocks
        self.tokens: dict[int, list[int]] = {}
        self._prompt_len: dict[int, int] = {}
        self.prompt_ids: dict[int, list[int]] = {}
        for r in requests:
            self.prompt_ids[r.request_id] = prompt_token_ids(seed, r.request_id, r.prompt_tokens, cfg.vocab_size)
        #: seq_id -> block table when last computed (a swap-out's source: the allocator has forgotten it)
        self._tables: dict[int, list[int]] = {}
        self._swapped: dict[int, object] = {}  # seq_id -> the Sequence, while its KV is in host memory
        #: per step: (predicted_s, measured_s)
        self.step_times_s: list[tuple[float, float]] = []

    def generated(self, seq_id: int) -> list[int]:
        """The token ids ``seq_id`` generated (after its prompt); [] if it never ran."""
        ids = self.tokens.get(seq_id, [])
        prompt = self._prompt_len.get(seq_id, len(ids))
        return ids[prompt:]

    def _tokens(self, seq) -> list[int]:
        ids = self.tokens.get(seq.seq_id)
        if ids is None:
            ids = self.tokens[seq.seq_id] = list(self.prompt_ids[seq.group.request_id])
            self._prompt_len[seq.seq_id] = len(ids)
        return ids

    def _table(self, seq) -> list[int]:
        table = self._tables[seq.seq_id] = self.allocator.block_table(seq.seq_id)
        if table:
            self.cache.ensure(max(table))
        return table

    def execute(self, plan: StepPlan) -> StepResult:
        if plan.num_steps != 1:
            raise RuntimeError("mode=real takes steps one by one: run the engine with event_driven=false")
        if plan.has_beam_search:
            raise ConfigError(
                "mode=real does not run beam search yet (workload.fan_out=beam): its beams are drawn, not scored"
            )
        predicted = self.sim.execute(plan)
        clock = _Clock(self.device)
        clock.mark()
        for preemption in plan.preemptions:
            for seq in preemption.group.seqs:
                table = self._tables.pop(seq.seq_id, None)
                if preemption.mechanism == Mechanism.SWAP and seq.status is Status.SWAPPED and table is not None:
                    self.cache.swap_out(seq.seq_id, table)
                    self._swapped[seq.seq_id] = seq
        if plan.swap_in:
            # the scheduler marks the sequences it swapped back in as running again
            for seq in [s for s in self._swapped.values() if s.status is Status.RUNNING]:
                del self._swapped[seq.seq_id]
                self.cache.swap_in(seq.seq_id, self._table(seq))
        clock.mark()  # swaps done
        for copy in plan.copies:
            self.cache.copy_blocks(copy.src_block_id, copy.dst_block_id, copy.num_blocks)
        clock.mark()  # copies done
        logits: dict[int, torch.Tensor] = {}
        for chunk in plan.prefills:
            ids = self._tokens(chunk.seq)
            start = chunk.num_context_tokens
            logits[chunk.seq.seq_id] = self.runner.prefill(
                ids[start : start + chunk.num_new_tokens], start, self._table(chunk.seq)
            )
            clock.mark()  # one mark per chunk
        if plan.decodes:
            contexts = [seq.num_computed_tokens - 1 for seq in plan.decodes]
            ids = [self._tokens(seq)[c] for seq, c in zip(plan.decodes, contexts)]
            out = self.runner.decode(ids, contexts, [self._table(seq) for seq in plan.decodes])
            for seq, row in zip(plan.decodes, out):
                logits[seq.seq_id] = row
        for parent, child in plan.forks:
            self.tokens[child.seq_id] = list(self._tokens(parent)[: child.num_computed_tokens])
            self._prompt_len[child.seq_id] = child.prompt_tokens
            child_table = self._table(child)
            if not self.shares_blocks:
                self.cache.copy_positions(self._tables[parent.seq_id], child_table, child.num_computed_tokens)
            logits.setdefault(child.seq_id, logits.get(parent.seq_id))
        for seq in [*plan.decodes, *plan.samples]:
            ids = self._tokens(seq)
            if len(ids) != seq.num_tokens:
                raise RuntimeError(f"sequence {seq.seq_id} has {len(ids)} token ids for {seq.num_tokens} tokens")
            ids.append(int(torch.argmax(logits[seq.seq_id])))
        clock.mark()  # decode, forks, sampling done
        intervals = clock.intervals_s()
        swap_s, copy_s, chunk_times_s, decode_s = (
            intervals[0],
            intervals[1],
            tuple(intervals[2:-1]),
            intervals[-1],
        )
        prefill_s = sum(chunk_times_s, 0.0)
        recompute_s = sum(
            (t * c.num_recomputed_tokens / c.num_new_tokens for t, c in zip(chunk_times_s, plan.prefills)),
            0.0,
        )
        measured_s = swap_s + copy_s + prefill_s + decode_s
        predicted_s = float(predicted.durations_s[0])
        self.step_times_s.append((predicted_s, measured_s))
        return StepResult(
            plan.start_s,
            (measured_s,),
            plan.start_s + measured_s,
            prefill_s,
            chunk_times_s,
            decode_s,
            swap_s,
            copy_s,
            recompute_s,
            predicted_s=predicted_s,
        )
