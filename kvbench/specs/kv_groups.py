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

A ``state`` group (a fixed number of bytes per sequence, e.g. an SSM layer's state) is declared for
completeness; no model config here produces one and the hybrid allocator refuses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvbench.errors import ConfigError, require

FULL = "full"
WINDOW = "window"
STATE = "state"
KINDS = (FULL, WINDOW, STATE)

#: transformers' default ``sliding_window`` per model type (configuration_<type>.py), used when a
#: config leaves the field out; an explicit null means no window (every layer full attention)
WINDOW_DEFAULTS: dict[str, int] = {"mistral": 4096, "gemma2": 4096, "gemma3_text": 4096}
#: model types whose window layers follow a pattern when ``layer_types`` is absent: every
#: ``pattern``-th layer (1-based) is full attention, the others windowed, as transformers derives
#: ``layer_types`` (Gemma-2: 2, alternating; Gemma-3: ``sliding_window_pattern``, default 6)
PATTERN_DEFAULTS: dict[str, int] = {"gemma2": 2, "gemma3_text": 6}
#: model types whose ``sliding_window`` windows every layer when ``layer_types`` is absent
WINDOW_EVERY_LAYER = ("mistral",)
LAYER_TYPE_KINDS = {"full_attention": FULL, "sliding_attention": WINDOW}


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


def layer_windows(fields: dict[str, Any], model_type: str, num_layers: int, where: str = "") -> list[int]:
    """Each layer's window in tokens (0: full attention), as transformers reads the config:
    ``layer_types`` when given, else the family's rule for ``sliding_window`` (and its pattern)."""
    window = fields.get("sliding_window", WINDOW_DEFAULTS.get(model_type))
    if window is None:
        return [0] * num_layers  # no window: every layer full attention (the full-attention twin)
    ok = isinstance(window, int) and not isinstance(window, bool) and window >= 1
    require(ok, "model.hf_config.sliding_window", window, f"use a positive integer or null{where}")
    layer_types = fields.get("layer_types")
    if layer_types is not None:
        ok = isinstance(layer_types, (list, tuple)) and len(layer_types) == num_layers
        ok = ok and all(t in LAYER_TYPE_KINDS for t in layer_types)
        require(
            ok,
            "model.hf_config.layer_types",
            layer_types,
            f"give num_hidden_layers={num_layers} entries, each one of {', '.join(LAYER_TYPE_KINDS)}{where}",
        )
        return [window if LAYER_TYPE_KINDS[t] == WINDOW else 0 for t in layer_types]
    if model_type in PATTERN_DEFAULTS:
        pattern = fields.get("sliding_window_pattern", PATTERN_DEFAULTS[model_type])
        ok = isinstance(pattern, int) and not isinstance(pattern, bool) and pattern >= 1
        require(ok, "model.hf_config.sliding_window_pattern", pattern, f"use a positive integer{where}")
        return [0 if (i + 1) % pattern == 0 else window for i in range(num_layers)]
    if model_type in WINDOW_EVERY_LAYER:
        return [window] * num_layers
    return [0] * num_layers  # a family without windows (Llama, Qwen3, OPT): its sliding_window is unused


def kv_groups(windows: list[int]) -> tuple[KVGroup, ...]:
    """The layers cut into groups of one kind (and one window) each, all of the same size: the
    greatest common divisor of the counts. Full groups first, then windows from the widest."""
    counts: dict[int, int] = {}
    for window in windows:
        counts[window] = counts.get(window, 0) + 1
    if not counts:
        raise ConfigError("the model has no layers")
    size = math.gcd(*counts.values())
    groups = []
    for window in sorted(counts, key=lambda w: (w != 0, -w)):
        kind = FULL if window == 0 else WINDOW
        groups += [KVGroup(kind, size, window)] * (counts[window] // size)
    return tuple(groups)


def is_hybrid(groups: tuple[KVGroup, ...]) -> bool:
    """Whether a cache must keep these groups apart: more than one group, or any not full."""
    return len(groups) > 1 or any(g.kind != FULL for g in groups)
