"""Write kvbench's excerpt of aiconfigurator-core's tables (kvbench/profiles/), from the installed
package: the rows that price kvbench's dense model configs at TP 1-8 on A100/H100/H200 with each
measured kernel, and the silicon rows ``kvbench validate`` admits. Run it after changing the
pinned package version or the model configs:

    pip install -e '.[profiles]' && python tools/make_profile_excerpt.py

The excerpt holds the same rows as the package (filtered, never edited), so a run priced by it
gives the numbers the package gives.
"""

from __future__ import annotations

import shutil

from kvbench_plugins.kernels.measured import MEASURED_KERNELS

from kvbench.api import compose, model_spec_of
from kvbench.exec import profiled
from kvbench.specs import profiles

MODELS = ["llama2-7b", "llama3-8b", "llama3.1-8b", "qwen3-32b", "llama3.1-70b"]
#: the MoE / MLA / window / linear models, each at its config's default layout: their every row is
#: recorded while their tables load (profiled_arch), on each system and measured kernel that prices them
ARCH_MODELS = [
    "deepseek-v3",
    "deepseek-r1",
    "gpt-oss-120b",
    "gpt-oss-20b",
    "qwen3-235b-a22b",
    "qwen3-30b-a3b",
    "qwen3.5-397b-a17b",
    "minimax-m2.5",
    "kimi-k2.5",
    "glm-5",
]
#: the systems the architecture models' rows are kept for (the excerpt's size: Hopper H200 and B200)
ARCH_SYSTEMS = {"h200": "h200_sxm", "b200-sxm": "b200_sxm"}
#: layouts beyond the configs' defaults: DeepSeek under attention data parallelism and expert
#: parallelism across one node (TP1 x ADP8 x EP8, as the silicon rows run it), gpt-oss at TP1 and
#: TP2, GLM-5 in NVFP4, MiniMax-M2.5 at TP8
EXTRA_LAYOUTS = {
    "deepseek-v3": [
        ["model.tp=1", "model.attention_dp=8", "model.ep=8"],
        ["model.tp=4", "model.attention_dp=2", "model.ep=8"],  # tests/kvbench/exec/test_profiled_arch.py
    ],
    "gpt-oss-120b": [["model.tp=1"], ["model.tp=2"]],  # TRT-LLM's moe_tp=2: a layout stand-in
    "glm-5": [["model.dtype=nvfp4", "model.moe_dtype=nvfp4"]],  # NVFP4's module rows (Blackwell)
    "minimax-m2.5": [["model.tp=8"]],  # vLLM's moe_tp=8 fp8_block: a layout stand-in
}
#: the papers' models, at TP1: kvbench paper prices the vLLM paper's OPT-13B rate sweeps on the
#: profiled clock too (kvbench/studies/paper/vllm_throughput.py)
PAPER_MODELS = ["opt-13b"]
OUT = profiles.EXCERPT_DIR / "systems"


def needed_gemm_shapes(grid: profiled.GemmGrid, model) -> set[tuple[int, int]]:
    """The measured (n, k) a GemmGrid reads for this model's GEMMs (recorded, not recomputed)."""
    seen: set[tuple[int, int]] = set()
    real = grid._at_m
    grid._at_m = lambda n, k, m: (seen.add((n, k)), real(n, k, m))[1]
    h, d, tp = model.hidden_size, model.head_dim, model.tp
    ffn = model.intermediate_size // tp
    for n, k in [
        ((model.heads_per_gpu + 2 * model.kv_heads_per_gpu) * d, h),
        (h, model.heads_per_gpu * d),
        ((2 if model.gated_mlp else 1) * ffn, h),
        (h, ffn),
        (model.vocab_size // tp, h),
    ]:
        grid.latency_s(1, n, k)
    grid._at_m = real
    return seen


def main() -> None:
    assert not profiles.table_root().excerpt, "install the profiles extra first"
    root = profiles.table_root().systems_dir
    ARCH_ROWS.update(_record_arch_rows())
    for key, index in _record_transfer_rows().items():
        ARCH_ROWS.setdefault(key, set()).update(index)
    if OUT.exists():
        shutil.rmtree(OUT)
    specs = [model_spec_of(compose([f"model={m}", f"model.tp={tp}"])[0]) for m in MODELS for tp in (1, 2, 4, 8)]
    specs += [model_spec_of(compose([f"model={m}"])[0]) for m in PAPER_MODELS]
    for system in sorted(set(profiles.SYSTEMS.values())):
        (OUT).mkdir(parents=True, exist_ok=True)
        shutil.copy(root / f"{system}.yaml", OUT / f"{system}.yaml")
        by_framework: dict[str, list] = {}
        for kernel in MEASURED_KERNELS:
            if system in kernel.measured.sources:
                by_framework.setdefault(kernel.measured.framework, []).append(kernel.measured)
        for measured in by_framework.values():
            m = measured[0]  # one framework: the same version folders, GEMM and all-reduce tables
            sources = {k.sources[system] for k in measured} | {k.prefill_source(system) for k in measured}
            v = profiles.versions(system, "attention", m.framework, "generation_attention_perf")[-1]
            shapes = {(s.heads_per_gpu, s.kv_heads_per_gpu, s.head_dim) for s in specs}
            for table in ("generation_attention_perf", "context_attention_perf"):
                frame = profiles.read_table(system, "attention", m.framework, v, table)
                keep = frame[
                    frame["kernel_source"].isin(sources)
                    & ((frame["window_size"] == 0) if "window_size" in frame else True)
                    & frame[["num_heads", "num_key_value_heads", "head_dim"]].apply(tuple, axis=1).isin(shapes)
                ]
                _write(keep, system, "attention", m.framework, v, table)
            gemm_versions = profiles.versions(system, "gemm", m.framework, "gemm_perf")
            gv = v if v in gemm_versions else gemm_versions[-1]
            gemms = profiles.read_table(system, "gemm", m.framework, gv, "gemm_perf")
            keep_nk: set[tuple[int, int]] = set()
            for dtype in profiles.GEMM_DTYPES:
                src = profiled._gemm_source(gemms, m, dtype)
                part = gemms[(gemms["gemm_dtype"] == dtype) & (gemms["kernel_source"] == src)]
                if part.empty:
                    continue
                grid = profiled.GemmGrid(part, profiled._Counter())
                for spec in specs:
                    keep_nk |= needed_gemm_shapes(grid, spec)
            nk = gemms[["n", "k"]].apply(tuple, axis=1)
            _write(gemms[nk.isin(keep_nk)], system, "gemm", m.framework, gv, "gemm_perf")
            ar_versions = profiles.versions(system, "comm", m.framework, "custom_allreduce_perf")
            if ar_versions:
                ar = profiles.read_table(system, "comm", m.framework, ar_versions[-1], "custom_allreduce_perf")
                _write(
                    ar[ar["kernel_source"] == m.allreduce_source],
                    system,
                    "comm",
                    m.framework,
                    ar_versions[-1],
                    "custom_allreduce_perf",
                )
    for (system, op, framework, version, table), index in sorted(ARCH_ROWS.items()):
        if not (OUT / "data" / system / op / framework / version / f"{table}.parquet").is_file():
            if not (OUT / f"{system}.yaml").is_file():
                shutil.copy(root / f"{system}.yaml", OUT / f"{system}.yaml")
            frame = profiles.read_table(system, op, framework, version, table)
            _write(frame.loc[sorted(index)], system, op, framework, version, table)
    from kvbench.validation.silicon import COLUMNS, admitted, read_silicon

    frame, _ = read_silicon()
    rows, _ = admitted(frame)
    rows[list(COLUMNS)].to_csv(profiles.EXCERPT_DIR / "silicon_sample.csv", index=False)
    total = sum(p.stat().st_size for p in profiles.EXCERPT_DIR.rglob("*") if p.is_file())
    print(f"wrote {profiles.EXCERPT_DIR} ({total / 1e6:.2f} MB)")


#: (system, op, framework, version, table) -> the row labels the architecture models read
ARCH_ROWS: dict[tuple, set] = {}


def _write(frame, system, op, framework, version, table) -> None:
    """Write the rows ``frame`` kept of a table (labels as read), with the rows the architecture
    models read of the same table, in the table's order."""
    extra = ARCH_ROWS.get((system, op, framework, version, table))
    if extra:
        full = profiles.read_table(system, op, framework, version, table)
        frame = full.loc[sorted(set(frame.index) | extra)]
    folder = OUT / "data" / system / op / framework / version
    folder.mkdir(parents=True, exist_ok=True)
    frame.reset_index(drop=True).to_parquet(folder / f"{table}.parquet", index=False)


def _record_transfer_rows() -> dict[tuple, set]:
    """The decode rows the kernel transfer (kvbench.exec.transfer) reads to price kvbench's own
    triton and flashinfer kernels on H100/H200 for every dense model config at TP 1-8, bf16 and
    fp8 KV: each source table and its partner on the source GPU, and the partner on the target."""
    from kvbench.exec import transfer

    used: dict[tuple, set] = {}

    def keep(table: transfer.Table, framework: str, source: str) -> None:
        version = profiles.versions(table.system, "attention", framework, "generation_attention_perf")[-1]
        frame = profiles.read_table(table.system, "attention", framework, version, "generation_attention_perf")
        s = table.shape
        rows = frame[
            (frame["kernel_source"] == source)
            & (frame["window_size"] == 0)
            & (frame["num_heads"] == s.heads)
            & (frame["num_key_value_heads"] == s.kv_heads)
            & (frame["head_dim"] == s.head_dim)
            & (frame["kv_cache_dtype"] == s.kv_dtype)
        ]
        key = (table.system, "attention", framework, version, "generation_attention_perf")
        used.setdefault(key, set()).update(rows.index.tolist())

    specs = [model_spec_of(compose([f"model={m}", f"model.tp={tp}"])[0]) for m in MODELS for tp in (1, 2, 4, 8)]
    specs += [model_spec_of(compose([f"model={m}"])[0]) for m in PAPER_MODELS]
    shapes = {(s.heads_per_gpu, s.kv_heads_per_gpu, s.head_dim) for s in specs}
    for kernel in transfer.STAND_INS:
        for system in transfer.TARGET_SYSTEMS:
            for heads, kv_heads, head_dim in sorted(shapes):
                for kv_dtype in ("bfloat16", "fp8"):
                    target = transfer.Table(system, transfer.Shape(heads, kv_heads, head_dim, kv_dtype))
                    if transfer.partner(target) is None:
                        continue
                    keep(target, *transfer.PARTNER)
                    for source in transfer.pick_sources(kernel, target)[0]:
                        keep(source, *transfer.STAND_INS[kernel])
                        keep(source, *transfer.PARTNER)
    return used


def _record_arch_rows() -> dict[tuple, set]:
    """The rows every grid of the architecture models reads (each frame read is tagged with its
    table in ``attrs``, which pandas carries through filtering), by table."""

    from kvbench.errors import ConfigError
    from kvbench.exec import profiled_arch, profiled_moe
    from kvbench.exec.profiled import ProfiledCostModel, load_tables, table_kv_dtype

    used: dict[tuple, set] = {}
    real_read = profiles.read_table.__wrapped__

    def tagged_read(system, op, framework, version, table):
        frame = real_read(system, op, framework, version, table)
        frame.attrs["source"] = (system, op, framework, version, table)
        return frame

    def record(frame) -> None:
        key = frame.attrs.get("source")
        if key is not None:
            used.setdefault(key, set()).update(frame.index.tolist())

    grids = (
        profiled.DecodeAttentionGrid,
        profiled.PrefillAttentionCurve,
        profiled_moe.TokenCurve,
        profiled.AllReduceCurve,
    )
    originals = {cls: cls.__init__ for cls in grids}

    def wrap(cls):
        init = originals[cls]

        def recording_init(self, frame, *args, **kwargs):
            record(frame)
            init(self, frame, *args, **kwargs)

        return recording_init

    gemm_init = profiled.GemmGrid.__init__

    def gemm_recording_init(self, frame, counter):
        gemm_init(self, frame, counter)
        self._frame = frame
        real_at_m = self._at_m

        def at_m(n, k, m):
            rows = frame[(frame["n"] == n) & (frame["k"] == k)]
            record(rows)
            return real_at_m(n, k, m)

        self._at_m = at_m

    from kvbench.api import compose, hardware_spec, model_spec_of

    profiles.read_table.cache_clear()
    saved_read = profiles.read_table
    profiles.read_table = tagged_read
    for cls in grids:
        cls.__init__ = wrap(cls)
    profiled.GemmGrid.__init__ = gemm_recording_init
    try:
        for hardware, system in ARCH_SYSTEMS.items():
            hw = hardware_spec(compose([f"hardware={hardware}"])[0])
            cases = [(name, []) for name in ARCH_MODELS]
            cases += [(name, extra) for name, layouts in EXTRA_LAYOUTS.items() for extra in layouts]
            for name, extra in cases:
                cfg = compose([f"model={name}", f"hardware={hardware}", *extra])[0]
                model = model_spec_of(cfg)
                for kernel in MEASURED_KERNELS:
                    if system not in kernel.measured.sources or kernel.name == "sglang_triton":
                        continue
                    gemm_dtype = kernel(kernel.Config()).gemm_dtype(cfg.model.dtype)
                    try:
                        tables = load_tables(kernel.measured, system, model, gemm_dtype, table_kv_dtype(model))
                    except ConfigError as exc:
                        print(f"  {name} {kernel.name} {system}: not priced ({exc})")
                        continue
                    cost = ProfiledCostModel(model, hw, tables=tables)
                    for tokens in (1, 64):  # touch every GEMM shape (the grid reads (n, k) lazily)
                        cost.prefill_chunk_time_s(tokens, 0)
                        cost.decode_time_s(tokens * 1024, tokens)
                    assert profiled_arch.needs_arch(model)
    finally:
        profiles.read_table = saved_read
        for cls, init in originals.items():
            cls.__init__ = init
        profiled.GemmGrid.__init__ = gemm_init
        profiles.read_table.cache_clear()
    return used


if __name__ == "__main__":
    main()
