"""What a one-request run pays before and after its loop: the modules it imports and the times it
composes its config (``benchmarks/startup.py`` times it; these check the what, never the how long)."""

from __future__ import annotations

import json

import pytest
from kvbench_cli import kvbench

#: kvbench's entry point, reporting at exit which of ``WATCHED`` the process imported and how
#: many times Hydra composed: entered ``Hydra.compose_config``, and composed (the defaults list,
#: the files, the merge: ``ConfigLoaderImpl._load_configuration_impl``)
SPY = """
import atexit, json, sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.hydra import Hydra

WATCHED = {watched!r}
calls = {{"compose_config": 0, "composed": 0}}

def counted(cls, name, key):
    original = getattr(cls, name)
    def spy(*args, **kwargs):
        calls[key] += 1
        return original(*args, **kwargs)
    setattr(cls, name, spy)

counted(Hydra, "compose_config", "compose_config")
counted(ConfigLoaderImpl, "_load_configuration_impl", "composed")

@atexit.register
def report():
    imported = sorted(name for name in WATCHED if name in sys.modules)
    print("SPY " + json.dumps({{"imported": imported, **calls}}))

from kvbench.commands.entry import main
main()
"""
#: never imported by a simulated run on the roofline: the real mode's stack, W&B (off by default),
#: the profiled clock and its tables (a measured or transferred kernel's), pyplot (a run's figures
#: are drawn without it)
NEVER = ("torch", "transformers", "triton", "wandb", "kvbench.exec.profiled", "kvbench.exec.real", "matplotlib.pyplot")
WATCHED = (*NEVER, "matplotlib", "pandas", "rich")
#: kernel=torch: the roofline's path (kvbench's default kernel, triton, is priced on the default
#: H100 by the transfer's profiled clock, which reads its tables with pandas: checked below)
ONE_REQUEST = ["workload.num_requests=1", "progress=false", "kernel=torch"]


def _spied(tmp_path, monkeypatch, *args: str) -> dict:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    proc = kvbench(*args, cwd=tmp_path, code=SPY.format(watched=WATCHED))
    assert proc.returncode == 0, proc.stderr
    [line] = [line for line in proc.stdout.splitlines() if line.startswith("SPY ")]
    return json.loads(line.removeprefix("SPY "))


def test_a_run_without_figures_imports_neither_matplotlib_nor_pandas_nor_the_gpu_stack(tmp_path, monkeypatch):
    spied = _spied(tmp_path, monkeypatch, *ONE_REQUEST, "output.figures=false", "hydra.run.dir=run")
    assert set(spied["imported"]) == {"rich"}  # its summary on screen; its tables through pyarrow and numpy
    tables = {f"{table}.{ext}" for table in ("refusals", "requests", "steps", "summary") for ext in ("csv", "parquet")}
    written = {path.name for path in (tmp_path / "run").iterdir()}
    assert written == {".hydra", "COMPLETE", "config.json", "summary.json", *tables}


#: a prefix-caching allocator on a trace with prompt content draws the prefix cache too
#: (its first 5 requests: the trace's first is longer than the model's context)
PREFIX_CACHING = [
    "allocator=paged_cached",
    "workload=mooncake_conversation",
    "workload.num_requests=5",
    "progress=false",
    "kernel=torch",
]


@pytest.mark.parametrize("overrides", [ONE_REQUEST, PREFIX_CACHING], ids=["paged", "prefix_caching"])
def test_a_run_draws_its_figures_without_pyplot_or_pandas(tmp_path, monkeypatch, overrides):
    spied = _spied(tmp_path, monkeypatch, *overrides, "hydra.run.dir=run")
    assert set(spied["imported"]) == {"matplotlib", "rich"}
    assert (tmp_path / "run" / "memory.png").is_file()
    assert (tmp_path / "run" / "prefix_cache.png").is_file() == (overrides is PREFIX_CACHING)


def test_the_default_kernel_on_h100_reads_the_transfer_tables_and_nothing_of_the_gpu_stack(tmp_path, monkeypatch):
    spied = _spied(tmp_path, monkeypatch, "workload.num_requests=1", "progress=false", "output.figures=false")
    assert set(spied["imported"]) == {"kvbench.exec.profiled", "pandas", "rich"}


@pytest.mark.parametrize("output", [[], ["output.write=false"]])
def test_a_run_composes_its_config_once(tmp_path, monkeypatch, output):
    spied = _spied(tmp_path, monkeypatch, *ONE_REQUEST, *output, "hydra.run.dir=run")
    # Hydra composes to read hydra.mode, then again to run; the second is handed the first's config
    assert spied["composed"] == 1
    assert spied["compose_config"] == 2


def test_a_sweep_composes_its_own_config_once(tmp_path, monkeypatch):
    spied = _spied(tmp_path, monkeypatch, "-m", "allocator=naive,paged", *ONE_REQUEST, "hydra.sweep.dir=sweep")
    # the sweep's config once (Hydra: twice), then each job's twice: Hydra's sweeper composes every
    # job before launching any (a bad value stops the sweep before it starts), its launcher again
    assert spied["composed"] == 1 + 2 * 2


def test_version_through_the_console_script_imports_no_hydra(tmp_path):
    from kvbench.output.provenance import version_line

    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print(sorted(m for m in ('hydra', 'omegaconf', 'pandas') if m in sys.modules)))\n"
        "from kvbench.commands.entry import main\n"
        "main()\n"
    )
    proc = kvbench("--version", cwd=tmp_path, code=code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [version_line(), "[]"]
