"""Real mode through kvbench's Triton kernel (under Triton's interpreter on a CPU) emits exactly
the tokens the torch reference kernel does: the kernel is part of the exactness claim."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pandas as pd
import pytest
from hang import HANG_S

# found, never imported here: Triton picks interpreter-or-compiled when first imported in a process,
# and tests/plugins/kernels/test_kernel_triton.py must be the one to import it in pytest's process
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="the triton package is not installed"
)

ARGS = [
    "mode=real",
    "model=tiny-llama",
    "allocator=paged",
    "allocator.block_size_tokens=8",
    "workload=real_smoke",
    "workload.num_requests=6",
    "wandb.mode=disabled",
    "progress=false",
    "output.figures=false",
]


def tokens(kernel: str, folder) -> list:
    # the interpreter must be chosen before triton is imported: a fresh process, with it in the environment
    env = {**os.environ, "TRITON_INTERPRET": "1", "HYDRA_FULL_ERROR": "0"}
    code = "from kvbench.commands.main import main; main()"
    proc = subprocess.run(
        [sys.executable, "-c", code, *ARGS, f"kernel={kernel}", f"hydra.run.dir={folder}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stderr
    frame = pd.read_parquet(folder / "requests.parquet")
    return [[list(map(int, branch)) for branch in row] for row in frame["output_token_ids"]]


def test_triton_and_torch_kernels_emit_the_same_tokens(tmp_path):
    torch_tokens = tokens("torch", tmp_path / "torch")
    assert len(torch_tokens) == 6 and all(len(row[0]) > 0 for row in torch_tokens)
    assert tokens("triton", tmp_path / "triton") == torch_tokens
