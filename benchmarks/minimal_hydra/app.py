"""The floor any Hydra command-line application pays to start: a ``@hydra.main`` app with a small
config tree (a primary config and four groups of a few options each) that composes its config,
prints one line and exits. ``benchmarks/startup.py`` times it beside kvbench, in the same job.

    python benchmarks/minimal_hydra/app.py                       # the defaults
    python benchmarks/minimal_hydra/app.py model=large workload.num_requests=1 hydra.run.dir=/tmp/x
    python benchmarks/minimal_hydra/app.py output.tables=true output.figure=true hydra.run.dir=/tmp/x

The last line is the floor of an application that also writes what a kvbench run writes by
default, with the same libraries and nothing else: ``output.tables=true`` writes a one-row table
as Parquet (a numpy column handed to Arrow through its buffer, as kvbench does: pyarrow's own
conversions would import pandas) and as CSV; ``output.figure=true`` draws one figure with
matplotlib (a ``Figure`` on the Agg canvas, no pyplot, as kvbench draws) and saves it as PNG.
Both go to the run's folder.

Nothing here is kvbench's: only Hydra (and OmegaConf, which Hydra imports) is imported, plus numpy,
pyarrow and matplotlib when asked to write. (Hydra scans every installed ``hydra_plugins`` package at
start-up, so where kvbench is installed its sweeper plugin is imported here too, about 3 ms, as in
any Hydra application in that environment.)
"""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


def write_tables(out_dir: Path, cfg: DictConfig) -> None:
    """One row of three numeric columns, as Parquet and CSV."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {
        "num_requests": np.array([cfg.workload.num_requests], dtype=np.int64),
        "prompt_tokens": np.array([cfg.workload.prompt_tokens], dtype=np.int64),
        "output_tokens": np.array([cfg.workload.output_tokens], dtype=np.int64),
    }
    arrays = [pa.Array.from_buffers(pa.int64(), 1, [None, pa.py_buffer(v)]) for v in columns.values()]
    table = pa.Table.from_arrays(arrays, names=list(columns))
    with pq.ParquetWriter(out_dir / "table.parquet", table.schema) as writer:
        writer.write_table(table)
    rows = [",".join(columns), ",".join(str(int(v[0])) for v in columns.values())]
    (out_dir / "table.csv").write_text("\n".join(rows) + "\n")


def write_figure(out_dir: Path) -> None:
    """One stacked-area figure with a title, axis labels and a legend, as PNG."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    time_s = np.linspace(0.0, 1.0, 8)
    fig = Figure(figsize=(8, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.stackplot(time_s, [time_s, 1.0 - time_s], labels=["used", "free"])
    ax.set_title("a minimal figure")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("share")
    ax.legend(loc="upper right")
    fig.savefig(out_dir / "figure.png", dpi=110, format="png")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    if cfg.output.tables:
        write_tables(out_dir, cfg)
    if cfg.output.figure:
        write_figure(out_dir)
    print(f"{cfg.model.name} on {cfg.hardware.name}, {cfg.allocator.name}: {cfg.workload.num_requests} requests")


if __name__ == "__main__":
    main()
