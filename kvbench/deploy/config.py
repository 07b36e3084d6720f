"""The ``deployment`` config group: one engine (``aggregated``) or prefill and decode workers
(``disagg``), the KV link between them, and each role's parallel layout and batch limits.

pandas-free and import-light: the typed schema (:mod:`kvbench.app.config`) and ``--help`` load it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from kvbench.errors import require

DEPLOYMENTS = ("aggregated", "disagg")
#: when a request's KV leaves the prefill worker: once its whole prompt is computed, or layer by
#: layer while the prefill computes it (engines differ: both are offered)
TRANSFERS = ("after_prefill", "layerwise")
#: auto: nvlink when a prefill and a decode worker fit in one NVLink domain, else network
LINKS = ("auto", "nvlink", "network")


def _check_layout(layout: object, role: str) -> None:
    """Every value of a role's layout is null (the run's own) or a positive integer."""
    for f in fields(layout):
        value = getattr(layout, f.name)
        ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)
        require(ok, f"deployment.{role}.{f.name}", value, "use a positive integer, or null for the run's own")


@dataclass
class PrefillLayout:
    """A prefill worker's layout and batch limits; null keeps the run's own (``model.*``, ``scheduler.*``)."""

    tp: int | None = None
    attention_dp: int | None = None
    ep: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None

    def validate(self) -> None:
        _check_layout(self, "prefill")


@dataclass
class DecodeLayout:
    """A decode worker's layout and batch limit; null keeps the run's own."""

    tp: int | None = None
    attention_dp: int | None = None
    ep: int | None = None
    max_num_seqs: int | None = None

    def validate(self) -> None:
        _check_layout(self, "decode")


@dataclass
class DeploymentConfig:
    """How the run is deployed: ``deployment=aggregated`` (one engine, kvbench's runs as they
    always were) or ``deployment=disagg`` (``prefill_workers`` + ``decode_workers`` engines).
    The worker counts, link and layouts are read only by a disaggregated run."""

    name: str = "aggregated"
    prefill_workers: int = 1
    decode_workers: int = 1
    #: after_prefill or layerwise (see TRANSFERS)
    transfer: str = "after_prefill"
    #: auto, nvlink or network (see LINKS)
    link: str = "auto"
    #: the link's bandwidth per GPU, one direction; null: the hardware config's for the link kind
    link_bytes_per_s: float | None = None
    #: the link's one-way latency per transfer; null: the hardware config's for the link kind
    link_latency_s: float | None = None
    prefill: PrefillLayout = field(default_factory=PrefillLayout)
    decode: DecodeLayout = field(default_factory=DecodeLayout)

    def validate(self) -> None:
        require(self.name in DEPLOYMENTS, "deployment.name", self.name, f"choose one of {', '.join(DEPLOYMENTS)}")
        require(
            self.prefill_workers >= 1,
            "deployment.prefill_workers",
            self.prefill_workers,
            "a layout with no prefill worker cannot serve a request; use 1 or more",
        )
        require(
            self.decode_workers >= 1,
            "deployment.decode_workers",
            self.decode_workers,
            "a layout with no decode worker cannot serve a request; use 1 or more",
        )
        require(
            self.transfer in TRANSFERS, "deployment.transfer", self.transfer, f"choose one of {', '.join(TRANSFERS)}"
        )
        require(self.link in LINKS, "deployment.link", self.link, f"choose one of {', '.join(LINKS)}")
        require(
            self.link_bytes_per_s is None or self.link_bytes_per_s >= 1,
            "deployment.link_bytes_per_s",
            self.link_bytes_per_s,
            "a link with zero bandwidth never delivers the KV; use a rate >= 1 byte per second, or null for the "
            "hardware config's",
        )
        require(
            self.link_latency_s is None or self.link_latency_s >= 0,
            "deployment.link_latency_s",
            self.link_latency_s,
            "use seconds >= 0, or null for the hardware config's",
        )
        self.prefill.validate()
        self.decode.validate()

    @property
    def disaggregated(self) -> bool:
        return self.name == "disagg"


#: where each layout key of a role goes in the run's config
LAYOUT_KEYS = {
    "tp": "model.tp",
    "attention_dp": "model.attention_dp",
    "ep": "model.ep",
    "max_num_seqs": "scheduler.max_num_seqs",
    "max_num_batched_tokens": "scheduler.max_num_batched_tokens",
}


def role_overrides(deployment: DeploymentConfig, role: str) -> list[str]:
    """The Hydra overrides (``model.tp=2``, ``scheduler.max_num_seqs=64``) that turn the run's
    config into a ``role`` worker's: one per layout value the deployment sets (null ones keep the
    run's own). Compose them after the run's own overrides, as :func:`role_config` does."""
    require(role in ("prefill", "decode"), "role", role, "choose prefill or decode")
    layout = deployment.prefill if role == "prefill" else deployment.decode
    return [
        f"{LAYOUT_KEYS[f.name]}={getattr(layout, f.name)}"
        for f in fields(layout)
        if getattr(layout, f.name) is not None
    ]


def role_config(cfg, deployment: DeploymentConfig, role: str):
    """A copy of the composed run config ``cfg`` (a DictConfig) with the ``role`` worker's layout
    values set (:func:`role_overrides`); ``cfg`` itself is left as it is."""
    from omegaconf import OmegaConf

    role_cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    for override in role_overrides(deployment, role):
        key, _, value = override.partition("=")
        OmegaConf.update(role_cfg, key, int(value), merge=True)
    return role_cfg
