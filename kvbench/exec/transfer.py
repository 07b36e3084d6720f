"""A kernel's decode attention on a GPU where it was never measured: the partner-ratio transfer.

kvbench's own ``flashinfer`` and ``triton`` kernels have no public measurement on H100 or H200 at
Llama-2-7B's shape (aiconfigurator-core 0.12.0 times SGLang's FlashInfer backend on L40S, RTX PRO
6000 and the Blackwell GPUs only, and SGLang's Triton backend on H100/H200 at head_dim 256 and
512, grouped-query shapes only). Both were measured beside a *partner*, TRT-LLM's PyTorch-flow
attention (``torch_flow``, TRT-LLM 1.3.0rc20), on every one of those GPUs and on H100/H200 at every
shape the run needs. The transfer prices kernel K on GPU T at shape S, point by point of the
partner's measured (batch, context) grid on T::

    K(T, S, b, s) = partner(T, S, b, s) * exp(mean over sources of log(K(g, S', b, s) / partner(g, S', b, s)))

where each source is a measured table of K on GPU g at shape S' (with the partner measured at the
same g and S'). A source lacking the point (b, s) lends its nearest measured point (nearest batch,
then nearest context, in log scale): the ratio is flat where both kernels are bandwidth-bound.

Which sources, by kernel (``RULES``):

- **FlashInfer** (``same_shape``): its tables at the target's exact shape (heads, KV heads,
  head_dim, KV dtype) on every other GPU; the ratio carries what FlashInfer does differently from
  TRT-LLM's kernel at that shape, the partner carries the target GPU.
- **Triton** (``nearest_shape``): no GPU measured SGLang's Triton decode at a multi-head-attention
  shape with head_dim 128, so the sources are its tables at the nearest measured shapes (distance:
  |log2| of the head_dim ratio plus |log2| of the KV-head ratio, :data:`DISTANCE`, chosen held
  out among :data:`DISTANCES`; ties: all of them), on every GPU, the target's own counted twice (a ratio carries its GPU). For
  Llama-2-7B that is RTX PRO 6000's head_dim 128 table at 40/8 heads.

Held out (:func:`leave_one_out`): each measured table of the kernel that has a partner is hidden
and predicted from the rest by the same rule; for Triton every table of the hidden one's shape is
hidden too (on every GPU), since the runs it prices have none. ``python -m kvbench.studies.transfer``
prints, and ``docs/transfer/`` keeps, the median and p90 absolute relative error per kernel over
every grid point of every held-out table; the roofline-efficiency alternative (the source GPUs'
fraction of HBM bandwidth at each point, applied to the target's) is scored beside it, and lost
(docs/transfer/README.md).

What this prices is a stand-in, said so in every label: kvbench's ``triton`` kernel by SGLang's
Triton decode backend, its ``flashinfer`` kernel by SGLang's FlashInfer backend (both paged,
bf16/fp8 KV, CUDA-graph captured). Every other part of the step is SGLang's own tables on the
target GPU (``kvbench.app.run._transfer_tables``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from kvbench.errors import ConfigError
from kvbench.specs import profiles

#: the partner kernel measured beside both kernels on every GPU: (framework, kernel_source)
PARTNER = ("trtllm", "torch_flow")
#: kvbench kernel -> (framework, kernel_source) of the measured kernel that stands in for it
STAND_INS = {"flashinfer": ("sglang", "flashinfer"), "triton": ("sglang", "triton")}
#: how each kernel's sources are picked (module docstring)
RULES = {"flashinfer": "same_shape", "triton": "nearest_shape"}
#: the GPUs the transfer prices (where the kernels have no measured table at the runs' shapes)
TARGET_SYSTEMS = ("h100_sxm", "h200_sxm")
#: the measured kernel whose tables price everything but decode attention (SGLang, which runs
#: both backends; its FA3 prefill stands in for FlashInfer's FA3-based prefill on Hopper)
REST_OF_STEP = "sglang_fa3"


@dataclass(frozen=True, order=True)
class Shape:
    """One attention layer's shape per GPU, as the tables key it."""

    heads: int
    kv_heads: int
    head_dim: int
    kv_dtype: str  #: "bfloat16" or "fp8"

    def __str__(self) -> str:
        return f"{self.heads}/{self.kv_heads} heads, head_dim {self.head_dim}, kv {self.kv_dtype}"


@dataclass(frozen=True)
class Table:
    system: str
    shape: Shape


@dataclass(frozen=True)
class Prediction:
    """A transferred decode-attention table: ``batch_size``, ``step``, ``latency`` (ms) columns."""

    frame: object  #: pandas DataFrame in the measured tables' columns
    sources: tuple[Table, ...]
    rule: str


def _newest(system: str, framework: str) -> str | None:
    found = profiles.versions(system, "attention", framework, "generation_attention_perf")
    return found[-1] if found else None


_SHAPE_COLUMNS = ["num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype"]


def _path(system: str, framework: str):
    version = _newest(system, framework)
    if version is None:
        return None
    return (
        profiles.table_root().systems_dir
        / "data"
        / system
        / "attention"
        / framework
        / version
        / ("generation_attention_perf.parquet")
    )


def _read(path, columns: list[str], **equal):
    """The rows of one decode table where each ``equal`` column has its value, in ``columns``
    (a filtered Parquet read: the run reads the few rows it prices, not every table whole)."""
    import pandas as pd
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    windowed = "window_size" in names
    frame = pd.read_parquet(
        path,
        columns=[*columns, *(["window_size"] if windowed else [])],
        filters=[(k, "==", v) for k, v in equal.items()],
    )
    return frame[frame["window_size"] == 0] if windowed else frame


@functools.cache
def _shapes(system: str, framework: str, source: str) -> frozenset:
    """The shapes one measured decode kernel was timed at on one GPU."""
    path = _path(system, framework)
    if path is None:
        return frozenset()
    frame = _read(path, _SHAPE_COLUMNS, kernel_source=source).drop_duplicates(_SHAPE_COLUMNS)
    return frozenset(
        Shape(int(h), int(kv), int(d), str(t)) for h, kv, d, t in frame[_SHAPE_COLUMNS].itertuples(index=False)
    )


@functools.cache
def _median(system: str, framework: str, source: str, shape: Shape):
    """(batch_size, step) -> median latency (ms) of one measured decode kernel at one GPU and shape."""
    frame = _read(
        _path(system, framework),
        ["batch_size", "step", "latency"],
        kernel_source=source,
        num_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        kv_cache_dtype=shape.kv_dtype,
    )
    return frame.groupby(["batch_size", "step"])["latency"].median()


def measured_tables(kernel: str) -> list[Table]:
    """Every measured table of ``kernel``'s stand-in, on every GPU the tables hold."""
    framework, source = STAND_INS[kernel]
    return sorted(
        (
            Table(system, shape)
            for system in profiles.measured_systems()
            for shape in _shapes(system, framework, source)
        ),
        key=lambda t: (t.system, t.shape),
    )


def kernel_median(kernel: str, table: Table):
    """``kernel``'s stand-in at one measured table: (batch_size, step) -> median latency (ms)."""
    return _median(table.system, *STAND_INS[kernel], table.shape)


def measured(kernel: str) -> dict[Table, object]:
    """Every measured table of ``kernel``'s stand-in with its medians (the held-out check's)."""
    return {t: kernel_median(kernel, t) for t in measured_tables(kernel)}


def has_partner(table: Table) -> bool:
    return table.shape in _shapes(table.system, *PARTNER)


def partner(table: Table):
    """The partner's (batch, step) -> latency medians at ``table``'s GPU and shape, or None."""
    return _median(table.system, *PARTNER, table.shape) if has_partner(table) else None


def _log_ratio(kernel_med, partner_med) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """batch -> (log steps, log(kernel / partner)) over the points both measured."""
    both = kernel_med.to_frame("k").join(partner_med.to_frame("p"), how="inner")
    out = {}
    for b, part in both.groupby(level="batch_size"):
        steps = part.index.get_level_values("step").to_numpy(dtype=np.float64)
        out[int(b)] = (np.log(steps), np.log(part["k"].to_numpy() / part["p"].to_numpy()))
    return out


def _log_latency(kernel_med, scale: float) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """batch -> (log steps, log(latency * scale)): a source's latency carried to the target by the
    roofline (the roofline-efficiency alternative)."""
    out = {}
    for b, part in kernel_med.groupby(level="batch_size"):
        steps = part.index.get_level_values("step").to_numpy(dtype=np.float64)
        out[int(b)] = (np.log(steps), np.log(part.to_numpy() * scale))
    return out


def _roofline_scale(source: Table, target: Table) -> float:
    """Target over source time of the same (batch, context) at the same fraction of HBM bandwidth:
    the KV bytes per token ratio times the bandwidth ratio (``<system>.yaml``'s ``mem_bw``)."""

    def kv_bytes(shape: Shape) -> float:
        return shape.kv_heads * shape.head_dim * (1 if shape.kv_dtype == "fp8" else 2)

    bw = {t.system: float(profiles.system_constants(t.system)["mem_bw"]) for t in (source, target)}
    return kv_bytes(target.shape) / kv_bytes(source.shape) * bw[source.system] / bw[target.system]


def _ratio_at(ratios: dict, b: int, s: np.ndarray) -> np.ndarray:
    """A source's log ratio at batch ``b`` (nearest measured batch in log scale) and steps ``s``
    (nearest measured step in log scale)."""
    batches = np.array(sorted(ratios), dtype=np.float64)
    near = int(batches[np.argmin(np.abs(np.log(batches) - math.log(b)))])
    log_steps, log_ratio = ratios[near]
    idx = np.abs(np.log(s)[:, None] - log_steps[None, :]).argmin(axis=1)
    return log_ratio[idx]


def _log2_gap(x: float, y: float) -> float:
    return abs(math.log2(x / y))


#: candidate distances between shapes for the nearest-shape rule, scored held out by
#: ``python -m kvbench.studies.transfer`` (docs/transfer/README.md); :data:`DISTANCE` won
DISTANCES = {
    "head_dim + KV heads": lambda a, b: _log2_gap(a.head_dim, b.head_dim) + _log2_gap(a.kv_heads, b.kv_heads),
    "head_dim + queries per KV head": lambda a, b: (
        _log2_gap(a.head_dim, b.head_dim) + _log2_gap(a.heads / a.kv_heads, b.heads / b.kv_heads)
    ),
    "head_dim + queries per KV head + KV heads": lambda a, b: (
        _log2_gap(a.head_dim, b.head_dim)
        + _log2_gap(a.heads / a.kv_heads, b.heads / b.kv_heads)
        + _log2_gap(a.kv_heads, b.kv_heads)
    ),
    "KV bytes per token + queries per KV head": lambda a, b: (
        _log2_gap(a.kv_heads * a.head_dim, b.kv_heads * b.head_dim)
        + _log2_gap(a.heads / a.kv_heads, b.heads / b.kv_heads)
    ),
}
#: head_dim and KV heads, in log2: the KV one CTA streams and how many CTAs stream it
DISTANCE = "head_dim + KV heads"


def shape_distance(a: Shape, b: Shape, distance: str = DISTANCE) -> float:
    """How far apart two shapes are for a ratio's sake (:data:`DISTANCES`)."""
    return DISTANCES[distance](a, b)


def pick_sources(
    kernel: str, target: Table, hidden: frozenset = frozenset(), distance: str = DISTANCE
) -> tuple[list[Table], list[Table]]:
    """The source tables of ``kernel``'s rule for ``target`` (none of ``hidden``), and every table
    the rule chose among."""
    tables = [
        t
        for t in measured_tables(kernel)
        if t != target and t not in hidden and t.shape.kv_dtype == target.shape.kv_dtype and has_partner(t)
    ]
    rule = RULES[kernel]
    if rule == "same_shape":
        chosen = [t for t in tables if t.shape == target.shape and t.system != target.system]
    else:
        if not tables:
            return [], tables
        best = min(shape_distance(t.shape, target.shape, distance) for t in tables)
        chosen = [t for t in tables if math.isclose(shape_distance(t.shape, target.shape, distance), best)]
    return sorted(chosen, key=lambda t: (t.system, t.shape)), tables


#: how a source's table is carried to the target: by its ratio to the partner (the transfer), or
#: at the same fraction of HBM bandwidth (the roofline-efficiency alternative, scored beside it)
METHODS = ("partner", "roofline")


def predict(
    kernel: str, target: Table, hidden: frozenset = frozenset(), method: str = "partner", distance: str = DISTANCE
) -> Prediction:
    """``kernel``'s decode attention at ``target`` (its GPU and shape) by its rule, never reading
    ``target`` itself nor any table in ``hidden``; a one-line ConfigError where nothing can.
    ``method="roofline"``: the alternative (module docstring), on the partner's grid points."""
    mine = partner(target)
    if mine is None:
        raise ConfigError(
            f"no {PARTNER[0]} {PARTNER[1]} decode table on {target.system} at {target.shape} to transfer "
            f"kernel={kernel} from ({profiles.table_root().label})"
        )
    sources, _ = pick_sources(kernel, target, hidden, distance)
    if not sources:
        raise ConfigError(
            f"no measured {STAND_INS[kernel][1]} decode table with a {PARTNER[1]} partner to transfer "
            f"kernel={kernel} to {target.system} at {target.shape} from ({profiles.table_root().label})"
        )
    if method == "partner":
        ratios = [_log_ratio(kernel_median(kernel, t), partner(t)) for t in sources]
    else:
        ratios = [_log_latency(kernel_median(kernel, t), _roofline_scale(t, target)) for t in sources]
    # the target GPU's own tables (other shapes) count once more: the GPU is what a ratio carries
    weights = np.array([2.0 if t.system == target.system else 1.0 for t in sources])
    rows = []
    for b, part in mine.groupby(level="batch_size"):
        steps = part.index.get_level_values("step").to_numpy(dtype=np.float64)
        logs = np.stack([_ratio_at(r, int(b), steps) for r in ratios])
        mean = (weights[:, None] * logs).sum(axis=0) / weights.sum()
        latency = (part.to_numpy() if method == "partner" else 1.0) * np.exp(mean)
        rows.append(np.column_stack([np.full(len(steps), b), steps, latency]))
    import pandas as pd

    data = np.concatenate(rows)
    frame = pd.DataFrame(
        {"batch_size": data[:, 0].astype(np.int64), "step": data[:, 1].astype(np.int64), "latency": data[:, 2]}
    )
    return Prediction(frame, tuple(sources), RULES[kernel])


# --- held out ---------------------------------------------------------------------------------


def hidden_with(kernel: str, target: Table) -> frozenset:
    """What leave-one-out hides besides ``target``: for a nearest-shape kernel, every table of the
    target's shape (the runs it prices have none at theirs)."""
    if RULES[kernel] != "nearest_shape":
        return frozenset()
    return frozenset(t for t in measured_tables(kernel) if t.shape == target.shape)


def leave_one_out(kernel: str, method: str = "partner", distance: str = DISTANCE):
    """One row per measured table of ``kernel`` that has a partner, predicted with it hidden:
    ``system, shape, sources, points, median_error, p90_error`` (absolute relative latency error
    over the table's grid points both hold), and the points themselves (``measured_ms``,
    ``predicted_ms``) for figures."""
    import pandas as pd

    rows, points = [], []
    for target, med in sorted(measured(kernel).items(), key=lambda kv: (kv[0].system, kv[0].shape)):
        if partner(target) is None:
            continue
        try:
            pred = predict(kernel, target, hidden_with(kernel, target), method, distance)
        except ConfigError:
            continue  # no source left: nothing to score
        p = pred.frame.set_index(["batch_size", "step"])["latency"]
        both = med.to_frame("measured").join(p.to_frame("predicted"), how="inner")
        err = np.abs(both["predicted"] / both["measured"] - 1.0)
        rows.append(
            {
                "kernel": kernel,
                "system": target.system,
                "heads": target.shape.heads,
                "kv_heads": target.shape.kv_heads,
                "head_dim": target.shape.head_dim,
                "kv_dtype": target.shape.kv_dtype,
                "sources": " ".join(sorted({t.system for t in pred.sources})),
                "points": len(both),
                "median_error": float(np.median(err)),
                "p90_error": float(np.quantile(err, 0.9)),
            }
        )
        pts = both.reset_index()
        pts.insert(0, "method", method)
        pts.insert(0, "kernel", kernel)
        pts.insert(1, "system", target.system)
        pts.insert(2, "shape", str(target.shape))
        points.append(pts)
    frame = pd.DataFrame(rows)
    all_points = pd.concat(points, ignore_index=True) if points else pd.DataFrame()
    return frame, all_points


def require_full_tables() -> None:
    """The held-out check hides tables the excerpt does not ship: it needs the package's."""
    if profiles.table_root().excerpt:
        raise ConfigError(f"the held-out check needs every table: {profiles.INSTALL_HINT}")


# --- what a run reads ---------------------------------------------------------------------------

#: the held-out error per kernel and KV dtype, written by ``python -m kvbench.studies.transfer`` from the
#: full tables (aiconfigurator-core) and re-derived by tests/kvbench/exec/test_transfer.py
HELDOUT_FILE = profiles.EXCERPT_DIR / "transfer_heldout.csv"


def heldout_summary(points):
    """One row per kernel and KV dtype: tables, points, median and p90 absolute relative error."""
    import pandas as pd

    err = np.abs(points["predicted"] / points["measured"] - 1.0)
    frame = points.assign(error=err, kv_dtype=points["shape"].str.rsplit("kv ", n=1).str[1])
    rows = []
    for (method, kernel, dtype), part in frame.groupby(["method", "kernel", "kv_dtype"]):
        rows.append(
            {
                "method": method,
                "kernel": kernel,
                "kv_dtype": dtype,
                "tables": part[["system", "shape"]].drop_duplicates().shape[0],
                "points": len(part),
                "median_error": round(float(part["error"].median()), 4),
                "p90_error": round(float(part["error"].quantile(0.9)), 4),
            }
        )
    return pd.DataFrame(rows)


@functools.cache
def _heldout() -> dict[tuple[str, str], tuple[float, float, int]]:
    import pandas as pd

    if not HELDOUT_FILE.is_file():
        return {}
    frame = pd.read_csv(HELDOUT_FILE)
    frame = frame[frame["method"] == "partner"]
    return {
        (r.kernel, r.kv_dtype): (float(r.median_error), float(r.p90_error), int(r.tables))
        for r in frame.itertuples(index=False)
    }


def heldout_text(kernel: str, kv_dtype: str) -> str:
    found = _heldout().get((kernel, kv_dtype))
    if found is None:
        return "held-out error not computed (python -m kvbench.studies.transfer --heldout-file <this file>)"
    median, p90, tables = found
    return f"held-out median {100 * median:.1f} %, p90 {100 * p90:.1f} % over {tables} hidden tables (kv {kv_dtype})"


def decode_for_run(kernel: str, system: str, model, kv_dtype: str) -> tuple[object, str]:
    """The transferred decode-attention rows of one run and the label that names their sources."""
    target = Table(system, Shape(model.heads_per_gpu, model.kv_heads_per_gpu, model.head_dim, kv_dtype))
    pred = predict(kernel, target)
    framework, source = STAND_INS[kernel]
    versions = sorted({_newest(t.system, framework) for t in pred.sources})
    shapes = sorted({t.shape for t in pred.sources})
    at = "" if shapes == [target.shape] else f" at {'; '.join(str(s) for s in shapes)}"
    systems = ", ".join(sorted({t.system for t in pred.sources}))
    partner_version = _newest(system, PARTNER[0])
    label = (
        f"transfer: {kernel} as {framework} {'/'.join(versions)} {source} from {systems}{at}, via "
        f"{PARTNER[0]} {partner_version} {PARTNER[1]} on {system}; {heldout_text(kernel, kv_dtype)}"
    )
    return pred.frame, label


def applies(kernel_name: str, system: str | None) -> bool:
    """Whether a sim run of ``kernel_name`` on ``system`` is priced by the transfer (before any
    calibration file, which wins)."""
    return kernel_name in STAND_INS and system in TARGET_SYSTEMS
