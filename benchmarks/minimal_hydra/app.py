"""The floor any Hydra command-line application pays to start: a ``@hydra.main`` app with a small
config tree (a primary config and four groups of a few options each) that composes its config,
prints one line and exits. ``benchmarks/startup.py`` times it beside kvbench, in the same job.

    python benchmarks/minimal_hydra/app.py                       # the defaults
    python benchmarks/minimal_hydra/app.py model=large workload.num_requests=1 hydra.run.dir=/tmp/x

Nothing here is kvbench's: only Hydra (and OmegaConf, which Hydra imports) is imported.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    print(f"{cfg.model.name} on {cfg.hardware.name}, {cfg.allocator.name}: {cfg.workload.num_requests} requests")


if __name__ == "__main__":
    main()
