"""The README's table of what each shipped model keeps per token and per request, computed from
its config (never typed in): the layers by kind, the KV bytes per token and state bytes per
request on one GPU, the weights per GPU and the parameters, at the config's own layout and
precisions (``conf/model/<name>.yaml``)."""

from __future__ import annotations

from kvbench.specs.kv_groups import FULL, STATE, WINDOW
from kvbench.specs.model import ModelSpec

HEADER = (
    "`model=`",
    "architecture",
    "layers",
    "KV per token (B, one GPU)",
    "state per request (B, one GPU)",
    "layout (tp / attention_dp / ep)",
    "weights per GPU (GB)",
    "parameters total / active (B)",
)


def layers(model: ModelSpec) -> str:
    """The layers by what they keep: ``61 MLA + indexer``, ``18 full + 18 window-128``, ``15 full + 45 linear``."""
    if model.mla is not None:
        return f"{model.num_layers} MLA" + (" + indexer" if model.indexer is not None else "")
    counts: dict[str, int] = {}
    for group in model.kv_groups or ():
        kind = {FULL: "full", STATE: "linear", WINDOW: f"window-{group.window_tokens}"}[group.kind]
        counts[kind] = counts.get(kind, 0) + group.num_layers
    if not counts:
        return f"{model.num_layers} full"
    return " + ".join(f"{n} {kind}" for kind, n in counts.items())


def row(name: str, model: ModelSpec) -> tuple[str, ...]:
    return (
        name,
        model.architecture,
        layers(model),
        f"{model.kv_bytes_per_token:,}",
        f"{model.state_bytes_per_request:,}" if model.state_bytes_per_request else "-",
        f"{model.tp} / {model.attention_dp} / {model.ep}",
        f"{model.weight_bytes / 1e9:.1f}",
        f"{model.num_params / 1e9:.1f} / {model.active_params / 1e9:.1f}",
    )


def markdown(rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
