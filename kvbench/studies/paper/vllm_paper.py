"""The vLLM paper's numbers reproduced by kvbench.

Kwon et al., "Efficient Memory Management for Large Language Model Serving with PagedAttention",
SOSP 2023 (arXiv:2309.06180). The published values are read from
``kvbench/studies/paper/data/vllm_paper_reference.json`` (see ``data/README.md``); every other number is
computed here from kvbench's specs, its cost model or its runs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.api import CostModel
from kvbench.studies.paper import configs
from kvbench.studies.paper import vllm_model as vm
from kvbench.studies.paper.document import Figure, Section, Source, Table
from kvbench.studies.paper.plots import new_figure, save
from kvbench.studies.paper.rows import Row
from kvbench.studies.paper.runs import Runs, command

BASE = vm.BASE
#: the paper's systems and the kvbench allocator that models each
SYSTEMS = (
    ("Orca (Max)", "orca_max"),
    ("Orca (Pow2)", "orca_pow2"),
    ("Orca (Oracle)", "orca_oracle"),
    ("vLLM", "paged"),
)
POLICY = {"orca_max": "max", "orca_pow2": "pow2", "orca_oracle": "oracle"}
SIGMAS = (0.5, 1.0, 1.5)
#: Fig. 13's what-if: decode steps this many times longer than kvbench's roofline
STEP_STRETCH = (1, 2, 3)
#: Fig. 15's beam search: the fork probabilities swept, and requests per beam run (the slowest runs)
FORK_PROBABILITIES = (0.25, 0.5, 0.75)
BEAM_REQUESTS = 150
#: requests per ShareGPT fan-out run (long outputs times n branches)
SHAREGPT_FAN_REQUESTS = 60
#: the paper's dataset means (Fig. 11), per kvbench workload
MEANS = {"sharegpt_like": ("ShareGPT", 2.0), "alpaca_like": ("Alpaca", 30.0)}
BLOCK_SIZES = (8, 16, 32, 64, 128, 256)
#: a loaded rate per workload for the block-size sweep (kvbench's roofline serves faster than the
#: paper's GPU, so the paper's own rates leave memory idle): chosen so that memory binds
BLOCK_SWEEP_RATE = {"sharegpt_like": 3.0, "alpaca_like": 200.0}
BLOCK_SWEEP_REQUESTS = 500
#: §7.3's runs: a KV budget small enough that preemption happens
PRESSURE_BUDGET = "3e9"  # bytes, as the override is written
#: §6.2's largest sustainable rate: normalized latency at most this many times the system's own at
#: the lowest rate of the grid (kvbench's choice: the paper reads the knee off its curves)
SUSTAINABLE_SLOWDOWN = 2.0
SHAREGPT_RATES = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
ALPACA_RATES = (30.0, 60.0, 120.0, 180.0, 240.0, 320.0, 400.0)
FIG2_PARTS = ("token states", "reservation", "internal frag.", "external frag. & others")


def _pct(x: float) -> float:
    return 100.0 * x


def _sigma_overrides(workload: str, sigma: float) -> list[str]:
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


def _sigma(workload: str) -> float:
    """The lognormal sigma of the workload's lengths: kvbench's assumption about the paper's data."""
    return float(vm.workload(workload)["prompt_sigma"])


def _system_run(allocator: str, workload: str, sigma: float = 1.0, extra: tuple[str, ...] = ()) -> list[str]:
    return [f"allocator={allocator}", *BASE, *_sigma_overrides(workload, sigma), *extra]


def _lengths(result) -> tuple[np.ndarray, np.ndarray]:
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


# --- sections ---------------------------------------------------------------------------------------


def _kv_per_token(ref: dict) -> Section:
    m = vm.model("opt-13b")
    per_token = m.kv_bytes_per_token
    rows = [
        Row(
            "vllm.kv_bytes_per_token_opt13b",
            "§3",
            "KV cache of one token, OPT-13B (fp16)",
            "B",
            f"{ref['kv_bytes_per_token_opt13b']:,}",
            f"2 (K, V) x {m.num_layers} layers x {m.num_kv_heads} heads x {m.head_dim} dims x {m.dtype_bytes} B "
            f"= {per_token:,} B",
            float(per_token),
            why=f"The paper's 800 KB is 800 KiB ({per_token:,} B = {per_token / vm.KIB:g} KiB).",
        ),
        Row(
            "vllm.kv_bytes_2048_token_request",
            "§3",
            "KV cache of a 2,048-token request, OPT-13B",
            "GB",
            "1.6",
            f"2,048 x {per_token:,} B = {2048 * per_token / vm.GIB:.4f} GiB ({2048 * per_token / 1e9:.3f} GB)",
            2048 * per_token / vm.GIB,
            why=f"The paper's GB are GiB here too: {2048 * per_token / vm.GIB:.4f} GiB prints as "
            f"{2048 * per_token / vm.GIB:.1f}; in decimal GB it is {2048 * per_token / 1e9:.2f}, which would print as "
            f"{2048 * per_token / 1e9:.1f}.",
        ),
    ]
    return Section("§3 KV cache per token", "OPT-13B's KV bytes from its architecture (conf/model/opt-13b.yaml).", rows)


def _table1(ref: dict) -> Section:
    specs = {"OPT-13B": ("opt-13b", 1), "OPT-66B": ("opt-66b", 4), "OPT-175B": ("opt-175b", 8)}
    rows, records, notes = [], [], []
    for entry in ref["table1_models"]:
        name = entry["model"]
        slug = name.lower().replace("-", "")
        if name not in specs:
            notes.append(f"{name} ({entry['gpus']}): {entry['note']}")
            continue
        conf, _ = specs[name]
        m = vm.model(conf)
        params_gb = m.weight_bytes / 1e9
        kv_gb = entry["kv_cache_gb"]
        derived_kv_gb = entry["total_gpu_mem_gb"] - params_gb
        slots_gib = kv_gb * vm.GIB / m.kv_bytes_per_token
        slots_gb = kv_gb * 1e9 / m.kv_bytes_per_token
        records.append(
            {
                "model": name,
                "gpus": entry["gpus"],
                "num_params": m.num_params,
                "params_gb": params_gb,
                "kv_bytes_per_token": m.kv_bytes_per_token,
                "kv_cache_gb_paper": kv_gb,
                "slots_gib_units": slots_gib,
                "slots_gb_units": slots_gb,
                "slots_paper": entry["max_kv_slots"],
            }
        )
        param_claim = f"{entry['param_gb']}"
        counted = (
            f"kvbench counts {m.num_params / 1e9:.2f}e9 parameters from the architecture ({params_gb:.1f} GB in fp16)"
        )
        embeddings_gb = vm.embedding_params(conf) * m.dtype_bytes / 1e9
        param_why = {
            "OPT-13B": "",
            "OPT-66B": f"{counted}; the paper's {entry['param_gb']} GB is the nominal 66e9 x 2 B.",
            "OPT-175B": f"{counted}; the paper's {entry['param_gb']} GB matches neither the nominal 175e9 x 2 B = "
            f"{175e9 * m.dtype_bytes / 1e9:.0f} GB nor the architecture's count, nor that count without "
            f"the token embeddings ({params_gb - embeddings_gb:.1f} GB); the paper does not say how it "
            "counted.",
        }[name]
        rows.append(
            Row(
                f"vllm.table1_{slug}_param_gb",
                "Table 1",
                f"{name}: parameter size",
                "GB",
                param_claim,
                f"{m.num_params:,} parameters (counted from conf/model/{conf}.yaml) x 2 B = {params_gb:.1f} GB",
                params_gb,
                why=param_why,
            )
        )
        rows.append(
            Row(
                f"vllm.table1_{slug}_kv_gb",
                "Table 1",
                f"{name}: memory for the KV cache ({entry['gpus']})",
                "GB",
                f"{kv_gb}",
                f"{entry['total_gpu_mem_gb']} GB of HBM - {params_gb:.1f} GB of parameters = {derived_kv_gb:.1f} GB",
                derived_kv_gb,
                why="The paper keeps the rest of HBM for activations and the runtime (and, across GPUs, "
                "duplicated buffers), which it does not itemize: kvbench takes the KV budget as an input "
                f"(hardware.kv_budget_bytes; conf/hardware/a100-40gb.yaml gives OPT-13B "
                f"{vm.hardware('a100-40gb').kv_budget_bytes / vm.GIB:g} GiB) instead of deriving it.",
            )
        )
        slot_why = {
            "OPT-13B": f"In GiB units: {kv_gb} GiB / {m.kv_bytes_per_token / vm.KIB:g} KiB = {slots_gib:,.0f}; in "
            f"decimal GB it would be {kv_gb}e9 / {m.kv_bytes_per_token:,} = {slots_gb:,.0f}.",
            "OPT-66B": f"12 and 264 GiB give the paper's 15.7K and 60.1K; 21 GiB / 2.25 MiB gives {slots_gib:,.0f} "
            f"(21e9 B: {slots_gb:,.0f}), not 9.7K. The paper's 9.7K needs "
            f"{entry['max_kv_slots'] * m.kv_bytes_per_token / vm.GIB:.1f} GiB: its '21 GB' is most likely a "
            "rounded value, so the printed KV size, not the formula, is what differs.",
            "OPT-175B": f"In GiB units: {kv_gb} GiB / {m.kv_bytes_per_token / vm.MIB:g} MiB = {slots_gib:,.0f}.",
        }[name]
        rows.append(
            Row(
                f"vllm.table1_{slug}_max_slots",
                "Table 1",
                f"{name}: max. # KV cache slots",
                "K tokens",
                f"{entry['max_kv_slots'] / 1000:.1f}",
                f"{kv_gb} GiB / {m.kv_bytes_per_token:,} B ({m.kv_bytes_per_token / vm.MIB:g} MiB) = {slots_gib:,.0f}",
                slots_gib / 1000,
                why=slot_why,
            )
        )
    table = Table(
        "vllm_table1",
        "Table 1 recomputed: parameter bytes counted from the architecture, slots in GiB and in GB units",
        pd.DataFrame(records),
        decimals={"params_gb": 1, "slots_gib_units": 0, "slots_gb_units": 0},
    )
    return Section(
        "Table 1: model sizes and KV slots",
        "Parameters counted from conf/model/opt-{13b,66b,175b}.yaml; slots = KV budget / KV bytes per "
        "token, in the units that give the paper's numbers (GiB). Not reproduced: " + " ".join(notes),
        rows,
        [table],
    )


def _fig2_closed_forms(runs: Runs, allocator: str, workload: str, sigma: float = 1.0) -> tuple[dict, dict]:
    """kvbench's closed-form breakdown (% of KV) and the run's, for one system."""
    result = runs(_system_run(allocator, workload, sigma))
    s = result.summary
    prompt, output = _lengths(result)
    s_max = vm.workload(workload)["s_max_tokens"]
    slots = vm.budget_slots()
    sim = {
        "token": _pct(s["frac_token"]),
        "reserved": _pct(s["frac_reserved_future"]),
        "internal": _pct(s["frac_internal"]),
        "external": _pct(s["frac_external"] + s["frac_free"] + s["frac_cached"]),
    }
    if allocator == "paged":
        block = s["block_size_tokens"]
        held = vm.held_shares(prompt, output, prompt + output)
        tail = (block - 1) / 2
        token = held["token"] / (held["token"] + tail)
        return {
            "token": _pct(token),
            "reserved": None,
            "internal": None,
            "external": None,
            "tail": tail,
            "held": held,
        }, sim
    reserved = vm.reservation_slots(POLICY[allocator], prompt, output, s_max, vm.granule_tokens(allocator))
    held = vm.held_shares(prompt, output, reserved)
    if allocator == "orca_max":
        k = vm.orca_max_batch(s_max)
        share = k / slots
        external = 1.0 - k * int(reserved[0]) / slots
    else:
        external = sim["external"] / 100.0  # dynamics: the run's (no closed form)
        share = (1.0 - external) / held["slots"]
        k = None
    return {
        "token": _pct(share * held["token"]),
        "reserved": _pct(share * held["reserved"]),
        "internal": _pct(share * held["internal"]),
        "external": _pct(external),
        "k": k,
        "held": held,
        "s_max": s_max,
    }, sim


def _fig2(runs: Runs, ref: dict, figures_dir: Path) -> Section:
    paper = ref["fig2_kv_usage_pct"]
    rows, kvbench_bars = [], {}
    slots = vm.budget_slots()
    for label, allocator in SYSTEMS:
        formula, sim = _fig2_closed_forms(runs, allocator, "sharegpt_like")
        kvbench_bars[label] = [sim["token"], sim["reserved"], sim["internal"], sim["external"]]
        cmd = command(_system_run(allocator, "sharegpt_like"))
        held = formula["held"]
        slug = allocator
        for i, (part, key) in enumerate(zip(FIG2_PARTS, ("token", "reserved", "internal", "external"), strict=True)):
            claim = paper[label][i]
            if claim is None:
                continue
            value = formula[key]
            sim_tol = None
            if allocator == "orca_max":
                k = formula["k"]
                text = {
                    "token": f"{k} slots x E_t[p + t] {held['token']:.1f} / {slots:,} budget slots",
                    "reserved": f"{k} x E_t[o - t] {held['reserved']:.1f} / {slots:,}",
                    "internal": f"{k} x E_t[{formula['s_max']} - p - o] {held['internal']:.1f} / {slots:,}",
                    "external": f"({slots:,} - {k} x {formula['s_max']:,}) / {slots:,}",
                }[key]
                sim_tol = 0.1
                why = (
                    "E_t: over the run's drawn lengths, each request weighted by the decode steps it holds its "
                    "slot (prefill time left out). The closed form and the run measure the same saturated "
                    "state (the run's breakdown is over the steps where memory binds)."
                )
            elif allocator == "paged":
                text = (
                    f"E_t[p + t] / (E_t[p + t] + (B - 1) / 2) = {held['token']:.1f} / "
                    f"({held['token']:.1f} + {formula['tail']:.1f}) (memory full of sequences, half a block unfilled each)"
                )
                why = (
                    f"The run's share is over the few steps where memory binds at {MEANS['sharegpt_like'][1]:g} req/s (kvbench's roofline "
                    "decodes faster than the paper's GPU, so vLLM rarely saturates), and includes free slots "
                    "held back while the next request does not fit; the closed form assumes memory full."
                )
            elif key == "external":
                text = "— (free holes depend on the order of arrivals and finishes: the run's value)"
                why = "No closed form: the value shown is the run's time-weighted free share while memory binds."
            else:
                text = (
                    f"(1 - external {formula['external']:.1f} %, the run's) x E_t[{key}] / E_t[reservation "
                    f"{held['slots']:.0f} slots]"
                )
                why = (
                    f"Reservations are buddy-rounded to power-of-two blocks of {vm.granule_tokens(allocator)}-token granules; kvbench counts "
                    "that rounding as internal fragmentation. The split of the allocated share is a closed form; "
                    "the allocated share itself is the run's."
                )
            diff_why = {
                ("orca_pow2", "internal"): " The paper's Pow2 bars (13.6 % internal, 41.6 % external) and its Oracle "
                "bar with no internal fragmentation suggest it counted the buddy rounding as external "
                "fragmentation & others; kvbench books it inside the reservation, as internal.",
                ("orca_pow2", "external"): " See the internal row: the paper books the buddy rounding here.",
                ("orca_oracle", "internal"): " The paper's Oracle reserves exactly p + o with no rounding "
                "(0 %); kvbench's oracle still rounds to a power-of-two buddy block.",
                (
                    "orca_oracle",
                    "external",
                ): " The paper's 36.6 % likely holds buddy rounding kvbench books as internal.",
            }.get((allocator, key), "")
            rows.append(
                Row(
                    f"vllm.fig2_{slug}_{key}",
                    "Fig. 2",
                    f"{label}: {part} (% of KV memory)",
                    "%",
                    f"{claim}",
                    text,
                    value,
                    simulated=sim[key],
                    run=cmd,
                    why=why + diff_why + " The paper gives only the means of ShareGPT's lengths; the "
                    f"lognormal sigma {_sigma('sharegpt_like'):.1f} is kvbench's assumption (see the "
                    "sensitivity table).",
                    sim_tol=sim_tol,
                )
            )
    # sensitivity
    records = []
    for sigma in SIGMAS:
        for label, allocator in SYSTEMS:
            s = runs.summary(_system_run(allocator, "sharegpt_like", sigma))
            records.append(
                {
                    "sigma": sigma,
                    "system": label,
                    "token_pct": _pct(s["frac_token"]),
                    "reservation_pct": _pct(s["frac_reserved_future"]),
                    "internal_pct": _pct(s["frac_internal"]),
                    "external_and_free_pct": _pct(s["frac_external"] + s["frac_free"] + s["frac_cached"]),
                    "breakdown_period": s["breakdown_period"],
                    "saturated_fraction": s["saturated_fraction"],
                }
            )
    sens = Table(
        "vllm_fig2_sigma_sensitivity",
        "Fig. 2 bars (kvbench runs, % of KV while memory binds) as the lognormal sigma of ShareGPT-like "
        "lengths moves, the paper's means kept (median = mean / e^(sigma^2 / 2)); not tuned to match. "
        "breakdown_period 'all': memory never bound in that run, so its bars are over the whole run",
        pd.DataFrame(records),
        run=command(_system_run("orca_max", "sharegpt_like", 0.5)) + " ...",
        decimals={c: 1 for c in ("token_pct", "reservation_pct", "internal_pct", "external_and_free_pct")},
    )
    path = _fig2_figure(paper, kvbench_bars, figures_dir / "vllm_fig2_memory_breakdown.png")
    fig = Figure(
        "Fig. 2: KV memory breakdown, the paper's bars beside kvbench's runs "
        f"(OPT-13B, A100-40GB, ShareGPT-like at {MEANS['sharegpt_like'][1]:g} req/s)",
        path,
    )
    return Section(
        "Fig. 2: memory breakdown",
        "Share of the KV budget while memory binds, OPT-13B on the A100-40GB, "
        f"ShareGPT-like traffic at {MEANS['sharegpt_like'][1]:g} req/s.",
        rows,
        [sens],
        [fig],
    )


def _fig2_figure(paper: dict, kvbench_bars: dict, path: Path) -> Path:
    fig, ax = new_figure(8.0, 4.2)
    colors = ("#4c72b0", "#dd8452", "#c44e52", "#8c8c8c")
    x = 0.0
    ticks, labels = [], []
    for label, _ in SYSTEMS:
        for who, values in (("paper", paper[label]), ("kvbench", kvbench_bars[label])):
            bottom = 0.0
            known = [0.0 if v is None else v for v in values]
            for part, value, color in zip(FIG2_PARTS, known, colors, strict=True):
                ax.bar(
                    x,
                    value,
                    0.8,
                    bottom=bottom,
                    color=color,
                    label=part if x == 0 else None,
                    hatch="//" if who == "paper" else None,
                    edgecolor="white",
                )
                bottom += value
            if who == "paper" and any(v is None for v in values):
                ax.bar(x, 100.0 - bottom, 0.8, bottom=bottom, color="#eeeeee", edgecolor="white")
            ticks.append(x)
            labels.append(label.replace(" (", "\n(") + "\n" + who)  # "Orca", "(Max)", "paper" on three lines
            x += 1.0
        x += 0.6
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_ylabel("% of KV memory")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4)
    ax.set_title("KV memory breakdown (hatched: the vLLM paper; plain: kvbench)", fontsize=9)
    return save(fig, path)


def _fig13(runs: Runs, ref: dict) -> Section:
    paper = ref["fig13_avg_batched_requests_opt13b"]
    cm = vm.cost()
    slots = vm.budget_slots()
    rows, records = [], []
    for workload, key in (("sharegpt_like", "ShareGPT_2rps"), ("alpaca_like", "Alpaca_30rps")):
        name, rate = MEANS[workload]
        for label, allocator in SYSTEMS:
            result = runs(_system_run(allocator, workload))
            prompt, output = _lengths(result)
            s_max = vm.workload(workload)["s_max_tokens"]
            sim = result.summary["mean_concurrency"]
            if allocator == "orca_max":
                value = float(vm.orca_max_batch(s_max))
                granule, kv = vm.granule_tokens(allocator), cm.model.kv_bytes_per_token
                per_request = int(vm.buddy_slots(np.array([s_max]), granule)[0]) // granule
                text = (
                    f"floor over buddy blocks of {slots // granule:,} granules (budget "
                    f"{configs.built(BASE).budget_bytes:,} B / ({granule} x {kv:,} B)) / {per_request} granules per "
                    f"{s_max:,}-token reservation = {value:.0f}"
                )
                sim_tol, why = (
                    0.05,
                    (
                        "Memory binds from the first seconds on: the run's time-weighted batch is the "
                        f"closed form's {value:.0f} except while the batch first fills."
                    ),
                )
            else:
                held = vm.held_shares(
                    prompt,
                    output,
                    prompt + output
                    if allocator == "paged"
                    else vm.reservation_slots(POLICY[allocator], prompt, output, s_max, vm.granule_tokens(allocator)),
                )
                per_seq = (
                    held["token"] + (result.summary["block_size_tokens"] - 1) / 2
                    if allocator == "paged"
                    else held["slots"]
                )
                memory_bound = slots / per_seq
                little = vm.little_batch(rate, output, held["token"], cm)
                value = min(memory_bound, little)
                text = (
                    f"min(memory bound {slots:,} / {per_seq:.0f} slots per sequence = {memory_bound:.1f}, "
                    f"Little's law {rate:g} req/s x E[o] {output.mean():.0f} x roofline step = {little:.1f})"
                )
                sim_tol = None
                why = (
                    "The run measures the time-weighted number of running sequences, with queueing, prefill "
                    "steps and fragmentation; the closed form is a bound (memory) or a steady state (Little's law "
                    f"with kvbench's uncalibrated roofline decode step, {cm.weights_time_s * 1e3:.1f} ms of weights "
                    "for OPT-13B on the A100). The paper's batches come from a real GPU whose steps are longer, so "
                    "more requests overlap at the same rate: where memory does not bind, kvbench's batch is smaller "
                    "by the ratio of step times (the step-time table below runs the what-if)."
                )
            records.append(
                {
                    "workload": name,
                    "rate_per_s": rate,
                    "system": label,
                    "paper": paper[key][label],
                    "closed_form": value,
                    "simulated": sim,
                }
            )
            rows.append(
                Row(
                    f"vllm.fig13_{workload.removesuffix('_like')}_{allocator}",
                    "Fig. 13",
                    f"{label}: average batched requests, {name} at {rate:g} req/s",
                    "requests",
                    f"{paper[key][label]:.2f}",
                    text,
                    value,
                    simulated=sim,
                    run=command(_system_run(allocator, workload)),
                    sim_tol=sim_tol,
                    why=why + f" Lengths: lognormal sigma {_sigma(workload):.1f} around the paper's means "
                    "(kvbench's assumption).",
                )
            )
    sens = []
    for workload in ("sharegpt_like", "alpaca_like"):
        for sigma in SIGMAS:
            for label, allocator in SYSTEMS:
                sens.append(
                    {
                        "workload": MEANS[workload][0],
                        "sigma": sigma,
                        "system": label,
                        "mean_batched": runs.summary(_system_run(allocator, workload, sigma))["mean_concurrency"],
                    }
                )
    # What-if, not a calibration: the same runs on a GPU whose decode steps take STEP_STRETCH times
    # longer (HBM bandwidth divided), to show how much of the gap is the uncalibrated step time
    bandwidth = vm.hardware("a100-40gb").hbm_bandwidth_bytes_per_s
    stretch = []
    for workload, key in (("sharegpt_like", "ShareGPT_2rps"), ("alpaca_like", "Alpaca_30rps")):
        for factor in STEP_STRETCH:
            slower = () if factor == 1 else (f"hardware.hbm_bandwidth_bytes_per_s={bandwidth / factor:.6g}",)
            for label, allocator in SYSTEMS:
                stretch.append(
                    {
                        "workload": MEANS[workload][0],
                        "step_stretch": factor,
                        "system": label,
                        "paper": paper[key][label],
                        "mean_batched": runs.summary(_system_run(allocator, workload, extra=slower))[
                            "mean_concurrency"
                        ],
                    }
                )
    vllm_batch = paper["ShareGPT_2rps"]["vLLM"]
    share_rate = MEANS["sharegpt_like"][1]
    share_out = ref["fig11_dataset_means_tokens"]["ShareGPT"]["output_mean"]
    implied_s = vllm_batch / (share_rate * share_out)
    tables = [
        Table(
            "vllm_fig13_batched_requests",
            "Fig. 13 beside kvbench's closed form and runs",
            pd.DataFrame(records),
            decimals={"closed_form": 2, "simulated": 2},
        ),
        Table(
            "vllm_fig13_step_sensitivity",
            "Fig. 13's average batch in kvbench's runs if every decode step took "
            "1x, 2x or 3x as long as kvbench's uncalibrated roofline says (HBM bandwidth divided by the factor: a "
            f"what-if, not a calibration). By Little's law the paper's vLLM batch of {vllm_batch} at {share_rate:g} req/s "
            f"with a mean output of {share_out} tokens means {implied_s * 1e3:.0f} ms per step, "
            f"{implied_s / cm.weights_time_s:.1f}x the roofline's {cm.weights_time_s * 1e3:.1f} ms of weight reads",
            pd.DataFrame(stretch),
            decimals={"paper": 2, "mean_batched": 2},
        ),
        Table(
            "vllm_fig13_sigma_sensitivity",
            "Fig. 13's average batch in kvbench's runs as the lognormal sigma moves (means kept); not tuned to match",
            pd.DataFrame(sens),
            decimals={"mean_batched": 2},
        ),
    ]
    return Section(
        "Fig. 13: average batched requests",
        "OPT-13B on the A100-40GB; the time-weighted number of running sequences (the summary's mean_concurrency).",
        rows,
        tables,
    )


def _fig15(runs: Runs, ref: dict) -> Section:
    paper = ref["fig15_memory_saving_pct_opt13b_alpaca"]
    rows, records = [], []
    block = int(configs.composed(["allocator=paged"]).allocator.block_size_tokens)
    fork = float(vm.workload("alpaca_like")["beam_fork_probability"])  # kvbench's default assumption

    def fan(workload: str, n: int, kind: str, probability: float | None = None, num_requests: int = 300) -> list[str]:
        extra = [f"workload.num_requests={num_requests}", f"workload.num_branches={n}", f"workload.fan_out={kind}"]
        if probability is not None:
            extra.append(f"workload.beam_fork_probability={probability}")
        return ["allocator=paged", *BASE, f"workload={workload}", *extra]

    single = runs(_system_run("paged", "alpaca_like"))
    prompt1, output1 = _lengths(single)
    # where the closed form and a run measure the same thing: every branch as long as the others
    # (fixed lengths), so the prompt's blocks stay shared for the request's whole decode
    equal_n = 2
    equal = [
        "allocator=paged",
        *BASE,
        "workload=alpaca_like",
        "workload.lengths=fixed",
        "workload.prompt_tokens=40",
        "workload.output_tokens=58",
        "workload.num_requests=30",
        f"workload.num_branches={equal_n}",
    ]
    equal_run = runs(equal)
    equal_p, equal_o = _lengths(equal_run)
    equal_closed = _pct(vm.sampling_saving(equal_p, np.rint(equal_o / equal_n).astype(np.int64), equal_n, block))
    equal_sim = _pct(token_saving(equal_run))
    for n in (2, 4, 6):
        over = fan("alpaca_like", n, "sample")
        result = runs(over)
        prompt, output = _lengths(result)
        branch = np.maximum(1, np.rint(output / n).astype(np.int64))
        value = _pct(vm.sampling_saving(prompt, branch, n, block))
        sim = _pct(token_saving(result))
        records.append(
            {
                "fan_out": "sample",
                "n": n,
                "beam_fork_probability": None,
                "closed_form_blocks_pct": value,
                "run_token_slots_pct": sim,
                "paper_pct": paper["parallel_sampling"][str(n)],
            }
        )
        rows.append(
            Row(
                f"vllm.fig15_sampling_n{n}",
                "Fig. 15",
                f"memory saving, parallel sampling n = {n} (Alpaca)",
                "%",
                f"{paper['parallel_sampling'][str(n)]}",
                f"sum (n - 1) floor(p / {block}) o / sum n sum_t ceil((p + t) / {block}) over the run's requests",
                value,
                simulated=sim,
                run=command(over),
                why=f"Only the prompt's full {block}-token blocks are shared (the partly filled one is copied "
                f"on write): Alpaca-like prompts (median {vm.workload('alpaca_like')['prompt_tokens']} "
                "tokens) mostly fill none. The closed form gives "
                "every branch the request's mean branch length; in the run each branch draws its own "
                "(lognormal) length, and the prompt stays shared only while two branches are alive, so the "
                f"run saves less. With equal branches the two agree, up to blocks against token slots: {equal_closed:.1f} % (closed form) "
                f"and {equal_sim:.1f} % (run) for `{command(equal)}`. The paper's saving reflects its real "
                "prompt lengths, whose shape kvbench assumes lognormal.",
            )
        )
    for n in (2, 4, 6):
        for probability in FORK_PROBABILITIES:
            over = fan("alpaca_like", n, "beam", probability, num_requests=BEAM_REQUESTS)
            sim = _pct(token_saving(runs(over)))
            records.append(
                {
                    "fan_out": "beam",
                    "n": n,
                    "beam_fork_probability": probability,
                    "closed_form_blocks_pct": None,
                    "run_token_slots_pct": sim,
                    "paper_pct": paper["beam_search"][str(n)],
                }
            )
            if probability == fork:
                rows.append(
                    Row(
                        f"vllm.fig15_beam_n{n}",
                        "Fig. 15",
                        f"memory saving, beam search width {n} (Alpaca)",
                        "%",
                        f"{paper['beam_search'][str(n)]}",
                        "— (no closed form: beams re-fork at random; the claim is judged against the run's "
                        "token-slot saving)",
                        None,
                        simulated=sim,
                        run=command(over),
                        why="kvbench has no token model: a beam is replaced by a copy of another with "
                        f"probability {fork:g} after each step (workload.beam_fork_probability, an "
                        f"assumption; the table sweeps {' / '.join(f'{q:g}' for q in FORK_PROBABILITIES)}). "
                        f"Measured in token slots over {BEAM_REQUESTS} requests.",
                    )
                )
    # §3's prompt share and ShareGPT's ranges
    n = 2
    share = float((output1 * prompt1).sum() / (output1 * prompt1 + n * output1 * (output1 + 1) / 2).sum())
    rows.append(
        Row(
            "vllm.sec3_prompt_share_of_kv",
            "§3",
            "prompt KV as a share of all KV, parallel sampling",
            "%",
            "12",
            f"sum o p / sum (o p + n o (o + 1) / 2), n = {n}, over the Alpaca-like run's lengths",
            _pct(share),
            run=command(_system_run("paged", "alpaca_like")),
            why="The paper does not say which workload or n its 12 % is for; kvbench takes Alpaca-like "
            f"lengths, n = {n} branches each storing its own output, the prompt once, time-weighted.",
        )
    )
    ranges = paper["ShareGPT_text_only"]
    for kind, key in (("sample", "parallel_sampling"), ("beam", "beam_search")):
        low, high = (float(x.rstrip("%")) for x in ranges[key].split("-"))
        values = [
            _pct(token_saving(runs(fan("sharegpt_like", n, kind, num_requests=SHAREGPT_FAN_REQUESTS))))
            for n in (2, 4, 6)
        ]
        for n, v in zip((2, 4, 6), values, strict=True):
            records.append(
                {
                    "fan_out": f"{kind} (ShareGPT)",
                    "n": n,
                    "beam_fork_probability": fork if kind == "beam" else None,
                    "closed_form_blocks_pct": None,
                    "run_token_slots_pct": v,
                    "paper_pct": None,
                }
            )
        holds = all(low <= v <= high for v in values)
        rows.append(
            Row(
                f"vllm.fig15_sharegpt_{key}_range",
                "§6.3",
                f"memory saving on ShareGPT, {key.replace('_', ' ')}",
                "%",
                ranges[key],
                f"every n in 2, 4, 6 within [{low}, {high}] % in kvbench's runs",
                None,
                simulated=float(np.mean(values)),
                run=command(fan("sharegpt_like", 2, kind, num_requests=SHAREGPT_FAN_REQUESTS)) + " (n = 2, 4, 6)",
                holds=holds,
                why=f"kvbench's token-slot savings for n = 2, 4, 6: {', '.join(f'{v:.1f}' for v in values)} % "
                f"({SHAREGPT_FAN_REQUESTS} requests each; ShareGPT-like prompts fill several {block}-token "
                f"blocks, so sharing saves more than on Alpaca). Beam search at fork probability {fork:g}, "
                "an assumption.",
            )
        )
    table = Table(
        "vllm_fig15_memory_saving",
        "Fig. 15: memory saving by sharing, kvbench's closed form (blocks) "
        "and runs (token slots); beam search swept over the fork probability",
        pd.DataFrame(records),
        decimals={"closed_form_blocks_pct": 2, "run_token_slots_pct": 2},
    )
    return Section(
        "Fig. 15: memory saved by sharing",
        f"OPT-13B, Alpaca-like traffic at {MEANS['alpaca_like'][1]:g} "
        f"req/s, paged with {block}-token blocks; saving = blocks saved by sharing / blocks without "
        "sharing.",
        rows,
        [table],
    )


def _block_size(runs: Runs, ref: dict, figures_dir: Path) -> Section:
    records, curves, mean_tokens = [], {}, {}
    for workload in ("sharegpt_like", "alpaca_like"):
        rate = BLOCK_SWEEP_RATE[workload]
        values = []
        for block in BLOCK_SIZES:
            over = [
                "allocator=paged",
                *BASE,
                f"workload={workload}",
                f"workload.rate_per_s={rate}",
                f"workload.num_requests={BLOCK_SWEEP_REQUESTS}",
                f"allocator.block_size_tokens={block}",
            ]
            result = runs(over)
            value = normalized_latency(result)
            values.append(value)
            prompt, output = _lengths(result)
            mean_tokens[workload] = float((prompt + output).mean())
            records.append(
                {
                    "workload": MEANS[workload][0],
                    "rate_per_s": rate,
                    "block_size": block,
                    "normalized_latency_s_per_token": value,
                    "num_preemptions": result.summary["num_preemptions"],
                    "mean_batched": result.summary["mean_concurrency"],
                }
            )
        curves[MEANS[workload][0]] = values
    sg, al = np.array(curves["ShareGPT"]), np.array(curves["Alpaca"])
    sizes = np.array(BLOCK_SIZES)
    mid = (sizes >= 16) & (sizes <= 128)
    sg_holds = bool(np.all(sg[mid] <= 1.1 * sg.min()))
    good = (sizes == 16) | (sizes == 32)
    al_holds = bool(np.all(al[good] <= 1.1 * al.min()) and np.all(al[sizes >= 128] > 1.1 * al.min()))
    run = (
        f"kvbench allocator=paged {' '.join(BASE)} workload=<w> workload.rate_per_s=<r> "
        f"workload.num_requests={BLOCK_SWEEP_REQUESTS} allocator.block_size_tokens={BLOCK_SIZES[0]},...,{BLOCK_SIZES[-1]}"
    )
    note = (
        " kvbench's kernels run at one speed whatever the block size (uncalibrated), so small blocks cost "
        "nothing here; on the paper's GPU, blocks below 16 underuse the kernel, which kvbench can show only with "
        "a calibration measured on a GPU."
    )
    rows = [
        Row(
            "vllm.sec7_2_sharegpt_block_16_128",
            "§7.2",
            "ShareGPT: block sizes 16-128 perform best",
            "",
            ref["sec7_2_block_size"].split(";")[0],
            "every block size in 16..128 within 10 % of the best normalized "
            f"latency at {BLOCK_SWEEP_RATE['sharegpt_like']:g} req/s",
            None,
            run=run,
            holds=sg_holds,
            why="Normalized latency (s/token) per block: "
            + ", ".join(f"{b}: {v:.4f}" for b, v in zip(BLOCK_SIZES, sg, strict=True))
            + ". Larger blocks leave more unfilled tail per sequence, fewer sequences fit, and at this load the queue "
            "grows." + note,
        ),
        Row(
            "vllm.sec7_2_alpaca_block_16_32",
            "§7.2",
            "Alpaca: 16 and 32 work well, larger sizes degrade",
            "",
            "16 and 32 work well; larger degrade",
            "16 and 32 within 10 % of the best, 128 and 256 more than 10 % worse "
            f"(at {BLOCK_SWEEP_RATE['alpaca_like']:g} req/s)",
            None,
            run=run,
            holds=al_holds,
            why="Normalized latency (s/token) per block: "
            + ", ".join(f"{b}: {v:.4f}" for b, v in zip(BLOCK_SIZES, al, strict=True))
            + f". Alpaca's short sequences (about {mean_tokens['alpaca_like']:.0f} tokens) waste most of a large block."
            + note,
        ),
    ]
    fig, ax = new_figure(6.0, 3.6)
    for name, values in curves.items():
        ax.plot(BLOCK_SIZES, values, marker="o", label=f"{name} ({BLOCK_SWEEP_RATE[name.lower() + '_like']:g} req/s)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(BLOCK_SIZES, [str(b) for b in BLOCK_SIZES])
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel("normalized latency (s/token)")
    ax.legend(fontsize=8)
    ax.set_title("kvbench: normalized latency by block size (OPT-13B, A100-40GB)", fontsize=9)
    path = save(fig, figures_dir / "vllm_block_size.png")
    return Section(
        "§7.2: block size",
        "Paged, OPT-13B on the A100-40GB, at a rate where memory binds.",
        rows,
        [
            Table(
                "vllm_block_size",
                "Normalized latency by block size (kvbench runs)",
                pd.DataFrame(records),
                run,
                decimals={"normalized_latency_s_per_token": 4, "mean_batched": 1},
            )
        ],
        [Figure("kvbench's normalized latency by block size", path)],
    )


def _swap_recompute(runs: Runs, ref: dict, figures_dir: Path) -> Section:
    cm = vm.cost()
    hw = cm.hardware
    result = runs(_system_run("paged", "sharegpt_like"))
    prompt, output = _lengths(result)
    tokens = round(vm.held_shares(prompt, output, prompt + output)["token"])
    closed = [
        {"block_size": b, "swap_s": vm.swap_round_trip_s(tokens, b, cm), "recompute_s": vm.recompute_s(tokens, cm)}
        for b in (1, 2, 4, *BLOCK_SIZES)
    ]
    # vLLM's swap copied each block once per layer for K and once for V: 2 x L copies per block
    copies = 2 * cm.model.num_layers
    per_layer = dataclasses.replace(cm.hardware, host_transfer_overhead_s=copies * hw.host_transfer_overhead_s)
    cm_layers = CostModel(cm.model, per_layer)
    for record in closed:
        record["swap_s_per_layer_copies"] = vm.swap_round_trip_s(tokens, record["block_size"], cm_layers)
    frame = pd.DataFrame(closed)
    run_records = []
    for preemption in ("swap", "recompute"):
        for block in BLOCK_SIZES:
            over = [
                "allocator=paged",
                *BASE,
                "workload=sharegpt_like",
                "workload.num_requests=300",
                f"hardware.kv_budget_bytes={PRESSURE_BUDGET}",
                f"preemption={preemption}",
                f"allocator.block_size_tokens={block}",
            ]
            r = runs(over)
            s = r.summary
            run_records.append(
                {
                    "preemption": preemption,
                    "block_size": block,
                    "num_preemptions": s["num_preemptions"],
                    "preemption_cost_s": s["preemption_cost_s"],
                    "cost_per_preemption_s": s["preemption_cost_s"] / max(s["num_preemptions"], 1),
                    "normalized_latency_s_per_token": normalized_latency(r),
                }
            )
    runs_frame = pd.DataFrame(run_records)
    swap, rec = frame["swap_s"].to_numpy(), frame["recompute_s"].to_numpy()
    swap_l = frame["swap_s_per_layer_copies"].to_numpy()
    sizes = frame["block_size"].to_numpy()
    kv_sizes = np.isin(sizes, BLOCK_SIZES)
    nl = runs_frame.pivot(index="block_size", columns="preemption", values="normalized_latency_s_per_token")
    comparable = bool(np.all(np.abs(nl.loc[[16, 32, 64], "recompute"] / nl.loc[[16, 32, 64], "swap"] - 1) <= 0.1))
    formula = (
        f"a {tokens}-token sequence (ShareGPT-like's time-weighted mean): swap = 2 x ({tokens} x "
        f"{cm.model.kv_bytes_per_token:,} B / "
        f"{hw.host_link_bytes_per_s / 1e9:g} GB/s + ceil({tokens} / B) x {hw.host_transfer_overhead_s * 1e6:g} us); "
        f"recompute = prefill of {tokens} tokens = {rec[0] * 1e3:.1f} ms"
    )
    per_copy = (
        " kvbench charges one copy of hardware.host_transfer_overhead_s "
        f"({hw.host_transfer_overhead_s * 1e6:g} us, an assumption) per block swapped; vLLM's swap copied every "
        f"block once per layer for K and for V (2 x {cm.model.num_layers} copies per block for OPT-13B), so its "
        f"per-block overhead was about {copies}x kvbench's, which is what made small blocks expensive (the rows 'with per-layer copies' below price that). Block sizes 1-4 are outside kvbench's allocator (8-256) and appear only in the closed form."
    )
    claim = ref["sec7_3_swap_vs_recompute"]
    rows = [
        Row(
            "vllm.sec7_3_swap_excessive_small_blocks",
            "§7.3",
            "swap overhead excessive at small block sizes",
            "",
            claim.split(";")[0],
            "swap(B = 8) at least 2x swap(B = 256)",
            None,
            run=formula,
            holds=bool(swap[sizes == 8][0] >= 2 * swap[sizes == 256][0]),
            why=f"swap of the {tokens}-token sequence: "
            + ", ".join(f"B={b}: {s * 1e3:.1f} ms" for b, s in zip(sizes, swap, strict=True))
            + "."
            + per_copy,
        ),
        Row(
            "vllm.sec7_3_recompute_constant",
            "§7.3",
            "recompute overhead constant across block sizes",
            "",
            "recompute overhead is constant across block sizes",
            "recompute(B) the same for every B (kvbench's prefill does not read blocks)",
            None,
            run=formula,
            holds=bool(np.ptp(rec) == 0.0),
            why=f"{rec[0] * 1e3:.1f} ms at every block size; the runs (table) differ only through which victims they preempt.",
        ),
        Row(
            "vllm.sec7_3_recompute_small_swap_large",
            "§7.3",
            "recompute better at small blocks, swap better at large",
            "",
            "recompute better at small blocks, swap better at large blocks",
            "recompute(8) < swap(8) and swap(256) < recompute(256)",
            None,
            run=formula,
            holds=bool(rec[sizes == 8][0] < swap[sizes == 8][0] and swap[sizes == 256][0] < rec[sizes == 256][0]),
            why=f"kvbench: swap {swap[sizes == 8][0] * 1e3:.1f} ms at B=8 against recompute {rec[0] * 1e3:.1f} ms; the "
            "roofline prefill of OPT-13B is slower than a 32 GB/s transfer of the same KV at every block size "
            "kvbench allows, and the crossing only appears at B=1 in the closed form"
            f" ({swap[0] * 1e3:.1f} ms)." + per_copy,
        ),
        Row(
            "vllm.sec7_3_recompute_within_20pct",
            "§7.3",
            "recompute overhead never above 20 % of swap's latency",
            "",
            "recompute never more than 20% above swap",
            "recompute(B) <= 1.2 x swap(B) for every B in 8..256 (read as: "
            "recompute is never more than 20 % slower than swapping)",
            None,
            run=formula,
            holds=bool(np.all(rec[kv_sizes] <= 1.2 * swap[kv_sizes])),
            why="recompute / swap: "
            + ", ".join(
                f"B={b}: {r / s:.2f}" for b, r, s in zip(sizes[kv_sizes], rec[kv_sizes], swap[kv_sizes], strict=True)
            )
            + ". The paper's sentence is ambiguous; kvbench reads it as a bound on recompute's excess. "
            f"kvbench's recompute is an uncalibrated roofline prefill at {hw.prefill_flops_efficiency * 100:g} % "
            "of peak FLOP/s and its swap "
            "an ideal PCIe link: both are assumptions a GPU calibration would replace.",
        ),
        Row(
            "vllm.sec7_3_comparable_16_64",
            "§7.3",
            "swap and recompute comparable end to end at blocks 16-64",
            "",
            "comparable end-to-end for block sizes 16-64",
            "normalized latency of recompute within 10 % of swap's at "
            f"B = 16, 32, 64 (runs with a {float(PRESSURE_BUDGET) / 1e9:g} GB KV budget)",
            None,
            run="kvbench allocator=paged model=opt-13b hardware=a100-40gb workload=sharegpt_like workload.num_requests=300 "
            f"hardware.kv_budget_bytes={PRESSURE_BUDGET} preemption=swap,recompute "
            f"allocator.block_size_tokens={BLOCK_SIZES[0]},...,{BLOCK_SIZES[-1]}",
            holds=comparable,
            why="Normalized latency (s/token), swap / recompute: "
            + ", ".join(f"B={b}: {nl.loc[b, 'swap']:.4f} / {nl.loc[b, 'recompute']:.4f}" for b in BLOCK_SIZES)
            + f". The budget is cut to {float(PRESSURE_BUDGET) / 1e9:g} GB so that preemption happens.",
        ),
    ]
    # the same claims if every block costs vLLM's 2 x L copies (an assumption about its swap, stated)
    layers = (
        f"kvbench's closed form with {copies} copies of {hw.host_transfer_overhead_s * 1e6:g} us per block "
        f"(vLLM's swap copied each block once per layer for K and for V; OPT-13B has {cm.model.num_layers} "
        "layers): "
    )
    swaps_l = "swap " + ", ".join(f"B={b}: {v * 1e3:.1f} ms" for b, v in zip(sizes, swap_l, strict=True))
    formula_l = formula.replace(
        f"x {hw.host_transfer_overhead_s * 1e6:g} us)", f"x {copies} x {hw.host_transfer_overhead_s * 1e6:g} us)"
    )
    small, large = sizes == 8, sizes == 256
    rows += [
        Row(
            "vllm.sec7_3_swap_excessive_small_blocks_per_layer",
            "§7.3",
            "swap overhead excessive at small block sizes, with per-layer copies",
            "",
            claim.split(";")[0],
            "swap(B = 8) at least 2x swap(B = 256)",
            None,
            run=formula_l,
            holds=bool(swap_l[small][0] >= 2 * swap_l[large][0]),
            why=layers + swaps_l + ".",
        ),
        Row(
            "vllm.sec7_3_recompute_small_swap_large_per_layer",
            "§7.3",
            "recompute better at small blocks, swap better at large, with per-layer copies",
            "",
            "recompute better at small blocks, swap better at large blocks",
            "recompute(8) < swap(8) and swap(256) < recompute(256)",
            None,
            run=formula_l,
            holds=bool(rec[small][0] < swap_l[small][0] and swap_l[large][0] < rec[large][0]),
            why=layers + swaps_l + f"; recompute {rec[0] * 1e3:.1f} ms at every block size.",
        ),
        Row(
            "vllm.sec7_3_recompute_within_20pct_per_layer",
            "§7.3",
            "recompute overhead never above 20 % of swap's latency, with per-layer copies",
            "",
            "recompute never more than 20% above swap",
            "recompute(B) <= 1.2 x swap(B) for every B in 8..256",
            None,
            run=formula_l,
            holds=bool(np.all(rec[kv_sizes] <= 1.2 * swap_l[kv_sizes])),
            why=layers
            + "recompute / swap: "
            + ", ".join(
                f"B={b}: {r / v:.2f}" for b, r, v in zip(sizes[kv_sizes], rec[kv_sizes], swap_l[kv_sizes], strict=True)
            )
            + ".",
        ),
    ]
    fig, ax = new_figure(6.0, 3.6)
    ax.plot(sizes, swap * 1e3, marker="o", label="swap round trip (closed form)")
    ax.plot(sizes, swap_l * 1e3, marker="^", label=f"swap, {copies} copies per block (vLLM's per-layer copies)")
    ax.plot(sizes, rec * 1e3, marker="s", label="recompute (closed form)")
    per = runs_frame.pivot(index="block_size", columns="preemption", values="cost_per_preemption_s")
    ax.plot(per.index, per["swap"] * 1e3, ls="--", marker="x", label="swap, runs: cost per preemption")
    ax.plot(per.index, per["recompute"] * 1e3, ls="--", marker="+", label="recompute, runs: cost per preemption")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel("ms")
    ax.legend(fontsize=7)
    ax.set_title(f"kvbench: swap vs recompute of a {tokens}-token sequence (OPT-13B, A100-40GB)", fontsize=9)
    path = save(fig, figures_dir / "vllm_swap_recompute.png")
    return Section(
        "§7.3 / Fig. 19: swap against recompute",
        "kvbench's closed form for one sequence and runs under memory pressure.",
        rows,
        [
            Table(
                "vllm_swap_recompute_closed_form",
                "Swap and recompute of one sequence by block size (closed form)",
                frame,
                formula,
                decimals={"swap_s": 4, "recompute_s": 4, "swap_s_per_layer_copies": 4},
            ),
            Table(
                "vllm_swap_recompute_runs",
                "Preemption by swap and by recompute, by block size (runs, "
                f"{float(PRESSURE_BUDGET) / 1e9:g} GB KV budget)",
                runs_frame,
                decimals={"preemption_cost_s": 3, "cost_per_preemption_s": 4, "normalized_latency_s_per_token": 4},
            ),
        ],
        [Figure("Swap and recompute time by block size", path)],
    )


def _sustainable_rate(runs: Runs, allocator: str, workload: str, rates: tuple[float, ...], records: list) -> float:
    """The largest rate of the grid whose normalized latency stays within SUSTAINABLE_SLOWDOWN x
    the same system's at the grid's lowest rate."""
    best, light = 0.0, None
    for rate in rates:
        over = [
            f"allocator={allocator}",
            *BASE,
            f"workload={workload}",
            f"workload.rate_per_s={rate}",
            "workload.num_requests=300",
        ]
        value = normalized_latency(runs(over))
        light = value if light is None else light
        records.append(
            {
                "workload": MEANS[workload][0],
                "system": allocator,
                "rate_per_s": rate,
                "normalized_latency_s_per_token": value,
            }
        )
        if value <= SUSTAINABLE_SLOWDOWN * light:
            best = rate
    return best


def _throughput(runs: Runs, ref: dict) -> Section:
    records: list = []
    sg = {
        a: _sustainable_rate(runs, a, "sharegpt_like", SHAREGPT_RATES, records)
        for a in ("orca_max", "orca_oracle", "paged")
    }
    al = {a: _sustainable_rate(runs, a, "alpaca_like", ALPACA_RATES, records) for a in ("orca_oracle", "paged")}
    claims = ref["sec6_2_throughput_claims"]
    grid = (
        f"largest rate on a grid with normalized latency <= {SUSTAINABLE_SLOWDOWN:g}x the system's own at "
        "the grid's lowest rate (300 requests per run; the threshold is kvbench's choice)"
    )
    uncalibrated = (
        " kvbench's cost model is uncalibrated (no GPU has measured it), so this is a prediction, not a check."
    )

    def ratio(a: float, b: float) -> float | None:
        return a / b if b > 0 else None

    rows = [
        Row(
            "vllm.sec6_2_vs_orca_oracle",
            "§6.2",
            "request rate, vLLM / Orca (Oracle), ShareGPT",
            "x",
            claims["ShareGPT_vs_Orca_Oracle_request_rate"],
            f"paged {sg['paged']:g} / orca_oracle {sg['orca_oracle']:g} req/s: {grid}",
            ratio(sg["paged"], sg["orca_oracle"]),
            simulated=ratio(sg["paged"], sg["orca_oracle"]),
            gpu_only=True,
            why="The paper's range spans OPT-13B/66B/175B; kvbench runs OPT-13B only." + uncalibrated,
        ),
        Row(
            "vllm.sec6_2_vs_orca_max",
            "§6.2",
            "request rate, vLLM / Orca (Max), ShareGPT",
            "x",
            claims["ShareGPT_vs_Orca_Max_request_rate"],
            f"paged {sg['paged']:g} / orca_max {sg['orca_max']:g} req/s: {grid}",
            ratio(sg["paged"], sg["orca_max"]),
            simulated=ratio(sg["paged"], sg["orca_max"]),
            gpu_only=True,
            why="OPT-13B only." + uncalibrated,
        ),
        Row(
            "vllm.sec6_2_vs_fastertransformer",
            "§6.2",
            "request rate, vLLM / FasterTransformer",
            "x",
            claims["vs_FasterTransformer_request_rate"],
            "— (FasterTransformer is not modelled)",
            None,
            gpu_only=True,
            why="kvbench has request-level batching (scheduler=static) but not FasterTransformer's kernels or its "
            "memory manager; no prediction is made.",
        ),
        Row(
            "vllm.sec6_3_basic_sampling",
            "§6.3",
            "request rate, vLLM / Orca (Oracle), Alpaca basic sampling",
            "x",
            f"{ref['sec6_3_speedup_vs_orca_oracle_opt13b_alpaca']['basic_sampling']}x",
            f"paged {al['paged']:g} / orca_oracle {al['orca_oracle']:g} req/s: {grid}",
            ratio(al["paged"], al["orca_oracle"]),
            simulated=ratio(al["paged"], al["orca_oracle"]),
            gpu_only=True,
            why="Uncalibrated roofline; a coarse rate grid." + uncalibrated,
        ),
        Row(
            "vllm.sec6_3_beam_width_6",
            "§6.3",
            "request rate, vLLM / Orca (Oracle), beam width 6",
            "x",
            f"{ref['sec6_3_speedup_vs_orca_oracle_opt13b_alpaca']['beam_width_6']}x",
            "— (not run: beam-search rate sweeps are the slowest kvbench runs; see Fig. 15 for its memory)",
            None,
            gpu_only=True,
            why="Left out to keep the build short.",
        ),
        Row(
            "vllm.sec6_4_one_shot_prefix",
            "§6.4",
            "throughput, shared 80-token prefix (LLaMA-13B, WMT16)",
            "x",
            f"{ref['sec6_4_shared_prefix_llama13b_wmt16']['one_shot_80tok_prefix']}x",
            "— (no LLaMA-13B config, no WMT16 lengths)",
            None,
            gpu_only=True,
            why="kvbench can run workload.shared_prefix_tokens=80 with allocator=paged_cached, but not the "
            "paper's model and data; no prediction is made.",
        ),
        Row(
            "vllm.sec6_4_five_shot_prefix",
            "§6.4",
            "throughput, shared 341-token prefix (LLaMA-13B, WMT16)",
            "x",
            f"{ref['sec6_4_shared_prefix_llama13b_wmt16']['five_shot_341tok_prefix']}x",
            "— (as the one-shot row)",
            None,
            gpu_only=True,
            why="As the one-shot row.",
        ),
        Row(
            "vllm.sec6_5_chatbot",
            "§6.5",
            "chatbot request rate, vLLM / Orca baselines",
            "x",
            "2x",
            "— (no chat-history workload)",
            None,
            gpu_only=True,
            why="The paper's chatbot truncates real ShareGPT conversations to 1,024 tokens; kvbench has no such trace.",
        ),
        Row(
            "vllm.sec7_1_kernel_overhead",
            "§7.1",
            "PagedAttention kernel latency over FasterTransformer's",
            "%",
            "20-26%",
            "— (needs a GPU: kvbench's kernels run at one speed until calibrated)",
            None,
            gpu_only=True,
            why="gpu/run_all.sh measures kvbench's own kernels on a GPU; FasterTransformer's kernel is not among them.",
        ),
    ]
    return Section(
        "§6-§7.1: throughput and kernels (GPU only)",
        "What kvbench predicts uncalibrated, never judged.",
        rows,
        [
            Table(
                "vllm_rate_sweep",
                "Normalized latency by request rate (kvbench runs, 300 requests each)",
                pd.DataFrame(records),
                decimals={"normalized_latency_s_per_token": 4},
            )
        ],
    )


def build(runs: Runs, figures_dir: Path) -> Source:
    """The vLLM paper reproduced: every section's rows, tables and figures (figures written to
    ``figures_dir``)."""
    figures_dir = Path(figures_dir)
    ref = vm.reference()
    sections = [
        _kv_per_token(ref),
        _table1(ref),
        _fig2(runs, ref, figures_dir),
        _fig13(runs, ref),
        _fig15(runs, ref),
        _block_size(runs, ref, figures_dir),
        _swap_recompute(runs, ref, figures_dir),
        _throughput(runs, ref),
    ]
    return Source(
        name="vllm_paper",
        title="The vLLM paper (Kwon et al., SOSP 2023)",
        about='Kwon et al., "Efficient Memory Management for Large Language Model Serving with PagedAttention", '
        "SOSP 2023, arXiv:2309.06180. The paper's values are read from kvbench/studies/paper/data/"
        "vllm_paper_reference.json; kvbench's closed forms come from its model, hardware and cost-model "
        "specs, and its runs from the Orca baselines (allocator=orca_max, orca_pow2, orca_oracle) and "
        "PagedAttention (allocator=paged). Request lengths are lognormal around the paper's published means "
        "(an assumption, with a sensitivity sweep); throughput and kernel claims need a GPU and are shown, "
        "not judged.",
        sections=sections,
    )
