"""mode=real on a CPU: the generated token ids do not depend on how the KV cache was placed,
batched, chunked, preempted or swapped, and equal Hugging Face's greedy generate."""

from __future__ import annotations

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvbench.api import run  # noqa: E402 - after the importorskip above
from kvbench.errors import ConfigError  # noqa: E402
from kvbench.exec.real import prediction_error  # noqa: E402
from kvbench.exec.real.executor import prompt_token_ids  # noqa: E402

SEED = 3
# 6 requests, prompts 5-20 tokens, outputs 3-10, S_max 32 (so that the contiguous allocators fit)
WORKLOAD = [
    "model=tiny-llama",
    "kernel=torch",
    "mode=real",
    "progress=false",
    "output.write=false",
    f"seed={SEED}",
    "workload=synthetic",
    "workload.num_requests=6",
    "workload.lengths=lognormal",
    "workload.prompt_tokens=12",
    "workload.output_tokens=6",
    "workload.prompt_sigma=0.6",
    "workload.output_sigma=0.6",
    "workload.min_tokens=5",
    "workload.max_prompt_tokens=20",
    "workload.max_output_tokens=10",
    "workload.s_max_tokens=32",
]
#: 48 token slots of the tiny model (512 bytes each), no watermark: running requests outgrow it and preempt
TIGHT = ["hardware.kv_budget_bytes=24576", "scheduler.watermark_fraction=0"]


def _tokens(result) -> dict[int, list[int]]:
    return {int(r): ids[0] for r, ids in zip(result.requests["request_id"], result.requests["output_token_ids"])}


@functools.cache
def _run(*overrides: str):
    return run([*WORKLOAD, *overrides])


def _generated(model, row) -> list[int]:
    """The token ids Hugging Face's greedy generate adds to the prompt of ``row`` (a request-table
    row), one prompt at a time (no padding)."""
    prompt = prompt_token_ids(SEED, int(row.request_id), int(row.prompt_tokens), model.config.vocab_size)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        gen = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=int(row.output_tokens),
            pad_token_id=0,
        )
    return gen[0, len(prompt) :].tolist()


@functools.lru_cache(maxsize=1)
def _reference() -> dict[int, list[int]]:
    """Hugging Face greedy generate of each request, same weights."""
    from kvbench.exec.real.model import build_model

    base = _run("allocator=paged")
    cfg_model = base.config["model"]
    model = build_model(dict(cfg_model["hf_config"]), cfg_model["dtype"], SEED)
    return {int(row.request_id): _generated(model, row) for row in base.requests.itertuples()}


def test_paged_matches_hugging_face_generate():
    result = _run("allocator=paged")
    ref = _reference()
    assert len(ref) == 6 and all(3 <= len(v) <= 10 for v in ref.values())
    assert _tokens(result) == ref
    # a real run's step table: the measured time beside the cost model's prediction
    steps = result.steps
    assert (steps["measured_s"] == steps["duration_s"]).all() and (steps["predicted_s"] > 0).all()
    assert np.isfinite(result.summary["sim_step_error_median"])
    assert result.summary["sim_step_error_p90"] >= result.summary["sim_step_error_median"]


CASES = [
    ("allocator=paged", "allocator.block_size_tokens=8", "scheduler=mixed", *TIGHT, "preemption=recompute"),
    ("allocator=paged", "allocator.block_size_tokens=16", "scheduler=mixed", *TIGHT, "preemption=swap"),
    ("allocator=paged", "allocator.block_size_tokens=8", "scheduler=prefill_first", *TIGHT, "preemption=swap"),
    ("allocator=paged", "allocator.block_size_tokens=16", "scheduler=prefill_first", *TIGHT, "preemption=recompute"),
    (
        "allocator=paged",
        "allocator.block_size_tokens=8",
        "scheduler=chunked",
        "scheduler.max_num_batched_tokens=7",
        "scheduler.max_num_seqs=4",
        *TIGHT,
        "preemption=swap",
    ),
    (
        "allocator=paged",
        "allocator.block_size_tokens=16",
        "scheduler=chunked",
        "scheduler.max_num_batched_tokens=7",
        "scheduler.max_num_seqs=4",
        *TIGHT,
        "preemption=recompute",
    ),
    ("allocator=naive", "allocator.s_max_tokens=32", "scheduler=mixed", *TIGHT),
    (
        "allocator=per_request",
        "scheduler=chunked",
        "scheduler.max_num_batched_tokens=7",
        "scheduler.max_num_seqs=4",
        *TIGHT,
    ),
]


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: "-".join(x.split("=")[-1] for x in o))
def test_tokens_do_not_depend_on_placement_batching_or_preemption(overrides):
    result = _run(*overrides)
    assert _tokens(result) == _reference()
    if "preemption=swap" in overrides:
        assert result.summary["num_swap_preemptions"] > 0, "the case must swap to test swapping"
    elif "preemption=recompute" in overrides:
        assert result.summary["num_recompute_preemptions"] > 0, "the case must recompute to test recomputing"


def test_fan_out_branches_each_generate_the_greedy_continuation():
    # greedy: every branch of a request continues its prompt the same way, whether it shares
    # the prompt's blocks (paged, copy-on-write) or copies them (per_request)
    for allocator in ("allocator=paged", "allocator=per_request"):
        result = _run(
            allocator,
            "workload.num_branches=2",
            "workload.lengths=fixed",
            "workload.prompt_tokens=9",
            "workload.output_tokens=5",
        )
        for ids in result.requests["output_token_ids"]:
            assert len(ids) == 2 and ids[0] == ids[1] and len(ids[0]) == 5
        assert result.steps["num_forks"].sum() == 6


def test_a_gpu_only_kernel_on_a_cpu_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="mode='real' cannot run here: kernel=flashinfer"):
        run([*WORKLOAD, "kernel=flashinfer"])


def test_prediction_error():
    err = prediction_error([1.0, 3.0, 2.0], [2.0, 2.0, 2.0])
    assert err["sim_step_error_median"] == 0.5
    assert err["sim_step_error_p90"] == pytest.approx(0.5)
    with pytest.raises(ValueError):
        prediction_error([1.0], [0.0])


def test_real_weights_from_a_local_folder_are_the_ones_used(tmp_path):
    """model.config_path naming a save_pretrained folder: its weights, not the seed's, generate."""
    from kvbench.exec.real.model import build_model

    hf_config = dict(_run("allocator=paged").config["model"]["hf_config"])
    saved = build_model(hf_config, "float32", seed=123)  # weights no seed of the run would draw
    saved.save_pretrained(tmp_path / "tiny")
    result = run([*WORKLOAD, "allocator=paged", f"model.config_path={tmp_path / 'tiny'}"])
    for row, ids in zip(result.requests.itertuples(), result.requests["output_token_ids"]):
        assert list(ids[0]) == _generated(saved, row)
    assert _tokens(result) != _tokens(_run("allocator=paged"))  # not the seeded random weights


def test_a_real_run_records_where_it_was_measured_and_a_cpu_s_is_never_calibrated_from(tmp_path, capsys):
    from kvbench.commands import calibrate
    from kvbench.exec.real.device import cpu_name
    from kvbench.output.results import write_run

    result = _run("allocator=paged")
    on_gpu = torch.cuda.is_available()
    device_type, _, name = result.summary["measured_on"].partition(": ")
    assert device_type == ("cuda" if on_gpu else "cpu") and name
    if on_gpu:
        return  # a GPU's run is what calibrate fits (tests/kvbench/test_calibrate.py)
    assert name == cpu_name()
    write_run(result, tmp_path / "run", figures=False)
    with pytest.raises(SystemExit) as stop:
        calibrate.main([str(tmp_path / "run"), "--out", str(tmp_path / "cal")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err
    assert f"was measured on a CPU ({name}), while its config prices hardware=h100-sxm" in err
    assert not (tmp_path / "cal").exists()


def test_measured_on_names_the_device_type_then_the_chip(monkeypatch):
    from kvbench.exec.real.device import measured_on

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert measured_on(torch.device("cuda", 0)) == "cuda: NVIDIA H200"
    assert measured_on(torch.device("cpu")).startswith("cpu: ")
