"""The vLLM paper's numbers reproduced by kvbench.

Kwon et al., "Efficient Memory Management for Large Language Model Serving with PagedAttention",
SOSP 2023 (arXiv:2309.06180). The published values are read from
``kvbench/studies/paper/data/vllm_paper_reference.json`` (see ``data/README.md``); every other number is
computed from kvbench's specs, its cost model or its runs, one module per part of the paper:

- §3 and Table 1 :mod:`~kvbench.studies.paper.vllm_sizes`;
- Fig. 2 :mod:`~kvbench.studies.paper.vllm_fig2`, Fig. 13 :mod:`~kvbench.studies.paper.vllm_fig13`,
  Fig. 15 and §6.3's sharing :mod:`~kvbench.studies.paper.vllm_fig15`;
- §7.2 :mod:`~kvbench.studies.paper.vllm_block_size`, §7.3 :mod:`~kvbench.studies.paper.vllm_swap`;
- §6-§7.1's throughput and kernels :mod:`~kvbench.studies.paper.vllm_throughput`.

The runs they share and the paper's metrics are in :mod:`~kvbench.studies.paper.vllm_runs`, kvbench's
closed forms in :mod:`~kvbench.studies.paper.vllm_model`.
"""

from __future__ import annotations

from pathlib import Path

from kvbench.studies.paper import vllm_model as vm
from kvbench.studies.paper.document import Source
from kvbench.studies.paper.runs import Runs
from kvbench.studies.paper.vllm_block_size import block_size
from kvbench.studies.paper.vllm_fig2 import fig2
from kvbench.studies.paper.vllm_fig13 import fig13
from kvbench.studies.paper.vllm_fig15 import fig15
from kvbench.studies.paper.vllm_sizes import kv_per_token, table1
from kvbench.studies.paper.vllm_swap import swap_recompute
from kvbench.studies.paper.vllm_throughput import throughput


def build(runs: Runs, figures_dir: Path) -> Source:
    """The vLLM paper reproduced: every section's rows, tables and figures (figures written to
    ``figures_dir``)."""
    figures_dir = Path(figures_dir)
    ref = vm.reference()
    sections = [
        kv_per_token(ref),
        table1(ref),
        fig2(runs, ref, figures_dir),
        fig13(runs, ref),
        fig15(runs, ref),
        block_size(runs, ref, figures_dir),
        swap_recompute(runs, ref, figures_dir),
        throughput(runs, ref),
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
