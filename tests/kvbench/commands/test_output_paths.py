"""No command replaces an output path that is not a regular file: a FIFO, a folder, a device or a
link to one of them, given as a file to write (``--json FILE``) or lying where a command writes a
file into its output folder, is refused in one line with exit 2 before any work, and is still there,
unchanged, afterwards (kvbench.io.atomic.check_target)."""

from __future__ import annotations

import pytest
from kvbench_cli import assert_one_line_error, error_lines, kvbench
from special_files import BASIC, KINDS, assert_unchanged, make, words

RUN = ["workload.num_requests=3", "progress=false", "wandb.mode=disabled", "output.figures=false"]


def refused(proc, kind: str) -> None:
    """Exit 2 and one error line (``kvbench: error:``, ``kvbench compare: error:``...) naming the kind."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [line for line in error_lines(proc, "kvbench") if ": error: " in line]
    assert len(lines) == 1 and words(kind) in lines[0], proc.stderr


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """One complete run's folder, for the commands that read one (compare)."""
    folder = tmp_path_factory.mktemp("runs") / "run"
    done = kvbench(f"hydra.run.dir={folder}", *RUN, cwd=folder.parent)
    assert done.returncode == 0, done.stderr
    return folder


@pytest.mark.parametrize("kind", KINDS)
def test_diff_engine_json(tmp_path, kind):
    target = tmp_path / "diff.json"
    before = make(target, kind)
    done = kvbench("diff-engine", "--peer", "vllm_v1", "engine=vllm_v1", "--json", str(target), *RUN, cwd=tmp_path)
    refused(done, kind)
    assert "--json - for stdout" in done.stderr
    assert_unchanged(target, before)


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_never_replaces_what_lies_under_a_result_s_name(tmp_path, kind):
    folder = tmp_path / "run"
    target = folder / "summary.csv"
    before = make(target, kind)
    done = kvbench(f"hydra.run.dir={folder}", *RUN, cwd=tmp_path)
    refused(done, kind)
    assert_unchanged(target, before)
    assert not (folder / "summary.parquet").exists()  # refused before the run, not after it


@pytest.mark.parametrize("kind", ["FIFO", "device"])
def test_a_run_folder_that_is_not_a_folder(tmp_path, kind):
    target = tmp_path / "run"
    before = make(target, kind)
    done = kvbench(f"hydra.run.dir={target}", *RUN, cwd=tmp_path)
    assert_one_line_error(done, f"{words(kind)}, not a folder", status=2)
    assert_unchanged(target, before)


def test_a_sweep_job_whose_result_name_is_a_fifo_fails_alone(tmp_path):
    sweep = tmp_path / "sweep"
    target = sweep / "0" / "COMPLETE"
    before = make(target, "FIFO")
    done = kvbench("-m", f"hydra.sweep.dir={sweep}", "allocator=naive,paged", *RUN, cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # a failed job: the sweep goes on, the table says so
    assert "job 0" in done.stderr and "is a FIFO" in done.stderr and "Traceback" not in done.stderr
    assert (sweep / "1" / "COMPLETE").is_file()
    assert_unchanged(target, before)


@pytest.mark.parametrize("kind", BASIC)
def test_compare_out(run_folder, tmp_path, kind):
    out = tmp_path / "cmp"
    target = out / "compare.csv"
    before = make(target, kind)
    done = kvbench("compare", str(run_folder), str(run_folder), "--out", str(out), cwd=tmp_path)
    refused(done, kind)
    assert_unchanged(target, before)
    assert not (out / "compare.parquet").exists()


@pytest.mark.parametrize("kind", ["FIFO", "device"])
def test_compare_out_that_is_not_a_folder(run_folder, tmp_path, kind):
    out = tmp_path / "cmp"
    before = make(out, kind)
    done = kvbench("compare", str(run_folder), str(run_folder), "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2 and f"{words(kind)}, not a folder" in done.stderr, done.stderr
    assert_unchanged(out, before)


@pytest.mark.parametrize(
    "command, name",
    [
        (["slo-batch", "slo.tpot_s=0.05"], "tpot_vs_batch.csv"),
        (["slo-search", "--over", "rate", "slo.ttft_s=2"], "curve.csv"),
        (["validate", "--limit", "1"], "rows.csv"),
    ],
)
@pytest.mark.parametrize("kind", BASIC)
def test_out_folder_commands(tmp_path, command, name, kind):
    out = tmp_path / "out"
    target = out / name
    before = make(target, kind)
    done = kvbench(*command, "--out", str(out), cwd=tmp_path)
    refused(done, kind)
    assert_unchanged(target, before)
    assert [p.name for p in out.iterdir()] == [name], "refused before any work"


@pytest.mark.parametrize("command", [["slo-batch"], ["slo-search", "--over", "rate"], ["validate"], ["paper"]])
def test_out_that_is_a_fifo(tmp_path, command):
    out = tmp_path / "out"
    before = make(out, "FIFO")
    done = kvbench(*command, "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2 and "is a FIFO" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert_unchanged(out, before)


def test_paper_out_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "paper").symlink_to("real")
    done = kvbench("paper", "--out", str(tmp_path / "paper"), cwd=tmp_path)
    assert done.returncode == 2 and "is a symbolic link" in done.stderr, done.stderr
    assert (tmp_path / "paper").is_symlink() and not list((tmp_path / "real").iterdir())


@pytest.mark.parametrize("kind", BASIC)
def test_bench_kernels_dry_run(tmp_path, kind):
    pytest.importorskip("torch")
    folder = tmp_path / "bench"
    target = folder / "results.csv"
    before = make(target, kind)
    done = kvbench("bench-kernels", "dry_run=true", "kernels=[torch]", f"hydra.run.dir={folder}", cwd=tmp_path)
    refused(done, kind)
    assert_unchanged(target, before)


def test_a_hydra_folder_that_is_a_link_is_refused(tmp_path):
    """Hydra writes config.yaml, hydra.yaml and overrides.yaml into ``.hydra/``: through a link they
    would land outside the results folder."""
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".hydra").symlink_to(outside)
    done = kvbench(f"hydra.run.dir={folder}", *RUN, cwd=tmp_path)
    assert_one_line_error(done, ".hydra is a symbolic link", status=2)
    assert not list(outside.iterdir())


def test_a_hydra_file_that_is_a_fifo_is_refused(tmp_path):
    folder = tmp_path / "run"
    before = make(folder / ".hydra" / "config.yaml", "FIFO")
    done = kvbench(f"hydra.run.dir={folder}", *RUN, cwd=tmp_path)
    assert_one_line_error(done, "config.yaml is a FIFO", status=2)
    assert_unchanged(folder / ".hydra" / "config.yaml", before)


def test_a_resumed_sweep_refuses_a_linked_job_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "0").symlink_to(outside)
    done = kvbench("-m", f"hydra.sweep.dir={sweep}", "allocator=naive,paged", *RUN, cwd=tmp_path)
    assert_one_line_error(done, "is a symbolic link", status=2)
    assert not list(outside.iterdir())


def test_diff_engine_json_to_stdout(tmp_path):
    """``--json -``: the report alone on stdout, for a pipe; the table goes to stderr."""
    import json

    from kvbench.validation.differential import peer_module

    reason = peer_module("nano_vllm").unavailable_reason()
    if reason:
        pytest.skip(reason)
    args = ["--peer", "nano_vllm", "engine=nano_vllm", "allocator.block_size_tokens=256", "workload.num_requests=20"]
    done = kvbench("diff-engine", *args, "--json", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["identical"] and report["requests"] == 20
    assert "made the same decisions at every step" in done.stderr
    assert not list(tmp_path.iterdir()), "nothing written to a file named -"
