"""vLLM 0.33.0's own V1 scheduler (``vllm.v1.core.sched.scheduler.Scheduler``), driven step by step.

No GPU and no weights: the scheduler, its KVCacheManager and BlockPool are pure Python, so they
run on a CPU-only machine with the CPU torch (``tools/install_vllm_scheduler.sh`` makes such a
venv). The model is faked: after each ``schedule()`` it returns one sampled token for every
scheduled request whose computed tokens reach its known tokens, and none for a partial prefill
chunk, as vLLM's GPU model runner does; ``update_from_output`` then appends it, checks the stop
and frees a finished request's blocks, all before the next ``schedule()``.

Each step lasts ``caps.step_s`` on the same clock as kvbench's engine (kvbench/engine.py).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import tempfile
import warnings
from collections.abc import Callable
from contextlib import contextmanager

from kvbench.validation.peers.types import PeerCaps, PeerRequest, PeerStep, PeerTrace, check_progress, join_arrivals

VERSION = "0.33.0"
ENGINE = f"vllm {VERSION}"
_INSTALL_HINT = "tools/install_vllm_scheduler.sh makes a venv with it (CPU torch, no GPU needed)"

#: the smallest model ModelConfig accepts offline; its sizes only shape a KV spec nobody allocates
_TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 1,
    "vocab_size": 1000,
    "torch_dtype": "float32",
}
#: the one attention layer of that model, named as vLLM names it (the KV cache group's only layer)
_LAYER_NAME = "model.layers.0.self_attn.attn"


def _submission_stamps_s(requests: list[PeerRequest]) -> list[float]:
    """The arrival_time vLLM gets for each request. vLLM stamps a request when the server receives
    it, and its priority policy breaks ties of priority on the stamp (queue order, and the victim:
    the largest (priority, arrival_time), the first running of equal ones). A server never gives
    two requests one stamp; a trace's rows may share an arrival (a batch at t = 0), so a row that
    ties the one before it is stamped the next float after it: submitted in row order, as kvbench
    ranks them. Which step a request joins still follows its arrival_s."""
    stamps_s: list[float] = []
    for r in requests:
        stamp_s = r.arrival_s
        if stamps_s and stamp_s <= stamps_s[-1]:
            stamp_s = math.nextafter(stamps_s[-1], math.inf)
        stamps_s.append(stamp_s)
    return stamps_s


@functools.cache
def _vllm_id(request_id: int) -> str:
    """vLLM's request id: zero-padded so that string order (its priority tie-break) is numeric."""
    return f"{request_id:012d}"


def unavailable_reason() -> str | None:
    """None when vLLM 0.33.0's scheduler imports here; else one line saying how to install it.

    Cheap when vLLM is absent (a find_spec and a metadata read); the import itself (a few
    seconds) runs once per process, only where the right version is installed.
    """
    if importlib.util.find_spec("vllm") is None:
        return f"vLLM {VERSION} is not installed: {_INSTALL_HINT}"
    try:
        installed = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return f"vllm imports but has no package metadata (vLLM {VERSION} expected): {_INSTALL_HINT}"
    if installed != VERSION:
        return f"vLLM {installed} is installed, {VERSION} expected: {_INSTALL_HINT}"
    try:
        # torch.jit and vLLM warn at import about things the scheduler never uses; catch_warnings
        # also drops the filters vLLM installs while importing, so the process keeps its own
        with _quiet_vllm_logging(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import vllm.v1.core.sched.scheduler  # noqa: F401
    except Exception as exc:  # any failure of the import chain: a missing dependency, a CUDA-only torch
        return f"vLLM {VERSION} is installed but its scheduler does not import ({exc!r}): {_INSTALL_HINT}"
    return None


def run(
    requests: list[PeerRequest],
    caps: PeerCaps,
    *,
    max_steps: int = 1_000_000,
    on_finished: Callable[[int], None] = lambda n: None,
) -> PeerTrace:
    """Feed ``requests`` to vLLM's scheduler on kvbench's clock and record every step.

    Caps map one to one: ``num_blocks`` is vLLM's own count (its null block is one of them, so
    ``num_blocks - 1`` hold KV), ``long_prefill_token_threshold`` 0 is none, ``policy`` is
    "fcfs" or "priority" (lower ``PeerRequest.priority`` first). Everything else is vLLM's
    default: ``scheduler_reserve_full_isl`` on, watermark 0, no async scheduling, no spec decode.

    ``max_model_len`` is the longest request (prompt + output), the least that lets every request
    produce all its tokens (vLLM's input processor refuses a prompt of max_model_len tokens or more,
    and check_stop ends a request at max_model_len tokens); no other decision depends on it. With chunked
    prefill off vLLM refuses ``max_num_batched_tokens < max_model_len`` (a prompt, or a preempted
    request's prompt and generated tokens, longer than the budget would never be scheduled):
    such a run raises ValueError rather than change either cap.

    Generated token ids are negative and distinct per request (vocabulary ids are >= 0), so with
    prefix caching a block holding generated tokens is shared by no other request; a request
    preempted and admitted again can still hit its own blocks while they stay cached.

    ``PeerTrace.blocks_used``: blocks held once the step is scheduled (before its finished
    requests are freed, as kvbench's step ledger is taken), the null block not counted (a freed
    block still cached for its prefix counts as free, as vLLM's own usage does).

    Request ids are zero-padded decimal strings: vLLM's priority queue breaks ties on the id
    string, and padding makes that order the numeric one kvbench uses.
    """
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    max_model_len_tokens = _check(requests, caps)

    with _quiet_vllm_logging(), tempfile.TemporaryDirectory(prefix="kvbench-vllm-model-") as model_dir:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request

        scheduler, block_hasher = _build_scheduler(caps, max_model_len_tokens, model_dir)
        block_pool = scheduler.kv_cache_manager.block_pool

        # vLLM lists the ids in SchedulerOutput.preempted_req_ids (a set); the instance attribute
        # below shadows the method schedule() calls, to keep the order the victims were taken in
        preempted_in_order: list[str] = []
        upstream_preempt = scheduler._preempt_request

        def recording_preempt(request, *args, **kwargs):
            preempted_in_order.append(request.request_id)
            return upstream_preempt(request, *args, **kwargs)

        scheduler._preempt_request = recording_preempt

        vllm_requests = [
            Request(
                request_id=_vllm_id(r.request_id),
                prompt_token_ids=list(r.token_ids),
                sampling_params=SamplingParams(max_tokens=r.output_tokens, ignore_eos=True),
                pooling_params=None,
                arrival_time=stamp_s,
                priority=r.priority,
                block_hasher=block_hasher,
            )
            for r, stamp_s in zip(requests, _submission_stamps_s(requests), strict=True)
        ]
        peer_id_of = {_vllm_id(r.request_id): r.request_id for r in requests}
        generated_token_of = {_vllm_id(r.request_id): -2 - i for i, r in enumerate(requests)}
        by_id = {req.request_id: req for req in vllm_requests}

        steps: list[PeerStep] = []
        blocks_used: list[int] = []
        clock_s, next_arrival, num_finished = 0.0, 0, 0
        while num_finished < len(requests):
            check_progress(ENGINE, len(steps), max_steps, num_finished, len(requests))
            idle = scheduler.get_num_unfinished_requests() == 0
            next_arrival, clock_s = join_arrivals(
                requests, next_arrival, clock_s, idle, lambda i: scheduler.add_request(vllm_requests[i])
            )

            preempted_in_order.clear()
            scheduler_output = scheduler.schedule()
            scheduled = dict(scheduler_output.num_scheduled_tokens)
            # the null block is always taken: not counted
            blocks_used.append(block_pool.num_gpu_blocks - block_pool.get_num_free_blocks() - 1)
            if set(preempted_in_order) != set(scheduler_output.preempted_req_ids):
                raise RuntimeError(
                    f"{ENGINE}: step {len(steps)}: recorded preemptions {preempted_in_order} "
                    f"differ from SchedulerOutput.preempted_req_ids {sorted(scheduler_output.preempted_req_ids)}"
                )
            if not scheduled and next_arrival == len(requests):
                # nothing scheduled and nothing left to arrive: every later step would be the same
                raise RuntimeError(
                    f"{ENGINE}: step {len(steps)} scheduled nothing with {len(requests) - num_finished} requests "
                    "unfinished and none left to arrive: vLLM would wait forever"
                )

            # the fake model: schedule() has already advanced num_computed_tokens, so a request
            # whose computed tokens reach its known tokens samples one; a partial chunk samples none
            req_ids = list(scheduled)
            sampled = [
                [generated_token_of[rid]] if by_id[rid].num_computed_tokens >= by_id[rid].num_tokens else []
                for rid in req_ids
            ]
            runner_output = ModelRunnerOutput(
                req_ids=req_ids,
                req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
                sampled_token_ids=sampled,
            )
            engine_outputs = scheduler.update_from_output(scheduler_output, runner_output)
            finished = [
                peer_id_of[out.request_id]
                for outputs in engine_outputs.values()
                for out in outputs.outputs
                if out.finish_reason is not None
            ]
            num_finished += len(finished)
            on_finished(len(finished))  # progress

            steps.append(
                PeerStep(
                    scheduled={peer_id_of[rid]: n for rid, n in scheduled.items()},
                    preempted=[peer_id_of[rid] for rid in preempted_in_order],
                    finished=finished,
                )
            )
            clock_s += caps.step_s

        # ignore_eos: each request must stop at exactly output_tokens (a raise, not an assert, so
        # that python -O checks it too)
        for req, r in zip(vllm_requests, requests):
            if not req.is_finished() or req.num_output_tokens != r.output_tokens:
                raise RuntimeError(
                    f"{ENGINE}: request {r.request_id} generated {req.num_output_tokens} tokens "
                    f"({req.status.name}), {r.output_tokens} asked"
                )
    return PeerTrace(engine=ENGINE, steps=steps, blocks_used=blocks_used)


def _check(requests: list[PeerRequest], caps: PeerCaps) -> int:
    """ValueError for what this run cannot honour; returns the max_model_len to configure."""
    if caps.policy not in ("fcfs", "priority"):
        raise ValueError(f"{ENGINE}: policy must be 'fcfs' or 'priority', not {caps.policy!r}")
    if caps.block_size_tokens < 1 or caps.num_blocks < 2 or caps.max_num_seqs < 1 or caps.max_num_batched_tokens < 1:
        raise ValueError(
            f"{ENGINE}: every cap must be at least 1, and num_blocks at least 2 (one is the null block): {caps}"
        )
    if not requests:
        raise ValueError(f"{ENGINE}: no requests")
    ids = [r.request_id for r in requests]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{ENGINE}: request ids must be unique")
    usable_blocks = caps.num_blocks - 1
    for r in requests:
        if r.prompt_tokens < 1 or r.output_tokens < 1 or len(r.token_ids) != r.prompt_tokens:
            raise ValueError(
                f"request {r.request_id}: needs prompt_tokens >= 1 token ids, as many as prompt_tokens, and output_tokens >= 1"
            )
        if min(r.token_ids) < 0:
            raise ValueError(f"request {r.request_id}: token ids must be >= 0 (negative ones are the generated tokens)")
        # the most a request ever holds: its last token is never computed, and its admission after
        # a preemption needs blocks for its prompt and every token generated so far at once
        needed_blocks = -(-(r.prompt_tokens + r.output_tokens - 1) // caps.block_size_tokens)
        if needed_blocks > usable_blocks:
            raise ValueError(
                f"request {r.request_id} needs {needed_blocks} blocks; {caps.num_blocks} blocks leave "
                f"{usable_blocks} beside vLLM's null block: vLLM would wait forever"
            )
    max_model_len_tokens = max(r.prompt_tokens + r.output_tokens for r in requests)
    if not caps.chunked_prefill and caps.max_num_batched_tokens < max_model_len_tokens:
        raise ValueError(
            f"{ENGINE}: with chunked prefill off vLLM needs max_num_batched_tokens >= max_model_len; "
            f"max_num_batched_tokens is {caps.max_num_batched_tokens} and the longest request (prompt + output) "
            f"is {max_model_len_tokens} tokens"
        )
    return max_model_len_tokens


def _build_scheduler(caps: PeerCaps, max_model_len_tokens: int, model_dir: str):
    """vLLM's Scheduler as EngineCore builds it, with the KV cache config handed in directly
    (no executor profiles memory): one full-attention group of ``caps.num_blocks`` blocks."""
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump({**_TINY_LLAMA_CONFIG, "max_position_embeddings": max_model_len_tokens}, f)
    model_config = ModelConfig(
        model=model_dir, skip_tokenizer_init=True, max_model_len=max_model_len_tokens, dtype="float32"
    )
    scheduler_config = SchedulerConfig(
        max_model_len=max_model_len_tokens,
        is_encoder_decoder=False,
        max_num_seqs=caps.max_num_seqs,
        max_num_batched_tokens=caps.max_num_batched_tokens,
        enable_chunked_prefill=caps.chunked_prefill,
        # vLLM refuses a threshold above max_model_len; one at or above the longest request cuts
        # no chunk (no request ever has more tokens to compute), so the clamp changes nothing
        long_prefill_token_threshold=min(caps.long_prefill_token_threshold, max_model_len_tokens),
        policy=caps.policy,
        watermark=caps.watermark_fraction,
        # the synchronous Scheduler: each step's output is applied before the next is scheduled
        async_scheduling=False,
    )
    cache_config = CacheConfig(block_size=caps.block_size_tokens, enable_prefix_caching=caps.prefix_caching)
    cache_config.num_gpu_blocks = caps.num_blocks  # what EngineCore sets after profiling
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),  # no platform detection
    )
    # VllmConfig may adjust what it was given: refuse a run whose caps it changed
    resolved = vllm_config.scheduler_config
    got = (
        resolved.enable_chunked_prefill,
        resolved.max_num_batched_tokens,
        resolved.max_num_seqs,
        vllm_config.cache_config.enable_prefix_caching,
        vllm_config.cache_config.block_size,
    )
    want = (
        caps.chunked_prefill,
        caps.max_num_batched_tokens,
        caps.max_num_seqs,
        caps.prefix_caching,
        caps.block_size_tokens,
    )
    if got != want:
        raise RuntimeError(
            f"{ENGINE}: VllmConfig changed the caps (chunked, tokens, seqs, caching, block): {got} != {want}"
        )

    kv_cache_config = KVCacheConfig(
        num_blocks=caps.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                [_LAYER_NAME],
                FullAttentionSpec(block_size=caps.block_size_tokens, num_kv_heads=1, head_size=64, dtype=torch.float32),
            )
        ],
    )
    scheduler = Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=caps.block_size_tokens,
    )

    # EngineCore hashes each request's full blocks as its tokens grow (only with prefix caching)
    block_hasher = None
    if caps.prefix_caching:
        hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        block_hasher = get_request_block_hasher(caps.block_size_tokens, hash_fn)
    return scheduler, block_hasher


@contextmanager
def _quiet_vllm_logging():
    """vLLM 0.33 leaves its loggers unconfigured until a server configures them, so its warnings
    (e.g. that the compiled ``vllm._C`` is missing, which the scheduler never needs) reach stderr
    through Python's last-resort handler. Raise the ``vllm`` logger to ERROR while it runs, unless
    the process has set a level on it itself; no other logger is touched."""
    vllm_logger = logging.getLogger("vllm")
    if vllm_logger.level != logging.NOTSET:
        yield
        return
    vllm_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        vllm_logger.setLevel(logging.NOTSET)
