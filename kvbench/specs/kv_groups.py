"""KV-cache groups: which layers keep which tokens' KV, read from a model's config.json fields.

A full-attention layer keeps every token's K and V; a sliding-window layer keeps only the last
``W`` tokens' (each query attends to itself and the ``W - 1`` tokens before it). Models mix them:
Mistral-7B v0.1 windows every layer (``sliding_window``), Gemma-2 alternates window and full layers
1:1, Gemma-3 has five window layers per full one, gpt-oss alternates 128-token windows with full
layers. transformers spells the pattern as ``layer_types`` (one ``"sliding_attention"`` or
``"full_attention"`` per layer), derived for older configs from ``sliding_window_pattern``.

vLLM's hybrid KV cache manager (design doc "Hybrid KV Cache Manager") cuts the layers into *KV cache
groups* of one attention type each, all groups the same number of layers, so that one block of any
group has the same bytes (block tokens x the group's layers x bytes per layer and token) and all
groups draw from one block pool; each request has one block table per group. vLLM pads the last
group of a type when the counts do not divide; kvbench takes groups of the greatest common divisor
of the counts instead (no padding: Gemma-3's 40 window + 8 full layers are 6 groups of 8, Gemma-2's
21 + 21 are 2 groups of 21), a choice that only changes how many groups there are.

A linear-attention layer (Qwen3.5's gated delta net, ``layer_types`` value ``"linear_attention"``)
keeps no KV per token but a fixed state per sequence: its layers form ``state`` groups (the same gcd
rule: Qwen3.5-397B's 45 linear and 15 full layers are 3 state groups and 1 full group of 15), each
with its bytes per sequence on one GPU (:mod:`kvbench.specs.architecture`). vLLM gives such state
its own group too (its hybrid allocator keeps one state block per request per mamba group).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvbench.errors import ConfigError, require

FULL = "full"
WINDOW = "window"
STATE = "state"
KINDS = (FULL, WINDOW, STATE)

#: transformers' default ``sliding_window`` per model type (configuration_<type>.py), used when a
#: config leaves the field out; an explicit null means no window (every layer full attention)
WINDOW_DEFAULTS: dict[str, int] = {"mistral": 4096, "gemma2": 4096, "gemma3_text": 4096, "gpt_oss": 128}
#: model types whose window layers follow a pattern when ``layer_types`` is absent: every
#: ``pattern``-th layer (1-based) is full attention, the others windowed, as transformers derives
#: ``layer_types`` (Gemma-2 and gpt-oss: 2, alternating; Gemma-3: ``sliding_window_pattern``, default 6)
PATTERN_DEFAULTS: dict[str, int] = {"gemma2": 2, "gemma3_text": 6, "gpt_oss": 2}
#: model types whose ``sliding_window`` windows every layer when ``layer_types`` is absent
WINDOW_EVERY_LAYER = ("mistral",)
LAYER_TYPE_KINDS = {"full_attention": FULL, "sliding_attention": WINDOW, "linear_attention": STATE}
#: model types whose layers are linear attention but every ``full_attention_interval``-th (1-based)
#: when ``layer_types`` is absent, as transformers derives ``layer_types`` for Qwen3.5
LINEAR_INTERVAL_DEFAULTS: dict[str, int] = {"qwen3_5_moe_text": 4}


@dataclass(frozen=True)
class KVGroup:
    """One KV-cache group: ``num_layers`` layers of one attention kind."""

    kind: str
    num_layers: int
    #: a window group's W (each query reads the last W tokens, itself included); 0 otherwise
    window_tokens: int = 0
    #: a state group's bytes per sequence (fixed, whatever its length); 0 otherwise
    state_bytes: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.num_layers < 1:
            raise ValueError(f"bad KV group {self}")
        if (self.kind == WINDOW) != (self.window_tokens > 0):
            raise ValueError(f"a window group and only a window group has window_tokens: {self}")

    def held_tokens(self, num_tokens: int) -> int:
        """Tokens whose KV this group's attention reads for the next token of a ``num_tokens``-token
        sequence: all of them, or the last W (0 for a state group, which reads its state)."""
        if self.kind == WINDOW:
            return num_tokens if num_tokens < self.window_tokens else self.window_tokens
        return num_tokens if self.kind == FULL else 0


def _layer_types(fields: dict[str, Any], model_type: str, num_layers: int, where: str) -> list[str] | None:
    """The config's ``layer_types`` checked (one known kind per layer), or derived from Qwen3.5's
    ``full_attention_interval``; None when neither is there."""
    layer_types = fields.get("layer_types")
    if layer_types is None and model_type in LINEAR_INTERVAL_DEFAULTS:
        interval = fields.get("full_attention_interval", LINEAR_INTERVAL_DEFAULTS[model_type])
        ok = isinstance(interval, int) and not isinstance(interval, bool) and interval >= 1
        require(ok, "model.hf_config.full_attention_interval", interval, f"use a positive integer{where}")
        return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]
    if layer_types is None:
        return None
    ok = isinstance(layer_types, (list, tuple)) and len(layer_types) == num_layers
    require(
        ok,
        "model.hf_config.layer_types",
        layer_types,
        f"give num_hidden_layers={num_layers} entries, each one of {', '.join(LAYER_TYPE_KINDS)}{where}",
    )
    for i, kind in enumerate(layer_types):
        if kind not in LAYER_TYPE_KINDS:
            raise ConfigError(
                f"model.hf_config.layer_types[{i}]={kind!r} is an unknown layer kind: "
                f"use one of {', '.join(LAYER_TYPE_KINDS)}{where}"
            )
    return list(layer_types)


def layer_kinds(fields: dict[str, Any], model_type: str, num_layers: int, where: str = "") -> list[tuple[str, int]]:
    """Each layer's ``(kind, window)`` (window 0 but for a window layer), as transformers reads the
    config: ``layer_types`` when given, else the family's rule for ``sliding_window`` (and its
    pattern). An explicit null ``sliding_window`` makes every window layer full attention (the
    full-attention twin); linear-attention layers stay state layers."""
    layer_types = _layer_types(fields, model_type, num_layers, where)
    window = fields.get("sliding_window", WINDOW_DEFAULTS.get(model_type))
    if window is not None:
        ok = isinstance(window, int) and not isinstance(window, bool) and window >= 1
        require(ok, "model.hf_config.sliding_window", window, f"use a positive integer or null{where}")
    if layer_types is not None:
        kinds = [LAYER_TYPE_KINDS[t] for t in layer_types]
        if window is None:
            kinds = [FULL if kind == WINDOW else kind for kind in kinds]
        return [(kind, window if kind == WINDOW else 0) for kind in kinds]
    if window is None:
        return [(FULL, 0)] * num_layers  # no window: every layer full attention (the full-attention twin)
    if model_type in PATTERN_DEFAULTS:
        pattern = fields.get("sliding_window_pattern", PATTERN_DEFAULTS[model_type])
        ok = isinstance(pattern, int) and not isinstance(pattern, bool) and pattern >= 1
        require(ok, "model.hf_config.sliding_window_pattern", pattern, f"use a positive integer{where}")
        return [(FULL, 0) if (i + 1) % pattern == 0 else (WINDOW, window) for i in range(num_layers)]
    if model_type in WINDOW_EVERY_LAYER:
        return [(WINDOW, window)] * num_layers
    return [(FULL, 0)] * num_layers  # a family without windows (Llama, Qwen3, OPT): its sliding_window is unused


def layer_windows(fields: dict[str, Any], model_type: str, num_layers: int, where: str = "") -> list[int]:
    """Each layer's window in tokens (0: full attention) of a model without linear-attention layers
    (:func:`layer_kinds` for one with them)."""
    kinds = layer_kinds(fields, model_type, num_layers, where)
    if any(kind == STATE for kind, _ in kinds):
        raise ConfigError(f"model.hf_config.layer_types has linear_attention layers, which hold no window{where}")
    return [window for _, window in kinds]


def kv_groups(layers: Sequence[int] | Sequence[tuple[str, int]], state_bytes_per_layer: int = 0) -> tuple[KVGroup, ...]:
    """The layers cut into groups of one kind (and one window) each, all of the same size: the
    greatest common divisor of the counts. ``layers`` holds each layer's window (0: full) or its
    ``(kind, window)``; a state group's ``state_bytes`` is its layers x ``state_bytes_per_layer``.
    Full groups first, then windows from the widest, then state groups."""
    counts: dict[tuple[str, int], int] = {}
    for layer in layers:
        key = layer if isinstance(layer, tuple) else ((FULL, 0) if layer == 0 else (WINDOW, layer))
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        raise ConfigError("the model has no layers")
    size = math.gcd(*counts.values())
    order = {FULL: 0, WINDOW: 1, STATE: 2}
    groups = []
    for kind, window in sorted(counts, key=lambda k: (order[k[0]], -k[1])):
        state_bytes = size * state_bytes_per_layer if kind == STATE else 0
        groups += [KVGroup(kind, size, window, state_bytes)] * (counts[kind, window] // size)
    return tuple(groups)


def is_hybrid(groups: tuple[KVGroup, ...]) -> bool:
    """Whether a cache must keep these groups apart: more than one group, or any not full."""
    return len(groups) > 1 or any(g.kind != FULL for g in groups)
