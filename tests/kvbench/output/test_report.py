"""Tables for people: a sweep's comparison and a run's summary fit a 100-column terminal, whole."""

from __future__ import annotations

import io
import json
import re
import shutil

import pandas as pd
import pytest
from prefix_summary import ZERO_PREFIX_HITS
from rich.console import Console

from kvbench.io.atomic import COMPLETE, mark_complete
from kvbench.output.report import REPORT_WIDTH, print_comparison, print_summary, report_console


def printed(print_fn, *args, width: int = 100, **kwargs) -> tuple[list[str], object]:
    """What ``print_fn`` shows on a terminal ``width`` columns wide, line by line, and its return value."""
    console = Console(width=width, record=True, file=io.StringIO())
    value = print_fn(*args, console=console, **kwargs)
    return console.export_text().splitlines(), value


def assert_fits(lines: list[str], width: int = 100) -> None:
    assert max(len(line) for line in lines) <= width, max(lines, key=len)
    assert not any("…" in line for line in lines), [line for line in lines if "…" in line]


def rows_of(lines: list[str], first_cell: str) -> list[list[str]]:
    """The cells of each table row whose first cell is ``first_cell``."""
    return [
        [cell.strip() for cell in line.strip("│").split("│")]
        for line in lines
        if line.startswith("│") and line.strip("│").split("│")[0].strip() == first_cell
    ]


@pytest.mark.parametrize("width", [100, 80])
def test_the_quick_start_comparison_fits_the_terminal_whole(allocator_sweep, width):
    lines, frame = printed(print_comparison, allocator_sweep, width=width)
    assert_fits(lines, width)
    assert sum("kvbench comparison (3 jobs)" in line for line in lines) == 1
    # the swept values are the first column, one row per job in each stacked table
    tables = sum(line.startswith("┏") for line in lines)
    for allocator in ("naive", "per_request", "paged"):
        assert len(rows_of(lines, allocator)) == tables
    # naive reserves S_max, so the block size differs although nobody swept it: a column
    assert [row[1] for row in rows_of(lines, "naive")][0] == "4096"
    assert list(frame["swept.allocator"]) == ["naive", "per_request", "paged"]


def test_settings_every_job_shares_are_said_once_above_the_tables(allocator_sweep):
    lines, _ = printed(print_comparison, allocator_sweep)
    text = " ".join(lines)
    shared = text[text.index("every job:") : text.index("┏")]
    for setting in (
        "llama2-7b",
        "on h100-sxm",
        "workload lecture_chat",
        "kernel triton",
        "scheduler mixed",
        "preemption recompute",
        "seed 0",
        "KV budget 62.5 GB",
    ):
        assert setting in shared
    assert "allocator" not in shared.split("same in every job")[0]  # swept: a column, not a setting


def test_units_are_in_the_headers_and_latencies_in_ms(allocator_sweep):
    lines, frame = printed(print_comparison, allocator_sweep)
    header = " ".join(line for line in lines if line.startswith("┃"))
    for unit in ("ms", "tok/s", "req/s", "% KV", "seqs", "tokens"):
        assert f" {unit} " in header
    assert " s " not in header.replace("preempt", "")  # no latency in seconds beside the ms ones
    # the cells are the summary's seconds in milliseconds
    ttft_ms = frame.loc[frame["swept.allocator"] == "paged", "ttft_p50_s"].iloc[0] * 1e3
    [row] = [r for r in rows_of(lines, "paged") if f"{ttft_ms:,.0f}" in r or f"{ttft_ms:,.1f}" in r]
    assert row


def test_a_latency_column_reaching_ten_seconds_reads_in_seconds():
    from kvbench.output.report import Column

    ttft = Column("ttft_p50_s", "TTFT\np50", "ms", "ms")
    hours = pd.Series([3673.012, 3674.277, float("nan")])
    shown = ttft.for_values(hours)
    assert (shown.unit, shown.header) == ("s", "TTFT\np50\ns")
    assert [shown.formatter(hours)(v) for v in hours] == ["3,673", "3,674", "-"]
    seconds = pd.Series([12.345, 9.0])
    assert ttft.for_values(seconds).formatter(seconds)(12.345) == "12.3"
    fast = pd.Series([0.0081, 9.999])
    assert ttft.for_values(fast) is ttft, "below 10 s a column stays in milliseconds"
    assert ttft.formatter(fast)(0.0081) == "8"  # the column reaches 1,000 ms: no decimals
    tpot = Column("tpot_p50_s", "TPOT\np50", "ms", "ms")
    assert tpot.for_values(pd.Series([1e4])).unit == "s" and tpot.for_values(pd.Series([0.041])).unit == "ms"


def test_each_kernels_calibration_is_said_once_above_the_tables_not_in_a_column():
    from kvbench.output.report import calibrations_by_kernel

    rows = pd.DataFrame({"kernel": ["a", "b", "a", "b"], "calibration": ["table A", "table B", "table A", "table B"]})
    assert calibrations_by_kernel(rows) == {"a": "table A", "b": "table B"}
    one = pd.DataFrame({"kernel": ["a", "b"], "calibration": ["uncalibrated", "uncalibrated"]})
    assert calibrations_by_kernel(one) == {}, "one calibration for all: said on the shared line"
    swept_dir = pd.DataFrame({"kernel": ["a", "a"], "calibration": ["file 1", "file 2"]})
    assert calibrations_by_kernel(swept_dir) == {}, "one kernel priced two ways: a column tells them apart"


def test_a_two_key_sweep_shows_each_key_as_a_column_and_its_failures(block_preemption_sweep):
    lines, frame = printed(print_comparison, block_preemption_sweep)
    assert_fits(lines)
    header = "\n".join(line for line in lines if line.startswith("┃"))
    assert "block" in header and "preemption" in header and "tokens" in header
    assert list(frame["swept.allocator.block_size_tokens"]) == ["16", "16", "7", "7", "64", "64"]
    assert list(frame["swept.preemption"]) == ["recompute", "swap"] * 3
    cells = [row[:3] for row in rows_of(lines, "7")]
    assert cells and all(row[1] in ("recompute", "swap") and row[2] == "failed" for row in cells)
    assert any(line.startswith("failed allocator.block_size_tokens=7 preemption=swap") for line in lines)
    # this budget preempts, so the preemption columns show, and the tables stay within the width
    assert "swap" in header and "cost" in header
    assert {"failed", "error", "label"} <= set(frame) and frame["failed"].sum() == 2


def test_a_wide_terminal_gets_one_table(block_preemption_sweep):
    lines, _ = printed(print_comparison, block_preemption_sweep, width=240)
    assert sum(line.startswith("┏") for line in lines) == 1


def test_without_hydras_record_the_varying_overrides_are_the_columns(sweep, tmp_path):
    source = sweep("allocators", {"allocator": ["naive", "per_request", "paged"]})
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    (copy / "multirun.yaml").unlink()
    _, frame = printed(print_comparison, copy)
    assert list(frame["swept.allocator"]) == ["naive", "per_request", "paged"]
    assert "swept.wandb.mode" not in frame  # the same in every job: not what the sweep varied
    for job in ("0", "1", "2"):
        shutil.rmtree(copy / job / ".hydra")
    lines, frame = printed(print_comparison, copy)
    assert list(frame["swept.job"]) == ["allocator=naive", "allocator=per_request", "allocator=paged"]
    assert_fits(lines)


def test_the_comparison_files_keep_their_columns(allocator_sweep):
    _, frame = printed(print_comparison, allocator_sweep)
    saved = pd.read_parquet(allocator_sweep / "comparison.parquet")
    for column in (
        "job",
        "allocator",
        "block_size_tokens",
        "peak_concurrency",
        "ttft_p50_s",
        "failed",
        "status",
        "label",
        "swept.allocator",
    ):
        assert column in saved
    assert (allocator_sweep / "comparison.csv").is_file() and (allocator_sweep / "comparison.png").is_file()


def _summary_lines(job_dir, width=100, **kwargs):
    summary = pd.read_parquet(job_dir / "summary.parquet").iloc[0].to_dict()
    lines, _ = printed(print_summary, summary, job_dir, width=width, **kwargs)
    return summary, lines


def test_the_run_summary_fits_one_screen_with_numbers_for_people(block_preemption_sweep):
    summary, lines = _summary_lines(block_preemption_sweep / "1")  # block 16, swap: every optional row
    assert len(lines) <= 32, "\n".join(lines)
    assert_fits(lines)
    text = "\n".join(lines)
    assert not re.search(r"\de[+-]\d", text)  # no 6.25e+10
    assert "5.00 GB" in text  # the budget in a unit, not 5000000000
    assert f"all {len(summary)} metrics: {block_preemption_sweep / '1' / 'summary.json'}" in text
    for label in ("TTFT p50 / p99 (ms)", "TPOT p50 / p99 (ms)", "peak concurrency", "preemptions", "KV budget"):
        assert label in text


def test_the_run_summary_leaves_out_what_says_nothing(allocator_sweep):
    _, lines = _summary_lines(allocator_sweep / "0")  # naive: no preemption, no SLO
    rows = "\n".join(line for line in lines if line.startswith("│"))
    for absent in ("recompute tax", "preemption cost", "goodput", "swapped out", "copies"):
        assert absent not in rows
    _, lines = _summary_lines(allocator_sweep / "0", slo_given=True)
    assert any(line.startswith("│ goodput") for line in lines)


def test_reports_take_columns_then_the_terminal_then_100(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    # pytest captures output: no terminal, as in a pipe or a CI log
    assert report_console().width == REPORT_WIDTH == 100
    monkeypatch.setenv("COLUMNS", "132")
    assert report_console().width == 132


def test_failed_and_interrupted_jobs_keep_their_rows(sweep, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(sweep("allocators", {"allocator": ["naive", "per_request", "paged"]}), copy)
    (copy / "1" / "COMPLETE").unlink()  # as if killed before its marker
    lines, frame = printed(print_comparison, copy)
    assert_fits(lines)
    assert list(frame["status"]) == ["ok", "incomplete", "ok"]
    assert all("incomplete" in row for row in rows_of(lines, "per_request"))
    assert any(line.startswith("incomplete allocator=per_request:") for line in lines)


def test_text_in_square_brackets_shows_as_written_not_as_markup(sweep, tmp_path):
    from kvbench.output.results import write_failure

    copy = tmp_path / "copy"
    shutil.copytree(sweep("allocators", {"allocator": ["naive", "per_request", "paged"]}), copy)
    write_failure(copy / "1", "allocator=per_request", "needs W&B: pip install 'kvbench[wandb]', or [bold]not")
    lines, _ = printed(print_comparison, copy, width=200)
    [failed] = [line for line in lines if line.startswith("failed allocator=per_request:")]
    assert failed.endswith("needs W&B: pip install 'kvbench[wandb]', or [bold]not"), failed


def _with_prefix_cache(source, copy, values: dict[str, list]) -> None:
    """A copy of a sweep whose finished jobs' summaries gain prefix-cache numbers (as a caching
    allocator's runs would write them), job by job in order."""
    shutil.copytree(source, copy)
    finished = [d for d in sorted(copy.iterdir(), key=lambda p: p.name) if (d / "summary.parquet").is_file()]
    for i, job_dir in enumerate(finished):
        summary = pd.read_parquet(job_dir / "summary.parquet")
        for key, column in values.items():
            summary[key] = column[i]
        summary.to_parquet(job_dir / "summary.parquet")
        # the marker vouches for each file's size: re-vouch, as the writer of such a summary would
        mark_complete(job_dir, list(json.loads((job_dir / COMPLETE).read_text())["files"]))


@pytest.mark.parametrize("width", [100, 80])
def test_the_prefix_cache_group_shows_when_a_job_cached_and_fits(block_preemption_sweep, tmp_path, width):
    copy = tmp_path / "prefix"
    # four finished jobs (block 16 and 64, recompute and swap): hits, ceiling, Belady, cached
    _with_prefix_cache(
        block_preemption_sweep,
        copy,
        {
            "prefix_hit_rate": [0.3125, 0.25, 0.0, 0.0],
            "prefix_hit_rate_infinite": [0.5, 0.5, 0.0, 0.0],
            "prefix_hit_rate_belady": [0.4375, 0.4375, 0.0, 0.0],
            "frac_cached": [0.125, 0.0625, 0.0, 0.0],
        },
    )
    lines, _ = printed(print_comparison, copy, width=width)
    assert_fits(lines, width)
    text = " ".join(line.strip() for line in lines)
    assert "prefix cache" in text and "Belady: optimal eviction" in text
    header = " ".join(line for line in lines if line.startswith("┃"))
    assert "Belady" in header and "cached" in header and "% tok." in header
    # block 16, recompute: 31.2 % hits of a 50.0 % ceiling, Belady 43.8 %, 12.5 % of the KV budget cached
    cells = [cell for row in rows_of(lines, "16") for cell in row]
    for shown in ("31.2", "50.0", "43.8", "12.5", "25.0", "6.2"):
        assert shown in cells, (shown, cells)


def test_without_prefix_caching_no_prefix_group(allocator_sweep):
    lines, _ = printed(print_comparison, allocator_sweep)
    assert not any("prefix" in line or "Belady" in line for line in lines)


def test_a_zero_hit_run_summary_says_why_and_fits(block_preemption_sweep):
    summary = pd.read_parquet(block_preemption_sweep / "1" / "summary.parquet").iloc[0].to_dict()
    summary.update(ZERO_PREFIX_HITS)
    lines, _ = printed(print_summary, summary, None, width=100)
    assert_fits(lines)
    assert len(lines) <= 40, "\n".join(lines)
    text = " ".join(line.strip("│ ") for line in lines)
    assert "prefix cache hits" in text and "ceiling / Belady / LRU" in text
    assert "less than one" in text and "16-token" in text


def test_transferred_kernels_are_said_with_their_sources_and_heldout_error_per_gpu():
    from kvbench.output.report import no_effect_warnings

    label = (
        "transfer: {k} as sglang 0.5.14 {k} from l40s, rtx_pro_6000_server, via trtllm 1.3.0rc20 torch_flow on "
        "h100_sxm; held-out median 11.3 %, p90 32.1 % over 212 hidden tables (kv bfloat16); rest of step: ..."
    )
    rows = pd.DataFrame(
        {
            "kernel": ["triton", "flashinfer", "triton", "flashinfer"],
            "hardware": ["h100-sxm", "h100-sxm", "a100-80gb", "a100-80gb"],
            "calibration": [label.format(k="triton"), label.format(k="flashinfer"), "uncalibrated", "uncalibrated"],
        }
    )
    same, transfer = no_effect_warnings(rows)
    assert "same simulated speed: no calibration for a100-80gb " in same
    assert transfer.startswith("no GPU measured these kernels on h100-sxm: priced by a transfer")
    assert "kernel=flashinfer from l40s, rtx_pro_6000_server (held-out median 11.3 %, p90 32.1 %" in transfer
    assert "kernel=triton from" in transfer and "rest of step" not in transfer
