"""The runs behind the vLLM paper's numbers (OPT-13B on one A100-40GB, as the paper's Table 1) and
what the paper's metrics read from them: the systems compared, the workloads' length shape, the
normalized latency and the memory saved by sharing."""

from __future__ import annotations

import numpy as np

from kvbench.studies.paper import vllm_model as vm

BASE = vm.BASE
#: the paper's systems and the kvbench allocator that models each
SYSTEMS = (
    ("Orca (Max)", "orca_max"),
    ("Orca (Pow2)", "orca_pow2"),
    ("Orca (Oracle)", "orca_oracle"),
    ("vLLM", "paged"),
)
#: the reservation policy of each Orca baseline
POLICY = {"orca_max": "max", "orca_pow2": "pow2", "orca_oracle": "oracle"}
#: the lognormal sigmas of the sensitivity tables (1.0 is the workloads' own)
SIGMAS = (0.5, 1.0, 1.5)
#: the paper's dataset means (Fig. 11), per kvbench workload
MEANS = {"sharegpt_like": ("ShareGPT", 2.0), "alpaca_like": ("Alpaca", 30.0)}
#: the block sizes swept (the paged allocator takes powers of two from 8 to 256)
BLOCK_SIZES = (8, 16, 32, 64, 128, 256)


def pct(x: float) -> float:
    return 100.0 * x


def sigma_overrides(workload: str, sigma: float) -> list[str]:
    """The workload with lognormal shape ``sigma``, medians moved to keep the paper's means."""
    ref = vm.reference()["fig11_dataset_means_tokens"][MEANS[workload][0]]
    if sigma == 1.0:
        return [f"workload={workload}"]  # the YAML's own medians are these (checked in the tests)
    return [
        f"workload={workload}",
        f"workload.prompt_sigma={sigma}",
        f"workload.output_sigma={sigma}",
        f"workload.prompt_tokens={vm.median_for_mean(ref['input_mean'], sigma)}",
        f"workload.output_tokens={vm.median_for_mean(ref['output_mean'], sigma)}",
    ]


def assumed_sigma(workload: str) -> float:
    """The lognormal sigma of the workload's lengths: kvbench's assumption about the paper's data."""
    return float(vm.workload(workload)["prompt_sigma"])


def system_run(allocator: str, workload: str, sigma: float = 1.0, extra: tuple[str, ...] = ()) -> list[str]:
    """The overrides of one system (kvbench allocator) on the paper's setting and ``workload``."""
    return [f"allocator={allocator}", *BASE, *sigma_overrides(workload, sigma), *extra]


def lengths(result) -> tuple[np.ndarray, np.ndarray]:
    """The prompt and output lengths (tokens) of a run's requests."""
    q = result.requests
    return q["prompt_tokens"].to_numpy(np.int64), q["output_tokens"].to_numpy(np.int64)


def normalized_latency(result) -> float:
    """The paper's metric: mean over finished requests of end-to-end latency / output tokens."""
    q = result.requests
    q = q[q["finish_s"] >= 0]
    return float(((q["finish_s"] - q["arrival_s"]) / q["max_branch_output_tokens"]).mean())


def token_saving(result) -> float:
    """Sharing's saving measured in a run, in token slots, time-weighted over decode spans: 1 -
    slots holding a token (a shared block counted once) / the tokens the decoding branches read
    (every branch its whole context, as if nothing were shared)."""
    s = result.steps
    s = s[(s["num_decode_seqs"] > 0) & (s["num_prefill_seqs"] == 0)]
    kv = result.summary["kv_bytes_per_token"]
    # a decode step reads each branch's whole context, the slot of the token it writes included, and
    # the ledger's token slots include that slot too
    logical = s["kv_read_bytes"] / s["num_steps"] / kv
    stored = s["token_bytes"] / kv
    return 1.0 - float((s["duration_s"] * stored).sum() / (s["duration_s"] * logical).sum())
