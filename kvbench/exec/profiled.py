"""The profiled clock: every step priced from public kernel measurements of a real GPU.

Where the roofline (:mod:`kvbench.exec.costmodel`) divides bytes by bandwidth and FLOPs by a
fraction of peak, this cost model looks each piece of a step up in the tables
:mod:`kvbench.specs.profiles` selects (NVIDIA's aiconfigurator-core measurements of vLLM, SGLang
and TRT-LLM kernels), per GPU of the tensor-parallel group:

- **GEMMs** of every layer (QKV, output, gate-and-up, down projections) at ``m`` = all tokens the
  step computes (prefill chunks and decodes share one forward pass, so they share the GEMMs), and
  the LM head at ``m`` = sequences that sample. Between measured ``(m, n, k)`` the latency is
  interpolated linearly in each of m, n and k (exact for ``a + b*n + c*k + d*n*k``, the shape of
  a GEMM's cost at fixed m); beyond the largest measured ``n`` or ``k`` the GEMM is priced as
  equal pieces (the LM head's vocabulary is wider than any measured n); beyond the largest
  measured ``m`` the latency grows in proportion to m.
- **Decode attention** of the step's sequences: one call per layer over ``b`` sequences, priced at
  their mean context length. The tables measure batches of equal lengths; a batch's cost at fixed
  ``b`` grows linearly with its sequences' total context where bandwidth binds, so the mean
  prices a mixed batch (``tests/kvbench/exec/test_profiled.py`` checks how linear the measured
  rows are). Between measured batch sizes and lengths: linear in each. The tables stop where
  ``b * s`` would overflow the GPU; beyond a row's longest measured length the latency grows at
  the best bandwidth any measured point of the table reached (about 90 % of HBM on H100).
- **Prefill attention** of each chunk: ``c`` new tokens over ``p`` cached ones cost the measured
  causal prefill of ``p + c`` tokens times the share of its score matrix the chunk computes,
  ``c * (2p + c) / (p + c)^2``; beyond the longest measured prompt, quadratic in the length.
- **All-reduces** under tensor parallelism: two per layer (after attention and after the MLP), of
  ``m * hidden`` bf16 activations, from the framework's all-reduce table (linear in message size;
  a GPU count the table never measured, inside one NVLink domain, by the stated, counted stand-in
  of :mod:`kvbench.exec.profiled_comm`).
  The tables' ``message_size`` counts elements, not bytes: aiconfigurator's estimator prices a
  layer's all-reduce at ``tokens x hidden`` from the same column (its comm ops carry an element
  count), and its measured latencies are NCCL's for that many bf16 values.
- **Elementwise work** the tables do not hold (two residual-add RMSNorms and the SiLU-and-multiply
  per layer) at the vendor's empirical memory factors from ``<system>.yaml`` (a fraction of HBM
  bandwidth plus a constant latency per operation).

Not priced: host-side work per step (scheduling, sampling, detokenization), which the engines
overlap with the GPU to different degrees; kvbench validate reports what this leaves out.
Every lookup outside the measured grid is counted (:attr:`ProfiledCostModel.extrapolated`) and a
run's summary reports the count (``profile_extrapolated_lookups``): never silent.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvbench.errors import ConfigError
from kvbench.exec import profiled_arch, profiled_comm
from kvbench.exec.costmodel import CostModel
from kvbench.specs import profiles
from kvbench.specs.profiles import MeasuredKernel

#: bytes per activation element moved by all-reduces and elementwise kernels (bf16)
ACTIVATION_BYTES = 2


class _Counter:
    """Lookups made outside the measured grid (mutable inside a frozen cost model)."""

    def __init__(self) -> None:
        self.count = 0


def _interp_extend(x: np.ndarray, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """Piecewise-linear through (xp, fp), clamped below the first point and continued past the
    last by the last segment's slope (callers decide what lies beyond; this is their default)."""
    y = np.interp(x, xp, fp)
    if len(xp) >= 2:
        beyond = x > xp[-1]
        if np.any(beyond):
            slope = (fp[-1] - fp[-2]) / (xp[-1] - xp[-2])
            y = np.where(beyond, fp[-1] + slope * (x - xp[-1]), y)
    return y


class DecodeAttentionGrid:
    """One layer's decode attention latency in seconds by batch size and context length."""

    def __init__(self, frame, kv_bytes_per_token_layer: float, counter: _Counter) -> None:
        self.batches: list[int] = sorted(int(b) for b in frame["batch_size"].unique())
        self.rows: list[tuple[np.ndarray, np.ndarray]] = []
        best_bytes_per_s = 0.0
        for b in self.batches:
            row = frame[frame["batch_size"] == b].groupby("step")["latency"].median().sort_index()
            s = row.index.to_numpy(dtype=np.float64)
            lat_s = row.to_numpy(dtype=np.float64) * 1e-3
            self.rows.append((s, lat_s))
            best_bytes_per_s = max(best_bytes_per_s, float(np.max(b * s * kv_bytes_per_token_layer / lat_s)))
        self.best_bytes_per_s = best_bytes_per_s
        self.kv_bytes_per_token_layer = kv_bytes_per_token_layer
        self.counter = counter

    def _row(self, i: int, s: np.ndarray) -> np.ndarray:
        xs, lat = self.rows[i]
        y = np.interp(s, xs, lat)
        beyond = s > xs[-1]
        if np.any(beyond):
            self.counter.count += int(np.count_nonzero(beyond))
            extra_bytes = (s - xs[-1]) * self.batches[i] * self.kv_bytes_per_token_layer
            y = np.where(beyond, lat[-1] + extra_bytes / self.best_bytes_per_s, y)
        return y

    def latency_s(self, batch: int, mean_context_tokens: np.ndarray) -> np.ndarray:
        s = np.asarray(mean_context_tokens, dtype=np.float64)
        j = bisect.bisect_left(self.batches, batch)
        if j < len(self.batches) and self.batches[j] == batch:
            return self._row(j, s)
        if j == 0:
            return self._row(0, s)
        if j == len(self.batches):  # more sequences than any measured batch: grow per sequence
            self.counter.count += s.size
            return self._row(j - 1, s) * batch / self.batches[-1]
        b0, b1 = self.batches[j - 1], self.batches[j]
        w = (batch - b0) / (b1 - b0)
        return (1 - w) * self._row(j - 1, s) + w * self._row(j, s)


class PrefillAttentionCurve:
    """One layer's causal prefill attention of one prompt, in seconds, by prompt length."""

    def __init__(self, frame, counter: _Counter) -> None:
        row = frame[frame["batch_size"] == frame["batch_size"].min()].groupby("isl")["latency"].median().sort_index()
        self.isl = row.index.to_numpy(dtype=np.float64)
        self.lat_s = row.to_numpy(dtype=np.float64) * 1e-3
        self.counter = counter

    def full_s(self, tokens: float) -> float:
        if tokens > self.isl[-1]:  # attention's work grows with the square of the prompt
            self.counter.count += 1
            return float(self.lat_s[-1] * (tokens / self.isl[-1]) ** 2)
        return float(np.interp(tokens, self.isl, self.lat_s))

    def chunk_s(self, num_new_tokens: int, num_context_tokens: int) -> float:
        total = num_new_tokens + num_context_tokens
        share = num_new_tokens * (2 * num_context_tokens + num_new_tokens) / (total * total)
        return self.full_s(total) * share


class GemmGrid:
    """GEMM latency in seconds by (m, n, k) for one dtype and kernel."""

    def __init__(self, frame, counter: _Counter) -> None:
        self.ns = sorted(int(n) for n in frame["n"].unique())
        self.ks = sorted(int(k) for k in frame["k"].unique())
        self.series: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        for (n, k), part in frame.groupby(["n", "k"]):
            row = part.groupby("m")["latency"].median().sort_index()
            self.series[(int(n), int(k))] = (row.index.to_numpy(np.float64), row.to_numpy(np.float64) * 1e-3)
        self.counter = counter

    def _at_m(self, n: int, k: int, m: float) -> float:
        found = self.series.get((n, k))
        if found is None:  # a hole in the grid: the nearest measured shape, scaled by n*k
            n2, k2 = min(self.series, key=lambda nk: abs(math.log(nk[0] * nk[1] / (n * k))))
            self.counter.count += 1
            return self._at_m(n2, k2, m) * (n * k) / (n2 * k2)
        ms, lat = found
        if m > ms[-1]:
            self.counter.count += 1
            return float(lat[-1] * m / ms[-1])
        return float(np.interp(m, ms, lat))

    @staticmethod
    def _bracket(grid: list[int], x: float) -> tuple[int, int, float]:
        j = bisect.bisect_left(grid, x)
        if j < len(grid) and grid[j] == x:
            return grid[j], grid[j], 0.0
        if j == 0:
            return grid[0], grid[0], 0.0
        lo, hi = grid[j - 1], grid[j]
        return lo, hi, (x - lo) / (hi - lo)

    def latency_s(self, m: int, n: int, k: int) -> float:
        if m <= 0:
            return 0.0
        pieces = math.ceil(n / self.ns[-1]) * math.ceil(k / self.ks[-1])
        if pieces > 1:
            n_piece, k_piece = n / math.ceil(n / self.ns[-1]), k / math.ceil(k / self.ks[-1])
            return pieces * self.latency_s(m, round(n_piece), round(k_piece))
        scale = 1.0
        if n < self.ns[0] or k < self.ks[0]:  # narrower than any measured: in proportion to the work
            scale = min(1.0, n / self.ns[0]) * min(1.0, k / self.ks[0])
            n, k = max(n, self.ns[0]), max(k, self.ks[0])
        n0, n1, wn = self._bracket(self.ns, n)
        k0, k1, wk = self._bracket(self.ks, k)
        corners = (
            (1 - wn) * (1 - wk) * self._at_m(n0, k0, m)
            + wn * (1 - wk) * (self._at_m(n1, k0, m) if wn else 0.0)
            + (1 - wn) * wk * (self._at_m(n0, k1, m) if wk else 0.0)
            + wn * wk * (self._at_m(n1, k1, m) if wn and wk else 0.0)
        )
        return scale * corners


class AllReduceCurve:
    """One all-reduce's latency in seconds by its message size in elements (the table's
    ``message_size`` unit: bf16 values, not bytes), for the group's GPU count. Rows standing in
    for a GPU count the table never measured (:func:`kvbench.exec.profiled_comm.rows_at_gpus`)
    count every lookup."""

    def __init__(self, frame, counter: _Counter) -> None:
        self.stand_in = bool(frame.attrs.get(profiled_comm.STAND_IN))
        row = frame.groupby("message_size")["latency"].median().sort_index()
        self.size = row.index.to_numpy(np.float64)
        self.lat_s = row.to_numpy(np.float64) * 1e-3
        self.counter = counter

    def latency_s(self, num_elements: float) -> float:
        if num_elements > self.size[-1] or self.stand_in:
            self.counter.count += 1
        return float(_interp_extend(np.array([num_elements], dtype=np.float64), self.size, self.lat_s)[0])


@dataclass(frozen=True)
class ProfileTables:
    """The tables that price one run, and the words a result row names them by."""

    label: str
    decode: DecodeAttentionGrid
    prefill: PrefillAttentionCurve
    gemm: GemmGrid
    #: the LM head's GEMMs: kept in bf16 by FP8 checkpoints (they exclude lm_head from quantization)
    lm_head_gemm: GemmGrid
    allreduce: AllReduceCurve | None
    mem_bytes_per_s: float  #: HBM bandwidth times the vendor's empirical factor
    mem_op_latency_s: float  #: the vendor's constant latency per memory-bound operation
    counter: _Counter
    #: the grids of experts, MLA, windows and linear attention (:mod:`kvbench.exec.profiled_arch`);
    #: None for a dense model
    arch: object | None = None


def _only(frame, what: str, where: str, **columns):
    """The rows of ``frame`` matching every column, or a one-line error naming what was measured."""
    mask = np.ones(len(frame), dtype=bool)
    for column, value in columns.items():
        if column in frame.columns:
            mask &= (frame[column] == value).to_numpy()
    rows = frame[mask]
    if rows.empty:
        # what the same kernel was measured with, so the user sees which shapes would work
        first, *rest = [c for c in columns if c in frame.columns]
        same = frame[frame[first] == columns[first]]
        shapes = sorted({tuple(r) for r in same[rest].drop_duplicates().to_numpy().tolist()})[:6] if rest else []
        measured = f"; {first}={columns[first]} was measured with ({', '.join(rest)}) in {shapes}" if shapes else ""
        hint = f" ({profiles.INSTALL_HINT} for the full tables)" if profiles.table_root().excerpt else ""
        raise ConfigError(
            f"{where} has no {what} for {', '.join(f'{k}={v}' for k, v in columns.items())}{hint}{measured}"
        )
    return rows


def _gemm_source(gemms, kernel: MeasuredKernel, gemm_dtype: str) -> str:
    """The framework's GEMM kernel for ``gemm_dtype``: the first of the kernel's preferences the
    table holds, else the only one it holds (older versions name theirs differently)."""
    present = set(gemms.loc[gemms["gemm_dtype"] == gemm_dtype, "kernel_source"].unique())
    for source in kernel.gemm_sources.get(gemm_dtype, ()):
        if source in present:
            return source
    if len(present) == 1:
        return next(iter(present))
    return kernel.gemm_sources.get(gemm_dtype, ("?",))[0]  # _only() then names what was measured


def table_kv_dtype(model) -> str:
    """The tables' name for the model's KV-cache dtype: fp8 for one byte per element, else bfloat16."""
    return "fp8" if model.kv_element_bytes == 1 else "bfloat16"


@dataclass(frozen=True)
class SelectedTables:
    """The rows of each table one run reads, filtered to its shapes (before any grid is built)."""

    label: str
    decode: object  #: pandas DataFrame: decode attention at the run's shape and KV dtype (None: MLA)
    prefill: object  #: prefill attention, the same shape (None: MLA)
    gemm: object  #: the weights' GEMMs, in their dtype
    lm_head_gemm: object  #: bf16 GEMMs for the LM head
    allreduce: object | None  #: all-reduces at the run's TP (None at TP 1)


def select_tables(kernel: MeasuredKernel, system: str, model, gemm_dtype: str, kv_dtype: str) -> SelectedTables:
    """The rows of the tables of one run (one-line ConfigError for anything not measured): whether
    a kernel can price a model on a GPU at all (``kvbench profiles``) is this call's answer."""
    fw = kernel.framework
    source = kernel.sources.get(system)
    if source is None:
        raise ConfigError(f"this kernel was not measured on {system}: measured on {', '.join(kernel.sources)}")
    root = profiles.table_root().label
    attn_version = profiles.newest_version(system, "attention", fw, "generation_attention_perf", "decode attention")
    where = f"{root} {system}/attention/{fw}/{attn_version}"
    heads, kv_heads, d = model.heads_per_gpu, model.kv_heads_per_gpu, model.head_dim
    shape = dict(num_heads=heads, num_key_value_heads=kv_heads, head_dim=d, kv_cache_dtype=kv_dtype, window_size=0)
    gen = ctx = None
    if getattr(model, "mla", None) is None:  # an MLA model's attention is priced by the mla tables
        gen = profiles.read_table(system, "attention", fw, attn_version, "generation_attention_perf")
        gen = _only(gen, "decode attention", where, kernel_source=source, **shape)
        ctx = profiles.read_table(system, "attention", fw, attn_version, "context_attention_perf")
        ctx = _only(ctx, "prefill attention", where, kernel_source=kernel.prefill_source(system), **shape)
    gemm_versions = profiles.versions(system, "gemm", fw, "gemm_perf")
    if not gemm_versions:
        raise ConfigError(f"{root} has no GEMM table measured with {fw} on {system}")
    # the attention's version when its GEMMs were measured too, else the newest
    gemm_version = attn_version if attn_version in gemm_versions else gemm_versions[-1]
    gemms = profiles.read_table(system, "gemm", fw, gemm_version, "gemm_perf")
    gemm_where = f"{root} {system}/gemm/{fw}/{gemm_version}"
    measured_dtypes = sorted(gemms["gemm_dtype"].unique())
    rows_dtype = kernel.gemm_rows_dtypes.get(gemm_dtype, gemm_dtype)  # the rows that price gemm_dtype
    if rows_dtype not in measured_dtypes:
        raise ConfigError(
            f"{gemm_where} never measured {rows_dtype} GEMMs (the weights' precision, model.dtype): measured "
            f"{', '.join(measured_dtypes)}"
        )
    gemm_source = _gemm_source(gemms, kernel, rows_dtype)
    gemm = _only(gemms, "GEMMs", gemm_where, kernel_source=gemm_source, gemm_dtype=rows_dtype)
    gemm_label = gemm_dtype if rows_dtype == gemm_dtype else f"{rows_dtype} (pricing {gemm_dtype})"
    head_source = _gemm_source(gemms, kernel, "bfloat16")
    lm_head = _only(gemms, "GEMMs", gemm_where, kernel_source=head_source, gemm_dtype="bfloat16")
    allreduce, ar_label = None, ""
    if model.tp > 1:
        ar_versions = profiles.versions(system, "comm", fw, "custom_allreduce_perf")
        if not ar_versions:
            raise ConfigError(f"{root} has no all-reduce table measured with {fw} on {system}")
        ar = profiles.read_table(system, "comm", fw, ar_versions[-1], "custom_allreduce_perf")
        ar_where = f"{root} {system}/comm/{fw}/{ar_versions[-1]}"
        ar = _only(ar, "all-reduces", ar_where, kernel_source=kernel.allreduce_source)
        what = f"{ar_where} has no all-reduces of kernel_source={kernel.allreduce_source}"
        # more GPUs than measured, inside one NVLink domain: a stated stand-in (profiled_comm)
        allreduce, stand_in = profiled_comm.rows_at_gpus(
            ar, profiled_comm.ALL_REDUCE, model.tp, system, what, "model.tp"
        )
        ar_label = f", all-reduce {kernel.allreduce_source} {ar_versions[-1]}{stand_in}"
    if kernel.prefill_source(system) != source:
        source = f"{source}/{kernel.prefill_source(system)}"  # decode/prefill
    label = (
        f"{root}: {system} {fw} {attn_version} {source} (kv {kv_dtype}), gemm {gemm_source} {gemm_label} "
        f"{gemm_version}{ar_label}"
    )
    return SelectedTables(label, gen, ctx, gemm, lm_head, allreduce)


def load_tables(
    kernel: MeasuredKernel, system: str, model, gemm_dtype: str, kv_dtype: str, decode=None
) -> ProfileTables:
    """Select and read the tables of one run (one-line ConfigError for anything not measured).
    ``decode``: a (frame, label) whose decode-attention rows replace the kernel's, and whose label
    leads the run's (a transferred kernel's: :mod:`kvbench.exec.transfer`)."""
    selected = select_tables(kernel, system, model, gemm_dtype, kv_dtype)
    if decode is not None:
        frame, lead = decode
        selected = dataclasses.replace(selected, decode=frame, label=f"{lead}; rest of step: {selected.label}")
    counter = _Counter()
    kv_bytes_per_token_layer = 2 * model.kv_heads_per_gpu * model.head_dim * model.kv_element_bytes
    gpu = profiles.system_constants(system)
    gemm, lm_head_gemm = GemmGrid(selected.gemm, counter), GemmGrid(selected.lm_head_gemm, counter)
    arch, label = None, selected.label
    if profiled_arch.needs_arch(model):
        arch = profiled_arch.ArchTables(kernel, system, model, gemm_dtype, kv_dtype, counter, gemm, lm_head_gemm)
        label = f"{label}, {', '.join(arch.labels)}"
    return ProfileTables(
        label=label,
        decode=None
        if selected.decode is None
        else DecodeAttentionGrid(selected.decode, kv_bytes_per_token_layer, counter),
        prefill=None if selected.prefill is None else PrefillAttentionCurve(selected.prefill, counter),
        gemm=gemm,
        lm_head_gemm=lm_head_gemm,
        allreduce=None if selected.allreduce is None else AllReduceCurve(selected.allreduce, counter),
        mem_bytes_per_s=float(gpu["mem_bw"]) * float(gpu["mem_bw_empirical_scaling_factor"]),
        mem_op_latency_s=float(gpu["mem_empirical_constant_latency"]),
        counter=counter,
        arch=arch,
    )


@dataclass(frozen=True)
class ProfiledCostModel(CostModel):
    """A :class:`CostModel` whose compute is looked up in measured tables (moving KV, swap and
    copy, stays the hardware config's: the tables hold no host-link measurements)."""

    tables: ProfileTables | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        m = self.model
        pricer = None
        if self.tables is not None and self.tables.arch is not None:
            pricer = profiled_arch.ArchPricer(m, self.tables, self.tables.arch)
        object.__setattr__(self, "_arch", pricer)
        needs_ffn = pricer is None or pricer.arch.counts.dense_mlp
        if not (m.hidden_size and (m.intermediate_size or not needs_ffn) and m.vocab_size):
            raise ConfigError(f"model {m.name!r} lacks hidden_size, intermediate_size or vocab_size for the GEMMs")
        tp, d, h = m.tp, m.head_dim, m.hidden_size
        ffn = m.intermediate_size // tp
        layer_shapes = [
            ((m.heads_per_gpu + 2 * m.kv_heads_per_gpu) * d, h),  # fused QKV projection
            (h, m.heads_per_gpu * d),  # output projection: n = hidden, k = heads * d
            ((2 if m.gated_mlp else 1) * ffn, h),  # gate and up (fused), or fc1
            (h, ffn),  # down, or fc2
        ]
        object.__setattr__(self, "_layer_shapes", layer_shapes)
        object.__setattr__(self, "_layer_cache", {})

    @property
    def extrapolated(self) -> int:
        return self.tables.counter.count

    @property
    def source(self) -> str:
        return self.tables.label

    # --- one step ------------------------------------------------------------------------------------

    def _per_token_layer_s(self, m_tokens: int) -> float:
        """Everything a layer costs that scales with the step's tokens, not with their context:
        GEMMs, all-reduces and elementwise kernels, for ``m_tokens`` tokens (cached by count)."""
        cached = self._layer_cache.get(m_tokens)
        if cached is not None:
            return cached
        t = self.tables
        model = self.model
        gemm_s = sum(t.gemm.latency_s(m_tokens, n, k) for n, k in self._layer_shapes)
        act_bytes = m_tokens * model.hidden_size * ACTIVATION_BYTES
        ffn = model.intermediate_size // model.tp
        # two residual-add RMSNorms (read x and residual, write both) and SiLU-and-multiply
        mem_bytes = 2 * 4 * act_bytes + 3 * m_tokens * ffn * ACTIVATION_BYTES
        elementwise_s = mem_bytes / t.mem_bytes_per_s + 3 * t.mem_op_latency_s
        act_elements = m_tokens * model.hidden_size  # an all-reduce's message, in the table's unit
        allreduce_s = 2 * t.allreduce.latency_s(act_elements) if t.allreduce is not None else 0.0
        total = gemm_s + elementwise_s + allreduce_s
        self._layer_cache[m_tokens] = total
        return total

    def _lm_head_s(self, num_sampling: int) -> float:
        m = self.model
        return self.tables.lm_head_gemm.latency_s(num_sampling, m.vocab_size // m.tp, m.hidden_size)

    def step_times_s(
        self, chunks: Sequence[tuple[int, int]], num_decodes: int, kv_read_tokens: int
    ) -> tuple[tuple[float, ...], float]:
        """Each prefill chunk's time and the decodes' time in one forward pass: the token-bound
        work (GEMMs, all-reduces, elementwise, LM head) at the step's token count, shared out in
        proportion to tokens, plus each part's own attention."""
        if self._arch is not None:
            return self._arch_step_times_s(chunks, num_decodes, kv_read_tokens)
        L = self.model.num_layers
        m_tokens = num_decodes + sum(c for c, _ in chunks)
        if m_tokens == 0:
            return (), 0.0
        per_token_s = (L * self._per_token_layer_s(m_tokens) + self._lm_head_s(num_decodes + len(chunks))) / m_tokens
        chunk_times = tuple(c * per_token_s + L * self.tables.prefill.chunk_s(c, p) for c, p in chunks)
        decode_s = 0.0
        if num_decodes:
            attention_s = float(self.tables.decode.latency_s(num_decodes, np.array([kv_read_tokens / num_decodes]))[0])
            decode_s = num_decodes * per_token_s + L * attention_s
        return chunk_times, decode_s

    def _arch_step_times_s(self, chunks, num_decodes: int, kv_read_tokens: int) -> tuple[tuple[float, ...], float]:
        """:meth:`step_times_s` of a model priced layer kind by layer kind (profiled_arch)."""
        pricer = self._arch
        prefill_tokens = sum(c for c, _ in chunks)
        m_tokens = num_decodes + prefill_tokens
        if m_tokens == 0:
            return (), 0.0
        shared_s = pricer.per_token_s(m_tokens, decode_only=not chunks) + self._lm_head_s(num_decodes + len(chunks))
        per_token_s = shared_s / m_tokens
        per_prefill_token_s = pricer.prefill_tokens_s(prefill_tokens) / prefill_tokens if prefill_tokens else 0.0
        chunk_times = tuple(c * (per_token_s + per_prefill_token_s) + pricer.chunk_attention_s(c, p) for c, p in chunks)
        decode_s = 0.0
        if num_decodes:
            attention_s = float(pricer.decode_attention_s(num_decodes, np.array([kv_read_tokens / num_decodes]))[0])
            decode_s = num_decodes * per_token_s + attention_s
        return chunk_times, decode_s

    def prefill_chunk_time_s(self, num_new_tokens: int, num_context_tokens: int = 0) -> float:
        return self.step_times_s([(num_new_tokens, num_context_tokens)], 0, 0)[0][0]

    def decode_time_s(self, kv_read_tokens: int, num_decodes: int = 1) -> float:
        return self.step_times_s([], num_decodes, kv_read_tokens)[1]

    def decode_times_s(self, first_kv_read_tokens: int, num_decodes: int, num_steps: int) -> np.ndarray:
        """``num_steps`` decode steps of the same sequences, each one token longer: the token-bound
        work is the same every step, the attention follows the mean context."""
        kv = first_kv_read_tokens + num_decodes * np.arange(num_steps, dtype=np.int64)
        if self._arch is not None:
            fixed_s = self._arch.per_token_s(num_decodes, decode_only=True) + self._lm_head_s(num_decodes)
            return fixed_s + self._arch.decode_attention_s(num_decodes, kv / num_decodes)
        L = self.model.num_layers
        fixed_s = L * self._per_token_layer_s(num_decodes) + self._lm_head_s(num_decodes)
        return fixed_s + L * self.tables.decode.latency_s(num_decodes, kv / num_decodes)

    @property
    def prefill_flops_per_s(self) -> float:
        """The FLOP/s a 2,048-token prefill achieves under these tables (reported, never used)."""
        m = self.model
        tokens = 2048
        flops = 2.0 * m.num_params / m.tp * tokens + 4.0 * m.num_layers * m.heads_per_gpu * m.head_dim * tokens**2
        return flops / self.prefill_time_s(tokens)

    @property
    def decode_bandwidth_fraction(self) -> float:
        """The best fraction of HBM bandwidth the measured decode kernel reached on this shape."""
        grid = self.tables.decode if self.tables.decode is not None else self.tables.arch.mla[0]
        return grid.best_bytes_per_s / self.hardware.hbm_bandwidth_bytes_per_s

    def swap_break_even_kv_tokens(self, block_size_tokens: int | None) -> float:
        """KV tokens above which a swap round trip costs less than recomputing the prefill, found
        numerically (the profiled prefill has no closed form); 0: swapping always cheaper."""
        hw, kv = self.hardware, self.model.kv_bytes_per_token

        def swap_minus_recompute(tokens: int) -> float:
            runs = 1 if block_size_tokens is None else -(-tokens // block_size_tokens)
            swap_s = 2.0 * (tokens * kv / hw.host_link_bytes_per_s + runs * hw.host_transfer_overhead_s)
            return swap_s - self.prefill_time_s(tokens)

        if swap_minus_recompute(1) <= 0:
            return 0.0
        lo, hi = 1, 2
        while swap_minus_recompute(hi) > 0:
            lo, hi = hi, hi * 2
            if hi > 1 << 24:
                return math.inf  # recompute is cheaper at every length a model takes
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if swap_minus_recompute(mid) > 0 else (lo, mid)
        return float(hi)
