"""``kvbench --help``: Hydra's help page, rendered from Hydra's own template and config.

Hydra's ``--help`` lists the options of every config group, its own included, through a call that
deep-copies its whole config repository once per group listed (about 80 copies with the launcher
plugins installed): over a second on a small machine. kvbench renders the same template
(``hydra.help`` in ``conf/config.yaml``: header, the groups a user picks from, the composed config
with the command line's overrides applied, footer) and lists only its own groups, once each,
wrapped to 100 columns (Hydra writes each group's options on one line, past 200 columns).
``--hydra-help`` is still Hydra's.
"""

from __future__ import annotations

import os
import signal
import string
import sys
import textwrap
from collections.abc import Sequence

from omegaconf import OmegaConf

HELP_FLAGS = ("--help", "-h")


def subcommand_lines(summaries: dict[str, str]) -> str:
    """The subcommands on ``kvbench --help``, one line each, in a column: the text of the
    ``${kvbench_subcommands:}`` interpolation in ``hydra.help`` (kvbench.commands.main registers it:
    Hydra's own rendering of the page gives the same text as kvbench's)."""
    width = max(map(len, summaries)) + len("kvbench ") + 2
    return "\n".join(f"  {'kvbench ' + name:<{width}}{summary}" for name, summary in summaries.items())


#: the width the help page is laid out for: a common terminal, and a pipe's or a log's (the
#: reports' width, :data:`kvbench.output.run_report.REPORT_WIDTH`)
PAGE_WIDTH = 100


def group_lines(groups: dict[str, list[str]], width: int = PAGE_WIDTH) -> str:
    """``group: option, option, ...`` for each config group, wrapped at ``width`` columns under its
    first option (never inside an option's name)."""
    return "\n".join(
        textwrap.fill(
            f"{group}: {', '.join(options)}",
            width,
            subsequent_indent=" " * (len(group) + 2),
            break_long_words=False,
            break_on_hyphens=False,
        )
        for group, options in groups.items()
    )


def wants_help(args: Sequence[str]) -> bool:
    return any(arg in HELP_FLAGS for arg in args)


def render_help(args: Sequence[str], config_name: str = "config", groups: Sequence[str] | None = None) -> str:
    """The help page for ``kvbench <args> --help`` (``key=value`` arguments are applied first):
    ``config_name``'s ``hydra.help``, listing the options of ``groups`` (kvbench's own by default)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from kvbench.app.config import CONFIG_GROUPS, PRESET_GROUPS

    overrides = [arg for arg in args if not arg.startswith("-")]
    listed = sorted((*CONFIG_GROUPS, *PRESET_GROUPS) if groups is None else groups)
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
        loader = GlobalHydra.instance().config_loader()
        group_text = group_lines({group: sorted(loader.get_group_options(group)) for group in listed})
    template = str(cfg.hydra.help.template)
    app_config = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    return string.Template(template).safe_substitute(
        APP_CONFIG_GROUPS=group_text + "\n",
        HYDRA_CONFIG_GROUPS="(kvbench --hydra-help lists Hydra's own groups)\n",
        CONFIG=OmegaConf.to_yaml(app_config, resolve=False),
    )


def print_page(page: str) -> None:
    """Print the page; a reader that stops early (``kvbench --help | head``) ends the command
    quietly, with 128 + SIGPIPE as a shell's own commands do, instead of a BrokenPipeError traceback."""
    try:
        print(page)
        sys.stdout.flush()
    except BrokenPipeError:
        # the interpreter flushes stdout again at exit: point it at nothing so that it cannot fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + getattr(signal, "SIGPIPE", 13))
