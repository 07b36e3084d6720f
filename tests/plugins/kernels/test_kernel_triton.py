"""The Triton paged kernel: the conformance suite through Triton's CPU interpreter (or on a GPU),
its split/tile arithmetic, a compile for a CUDA capability-9.0 target, and its CPU refusal.

NOTE: Triton decides interpreter-or-compiled once, when it is first imported (``@triton.jit`` and
its standard library read ``TRITON_INTERPRET`` at decoration time). So this module sets
``TRITON_INTERPRET=1`` before anything imports triton, unless a CUDA GPU is present, where it
runs the same suite compiled on the GPU instead. The GPU compile check and the CPU refusal run in
subprocesses with the variable unset. No other test module imports triton in-process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hang import HANG_S

HAS_CUDA = torch.cuda.is_available()
if "triton" not in sys.modules and "TRITON_INTERPRET" not in os.environ and not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

triton = pytest.importorskip("triton", reason="the triton package is not installed (pip install 'kvbench[kernels]')")

from kvbench_plugins.kernels.triton_paged import TritonConfig, TritonKernel  # noqa: E402

from kvbench.errors import ConfigError  # noqa: E402
from kvbench.kernels import triton_decode  # noqa: E402
from kvbench.kernels.layout import make_paged_case  # noqa: E402
from kvbench.testing.kernels import DECODE_CASES, DTYPES, assert_matches_reference  # noqa: E402

INTERPRETED = triton_decode.interpreter_active()
#: the defaults, and small tiles with forced splits so that short test sequences still loop over
#: several tiles and merge several partial results (some splits of short sequences stay empty)
OPTION_SETS = {
    "defaults": TritonConfig(),
    "tile16_splits3": TritonConfig(tile_tokens=16, num_splits=3),
}


@pytest.fixture
def device():
    if HAS_CUDA and not INTERPRETED:
        return "cuda"
    if not INTERPRETED:
        pytest.fail(
            "triton was imported before this module could set TRITON_INTERPRET=1, so its kernels cannot run "
            "through the CPU interpreter in this process; run this file on its own, or set TRITON_INTERPRET=1"
        )
    return "cpu"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("options", OPTION_SETS.values(), ids=OPTION_SETS.keys())
def test_triton_kernel_conforms(options, case, dtype, device):
    assert_matches_reference(TritonKernel(options).decode, case, dtype, device)


def test_explicit_scale_is_used(device):
    from kvbench_plugins.kernels.torch_ref import paged_decode_reference

    paged = make_paged_case([5, 40], 4, 2, 64, 8, torch.float32, device)
    out = TritonKernel(TritonConfig(tile_tokens=16)).decode(*paged.args, scale=0.3)
    torch.testing.assert_close(out, paged_decode_reference(*paged.args, scale=0.3), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "max_tokens, tile, splits, expected",
    [
        (512, 64, 0, (4, 128)),  # auto: 4 splits of the 128-token minimum
        (100, 64, 0, (1, 128)),  # too short to split: one split covering both tiles
        (512, 64, 3, (3, 192)),  # forced: 3 splits, each a whole number of tiles
        (48, 16, 8, (3, 16)),  # more splits than tiles: one tile each
    ],
)
def test_splits_cover_the_longest_sequence_in_whole_tiles(max_tokens, tile, splits, expected):
    num_splits, tokens_per_split = triton_decode.choose_splits(
        batch=2,
        num_kv_heads=2,
        max_tokens=max_tokens,
        tile_tokens=tile,
        num_splits=splits,
        min_tokens_per_split=128,
        target_programs=64,
    )
    assert (num_splits, tokens_per_split) == expected
    assert tokens_per_split % tile == 0 and num_splits * tokens_per_split >= max_tokens


def test_gqa_groups_pad_to_dot_shape_and_mha_uses_one_row():
    assert triton_decode.group_layout(32, 32) == (1, 1, False)
    assert triton_decode.group_layout(32, 8) == (4, 16, True)  # tl.dot needs >= 16 rows
    assert triton_decode.group_layout(6, 2) == (3, 16, True)
    assert triton_decode.group_layout(64, 2) == (32, 32, True)


@pytest.mark.parametrize(
    "field, value", [("tile_tokens", 24), ("tile_tokens", 8), ("num_warps", 3), ("num_splits", -1)]
)
def test_config_values_are_range_checked(field, value):
    with pytest.raises(ConfigError, match=f"kernel.{field}"):
        TritonConfig(**{field: value}).validate()


def _run_clean(code: str, tmp_path, timeout_s: int = HANG_S) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with TRITON_INTERPRET unset and a private Triton cache."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # compile for real, not from a cache
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when it is unset
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=timeout_s
    )


def test_compiles_for_cuda_capability_9_0_without_a_gpu(tmp_path):
    # The interpreter checks neither layouts nor tl.dot's shape rules: only a GPU build does. This
    # builds PTX and a cubin for sm_90 with Triton's bundled ptxas, with the argument types and
    # alignment hints a real launch would have, for each code path (MHA broadcast; GQA tl.dot in
    # fp16/bf16 and IEEE fp32; padded head dims; small and large blocks).
    code = r"""
        import re
        import torch
        from triton.backends.compiler import GPUTarget
        from kvbench.kernels.triton_compile import compile_for_target
        target = GPUTarget("cuda", 90, 32)
        variants = [
            (torch.float16, 32, 32, 128, 16),   # Llama-2-7B: MHA
            (torch.bfloat16, 32, 8, 128, 256),  # Llama-3-8B: GQA 4, the largest block
            (torch.float32, 6, 2, 80, 8),       # GQA 3, head dim 80, IEEE fp32 dot
            (torch.bfloat16, 28, 4, 64, 32),    # GQA 7
        ]
        for dtype, heads, kv_heads, head_dim, block in variants:
            kernels = compile_for_target(target, dtype, heads, kv_heads, head_dim, block, tile_tokens=64)
            for kernel in kernels:
                assert kernel.asm["cubin"], "no cubin"
                assert ".target sm_90" in kernel.asm["ptx"], "not built for sm_90"
            # block ids are loaded as int32 and must be widened before the block-stride multiply:
            # a 16 GiB cache has element offsets past 2**31 (the interpreter wraps them silently)
            assert re.search(r"arith\.extsi %\S+ : tensor<64xi32> to tensor<64xi64>", kernels[0].asm["ttir"]), (
                "block ids are not widened to int64"
            )
        print("compiled", len(variants) * 2, "kernels")
    """
    result = _run_clean(code, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "compiled 8 kernels" in result.stdout


def test_on_cpu_without_the_interpreter_decode_refuses_in_one_line(tmp_path):
    code = """
        import torch
        from kvbench.errors import ConfigError
        from kvbench.kernels.layout import make_paged_case
        from kvbench_plugins.kernels.triton_paged import TritonKernel
        paged = make_paged_case([3], 2, 1, 64, 8, torch.float32)
        try:
            TritonKernel().decode(*paged.args)
        except ConfigError as exc:
            print("REFUSED", exc)
    """
    if HAS_CUDA:
        pytest.skip("a CUDA GPU is present: the CPU refusal is only reachable without one")
    result = _run_clean(code, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("REFUSED"), result.stdout
    assert "needs a CUDA GPU" in lines[0] and "TRITON_INTERPRET=1" in lines[0]


def test_plugin_module_imports_without_torch_or_triton():
    code = "import sys, kvbench_plugins.kernels.triton_paged; sys.exit(bool({'torch', 'triton'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.skipif(HAS_CUDA, reason="runs where there is no GPU (on a GPU the suite above runs compiled)")
def test_gpu_run_is_skipped_here_with_a_reason():
    pytest.skip(
        "no CUDA GPU: the compiled Triton kernel's numerical checks run on a GPU "
        "(gpu/run_kernel_checks.sh); here they ran through the interpreter and the sm_90 compile test"
    )
