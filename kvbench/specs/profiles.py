"""Public measured GPU tables: where they are, which ones price a run, and their rows.

NVIDIA's ``aiconfigurator-core`` package (Apache-2.0, ``pip install -e '.[profiles]'``) ships
kernel latencies measured on real GPUs under ``aiconfigurator_core/systems/data/<system>/<op>/
<framework>/<version>/*.parquet``: decode attention (``generation_attention_perf``: latency in ms
of one layer's attention by batch size, context length ``step``, head counts, KV dtype and the
kernel that ran), prefill attention (``context_attention_perf``, by batch size and prompt length
``isl``), GEMMs (``gemm_perf``, by ``m, n, k``, dtype and kernel) and all-reduces
(``custom_allreduce_perf``, by message size and GPU count), for each serving framework (vLLM,
SGLang, TRT-LLM) and version measured. ``<system>.yaml`` holds the GPU's constants and the vendor's
empirical memory factors.

kvbench reads them from the installed package (never a copy), else from the small excerpt it
ships in ``kvbench/profiles/`` (the rows its tests and defaults need, with attribution): the source
a result was priced by is in its ``calibration`` column. Nothing here imports aiconfigurator-core:
the tables are files, found with importlib's spec lookup.

A :class:`MeasuredKernel` names one measured decode kernel per system; :func:`select_tables` picks
the tables of one run (the kernel's framework at its newest measured version, the GEMM kernel of
that framework for the weights' dtype, its CUDA-graph all-reduce) and filters each to the run's
shapes. A shape the tables never measured is a one-line ConfigError, not a guess.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kvbench.errors import ConfigError
from kvbench.errors.extras import install_hint

PACKAGE = "aiconfigurator-core"
#: the version whose layout and columns this module reads (pyproject's ``profiles`` extra pins it)
PACKAGE_VERSION = "0.12.0"
#: kvbench's excerpt of the package's tables (same layout under systems/), for runs without it
EXCERPT_DIR = Path(__file__).resolve().parents[1] / "profiles"
INSTALL_HINT = install_hint("profiles")

#: kvbench hardware config name -> the package's system name (the same GPU as measured)
SYSTEMS = {
    "a100-80gb": "a100_sxm",
    "h100-sxm": "h100_sxm",
    "h200": "h200_sxm",
    "h200-sxm": "h200_sxm",
    "b200-sxm": "b200_sxm",
    "b300-sxm": "b300_sxm",
    "gb200": "gb200",
    "gb300": "gb300",
}


@dataclass(frozen=True)
class MeasuredKernel:
    """A decode-attention kernel as the tables name it: ``framework`` and ``kernel_source`` per
    system (the same kernel family is measured under different names on different GPUs)."""

    framework: str  #: the folder name: vllm, sglang, trtllm
    sources: dict[str, str]  #: system -> the table's kernel_source
    #: the framework's GEMM kernels per weight dtype (bfloat16, fp8, fp8_block), in order of
    #: preference, as the tables name them
    gemm_sources: dict[str, tuple[str, ...]]
    #: the framework's all-reduce kernel_source (CUDA-graph captured, as the engines run decode)
    allreduce_source: str
    #: system -> the prefill table's kernel_source where the framework measured its prefill under
    #: another name than its decode (vLLM on Blackwell: FlashInfer's TRT-LLM prefill kernels are
    #: ``vllm_flashinfer_trtllmprefill``, while ``vllm_flashinfer_trtllmdecode``'s prefill rows are
    #: one-token queries only); absent: the decode kernel's name
    prefill_sources: dict[str, str] = field(default_factory=dict)
    #: weight dtype -> the GEMM table dtype whose rows price it, where the framework's rows for that
    #: dtype did not time the GPU's work (vLLM's fp8_block: ``kvbench_plugins.kernels.measured``);
    #: absent: the dtype's own rows
    gemm_rows_dtypes: dict[str, str] = field(default_factory=dict)

    def prefill_source(self, system: str) -> str:
        """The kernel_source of the prefill (``context_attention_perf``) rows on ``system``."""
        return self.prefill_sources.get(system, self.sources[system])


#: what each GEMM dtype is called in the tables (nvfp4: Blackwell only)
GEMM_DTYPES = ("bfloat16", "fp8", "fp8_block", "nvfp4")


def _version_key(version: str) -> tuple:
    """Sort key of a version folder name ("0.5.6.post2" < "0.5.14", "1.3.0rc20" < "1.3.0")."""
    parts = re.findall(r"\d+|[a-z]+", version)
    return tuple((0, int(p)) if p.isdigit() else (-1, p) for p in parts)


@dataclass(frozen=True)
class TableRoot:
    """Where the tables are read from and how a result row names that source."""

    systems_dir: Path
    label: str  #: "aiconfigurator-core 0.12.0" or "kvbench's excerpt of aiconfigurator-core 0.12.0"
    excerpt: bool


#: set to "excerpt" to price from kvbench's excerpt even where the package is installed (the
#: tests check that both give the same numbers)
SOURCE_VARIABLE = "KVBENCH_PROFILE_TABLES"


@functools.cache
def table_root() -> TableRoot:
    """The installed package's tables, else kvbench's excerpt."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if os.environ.get(SOURCE_VARIABLE) == "excerpt":
        spec = None
    if spec is not None and spec.submodule_search_locations:
        systems = Path(next(iter(spec.submodule_search_locations))) / "systems"
        version = importlib.metadata.version(PACKAGE)
        if version != PACKAGE_VERSION:
            raise ConfigError(
                f"{PACKAGE} {version} is installed but kvbench reads the tables of {PACKAGE_VERSION}: "
                f"{INSTALL_HINT} (it pins {PACKAGE_VERSION})"
            )
        if systems.is_dir():
            return TableRoot(systems, f"{PACKAGE} {version}", excerpt=False)
    return TableRoot(EXCERPT_DIR / "systems", f"kvbench's excerpt of {PACKAGE} {PACKAGE_VERSION}", excerpt=True)


def measured_systems() -> list[str]:
    root = table_root().systems_dir
    return sorted(p.name for p in (root / "data").iterdir() if p.is_dir()) if (root / "data").is_dir() else []


def system_constants(system: str) -> dict:
    """``<system>.yaml``'s gpu section (mem_bw, mem_bw_empirical_scaling_factor, ...)."""
    path = table_root().systems_dir / f"{system}.yaml"
    if not path.is_file():
        raise ConfigError(f"no {system}.yaml in {table_root().label}: {INSTALL_HINT}")
    return yaml.safe_load(path.read_text())["gpu"]


def nvlink_domain_gpus(system: str) -> int | None:
    """The GPUs one NVLink domain of ``<system>.yaml`` joins: ``num_gpus_per_rack`` where the nodes
    of a rack are joined by NVLink (``inter_node_bw`` as fast as ``intra_node_bw``: GB200 and GB300
    NVL72, 72), else ``num_gpus_per_node`` (None without the file or the count)."""
    path = table_root().systems_dir / f"{system}.yaml"
    if not path.is_file():
        return None
    node = yaml.safe_load(path.read_text()).get("node") or {}
    rack = int(node.get("num_gpus_per_rack", 0))
    if rack and float(node.get("inter_node_bw", 0)) >= float(node.get("intra_node_bw", math.inf)):
        return rack
    return int(node.get("num_gpus_per_node", 0)) or None


def versions(system: str, op: str, framework: str, table: str) -> list[str]:
    """The framework versions measured for ``table`` on ``system``, oldest first."""
    folder = table_root().systems_dir / "data" / system / op / framework
    if not folder.is_dir():
        return []
    found = [p.name for p in folder.iterdir() if (p / f"{table}.parquet").is_file()]
    return sorted(found, key=_version_key)


@functools.cache
def read_table(system: str, op: str, framework: str, version: str, table: str):
    """One parquet table as a pandas DataFrame (cached: a sweep reads each once per process)."""
    import pandas as pd

    return pd.read_parquet(table_root().systems_dir / "data" / system / op / framework / version / f"{table}.parquet")


def hardware_system(hardware_name: str) -> str:
    """The measured system a kvbench hardware config stands for, or a one-line error."""
    system = SYSTEMS.get(hardware_name)
    if system is None:
        known = ", ".join(f"hardware={h}" for h in SYSTEMS)
        raise ConfigError(
            f"hardware={hardware_name!r} has no public measured tables: a measured kernel runs on {known}"
        )
    return system


def newest_version(system: str, op: str, framework: str, table: str, what: str) -> str:
    found = versions(system, op, framework, table)
    if not found:
        hint = f" ({INSTALL_HINT} for the full tables)" if table_root().excerpt else ""
        raise ConfigError(f"{table_root().label} has no {what} measured with {framework} on {system}{hint}")
    return found[-1]
