"""The deployment and router config groups: defaults that leave a run as it was, each role's
layout as overrides, and every bad value refused in one line (exit 2 from the CLI)."""

from __future__ import annotations

import pytest
from kvbench_cli import assert_one_line_error, kvbench

from kvbench.api import build, compose
from kvbench.deploy.config import DeploymentConfig, role_config, role_overrides
from kvbench.errors import ConfigError


def test_the_defaults_are_one_engine_and_round_robin():
    cfg, choices = compose([])
    assert choices["deployment"] == "aggregated" and choices["router"] == "round_robin"
    assert build(cfg).deployment == DeploymentConfig()
    assert not DeploymentConfig().disaggregated


def test_disagg_sets_its_workers_and_each_role_s_layout_becomes_overrides():
    cfg, _ = compose(
        [
            "deployment=disagg",
            "deployment.prefill_workers=2",
            "deployment.prefill.tp=2",
            "deployment.prefill.max_num_batched_tokens=4096",
            "deployment.decode.attention_dp=4",
            "deployment.decode.max_num_seqs=64",
        ]
    )
    deployment = build(cfg).deployment
    assert deployment.disaggregated and (deployment.prefill_workers, deployment.decode_workers) == (2, 1)
    assert role_overrides(deployment, "prefill") == ["model.tp=2", "scheduler.max_num_batched_tokens=4096"]
    assert role_overrides(deployment, "decode") == ["model.attention_dp=4", "scheduler.max_num_seqs=64"]
    prefill, decode = role_config(cfg, deployment, "prefill"), role_config(cfg, deployment, "decode")
    p, d = build(prefill), build(decode)  # a role's config builds as any run's does
    assert (p.model.tp, p.model.attention_dp, p.scheduler.config.max_num_batched_tokens) == (2, 1, 4096)
    assert (d.model.tp, d.model.attention_dp, d.scheduler.config.max_num_seqs) == (1, 4, 64)
    s = build(cfg)  # the run's own config is left as it is
    assert (s.model.tp, s.model.attention_dp, s.scheduler.config.max_num_seqs) == (1, 1, 1024)


def test_a_role_with_no_layout_keeps_the_run_s_own():
    assert role_overrides(DeploymentConfig(name="disagg"), "decode") == []
    with pytest.raises(ConfigError, match="role='mixed'"):
        role_overrides(DeploymentConfig(), "mixed")


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("deployment.prefill_workers=0", "no prefill worker"),
        ("deployment.decode_workers=-1", "no decode worker"),
        ("deployment.link_bytes_per_s=0", "zero bandwidth"),
        ("deployment.link_latency_s=-0.001", "seconds >= 0"),
        ("deployment.transfer=eventually", "after_prefill, layerwise"),
        ("deployment.link=pcie", "auto, nvlink, network"),
        ("deployment.decode.max_num_seqs=0", "deployment.decode.max_num_seqs=0"),
        ("deployment.prefill.ep=-2", "deployment.prefill.ep=-2"),
        ("deployment.link_bytes_per_s=inf", "finite"),
    ],
)
def test_bad_deployment_values_are_one_line(override, fragment):
    cfg, _ = compose(["deployment=disagg", override])
    with pytest.raises(ConfigError) as refused:
        build(cfg)
    assert fragment in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["deployment.decode_workers=0"], ["deployment.decode_workers=0", "no decode worker"]),
        (["deployment.link_bytes_per_s=0"], ["deployment.link_bytes_per_s=0", "zero bandwidth"]),
        (["router.name=nearest"], ["router.name='nearest'", "least_loaded, prefix_aware, round_robin"]),
        (["deployment.prefill.tp=two"], ["deployment.prefill.tp=two"]),
    ],
)
def test_the_cli_refuses_bad_deployments_in_one_line_with_exit_2(tmp_path, args, fragments):
    proc = kvbench("deployment=disagg", *args, "workload.num_requests=5", "progress=false", cwd=tmp_path)
    assert_one_line_error(proc, *fragments, status=2)
    assert not list(tmp_path.rglob("summary.parquet"))
