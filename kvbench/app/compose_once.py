"""One composition of the config per command, where Hydra's ``@hydra.main`` makes two.

Before it runs an application, Hydra composes the whole config once only to read ``hydra.mode``
(``Hydra.get_mode``: in multirun mode, sweep overrides unchecked, errors swallowed), then composes
it again to run it (``Hydra.run`` or ``Hydra.multirun``), with ``hydra.mode=RUN`` (or
``MULTIRUN``) appended to the overrides when the config left the mode unset. The second
composition reads the same files with the same overrides: it differs from the first only where
the mode does (a sweep override is refused in a single run; a missing ``???`` default is an error
rather than skipped) and by that one appended override. :func:`composed_once` keeps the first
composition and hands it to the second whenever they are the same: it checks the overrides as the
second would, applies the appended override the way Hydra does, and composes anew otherwise.

Composing kvbench's config takes about 0.15 s (its defaults list reads some 40 files and merges
the schema), a tenth of a one-request run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def composed_once() -> Iterator[None]:
    """Within it, a command Hydra launches composes its config once (Hydra's own methods are
    restored on the way out). Hydra versions without the methods this relies on are left alone."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.hydra import Hydra

    get_mode = getattr(Hydra, "get_mode", None)
    load = getattr(ConfigLoaderImpl, "load_configuration", None)
    if get_mode is None or load is None or not hasattr(ConfigLoaderImpl, "_apply_overrides_to_config"):
        yield
        return
    #: what get_mode composed: (config name, overrides, its hydra.mode, the config), taken by the next load
    kept: list[tuple[Any, list[str], Any, Any]] = []

    def get_mode_once(self, config_name, overrides):
        from hydra.types import RunMode

        kept.clear()
        try:  # Hydra's get_mode, keeping the config it composes
            cfg = self.compose_config(
                config_name=config_name,
                overrides=overrides,
                with_log_configuration=False,
                run_mode=RunMode.MULTIRUN,
                validate_sweep_overrides=False,
            )
        except Exception:  # noqa: BLE001 - as Hydra: the run's own composition says what is wrong
            return None
        kept.append((config_name, list(overrides), cfg.hydra.mode, cfg))
        return cfg.hydra.mode

    def load_once(self, *args, **kwargs):
        first = kept.pop() if kept else None
        cfg = _reused(first, args, kwargs)
        return cfg if cfg is not None else load(self, *args, **kwargs)

    Hydra.get_mode = get_mode_once
    ConfigLoaderImpl.load_configuration = load_once
    try:
        yield
    finally:
        Hydra.get_mode = get_mode
        ConfigLoaderImpl.load_configuration = load


def _reused(first, args: tuple, kwargs: dict):
    """The config get_mode composed, as ``load_configuration(**kwargs)`` would compose it again, or
    None when that composition could differ (then it is done anew)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    if (
        first is None
        or args
        or set(kwargs) - {"config_name", "overrides", "run_mode", "from_shell", "validate_sweep_overrides"}
    ):
        return None
    config_name, overrides, mode, cfg = first
    asked = list(kwargs.get("overrides", []))
    run_mode = kwargs.get("run_mode")
    if kwargs.get("config_name") != config_name or asked[: len(overrides)] != overrides:
        return None
    appended = asked[len(overrides) :]
    if run_mode not in (RunMode.RUN, RunMode.MULTIRUN) or appended not in ([], [f"hydra.mode={run_mode.name}"]):
        return None
    if appended and mode is not None:
        return None  # Hydra appends the mode only to a config that leaves it unset
    choices = cfg.hydra.runtime.choices
    if run_mode == RunMode.RUN and any(OmegaConf.is_missing(choices, group) for group in choices):
        return None  # a ??? default skipped for the multirun mode: a single run must refuse it
    parser = OverridesParser.create()
    if kwargs.get("validate_sweep_overrides", True):
        try:
            ConfigLoaderImpl.validate_sweep_overrides_legal(
                overrides=parser.parse_overrides(overrides=asked),
                run_mode=run_mode,
                from_shell=kwargs.get("from_shell", True),
            )
        except Exception:  # noqa: BLE001 - composed anew, the error is raised where Hydra raises it
            return None
    if appended:  # as Hydra applies an override of a value, after the others; its line is the last
        parsed = parser.parse_overrides(overrides=appended)
        ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
        for override in parsed:
            cfg.hydra.overrides.hydra.append(override.input_line)
    return cfg
