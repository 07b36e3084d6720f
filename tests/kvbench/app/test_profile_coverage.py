"""Which measured kernel prices which shipped model on which GPU: computed by selecting the tables
as a run does, so a shape missing from a kernel's table marks the model as not covered."""

from __future__ import annotations

import pytest
from kvbench_plugins.kernels.measured import MEASURED_KERNELS

from kvbench.app import profile_coverage
from kvbench.app.profile_coverage import coverage, matrix, shipped_models
from kvbench.errors import ConfigError
from kvbench.specs import profiles

KERNELS = {cls.name: cls for cls in MEASURED_KERNELS}


def one(model: str, hardware: str, kernel: str):
    [row] = coverage([KERNELS[kernel]], [hardware], [model])
    return row


def test_every_shipped_model_config_is_listed():
    names = shipped_models()
    assert "llama2-7b" in names and "qwen3-32b" in names
    rows = coverage(MEASURED_KERNELS, ["h100-sxm"])
    assert [r[0] for r in matrix(rows, ["h100-sxm"])] == names
    # every measured kernel on the H100 once per model: vllm_fa3, sglang_fa3, sglang_triton, trtllm
    assert len(rows) == 4 * len(names)


def test_the_default_model_s_multi_head_shape_is_missing_from_vllm_fa3():
    llama2 = one("llama2-7b", "h100-sxm", "vllm_fa3")
    assert llama2.shape == "32/32/128" and not llama2.covered
    assert "num_heads=32, num_key_value_heads=32, head_dim=128" in llama2.refusal
    assert one("llama2-7b", "h100-sxm", "trtllm").covered
    assert one("llama3.1-8b", "h100-sxm", "vllm_fa3").covered  # 32/8/128: grouped-query, measured


def test_a_head_dim_missing_from_a_kernel_s_table_is_not_covered(monkeypatch):
    """The same model and kernel, with the head dim taken out of the kernel's decode table."""
    assert one("llama3.1-8b", "h200", "trtllm").covered
    read = profiles.read_table

    def without_head_dim_128(system, op, framework, version, table):
        frame = read(system, op, framework, version, table)
        if table == "generation_attention_perf" and framework == "trtllm":
            return frame[frame["head_dim"] != 128]
        return frame

    monkeypatch.setattr(profiles, "read_table", without_head_dim_128)
    row = one("llama3.1-8b", "h200", "trtllm")
    assert not row.covered and "has no decode attention" in row.refusal and "head_dim=128" in row.refusal
    assert one("llama3.1-8b", "h200", "sglang_fa3").covered  # another framework's table is untouched


def test_a_kernel_is_only_asked_where_it_was_measured():
    rows = coverage([KERNELS["vllm_fa2"], KERNELS["vllm_fa3"]], ["a100-80gb"], ["llama3.1-8b"])
    assert [(r.kernel, r.covered) for r in rows] == [("vllm_fa2", True)]


def test_a_cell_lists_the_kernels_that_price_the_model_or_a_dash():
    rows = [
        profile_coverage.Coverage("m", "32/8/128", "h200", "a", None),
        profile_coverage.Coverage("m", "32/8/128", "h200", "b", "no rows"),
        profile_coverage.Coverage("m", "32/8/128", "h200", "c", None),
        profile_coverage.Coverage("n", "40/40/128", "h200", "a", "no rows"),
    ]
    assert matrix(rows, ["h200", "h100-sxm"]) == [("m", "32/8/128", "a, c", "-"), ("n", "40/40/128", "-", "-")]


@pytest.mark.parametrize("hardware", ["a100-40gb"])
def test_a_gpu_without_tables_is_one_line(hardware):
    with pytest.raises(ConfigError) as err:
        coverage(MEASURED_KERNELS, [hardware])
    assert "no public measured tables" in str(err.value)
