"""``kvbench profiles``: which public measured tables kvbench can price a run with, per GPU.

    kvbench profiles                 # every hardware config with tables, every measured kernel
    kvbench profiles --hardware h100-sxm

For each measured kernel (``kernel=<name>``): the framework and version whose tables price it,
the KV-cache dtypes and the attention shapes (query heads / KV heads / head dim, per GPU)
measured, and the GEMM dtypes of that framework's table. A shape not listed is refused in one line.
Below, which measured kernels price each shipped model on each GPU (at ``model.tp=1`` and the
model's own dtypes), worked out by selecting each one's tables as a run does
(:mod:`kvbench.app.profile_coverage`).
"""

from __future__ import annotations

from rich import box
from rich.table import Table

from kvbench.app.profile_coverage import coverage, matrix
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
    console = wide_console()
    console.print(f"measured tables: {root.label}", highlight=False)
    console.print(f"  in {root.systems_dir}", highlight=False, soft_wrap=True)
    table = _grid("")
    for column in ("hardware", "kernel", "framework", "kernel source", "KV dtypes", "GEMM dtypes"):
        table.add_column(column, no_wrap=True)  # one word a line: only the shapes wrap
    table.add_column("attention shapes (H/KV/d)", ratio=1)  # takes the room left, wrapped at commas
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
                gemm_dtypes = "\n".join(sorted(set(gemms["gemm_dtype"]) & set(profiles.GEMM_DTYPES)))
            shown = ", ".join("/".join(map(str, s)) for s in shapes[:12]) + (
                f" (+{len(shapes) - 12})" if len(shapes) > 12 else ""
            )
            table.add_row(
                name,
                cls.name,
                f"{m.framework}\n{versions[-1]}",
                source,
                "\n".join(sorted(gen["kv_cache_dtype"].unique())),
                gemm_dtypes,
                shown or "-",
                end_section=True,
            )
    console.print(table)
    console.print(_coverage_table(MEASURED_KERNELS, wanted))
    return 0


def _grid(title: str) -> Table:
    """A table without vertical rules: within 100 columns (a pipe's width)."""
    return Table(
        title=title or None,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )


def _coverage_table(kernels: list[type], hardware: list[str]) -> Table:
    """Shipped models down, GPUs across: the measured kernels whose tables price the model there."""
    rows = coverage(kernels, hardware)
    table = _grid("the measured kernels that price each shipped model, per GPU (model.tp=1, its own dtypes)")
    table.add_column("model", no_wrap=True)
    table.add_column("H/KV/d", no_wrap=True)
    for name in hardware:
        table.add_column(name)
    for row in matrix(rows, hardware):
        table.add_row(*row)
    return table


def main() -> None:
    run_cli(_main, "kvbench profiles")


if __name__ == "__main__":
    main()
