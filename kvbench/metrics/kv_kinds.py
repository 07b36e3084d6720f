"""What the KV budget holds, by layer kind: MLA latents, full-attention KV, sliding-window KV, a
sparse indexer's keys and linear-attention state (the memory table's ``peak_<kind>_bytes``).

:func:`kv_kinds` reads a model's per-token bytes of each token-holding kind (one GPU's) and its state
per request; :func:`kind_peaks` turns a run's peaks into bytes per kind:

- ``state``: the most the live sequences' states held at once (the ledger's state part);
- a model whose layers form KV-cache groups under ``hybrid_paged``: each group kind's own blocks
  (``full_group_bytes``, ``window_group_bytes``), at their peaks;
- every other case (one group, or an allocator that keeps every token of every layer): what the
  sequences held besides their states, at its peak, split by each kind's share of the per-token
  bytes (each token slot holds every layer's KV, so the split is exact);
- an MLA model's full layers hold latents (``latent``), and a sparse one's an indexer key per token
  beside them (``indexer``): the full layers' bytes are split between them by their per-token bytes
  (both live in the same blocks).
"""

from __future__ import annotations

from collections.abc import Mapping

from kvbench.specs.kv_groups import FULL, STATE, WINDOW

#: the kinds, in the memory table's order
KINDS = ("latent", "indexer", "full", "window", "state")


def kv_kinds(model) -> dict[str, int] | None:
    """Per kind, one token's bytes on one GPU (``state``: one request's); None for a model of plain
    full-attention layers alone (its memory is all ``full``: the table says nothing more)."""
    groups = model.kv_groups
    mla = getattr(model, "mla", None) is not None
    if not groups and not mla:
        return None
    per_token = {FULL: 0, WINDOW: 0}
    if groups:
        for group in groups:
            if group.kind != STATE:
                per_token[group.kind] += model.kv_group_bytes_per_token(group)
    else:
        per_token[FULL] = model.kv_bytes_per_token
    kinds: dict[str, int] = {}
    indexer = getattr(model, "indexer_bytes_per_token", 0)
    if mla:
        kinds["latent"] = per_token[FULL] - indexer
        if indexer:
            kinds["indexer"] = indexer
    elif per_token[FULL]:
        kinds["full"] = per_token[FULL]
    if per_token[WINDOW]:
        kinds["window"] = per_token[WINDOW]
    state = getattr(model, "state_bytes_per_request", 0)
    if state:
        kinds["state"] = state
    return kinds


def kind_peaks(kinds: Mapping[str, int], peaks: Mapping[str, int]) -> dict[str, int]:
    """``peak_<kind>_bytes`` for each kind of ``kinds`` (:func:`kv_kinds`), from a run's peaks:
    ``state_bytes``, ``kv_held_bytes`` (what sequences held besides their states) and, under
    ``hybrid_paged``, ``full_group_bytes`` and ``window_group_bytes``."""
    out: dict[str, int] = {}
    grouped = "full_group_bytes" in peaks or "window_group_bytes" in peaks
    if grouped:
        full_bytes, window_bytes = peaks.get("full_group_bytes", 0), peaks.get("window_group_bytes", 0)
    else:  # one slot holds every kind's bytes of a token: split the peak by per-token bytes
        token_kinds = {k: v for k, v in kinds.items() if k != "state"}
        total = sum(token_kinds.values())
        held = peaks.get("kv_held_bytes", 0)
        share = {k: held * v // total for k, v in token_kinds.items()} if total else {}
        window_bytes = share.get("window", 0)
        full_bytes = held - window_bytes if total else 0
    # the full layers' blocks hold latents, and a sparse model's indexer keys beside them
    full_kinds = {k: kinds[k] for k in ("latent", "indexer", "full") if k in kinds}
    full_total = sum(full_kinds.values())
    for kind in KINDS:
        if kind not in kinds:
            continue
        if kind == "state":
            out["peak_state_bytes"] = peaks.get("state_bytes", 0)
        elif kind == "window":
            out["peak_window_bytes"] = window_bytes
        elif kind == "indexer":
            out["peak_indexer_bytes"] = full_bytes * kinds["indexer"] // full_total
        else:  # latent or full: the full layers' bytes less an indexer's share
            indexer = full_bytes * kinds.get("indexer", 0) // full_total if full_total else 0
            out[f"peak_{kind}_bytes"] = full_bytes - indexer
    return out
