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
        (2 * ffn, h),
        (h, ffn),
        (model.vocab_size // tp, h),
    ]:
        grid.latency_s(1, n, k)
    grid._at_m = real
    return seen


def main() -> None:
    assert not profiles.table_root().excerpt, "install the profiles extra first"
    root = profiles.table_root().systems_dir
    if OUT.exists():
        shutil.rmtree(OUT)
    specs = [model_spec_of(compose([f"model={m}", f"model.tp={tp}"])[0]) for m in MODELS for tp in (1, 2, 4, 8)]
    for system in sorted(set(profiles.SYSTEMS.values())):
        (OUT).mkdir(parents=True, exist_ok=True)
        shutil.copy(root / f"{system}.yaml", OUT / f"{system}.yaml")
        by_framework: dict[str, list] = {}
        for kernel in MEASURED_KERNELS:
            if system in kernel.measured.sources:
                by_framework.setdefault(kernel.measured.framework, []).append(kernel.measured)
        for measured in by_framework.values():
            m = measured[0]  # one framework: the same version folders, GEMM and all-reduce tables
            sources = {k.sources[system] for k in measured}
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
    from kvbench.validation.silicon import COLUMNS, admitted, read_silicon

    frame, _ = read_silicon()
    rows, _ = admitted(frame)
    rows[list(COLUMNS)].to_csv(profiles.EXCERPT_DIR / "silicon_sample.csv", index=False)
    total = sum(p.stat().st_size for p in profiles.EXCERPT_DIR.rglob("*") if p.is_file())
    print(f"wrote {profiles.EXCERPT_DIR} ({total / 1e6:.2f} MB)")


def _write(frame, system, op, framework, version, table) -> None:
    folder = OUT / "data" / system / op / framework / version
    folder.mkdir(parents=True, exist_ok=True)
    frame.reset_index(drop=True).to_parquet(folder / f"{table}.parquet", index=False)


if __name__ == "__main__":
    main()
