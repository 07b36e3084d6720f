"""nano-vllm's own scheduler, driven step by step, loaded from an installed or checked-out nano-vllm.

nano-vllm is not a PyPI package: its README installs it from its repository, and so does kvbench
(``pip install --no-deps git+https://github.com/GeeeekExplorer/nano-vllm.git`` and ``pip install
xxhash``: the scheduler needs only xxhash and numpy, not the torch, flash-attn and transformers its
metadata asks for), or takes a checkout's folder (``kvbench diff-engine --nano-vllm-path DIR``).
Checked against upstream commit ``bb823b3`` (version 0.2.0).

Upstream's ``nanovllm/__init__.py`` imports its LLM class and with it torch and flash-attn, and its
``nanovllm/config.py`` imports transformers and needs a model folder; the scheduler needs neither.
So kvbench loads only the four modules the scheduler is made of (``engine/scheduler.py``,
``engine/block_manager.py``, ``engine/sequence.py``, ``sampling_params.py``), from the files of the
package that ``importlib.util.find_spec("nanovllm")`` locates (which runs none of its code) or of
the given checkout, under empty parent modules that kvbench makes (``nanovllm``,
``nanovllm.engine``) and a ``nanovllm.config`` of kvbench's own holding :class:`SchedulerConfig`.
Those names are in ``sys.modules`` only while the four modules import; whatever was there before
is put back, so a real ``import nanovllm`` afterwards is unaffected.

No model runs: a fake model returns one token for every scheduled sequence, as nano-vllm's
ModelRunner.run does (one sampled token per sequence, a partial prefill chunk included), and
nano-vllm's own ``Scheduler.postprocess`` drops the token of a chunk that leaves the prompt
unfinished. Each step lasts ``caps.step_s`` on the same clock as kvbench's engine.

What nano-vllm does differently from vLLM (kept, not corrected: the point is to record nano-vllm):
a step is all prefill or all decode, and a step with any prefill has no decodes; ``max_num_seqs``
caps each step's batch, not the running set; only the first sequence of a step may be a partial
prefill chunk; a block is hashed for the prefix cache after the step that fills it, so two
requests admitted in the same step never share blocks.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import re
import sys
import types
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kvbench.errors import clip
from kvbench.validation.peers.types import PeerCaps, PeerRequest, PeerStep, PeerTrace, check_progress, join_arrivals

#: the upstream commit this driver and its hand-worked tests were checked against, and the
#: version upstream's pyproject.toml gives there
TESTED_COMMIT = "bb823b3e06983d71485a8e1f23715ebd87d98ef8"
TESTED_VERSION = "0.2.0"
VERSION = f"{TESTED_VERSION} ({TESTED_COMMIT[:7]})"
REPOSITORY = "https://github.com/GeeeekExplorer/nano-vllm.git"
#: how to get it, in one line: its metadata pins CUDA torch and flash-attn, which the scheduler never imports
INSTALL_HINT = (
    f"pip install --no-deps git+{REPOSITORY} && pip install xxhash, or give a checkout of it with --nano-vllm-path DIR"
)

#: upstream's Config asserts this: the block size its flash-attn paged KV cache takes
_UPSTREAM_BLOCK_MULTIPLE_TOKENS = 256
#: never produced: every generated token id is negative and below it (and ignore_eos is set anyway)
_EOS_TOKEN_ID = -1
#: the scheduler's modules, under nanovllm/, in an order each one's imports are already loaded
_MODULES = ("sampling_params", "engine.sequence", "engine.block_manager", "engine.scheduler")


@dataclass(slots=True)
class SchedulerConfig:
    """What nano-vllm's ``Scheduler.__init__`` reads from its Config, with upstream's field names.

    kvbench's own, not upstream's Config (which imports transformers and needs a model folder);
    upstream's block-size assert is made by :func:`run` instead."""

    max_num_batched_tokens: int
    max_num_seqs: int
    eos: int
    kvcache_block_size: int
    num_kvcache_blocks: int


@dataclass(frozen=True)
class Upstream:
    """nano-vllm's scheduler modules, loaded from ``package_dir`` (a ``nanovllm`` folder)."""

    package_dir: Path
    #: e.g. "nano-vllm 0.2.0 (bb823b3)": the version and commit where the install records them
    label: str
    Scheduler: type
    Sequence: type
    SamplingParams: type


def unavailable_reason(nano_vllm_path: str | None = None) -> str | None:
    """None when nano-vllm's scheduler loads here (from the installed ``nanovllm`` package, or from
    the checkout ``nano_vllm_path``); else one line saying how to get it."""
    try:
        load(nano_vllm_path)
    except ImportError as exc:
        return str(exc)
    return None


def load(nano_vllm_path: str | None = None) -> Upstream:
    """nano-vllm's scheduler modules, from the installed package or the checkout
    ``nano_vllm_path`` (its root, or its ``nanovllm`` folder); ImportError, one line saying how to
    get it, when they cannot be loaded."""
    missing = [name for name in ("xxhash", "numpy") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"nano-vllm's block manager needs {' and '.join(missing)}: pip install {' '.join(missing)}")
    if nano_vllm_path is not None:
        root = Path(nano_vllm_path).expanduser()
        package_dir = root / "nanovllm" if (root / "nanovllm").is_dir() else root
        if not (package_dir / "engine" / "scheduler.py").is_file():
            raise ImportError(
                f"--nano-vllm-path {clip(repr(nano_vllm_path))}: no nanovllm/engine/scheduler.py there; give a checkout of "
                f"nano-vllm (git clone {REPOSITORY})"
            )
        return _load(package_dir.resolve(), None)
    spec = importlib.util.find_spec("nanovllm")  # locates the package, runs none of its code
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"nano-vllm is not installed: {INSTALL_HINT}")
    return _load(Path(list(spec.submodule_search_locations)[0]).resolve(), "nano-vllm")


@functools.cache
def _load(package_dir: Path, distribution: str | None) -> Upstream:
    saved = {name: module for name, module in sys.modules.items() if name.partition(".")[0] == "nanovllm"}
    for name in saved:
        del sys.modules[name]
    try:
        parents = {"nanovllm": package_dir, "nanovllm.engine": package_dir / "engine"}
        for name, folder in parents.items():
            parent = types.ModuleType(name, "made by kvbench: a parent for nano-vllm's scheduler modules")
            parent.__path__ = [str(folder)]
            sys.modules[name] = parent
        config = types.ModuleType("nanovllm.config", "kvbench's stand-in for nano-vllm's Config (SchedulerConfig)")
        config.Config = SchedulerConfig
        sys.modules["nanovllm.config"] = config
        try:
            modules = {name: importlib.import_module(f"nanovllm.{name}") for name in _MODULES}
        except Exception as exc:  # a file that does not import here: one line, not its traceback
            raise ImportError(
                f"nano-vllm's scheduler at {package_dir} does not load ({type(exc).__name__}: {exc}): {INSTALL_HINT}"
            ) from None
    finally:
        for name in [name for name in sys.modules if name.partition(".")[0] == "nanovllm"]:
            del sys.modules[name]
        sys.modules.update(saved)
    scheduler_cls = modules["engine.scheduler"].Scheduler
    if "is_prefill" not in inspect.signature(scheduler_cls.postprocess).parameters:
        raise ImportError(
            f"nano-vllm's scheduler at {package_dir} predates chunked prefill (postprocess takes no is_prefill); "
            f"kvbench drives {VERSION} or later: {INSTALL_HINT}"
        )
    return Upstream(
        package_dir,
        _label(package_dir, distribution),
        scheduler_cls,
        modules["engine.sequence"].Sequence,
        modules["sampling_params"].SamplingParams,
    )


def _label(package_dir: Path, distribution: str | None) -> str:
    """The peer's name in reports, ``nano-vllm <version> (<commit>)``: the installed distribution's
    version and the commit pip recorded for a git install (its direct_url.json), else the version in
    the pyproject.toml beside the package (a checkout), else the package's folder."""
    version, commit = None, None
    if distribution is not None:
        try:
            dist = importlib.metadata.distribution(distribution)
            version = dist.version
            commit = json.loads(dist.read_text("direct_url.json") or "{}").get("vcs_info", {}).get("commit_id")
        except (importlib.metadata.PackageNotFoundError, ValueError, AttributeError):
            pass
    pyproject = package_dir.parent / "pyproject.toml"
    if version is None and pyproject.is_file():
        found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(errors="replace"), re.MULTILINE)
        version = found.group(1) if found else None
    if version is None:
        return f"nano-vllm at {package_dir}"
    return f"nano-vllm {version}" + (f" ({commit[:7]})" if commit else "")


def run(
    requests: list[PeerRequest],
    caps: PeerCaps,
    *,
    max_steps: int = 1_000_000,
    allow_any_block_size: bool = False,
    nano_vllm_path: str | None = None,
    on_finished: Callable[[int], None] = lambda n: None,
) -> PeerTrace:
    """Feed ``requests`` to nano-vllm's scheduler on kvbench's clock and record every step.

    ``nano_vllm_path``: a checkout of nano-vllm to load the scheduler from (default: the installed
    ``nanovllm`` package); RuntimeError, saying how to get it, when neither loads.

    ``allow_any_block_size`` (``kvbench diff-engine --any-block-size``): upstream nano-vllm refuses
    a block size that is not a multiple of 256 tokens (its Config asserts it); its scheduler and
    block manager work with any size, so True runs them at ``caps.block_size_tokens`` anyway
    (decisions nano-vllm itself could not run).

    ``caps.prefix_caching`` False is honoured by turning off the block manager's hashing on this
    run's instance (no block ever gets a hash, so no lookup ever hits); nano-vllm itself always
    caches, even a preempted sequence's own blocks when it is admitted again.

    nano-vllm cannot turn chunked prefill off: ``caps.chunked_prefill`` False holds while no step
    chunks, and the step that would chunk raises ValueError. It has no
    ``long_prefill_token_threshold``: one below ``max_num_batched_tokens`` raises ValueError.
    ``caps.num_blocks`` are all usable (nano-vllm has no null block).
    """
    _check(requests, caps, allow_any_block_size)  # nano-vllm's rules, known without loading it
    try:
        upstream = load(nano_vllm_path)
    except ImportError as exc:
        raise RuntimeError(str(exc)) from None
    Scheduler, Sequence, SamplingParams = upstream.Scheduler, upstream.Sequence, upstream.SamplingParams

    config = SchedulerConfig(
        max_num_batched_tokens=caps.max_num_batched_tokens,
        max_num_seqs=caps.max_num_seqs,
        eos=_EOS_TOKEN_ID,
        kvcache_block_size=caps.block_size_tokens,
        num_kvcache_blocks=caps.num_blocks,
    )
    with _sequence_block_size(Sequence, caps.block_size_tokens):
        scheduler = Scheduler(config)
        if not caps.prefix_caching:
            scheduler.block_manager.hash_blocks = lambda seq: None
        preempted: list = []
        upstream_preempt = scheduler.preempt

        def recording_preempt(seq) -> None:
            preempted.append(seq)
            upstream_preempt(seq)

        scheduler.preempt = recording_preempt  # the instance attribute shadows the method schedule() calls

        # the Sequence objects are made before the run, so that a step only adds them
        seqs = [
            Sequence(list(r.token_ids), SamplingParams(max_tokens=r.output_tokens, ignore_eos=True)) for r in requests
        ]
        request_id_of = {seq.seq_id: r.request_id for seq, r in zip(seqs, requests)}
        # one token id per request, negative so that no prompt (vocabulary ids are >= 0) contains
        # it and distinct per request so that two requests' generated blocks never hash alike (a
        # sampling model's would not either); a constant would let a recomputed request hit blocks
        # another request generated
        generated_token_of = {seq.seq_id: _EOS_TOKEN_ID - 1 - i for i, seq in enumerate(seqs)}

        steps: list[PeerStep] = []
        blocks_used: list[int] = []
        clock_s, next_arrival, num_finished = 0.0, 0, 0
        while num_finished < len(seqs):
            check_progress("nano-vllm", len(steps), max_steps, num_finished, len(seqs))
            next_arrival, clock_s = join_arrivals(
                requests, next_arrival, clock_s, scheduler.is_finished(), lambda i: scheduler.add(seqs[i])
            )

            preempted.clear()
            batch, is_prefill = scheduler.schedule()
            if is_prefill and not caps.chunked_prefill:
                _check_no_chunk(batch, request_id_of, len(steps), caps)
            # postprocess zeroes num_scheduled_tokens: read the chunk lengths first
            scheduled = {request_id_of[seq.seq_id]: seq.num_scheduled_tokens for seq in batch}
            step_preempted = [request_id_of[seq.seq_id] for seq in preempted]
            # ModelRunner.run samples one token for every sequence of the batch
            scheduler.postprocess(batch, [generated_token_of[seq.seq_id] for seq in batch], is_prefill)
            finished = [request_id_of[seq.seq_id] for seq in batch if seq.is_finished]
            num_finished += len(finished)
            on_finished(len(finished))  # progress
            steps.append(PeerStep(scheduled=scheduled, preempted=step_preempted, finished=finished))
            blocks_used.append(caps.num_blocks - len(scheduler.block_manager.free_block_ids))
            clock_s += caps.step_s

        # ignore_eos: each request must stop at exactly output_tokens (a raise, not an assert, so
        # that python -O checks it too)
        for seq, r in zip(seqs, requests):
            if not seq.is_finished or seq.num_completion_tokens != r.output_tokens:
                raise RuntimeError(
                    f"nano-vllm: request {r.request_id} generated {seq.num_completion_tokens} tokens, {r.output_tokens} asked"
                )
    return PeerTrace(engine=upstream.label, steps=steps, blocks_used=blocks_used)


def _check(requests: list[PeerRequest], caps: PeerCaps, allow_any_block_size: bool) -> None:
    """ValueError for what nano-vllm cannot run, or caps it has no way to honour."""
    # caps.watermark_fraction: nano-vllm keeps none; a kvbench config with one shows as a divergence
    if caps.policy != "fcfs":
        raise ValueError(f"nano-vllm schedules first come, first served only: policy {caps.policy!r}")
    if caps.block_size_tokens < 1 or caps.num_blocks < 1 or caps.max_num_seqs < 1 or caps.max_num_batched_tokens < 1:
        raise ValueError(f"nano-vllm: every cap must be at least 1: {caps}")
    if caps.block_size_tokens % _UPSTREAM_BLOCK_MULTIPLE_TOKENS and not allow_any_block_size:
        raise ValueError(
            f"nano-vllm takes block sizes that are multiples of {_UPSTREAM_BLOCK_MULTIPLE_TOKENS} tokens only "
            f"(its Config asserts it), not {caps.block_size_tokens}: set allocator.block_size_tokens="
            f"{_UPSTREAM_BLOCK_MULTIPLE_TOKENS} (or a multiple of it), or add --any-block-size (from Python: "
            f"allow_any_block_size=True) to run its scheduler at {caps.block_size_tokens} anyway"
        )
    if caps.block_size_tokens == 1:
        # can_append/may_append take a block when len(seq) % block_size == 1: never, at size 1
        raise ValueError("nano-vllm's block manager cannot run 1-token blocks")
    ids = [r.request_id for r in requests]
    if len(set(ids)) != len(ids):
        raise ValueError("nano-vllm: request ids must be unique")
    for r in requests:
        if r.prompt_tokens < 1 or r.output_tokens < 1 or len(r.token_ids) != r.prompt_tokens:
            raise ValueError(
                f"request {r.request_id}: needs prompt_tokens >= 1 token ids, as many as prompt_tokens, and output_tokens >= 1"
            )
        # the most a request holds: its last token is never computed, and a prefill after a
        # preemption is of the prompt and every token generated so far
        needed_tokens = r.prompt_tokens + r.output_tokens - 1
        # nano-vllm would wait for the blocks forever (and then fail an assert in schedule())
        needed_blocks = -(-needed_tokens // caps.block_size_tokens)
        if needed_blocks > caps.num_blocks:
            raise ValueError(f"request {r.request_id} needs {needed_blocks} blocks; nano-vllm has {caps.num_blocks}")
    # vLLM's long_prefill_token_threshold limits each prefill's chunk; nano-vllm has none, so only
    # a threshold the token budget already enforces (0: none, or at least the budget) holds
    if 0 < caps.long_prefill_token_threshold < caps.max_num_batched_tokens:
        raise ValueError(
            f"nano-vllm has no long_prefill_token_threshold: {caps.long_prefill_token_threshold} "
            f"below max_num_batched_tokens ({caps.max_num_batched_tokens}) cannot hold"
        )


def _check_no_chunk(batch: list, request_id_of: dict[int, int], step: int, caps: PeerCaps) -> None:
    """nano-vllm cannot turn chunking off: it chunks the first prefill of a step whose uncached
    tokens exceed the token budget. chunked_prefill=False holds exactly while that never happens
    (a prompt longer than the budget, or a preempted request's prompt and generated tokens)."""
    for seq in batch:
        if seq.num_cached_tokens + seq.num_scheduled_tokens < seq.num_tokens:
            raise ValueError(
                f"nano-vllm chunked request {request_id_of[seq.seq_id]}'s prefill of "
                f"{seq.num_tokens - seq.num_cached_tokens} tokens at step {step} (max_num_batched_tokens "
                f"{caps.max_num_batched_tokens}): chunked_prefill=False cannot hold"
            )


@contextmanager
def _sequence_block_size(sequence_cls, block_size_tokens: int):
    """nano-vllm keeps the block size on the Sequence class (LLMEngine sets it from its Config):
    set it for one run and put it back (so runs in one process are not thread-safe)."""
    previous = sequence_cls.block_size
    sequence_cls.block_size = block_size_tokens
    try:
        yield
    finally:
        sequence_cls.block_size = previous
