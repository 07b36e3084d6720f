"""``kvbench profiles``: which public measured tables kvbench can price a run with, per GPU.

    kvbench profiles                 # every hardware config with tables, every measured kernel
    kvbench profiles --hardware h100-sxm

For each measured kernel (``kernel=<name>``): the framework and version whose tables price it,
the KV-cache dtypes and the attention shapes (query heads / KV heads / head dim, per GPU)
measured, and the GEMM dtypes of that framework's table. A shape not listed is refused in one line.
"""

from __future__ import annotations

from rich.table import Table

from kvbench.commands.common import Parser, run_cli
from kvbench.errors import require
from kvbench.output.report import wide_console
from kvbench.plugins import lookup
from kvbench.specs import profiles


def _main(argv: list[str]) -> int:
    parser = Parser("kvbench profiles", "List the public measured tables kvbench prices runs with, per GPU.")
    parser.add_argument("--hardware", action="append", help=f"only this hardware config: {', '.join(profiles.SYSTEMS)}")
    args, overrides = parser.parse(argv)
    require(not overrides, "kvbench profiles", overrides[0] if overrides else None, "takes no kvbench overrides")
    wanted = args.hardware or list(profiles.SYSTEMS)
    for name in wanted:
        profiles.hardware_system(name)  # one line for a config without tables
    from kvbench_plugins.kernels.measured import MEASURED_KERNELS

    root = profiles.table_root()
    table = Table(title=f"measured tables in {root.label} ({root.systems_dir})", title_justify="left")
    for column in (
        "hardware",
        "kernel",
        "framework",
        "kernel_source",
        "kv dtypes",
        "attention shapes (H/KV/d)",
        "GEMM dtypes",
    ):
        table.add_column(column)
    for name in wanted:
        system = profiles.SYSTEMS[name]
        for cls in MEASURED_KERNELS:
            lookup("kernel", cls.name)  # registered under that name
            m = cls.measured
            source = m.sources.get(system)
            versions = profiles.versions(system, "attention", m.framework, "generation_attention_perf")
            if source is None or not versions:
                continue
            gen = profiles.read_table(system, "attention", m.framework, versions[-1], "generation_attention_perf")
            gen = gen[(gen["kernel_source"] == source) & ((gen["window_size"] == 0) if "window_size" in gen else True)]
            shapes = sorted(
                {
                    tuple(s)
                    for s in gen[["num_heads", "num_key_value_heads", "head_dim"]].drop_duplicates().to_numpy().tolist()
                }
            )
            gemm_versions = profiles.versions(system, "gemm", m.framework, "gemm_perf")
            gemm_dtypes = ""
            if gemm_versions:
                gemms = profiles.read_table(system, "gemm", m.framework, gemm_versions[-1], "gemm_perf")
                gemm_dtypes = ", ".join(sorted(set(gemms["gemm_dtype"]) & set(profiles.GEMM_DTYPES)))
            shown = ", ".join("/".join(map(str, s)) for s in shapes[:12]) + (
                f" (+{len(shapes) - 12})" if len(shapes) > 12 else ""
            )
            table.add_row(
                name,
                cls.name,
                f"{m.framework} {versions[-1]}",
                source,
                ", ".join(sorted(gen["kv_cache_dtype"].unique())),
                shown or "-",
                gemm_dtypes,
            )
    wide_console().print(table)
    return 0


def main() -> None:
    run_cli(_main, "kvbench profiles")


if __name__ == "__main__":
    main()
