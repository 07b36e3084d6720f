"""kvbench against another engine's own scheduler, decision by decision (``kvbench diff-engine``).

Both sides get the same requests (a kvbench workload's rows, each a prompt of unique token ids
unless the workload shares prefixes) and the same caps, taken from the kvbench config: the block
count the engine would carve from the same KV budget, the block size, ``max_num_seqs``,
``max_num_batched_tokens``, chunking, the long-prefill cap, prefix caching and the queue policy.
Every step lasts ``step_s`` on both sides (the check compares decisions, not timings), so an
arrival joins both at the same step boundary. kvbench runs step by step (``event_driven=False``)
and records what each step computed for each request; the peer's module records the same from its
own scheduler (:mod:`kvbench.validation.peers`). The comparison is exact: the set of
(request, tokens) of every step, every preemption, and every request's finish step, and the first
step where they differ, with both sides' decisions.
"""

from __future__ import annotations

import importlib
import inspect
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from omegaconf import DictConfig

from kvbench.api import RunSetup, build
from kvbench.app.checks import MEMORY_BASE_BYTES, refuse_beyond_memory
from kvbench.app.progress import progress_bar
from kvbench.core.request import Request, requests_from_workload
from kvbench.core.step import StepPlan, StepResult
from kvbench.engine import Engine
from kvbench.errors import ConfigError
from kvbench.validation.peers.types import PeerCaps, PeerRequest, PeerStep, PeerTrace

#: peer name -> its module (each exposes VERSION, unavailable_reason() and run(requests, caps, **options))
PEERS = {
    "vllm_v1": "kvbench.validation.peers.vllm_v1",
    "nano_vllm": "kvbench.validation.peers.nano_vllm",
}
#: the step length both sides run on (any positive value: arrivals are what it spaces)
DEFAULT_STEP_S = 0.01
#: token ids of a request's own prompt positions start here; shared prefixes' ids stay below it
_OWN_TOKEN_BASE = 1 << 40


def peer_module(name: str):
    if name not in PEERS:
        raise ConfigError(f"--peer={name!r} is not a peer kvbench can drive; choose one of: {', '.join(PEERS)}")
    return importlib.import_module(PEERS[name])


class FixedStepClock:
    """An executor whose every step lasts ``step_s``, as the peer drivers' clock does (the clock
    advances by the same float addition on both sides, so arrivals join at identical boundaries)."""

    def __init__(self, step_s: float, block_bytes: int) -> None:
        self.step_s = step_s
        self.block_bytes = block_bytes  # blocks in use = the ledger's allocated bytes / this
        self.steps: list[PeerStep] = []
        self.blocks_used: list[int] = []
        self.end_s: list[float] = []

    def execute(self, plan: StepPlan) -> StepResult:
        scheduled: dict[int, int] = defaultdict(int)
        for chunk in plan.prefills:
            scheduled[chunk.seq.group.request_id] += chunk.num_new_tokens
        for seq in plan.decodes:
            scheduled[seq.group.request_id] += 1
        preempted = [p.group.request_id for p in plan.preemptions]
        self.steps.append(PeerStep(dict(scheduled), preempted, []))
        if plan.ledger is not None:
            self.blocks_used.append(plan.ledger.allocated_bytes // self.block_bytes)
        end_s = plan.start_s + self.step_s
        self.end_s.append(end_s)
        return StepResult(plan.start_s, (self.step_s,), end_s, chunk_times_s=(0.0,) * len(plan.prefills))


@dataclass
class Setup:
    """One config's requests and caps, in both sides' terms."""

    requests: list[Request]
    peer_requests: list[PeerRequest]
    caps: PeerCaps
    #: kvbench's side, built once (a trace source has read its file) and not run yet
    run: RunSetup
    engine_label: str


@dataclass(frozen=True)
class CheckMemory:
    """What a differential check against one peer holds: a process's start (the peer's imports
    included) and bytes per token of its requests. Both sides keep every prompt's token ids (the
    peer's own sequences again) and every step's decisions, so its memory grows with tokens, not
    with requests as a run's does."""

    base_bytes: int
    prompt_token_bytes: int
    output_token_bytes: int


#: by peer: fitted by benchmarks/diff_engine_memory.py on 12 points of 2,000 to 12,000 requests
#: (benchmarks/results/diff_engine_memory-<peer>.md), every point predicted within 5.9 % (nano-vllm)
#: and 3.8 % (vLLM) by the fit made without it, each term rounded up by about a quarter: nano-vllm
#: 124 MB + 68 B a prompt token + 101 B an output token (the base taken as a run's,
#: :data:`kvbench.app.checks.MEMORY_BASE_BYTES`); vLLM 675 MB (its imports) + 81 B + 103 B
CHECK_MEMORY = {
    "nano_vllm": CheckMemory(MEMORY_BASE_BYTES, 86, 126),
    "vllm_v1": CheckMemory(850_000_000, 102, 129),
}


def check_memory(prompt_tokens: int, output_tokens: int, num_requests: int, peer: str | None = None) -> None:
    """Refuse, in one line, a check whose requests would not fit in this machine's memory (as the
    run's own check does: ``kvbench/app/checks.py``): 1,000,000 lecture requests (512 + 128 tokens)
    need about 60 GB against nano-vllm, 69 GB against vLLM. ``peer`` None: the larger need."""
    estimates = []
    for name, m in CHECK_MEMORY.items():
        if peer is None or name == peer:
            bytes_ = m.base_bytes + prompt_tokens * m.prompt_token_bytes + output_tokens * m.output_token_bytes
            estimates.append((bytes_, m))
    estimate, m = max(estimates, key=lambda pair: pair[0])
    words = (
        f"{m.base_bytes / 1e6:,.0f} MB + {prompt_tokens:,} prompt tokens x {m.prompt_token_bytes} B "
        f"+ {output_tokens:,} output tokens x {m.output_token_bytes} B: both sides keep every token "
        "and every step's decisions; measured"
    )
    refuse_beyond_memory(estimate, f"the differential check of {num_requests:,} requests", words)


def prepare(cfg: DictConfig, step_s: float = DEFAULT_STEP_S, peer: str | None = None) -> Setup:
    """What both sides run for the composed config ``cfg``: refuses (one line) what a peer cannot
    express (a non-paged allocator, fan-outs, a closed loop, a queue the peers lack) and a check
    that would not fit in memory against ``peer`` (None: against either)."""
    s = build(cfg)
    alloc, sched = s.allocator, s.scheduler.config
    if alloc.name != "paged":
        raise ConfigError(
            f"allocator={alloc.name!r}: the engines compared page their cache in blocks; use allocator=paged "
            "(block_size_tokens as the engine: vLLM 16, nano-vllm 256)"
        )
    workload = s.workload_source.generate(np.random.default_rng(int(cfg.seed)))
    if cfg.get("check_memory", True):  # before either side holds a request: one line, not a machine out of memory
        check_memory(
            int(workload.prompt_tokens.sum()), int(workload.output_tokens.sum()), len(workload.prompt_tokens), peer
        )
    requests = requests_from_workload(workload, int(cfg.seed))
    if workload.max_concurrency is not None:
        raise ConfigError("workload.arrival=closed_loop: the peers are driven open loop; use another arrival")
    for r in requests:
        if r.num_branches > 1:
            raise ConfigError(
                f"request {r.request_id} has {r.num_branches} branches: the differential check drives one "
                "sequence per request; use workload.num_branches=1"
            )
    block_bytes = alloc.block_size_tokens * alloc.kv_bytes_per_token
    # the engine carves its blocks from the whole budget; kvbench's null block came out of it already
    num_blocks = (s.budget_bytes // block_bytes) + (1 if s.engine.null_block else 0)
    queue = sched.queue
    if queue not in ("fcfs", "priority"):
        raise ConfigError(f"scheduler.queue={queue!r}: the peers schedule fcfs or priority; pick one of them")
    caps = PeerCaps(
        num_blocks=num_blocks,
        block_size_tokens=alloc.block_size_tokens,
        max_num_seqs=sched.max_num_seqs,
        max_num_batched_tokens=sched.max_num_batched_tokens,
        chunked_prefill=s.scheduler.name == "chunked" or bool(sched.head_only_chunking),
        long_prefill_token_threshold=sched.long_prefill_token_threshold,
        prefix_caching=bool(alloc.capabilities.caches_prefixes),
        policy=queue,
        # the peers count a watermark in blocks; kvbench's in bytes (watermark_in_blocks=false)
        # is passed as the same fraction, and any difference shows as a divergence
        watermark_fraction=0.0 if alloc.capabilities.reserves_future else sched.watermark_fraction,
        step_s=step_s,
    )
    label = s.engine.name + (f" {s.engine.version}" if s.engine.version else "")
    return Setup(requests, peer_requests(requests), caps, s, label)


def peer_requests(requests: list[Request]) -> list[PeerRequest]:
    """The requests with token ids: equal exactly where the workload's prefix hashes are equal
    (each distinct hash gets its own ids, one per position in its granule), the request's own
    everywhere else (ids from ``_OWN_TOKEN_BASE`` up, never equal to a shared one)."""
    index_of: dict[int, int] = {}
    out = []
    for r in requests:
        granule, hashes = r.hash_block_tokens, r.prefix_hashes
        ids = []
        for position in range(r.prompt_tokens):
            g = position // granule if granule else len(hashes)
            if g < len(hashes):
                index = index_of.setdefault(hashes[g], len(index_of))
                ids.append(index * granule + position % granule)
            else:  # unique to the request: its first own token already differs from everyone's
                ids.append(_OWN_TOKEN_BASE + r.request_id * 7 + position % 7)
        out.append(PeerRequest(r.request_id, r.prompt_tokens, r.max_output_tokens, r.arrival_s, tuple(ids), r.priority))
    return out


def run_kvbench(setup: Setup, on_finished: Callable[[int], None] = lambda n: None) -> PeerTrace:
    """kvbench's own decisions on the same clock, step by step (``on_finished(n)``: progress)."""
    s = setup.run
    clock = FixedStepClock(setup.caps.step_s, s.allocator.block_size_tokens * s.allocator.kv_bytes_per_token)
    engine = Engine(s.scheduler, clock, event_driven=False, on_finished=on_finished)
    record = engine.run(setup.requests)
    step_of_end = {end_s: i for i, end_s in enumerate(clock.end_s)}
    for request_id, finish_s in zip(record.requests["request_id"].tolist(), record.requests["finish_s"].tolist()):
        clock.steps[step_of_end[finish_s]].finished.append(int(request_id))
    return PeerTrace(f"kvbench ({setup.engine_label})", clock.steps, clock.blocks_used)


@dataclass
class Divergence:
    step: int
    kvbench: PeerStep
    peer: PeerStep


@dataclass
class Comparison:
    kvbench: PeerTrace
    peer: PeerTrace
    #: the first step whose scheduled tokens, preemptions or finishes differ (None: identical)
    first_divergence: Divergence | None
    num_identical_steps: int
    num_identical_finish_steps: int
    num_requests: int
    per_side: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        return self.first_divergence is None


def _same(a: PeerStep, b: PeerStep) -> bool:
    return (
        a.scheduled == b.scheduled
        and sorted(a.preempted) == sorted(b.preempted)
        and sorted(a.finished) == sorted(b.finished)
    )


def compare(kv: PeerTrace, peer: PeerTrace, num_requests: int) -> Comparison:
    first = None
    identical = 0
    for i in range(max(len(kv.steps), len(peer.steps))):
        a = kv.steps[i] if i < len(kv.steps) else PeerStep({})
        b = peer.steps[i] if i < len(peer.steps) else PeerStep({})
        if _same(a, b):
            identical += 1
        elif first is None:
            first = Divergence(i, a, b)
    kv_finish, peer_finish = kv.finish_steps(), peer.finish_steps()
    same_finish = sum(1 for rid, step in kv_finish.items() if peer_finish.get(rid) == step)
    per_side = {
        side.engine: {
            "steps": len(side.steps),
            "preemptions": side.num_preemptions(),
            "peak_blocks": max(side.blocks_used, default=0),
            "finished": len(side.finish_steps()),
        }
        for side in (kv, peer)
    }
    return Comparison(kv, peer, first, identical, same_finish, num_requests, per_side)


def run_differential(
    cfg: DictConfig, peer: str, step_s: float = DEFAULT_STEP_S, peer_options: dict | None = None, progress: bool = False
) -> Comparison:
    """Drive kvbench and ``peer`` over the composed config's requests and caps and compare; with
    ``progress``, each side's finished requests on stderr (a bar, or a line every 10 s in a log).
    ``peer_options``: keywords the peer's module takes (nano_vllm: ``nano_vllm_path``,
    ``allow_any_block_size``); its ``unavailable_reason`` gets those it names."""
    module = peer_module(peer)
    options = dict(peer_options or {})
    where = {k: v for k, v in options.items() if k in inspect.signature(module.unavailable_reason).parameters}
    setup = prepare(cfg, step_s, peer)  # what no peer can run is said first, installed or not
    reason = module.unavailable_reason(**where)
    if reason:
        raise ConfigError(f"--peer={peer}: {reason}")
    n = len(setup.requests)
    with progress_bar(n, "kvbench's side", enabled=progress, unit="requests") as advance:
        kv = run_kvbench(setup, advance)
    try:
        with progress_bar(n, f"{peer}'s own scheduler", enabled=progress, unit="requests") as advance:
            other = module.run(setup.peer_requests, setup.caps, on_finished=advance, **options)
    except ValueError as exc:  # a cap the peer cannot honour, said by its driver
        raise ConfigError(f"--peer={peer}: {exc}") from None
    except RuntimeError as exc:  # the peer could not finish this config (it stalled, or hit max_steps)
        raise ConfigError(f"--peer={peer} could not run this config: {exc}") from None
    return compare(kv, other, len(setup.requests))


def describe(step: PeerStep) -> str:
    """One side's decisions at a step, in one line."""
    scheduled = ", ".join(f"{rid}:{n}" for rid, n in sorted(step.scheduled.items()))
    parts = [f"scheduled {{{scheduled}}}"]
    if step.preempted:
        parts.append(f"preempted {sorted(step.preempted)}")
    if step.finished:
        parts.append(f"finished {sorted(step.finished)}")
    return "; ".join(parts)


def difference(d: Divergence) -> str:
    """What differs at the divergent step, request by request (only the requests that differ)."""
    a, b = d.kvbench.scheduled, d.peer.scheduled
    rows = [
        f"request {rid}: kvbench {a.get(rid, 0)}, peer {b.get(rid, 0)}"
        for rid in sorted(set(a) | set(b))
        if a.get(rid) != b.get(rid)
    ]
    if sorted(d.kvbench.preempted) != sorted(d.peer.preempted):
        rows.append(f"preempted: kvbench {sorted(d.kvbench.preempted)}, peer {sorted(d.peer.preempted)}")
    if sorted(d.kvbench.finished) != sorted(d.peer.finished):
        rows.append(f"finished: kvbench {sorted(d.kvbench.finished)}, peer {sorted(d.peer.finished)}")
    return "\n".join(rows)
