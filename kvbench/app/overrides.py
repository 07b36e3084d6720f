"""Hydra's errors about a command line, as one line that names the override and what is allowed.

kvbench does not pre-check overrides: Hydra parses them with its own grammar (list values, quoted
strings, ``range()``/``choice()`` sweeps), composes the config, types it against the structured
schema and, for a multirun, composes every job of the sweep before the first one runs. Its
messages span several lines (search paths, a hint to set ``HYDRA_FULL_ERROR``), so the exception is
turned into one line here, with the keys or options a user could have meant.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from kvbench.errors.extras import install_hint
from kvbench.errors.suggest import did_you_mean

GRAMMAR_URL = "https://hydra.cc/docs/advanced/override_grammar/basic/"

#: a refused choice as kvbench's checks word it (kvbench.errors.require and the plugin lookups):
#: ``preemption.victim='newst' is invalid: choose one of newest, least_progress, ...``
_REFUSED_CHOICE = re.compile(
    r"(?P<key>[^='\"]+)=(?P<value>'[^'\\]*'|\"[^\"\\]*\")(?P<middle>[ :;].*?)(?P<choose>choose one of:? )(?P<choices>.*)"
)
#: a choice is a plain name; the list ends at the first character a name cannot hold
_CHOICE = re.compile(r"[\w.\-/]+")


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _unparsable(args: Sequence[str]) -> str | None:
    """The first argument Hydra's override grammar rejects, if any."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for arg in args:
        if arg.startswith("-") or "=" not in arg and not arg.startswith("~"):
            continue
        try:
            parser.parse_override(arg)
        except HydraException:
            return arg
    return None


def _not_a_key(exc: BaseException, cause: BaseException, args: Sequence[str] = ()) -> str | None:
    """``Could not override 'a.b'`` because ``b`` is not a key of ``a``: the keys ``a`` has."""
    from omegaconf import DictConfig
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    if not isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        return None
    parent = getattr(cause, "parent_node", None)
    key = getattr(cause, "full_key", None)
    if not isinstance(parent, DictConfig) or not key:
        return None
    message = str(exc)
    typed = message.split("use +", 1)[1].split()[0] if "use +" in message else key
    where, _, leaf = str(key).rpartition(".")
    names = [str(k) for k in parent.keys() if k != "hydra"]
    name = parent.get("name") if where and "name" in parent else None
    place = f"{where} ({name})" if isinstance(name, str) else where or "the top level"
    owners = _options_with_key(where, leaf) if isinstance(name, str) else []
    if owners:  # a key of another option of the group: a sweep over the group cannot set it for all
        # kvbench's sweeper gives a key to the jobs whose option has it (kvbench/app/sweep_jobs.py);
        # the option the command line picked (orca_pow2), else its name field (per_request)
        chosen = [a.partition("=")[2] for a in args if a.partition("=")[0] == where and "," not in a]
        picked = chosen[-1] if chosen else name
        guess = (
            f"it is a key of {' and '.join(f'{where}={o}' for o in owners)}: set it in a run of "
            f"{'one of those' if len(owners) > 1 else 'that one'}, or sweep {where} over "
            f"{'them' if len(owners) > 1 else 'it'} too (kvbench -m {where}={picked},{','.join(owners)} "
            f"{where}.{leaf}={typed.partition('=')[2] or '...'});"
        )
    else:
        guess = did_you_mean(leaf, names, prefix=f"{where}." if where else "")
    return (
        f"{typed} is not a config key: {leaf!r} is not in {place}; {guess + ' ' if guess else ''}"
        f"its keys are: {', '.join(names)} (to add a key on purpose, write +{typed})"
    )


def _options_with_key(group: str, key: str) -> list[str]:
    """The options of config group ``group`` (kvbench's own ``conf/<group>/*.yaml``) that set ``key``."""
    from importlib.resources import files

    import yaml

    folder = files("kvbench.conf").joinpath(group)
    owners = []
    if not folder.is_dir():
        return owners
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            try:
                content = yaml.safe_load(entry.read_text())
            except yaml.YAMLError:
                continue
            if isinstance(content, dict) and key in content:
                owners.append(entry.name.removesuffix(".yaml"))
    return owners


#: Hydra's launchers kvbench documents, by the extra (pyproject) that installs each
LAUNCHER_EXTRAS = {"joblib": "joblib", "submitit_local": "submitit", "submitit_slurm": "submitit", "ray": "ray"}


def hydra_error_line(exc: BaseException, args: Sequence[str] = ()) -> str:
    """One line for a Hydra or OmegaConf exception raised while parsing or composing ``args``."""
    from hydra.errors import MissingConfigException, OverrideParseException

    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, OverrideParseException):
        bad = _unparsable(args)
        what = f"{bad!r} is not a valid override" if bad else "an override is not valid"
        return f"{what}: {_first_line(exc)} (Hydra's override grammar: {GRAMMAR_URL})"
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and exc.options:
        group, _, choice = exc.missing_cfg_file.rpartition("/")
        if group:
            guess = did_you_mean(choice, sorted(exc.options))
            extra = LAUNCHER_EXTRAS.get(choice) if group == "hydra/launcher" else None
            if extra and choice not in exc.options:  # a launcher kvbench documents, not installed here
                guess = f"it comes with an extra: {install_hint(extra)} (docs/launchers.md);"
            return (
                f"{group}={choice!r} is not a known {group}; {guess + ' ' if guess else ''}"
                f"choose one of: {', '.join(sorted(exc.options))}"
            )
    if cause is not None:
        line = _not_a_key(exc, cause, args)
        if line:
            return line
        first = _first_line(exc).removeprefix("Error merging override ")
        return f"{first} is invalid: {_first_line(cause)}"
    return _first_line(exc)


def _bool_keys(schema: type, prefix: str = "") -> list[str]:
    """The dotted keys of the boolean options of a typed config section and its typed subsections."""
    import dataclasses
    import typing

    keys = []
    try:
        hints = typing.get_type_hints(schema)
    except Exception:  # noqa: BLE001 - an outside plugin's annotation that cannot be resolved here
        hints = {f.name: f.type for f in dataclasses.fields(schema)}
    for f in dataclasses.fields(schema):
        kind = hints.get(f.name)
        if kind in (bool, "bool"):
            keys.append(prefix + f.name)
        elif dataclasses.is_dataclass(kind):
            keys += _bool_keys(kind, f"{prefix}{f.name}.")
    return keys


def bool_override_error(args: Sequence[str]) -> str | None:
    """One line for a boolean option given a value that is not true or false (``progress=2``).

    The top-level schema types these options as ``bool``, and OmegaConf then converts any integer
    (and "yes", "on", "1") silently: ``progress=2`` would read as true without a word. Hydra's own
    parser reads the override, so a sweep's values (``output.steps=true,2``) are checked one by one."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep
    from hydra.errors import HydraException

    from kvbench.app.config import KvbenchConfig

    keys = set(_bool_keys(KvbenchConfig))
    parser = OverridesParser.create()
    for arg in args:
        if arg.startswith("-") or "=" not in arg or arg.split("=", 1)[0].lstrip("+~") not in keys:
            continue
        try:
            override = parser.parse_override(arg)
        except HydraException:
            continue  # Hydra says what is wrong with it, in its own words
        value = override.value()
        values = value.list if isinstance(value, ChoiceSweep) else [value]
        bad = [v for v in values if not isinstance(v, bool)]
        if bad:
            return f"{override.key_or_group}={bad[0]!r} is invalid: use true or false"
    return None


def with_suggestion(message: str) -> str:
    """``message`` with ``did you mean `newest`?`` before its ``choose one of`` list when it refuses
    a value that is a near miss of one of the choices (``preemption.victim='newst' is invalid: did
    you mean `newest`? choose one of newest, least_progress, ...``); otherwise unchanged.

    kvbench's checks of choice-valued keys (``wandb.mode``, ``preemption.victim``, a plugin's
    ``kernel.backend``...) all word a refusal this way, through :func:`kvbench.errors.require`,
    and are spread over the modules that own the keys: the suggestion is added once, where the
    line is printed, for every one of them."""
    match = _REFUSED_CHOICE.fullmatch(message)
    if match is None or "did you mean" in message:
        return message
    choices = []
    for item in match["choices"].split(", "):
        name = _CHOICE.match(item)
        if name is None:
            break
        choices.append(name.group())
        if name.end() < len(item):  # `fcfs; or ...`, `fcfs (the default)`: the list ends here
            break
    guess = did_you_mean(ast.literal_eval(match["value"]), choices)
    if not guess:
        return message
    at = match.start("choose")
    if message[:at].endswith((": ", "; ")):  # a sentence of its own, before the list
        return f"{message[:at]}{guess} {message[at:]}"
    at = match.end("value")  # `... is invalid: unset it or choose one of`: beside the value
    return f"{message[:at]} ({guess}){message[at:]}"
