"""kvbench's closed forms behind the vLLM paper's numbers (Kwon et al., SOSP 2023, arXiv:2309.06180).

Everything here is computed from kvbench's own specs (``conf/model``, ``conf/hardware``) and cost
model, or from request lengths; nothing is typed in from the paper: the sections (``vllm_paper.py``
and the ``vllm_*`` modules it lists) read the paper's values from ``data/vllm_paper_reference.json``.
"""

from __future__ import annotations

import json
import math
from importlib import resources

import numpy as np
from omegaconf import OmegaConf

from kvbench.api import CostModel, HardwareSpec, ModelSpec, Transfer, hardware_spec
from kvbench.studies.paper import configs

GIB, MIB, KIB = 2**30, 2**20, 2**10
#: the paper's single-GPU setting (Table 1's OPT-13B on one A100-40GB)
BASE = ("model=opt-13b", "hardware=a100-40gb")


def reference() -> dict:
    """The vLLM paper's published values, as shipped in ``kvbench/studies/paper/data``."""
    return json.loads(resources.files("kvbench.studies.paper").joinpath("data/vllm_paper_reference.json").read_text())


def model(name: str) -> ModelSpec:
    return configs.model(name)


def hardware(name: str) -> HardwareSpec:
    return hardware_spec(configs.composed([f"hardware={name}"]))


def workload(name: str) -> dict:
    return dict(OmegaConf.to_container(configs.composed([f"workload={name}"]).workload))


def embedding_params(name: str) -> int:
    """Parameters of the token embedding table: vocabulary x embedding width (OPT's projection width)."""
    arch = configs.composed([f"model={name}"]).model.hf_config
    return int(arch["vocab_size"]) * int(arch.get("word_embed_proj_dim") or arch["hidden_size"])


def cost() -> CostModel:
    """The cost model a run of the paper's setting prices its steps with."""
    return configs.built(BASE).cost


def granule_tokens(allocator: str = "orca_max") -> int:
    """An Orca baseline's allocation unit in tokens (its buddy allocator's smallest block)."""
    return int(configs.composed([f"allocator={allocator}"]).allocator.granule_tokens)


def median_for_mean(mean: float, sigma: float) -> int:
    """The integer lognormal median whose mean is closest to ``mean``: mean / e^(sigma^2 / 2)."""
    return max(1, round(mean / math.exp(sigma * sigma / 2.0)))


# --- Fig. 2: the memory breakdown of contiguous reservations -------------------------------------


def buddy_slots(tokens: np.ndarray, granule: int) -> np.ndarray:
    """Slots of a buddy-placed reservation of ``tokens``: granules rounded up to a power of two."""
    granules = np.maximum(1, -(-tokens // granule))
    return granule * (1 << np.ceil(np.log2(granules)).astype(np.int64))


def reservation_slots(policy: str, prompt: np.ndarray, output: np.ndarray, s_max: int, granule: int) -> np.ndarray:
    """Slots each request reserves under Orca (Max), (Pow2) and (Oracle), buddy placement."""
    if policy == "max":
        tokens = np.full_like(prompt, s_max)
    elif policy == "pow2":
        tokens = prompt + (1 << np.ceil(np.log2(np.maximum(output, 1))).astype(np.int64))
    else:
        tokens = prompt + output
    return buddy_slots(tokens, granule)


def held_shares(prompt: np.ndarray, output: np.ndarray, reserved: np.ndarray) -> dict[str, float]:
    """Time-weighted slots of one resident request, each request held for its ``output`` decode
    steps (prefill left out): tokens (p + t, t = 1..o), reserved for future tokens (o - t) and
    never used (R - p - o), as sums over requests divided by the steps they are held."""
    p, o, r = (np.asarray(x, dtype=np.float64) for x in (prompt, output, reserved))
    steps = o.sum()
    return {
        "token": float((o * p + o * (o + 1) / 2).sum() / steps),
        "reserved": float((o * (o - 1) / 2).sum() / steps),
        "internal": float((o * (r - p - o)).sum() / steps),
        "slots": float((o * r).sum() / steps),
    }


def budget_slots() -> int:
    """KV token slots in the paper's setting: the run's KV budget / KV bytes per token."""
    setup = configs.built(BASE)
    return setup.budget_bytes // setup.model.kv_bytes_per_token


def orca_max_batch(s_max: int, granule: int | None = None) -> int:
    """Orca (Max)'s batch: how many S_max reservations fit the budget (power-of-two buddy blocks
    of ``granule`` tokens; None: the Orca allocators' configured granule)."""
    granule = granule_tokens() if granule is None else granule
    granules = budget_slots() // granule
    per_request = int(buddy_slots(np.array([s_max]), granule)[0]) // granule
    # the buddy arena is a sum of power-of-two top blocks; each holds top // per_request requests
    return sum((1 << k) // per_request for k in range(granules.bit_length()) if granules >> k & 1)


def little_batch(rate: float, output: np.ndarray, context_tokens: float, cm: CostModel) -> float:
    """Mean batch by Little's law when memory does not bind: B = rate x E[o] x t_step(B), with
    t_step(B) = (weight bytes + B x context x KV bytes) / HBM bandwidth (the roofline decode step);
    solved for B. inf when the rate exceeds what the roofline serves."""
    mean_out = float(np.mean(output))
    weights_s = cm.model.weight_bytes / cm.hardware.hbm_bandwidth_bytes_per_s
    per_seq_s = context_tokens * cm.model.kv_bytes_per_token / cm.hardware.hbm_bandwidth_bytes_per_s
    denominator = 1.0 - rate * mean_out * per_seq_s
    return rate * mean_out * weights_s / denominator if denominator > 0 else math.inf


# --- Fig. 15: blocks saved by sharing --------------------------------------------------------------


def sampling_saving(prompt: np.ndarray, branch_output: np.ndarray, n: int, block: int = 16) -> float:
    """Parallel sampling's block saving, time-weighted over decode steps: the n branches share the
    prompt's full blocks (floor(p / B), the partly filled one is copied on write), so each step
    saves (n - 1) x floor(p / B) blocks of the n x ceil((p + t) / B) that n separate sequences hold."""
    saved = without = 0.0
    for p, o in zip(prompt.tolist(), branch_output.tolist(), strict=True):
        t = np.arange(1, o + 1)
        without += n * float(np.ceil((p + t) / block).sum())
        saved += (n - 1) * (p // block) * o
    return saved / without


# --- §7.3: swap against recompute of one sequence --------------------------------------------------


def swap_round_trip_s(tokens: int, block: int, cm: CostModel) -> float:
    """Out and back, one copy per block (kvbench's assumption of hardware.host_transfer_overhead_s)."""
    blocks = -(-tokens // block)
    return cm.swap_round_trip_s(Transfer(blocks * block * cm.model.kv_bytes_per_token, blocks))


def recompute_s(tokens: int, cm: CostModel) -> float:
    return cm.prefill_time_s(tokens)
