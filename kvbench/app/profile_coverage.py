"""Which measured kernel can price which shipped model on which GPU: worked out by selecting each
combination's tables exactly as a run does (:func:`kvbench.exec.profiled.load_tables`), never
typed in. A combination is covered when every table a run reads holds the model's shape (query
heads, KV heads, head dim, KV dtype at ``model.tp=1``) and its GEMM dtype; else the run is refused,
and the reason is the one line the run would print.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from kvbench.errors import ConfigError
from kvbench.specs import profiles


@dataclass(frozen=True)
class Coverage:
    """One (model, hardware, kernel) combination: None as ``refusal`` where its tables price it."""

    model: str
    #: query heads / KV heads / head dim, as ``kvbench profiles`` writes an attention shape
    shape: str
    hardware: str
    kernel: str
    refusal: str | None

    @property
    def covered(self) -> bool:
        return self.refusal is None


def model_dir() -> Path:
    """The model configs kvbench ships (``model=<name>``)."""
    return Path(str(files("kvbench.conf") / "model"))


def shipped_models() -> list[str]:
    return sorted(path.stem for path in model_dir().glob("*.yaml"))


def _model(name: str):
    """The shipped config ``name``, at its own dtypes and ``model.tp`` (1), as a run builds it."""
    from omegaconf import OmegaConf

    from kvbench.app.config import to_dataclass
    from kvbench.specs.model import ModelConfig, model_spec

    config = to_dataclass(ModelConfig, OmegaConf.load(model_dir() / f"{name}.yaml"), "model")
    return config, model_spec(config)


def coverage(kernels: list[type], hardware: list[str], models: list[str] | None = None) -> list[Coverage]:
    """Every shipped model (or ``models``) against every measured kernel class in ``kernels`` on
    every hardware config in ``hardware`` where that kernel was measured."""
    from kvbench.exec.profiled import load_tables, table_kv_dtype

    rows = []
    for name in shipped_models() if models is None else models:
        config, model = _model(name)
        shape = f"{model.heads_per_gpu}/{model.kv_heads_per_gpu}/{model.head_dim}"
        for hardware_name in hardware:
            system = profiles.hardware_system(hardware_name)
            for cls in kernels:
                if system not in cls.measured.sources:
                    continue
                gemm_dtype = cls(cls.Config()).gemm_dtype(config.dtype)  # the kernel's default kernel.gemm
                try:
                    load_tables(cls.measured, system, model, gemm_dtype, table_kv_dtype(model))
                    refusal = None
                except ConfigError as exc:
                    refusal = str(exc).splitlines()[0]
                rows.append(Coverage(name, shape, hardware_name, cls.name, refusal))
    return rows


def matrix(rows: list[Coverage], hardware: list[str]) -> list[tuple[str, ...]]:
    """One row per model: its name, its shape, then per hardware config the kernels that price it
    (``sglang_fa3, trtllm``; ``-`` for none), as ``kvbench profiles`` and the README show it."""
    table = []
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model]
        cells = [", ".join(r.kernel for r in mine if r.hardware == name and r.covered) or "-" for name in hardware]
        table.append((model, mine[0].shape, *cells))
    return table
