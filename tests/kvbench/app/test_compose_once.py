"""One composition where Hydra makes two (kvbench/app/compose_once.py): the config a run gets is the
very one Hydra would have composed again, and where it could differ Hydra composes anew."""

from __future__ import annotations

import pytest
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from omegaconf import OmegaConf

from kvbench.app.compose_once import composed_once
from kvbench.app.searchpath import register as register_searchpath


@pytest.fixture
def hydra_app():
    """Hydra set up as ``kvbench`` sets it up (its config module, its plugins' search path)."""
    from hydra.core.config_store import ConfigStore

    from kvbench.app.config import KvbenchConfig

    ConfigStore.instance().store(name="kvbench_schema", node=KvbenchConfig)
    register_searchpath()
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        yield GlobalHydra.instance().hydra


def _as_hydra_runs_it(hydra_app, overrides: list[str], run_mode: RunMode):
    """What ``Hydra.run`` / ``Hydra.multirun`` compose after ``get_mode`` (``_run_app``'s steps, for
    a command line with ``-m`` when ``run_mode`` is MULTIRUN, without it when RUN)."""
    overrides = list(overrides)
    mode = hydra_app.get_mode(config_name="config", overrides=overrides)
    if mode is None:
        overrides.append(f"hydra.mode={run_mode.name}")
    else:
        run_mode = mode  # the config's mode decides (-m with hydra.mode=RUN aside: its own test below)
    return hydra_app.compose_config(config_name="config", overrides=overrides, run_mode=run_mode)


def _loads(monkeypatch) -> list:
    """Counts the compositions themselves (the defaults list, the files, the merge)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    calls = []
    impl = ConfigLoaderImpl._load_configuration_impl

    def counted(self, *args, **kwargs):
        calls.append(kwargs.get("run_mode"))
        return impl(self, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "_load_configuration_impl", counted)
    return calls


@pytest.mark.parametrize(
    "overrides, run_mode",
    [
        (["workload.num_requests=1"], RunMode.RUN),
        (["allocator=naive", "engine=vllm_v1", "hydra.run.dir=/tmp/x", "+hydra.job.env_set.A=1"], RunMode.RUN),
        (["hydra.mode=RUN", "seed=3"], RunMode.RUN),
        (["allocator=naive,paged", "seed=0,1"], RunMode.MULTIRUN),
        (["hydra.mode=MULTIRUN", "seed=0,1"], RunMode.RUN),  # the command line asks for a sweep without -m
    ],
)
def test_the_config_is_the_one_hydra_composes_again(hydra_app, monkeypatch, overrides, run_mode):
    twice = _as_hydra_runs_it(hydra_app, overrides, run_mode)
    loads = _loads(monkeypatch)
    with composed_once():
        once = _as_hydra_runs_it(hydra_app, overrides, run_mode)
    assert len(loads) == 1
    assert OmegaConf.to_container(once, resolve=False) == OmegaConf.to_container(twice, resolve=False)
    assert OmegaConf.to_yaml(once) == OmegaConf.to_yaml(twice)  # what Hydra saves in .hydra/


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["allocator=naive,paged"], "Ambiguous value"),  # a sweep without -m: the run's own composition refuses it
        (["allocator=pagd"], "allocator/pagd"),  # get_mode swallows the error, the run's composition raises it
    ],
)
def test_a_refused_command_line_is_composed_anew_and_refused_as_by_hydra(hydra_app, monkeypatch, overrides, message):
    def refusal():
        with pytest.raises(ConfigCompositionException) as refused:
            _as_hydra_runs_it(hydra_app, overrides, RunMode.RUN)
        return str(refused.value)

    by_hydra = refusal()
    loads = _loads(monkeypatch)
    with composed_once():
        assert refusal() == by_hydra and message in by_hydra
    assert len(loads) == 2


def test_a_sweep_asked_of_a_single_run_is_composed_anew(hydra_app, monkeypatch):
    # -m with a config whose hydra.mode says RUN: Hydra warns and appends hydra.mode=MULTIRUN
    loads = _loads(monkeypatch)
    with composed_once():
        assert hydra_app.get_mode(config_name="config", overrides=["hydra.mode=RUN"]) == RunMode.RUN
        cfg = hydra_app.compose_config(
            config_name="config", overrides=["hydra.mode=RUN", "hydra.mode=MULTIRUN"], run_mode=RunMode.MULTIRUN
        )
    assert cfg.hydra.mode == RunMode.MULTIRUN and len(loads) == 2


def test_hydra_is_itself_again_outside(hydra_app):
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.hydra import Hydra

    before = (Hydra.get_mode, ConfigLoaderImpl.load_configuration)
    with pytest.raises(RuntimeError), composed_once():
        assert (Hydra.get_mode, ConfigLoaderImpl.load_configuration) != before
        raise RuntimeError("a job's error")
    assert (Hydra.get_mode, ConfigLoaderImpl.load_configuration) == before
