"""Tab completion: kvbench answers Hydra's completion query itself, subcommands included.

``eval "$(kvbench -sc install=bash)"`` installs Hydra's shell function, which runs
``kvbench -sc query=bash`` with the line typed so far in ``COMP_LINE`` on every TAB (zsh runs the
same function through bashcompinit; fish's runs ``-sc query=fish``). Hydra's own answer knows
nothing of subcommands (``kvbench slo-batch <TAB>`` printed a parse error into the terminal), and
it costs: it rebuilds its config repository (every search-path folder listed, every primary
config read) once for each config group it lists, 19 times for ``kvbench <TAB>``, and kvbench's
search-path plugin imports every installed plugin (numpy, the schedulers) only to ask it for
config folders. Here:

- the first word: the subcommands it begins, beside Hydra's groups and keys;
- after a subcommand: Hydra's answer for the rest of the line against the config the subcommand's
  overrides apply to, or nothing (the shell then completes file names: ``compare``'s folders);
- Hydra's answer is Hydra's own code (``CompletionPlugin._query``, which only reads the config),
  given only the words Hydra's parser takes, on a config loader that builds the repository once per
  query, with a search path of Hydra's plugins and the config folders of plugins installed from
  outside kvbench (kvbench's own plugins have none: a test checks it).

Nothing here prints an error: a query that fails answers nothing (``HYDRA_COMP_DEBUG=1`` shows why
on stderr), since its output lands in the middle of the line being typed.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping, Sequence

#: Hydra's flag for a completion command (``-sc query=bash``)
COMPLETION_FLAGS = ("-sc", "--shell-completion")
#: how each shell's function reads the candidates: bash (and zsh) splits one line, fish reads lines
SEPARATORS = {"bash": " ", "zsh": " ", "fish": "\n"}
#: the distribution whose own plugins are known to add no config folder
KVBENCH_DISTRIBUTION = "kvbench"


def query_shell(args: Sequence[str]) -> str | None:
    """The shell of a completion query (``-sc query=bash``), or None for any other command line
    (``-sc install=bash`` and the like stay Hydra's)."""
    if len(args) != 2 or args[0] not in COMPLETION_FLAGS or not args[1].startswith("query="):
        return None
    shell = args[1].removeprefix("query=")
    return shell if shell in SEPARATORS else None


def typed_line(environ: Mapping[str, str]) -> str:
    """What was typed up to the cursor, without the command's name: COMP_LINE cut at COMP_POINT
    (Hydra reads the whole line, so a TAB in its middle completed the line's last word)."""
    line = environ.get("COMP_LINE", "")
    point = environ.get("COMP_POINT", "")
    if point.isdigit() and int(point) <= len(line):
        line = line[: int(point)]
    first, _, rest = line.lstrip().partition(" ")
    # `python -m kvbench ...` or a script path: Hydra's own rule for what the command's name is
    if os.path.basename(first).startswith("python"):
        from hydra.plugins.completion_plugin import CompletionPlugin

        return CompletionPlugin.strip_python_or_app_name(line)
    return rest if first else ""


def _debug(message: str) -> None:
    if os.environ.get("HYDRA_COMP_DEBUG") == "1":
        print(f"kvbench completion: {message}", file=sys.stderr)


def candidates(line: str, subcommands: Mapping[str, object]) -> list[str]:
    """The completions of ``line`` (what follows ``kvbench``), sorted."""
    words = line.split()
    new_word = not line or line[-1].isspace()
    current = "" if new_word else words[-1]
    before = words if new_word else words[:-1]
    if not before:
        names = [name for name in subcommands if name.startswith(current)]
        return sorted({*names, *_hydra_candidates("config", before, current, own_flags=True)})
    sub = subcommands.get(before[0])
    if sub is None:
        return _hydra_candidates("config", before, current, own_flags=True)
    config_name = getattr(sub, "config_name", None)
    if config_name is None:
        return []
    if config_name != "config":
        # a config of its own: its module stores the config's schema (bench-kernels: 0.15 s more)
        try:
            importlib.import_module(sub.module)
        except Exception as exc:  # noqa: BLE001 - a completion that fails answers nothing, silently
            _debug(f"{type(exc).__name__}: {exc}")
            return []
    return _hydra_candidates(config_name, before[1:], current, own_flags=False)


def _hydra_flags(current: str) -> list[str]:
    from hydra._internal.utils import get_args_parser

    flags = [flag for flag in get_args_parser()._option_string_actions if flag.startswith("--")]
    return sorted(flag for flag in {*flags, "--version"} if flag.startswith(current))


def _hydra_candidates(config_name: str, before: list[str], current: str, own_flags: bool) -> list[str]:
    """Hydra's completions of ``current`` after the words ``before``, for ``config_name``."""
    if current.startswith("-"):
        # a subcommand's own flags are its parser's: importing it would cost more than the TAB is worth
        return _hydra_flags(current) if own_flags else []
    try:
        from hydra._internal.core_plugins.bash_completion import BashCompletion
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from kvbench.commands.arguments import MULTIRUN_FLAGS

        parser = OverridesParser.create()

        def is_override(word: str) -> bool:
            if word.startswith("-"):
                return False
            try:
                parser.parse_override(word)
            except Exception:  # noqa: BLE001 - Hydra's parse errors come in several types
                return False
            return True

        # only what Hydra's completion can read, its sweep flag first as `kvbench` itself puts it: a
        # subcommand's `--flag value`, a typo or a flag after an override would stop it with a usage error
        sweep = [word for word in before if word in MULTIRUN_FLAGS][:1]
        kept = [*sweep, *(word for word in before if is_override(word))]
        line = " ".join([*kept, current]) if current else " ".join(kept) + " "
        return BashCompletion(_config_loader())._query(config_name=config_name, line=line)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a completion that fails answers nothing, silently
        _debug(f"{type(exc).__name__}: {exc}")
        return []


def outside_searchpaths() -> list[str]:
    """The config folders of kvbench plugins installed by other distributions, as
    :func:`kvbench.plugins.config_searchpaths` gives them, without importing kvbench's own plugins."""
    from importlib.metadata import entry_points

    import pluggy

    from kvbench import hookspecs
    from kvbench.plugins import ENTRY_POINT_GROUP

    pm = pluggy.PluginManager("kvbench")
    pm.add_hookspecs(hookspecs)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        if dist is not None and dist.metadata["Name"] == KVBENCH_DISTRIBUTION:
            continue
        try:
            pm.register(ep.load(), name=ep.name)
        except Exception as exc:  # noqa: BLE001 - a run says which plugin is broken; a TAB stays quiet
            _debug(f"plugin {ep.name!r} skipped: {type(exc).__name__}: {exc}")
    return sorted(path for path in pm.hook.kvbench_config_searchpath() if path)


def _config_loader():
    """Hydra's config loader for kvbench, as ``kvbench`` itself builds it, that builds its config
    repository once per (config, overrides) instead of once per group it lists."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    class OutsidePlugins(SearchPathPlugin):
        def manipulate_search_path(self, search_path) -> None:
            for path in outside_searchpaths():
                search_path.append(provider="kvbench-plugin", path=path)

    class OneRepository(ConfigLoaderImpl):
        def __init__(self, config_search_path) -> None:
            super().__init__(config_search_path=config_search_path)
            self.repositories: dict = {}

        # Hydra's own method, with the repository kept: listing a group only reads it
        def get_group_options(self, group_name, results_filter=ObjectType.CONFIG, config_name=None, overrides=None):
            key = (config_name, tuple(overrides or ()))
            if key not in self.repositories:
                self.repositories[key] = self._parse_overrides_and_create_caching_repo(config_name, list(key[1]))[1]
            return self.repositories[key].get_group_options(group_name, results_filter)

    Plugins.instance().register(OutsidePlugins)
    loader = OneRepository(config_search_path=create_config_search_path("pkg://kvbench.conf"))
    GlobalHydra.instance().initialize(Hydra(task_name="kvbench", config_loader=loader))
    return loader


def answer(shell: str, subcommands: Mapping[str, object], environ: Mapping[str, str] | None = None) -> str:
    """What ``kvbench -sc query=<shell>`` prints: the candidates in the shell's format."""
    found = candidates(typed_line(os.environ if environ is None else environ), subcommands)
    return SEPARATORS[shell].join(found)
