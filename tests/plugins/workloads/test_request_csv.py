"""The request_csv workload source: the columns it reads, what it declares, and its one-line errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pluggy
import pytest
from kvbench_cli import assert_one_line_error, kvbench
from kvbench_plugins.workloads import request_csv
from kvbench_plugins.workloads.request_csv import RequestCsvConfig, RequestCsvWorkload
from omegaconf import OmegaConf

from kvbench import hookspecs
from kvbench.app.config import plugin_config, to_dataclass
from kvbench.errors import ConfigError

CONF = Path(__file__).resolve().parents[3] / "conf" / "workload" / "request_csv.yaml"
KVBENCH_NAMES = "arrival_s,prompt_tokens,output_tokens\n0.5,100,10\n1.25,200,20\n1.25,300,30\n"
VIDUR_NAMES = (
    "request_id,arrived_at,num_prefill_tokens,num_decode_tokens,pd_ratio\n"
    "0,0.5,100,10,10\n1,1.25,200,20,10\n2,1.25,300,30,10\n"
)


def write(tmp_path: Path, text: str, name: str = "requests.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def source(path: Path, **options) -> RequestCsvWorkload:
    """The source built the way the CLI builds it: options merged into the typed config."""
    return RequestCsvWorkload(to_dataclass(RequestCsvConfig, {"path": str(path), **options}, "workload"))


def generate(path: Path, seed: int = 0, **options):
    return source(path, **options).generate(np.random.default_rng(seed))


def error(path: Path, **options) -> str:
    with pytest.raises(ConfigError) as caught:
        source(path, **options)
    message = str(caught.value)
    assert "\n" not in message
    return message


# -- registration and the preset ------------------------------------------------------------------


def test_registers_through_the_hook():
    pm = pluggy.PluginManager("kvbench")
    pm.add_hookspecs(hookspecs)
    pm.register(request_csv)
    assert pm.hook.kvbench_register_workloads() == [[RequestCsvWorkload]]
    assert RequestCsvWorkload.name == "request_csv"


def test_yaml_lists_every_option_and_requires_the_path(tmp_path):
    node = OmegaConf.load(CONF)
    assert node.name == "request_csv"
    assert set(node.keys()) - {"name"} == set(RequestCsvConfig.__dataclass_fields__)
    assert OmegaConf.is_missing(node, "path")
    with pytest.raises(ConfigError, match="path"):
        plugin_config(RequestCsvWorkload, node, "workload")
    node.path = str(write(tmp_path, KVBENCH_NAMES))
    assert plugin_config(RequestCsvWorkload, node, "workload") == RequestCsvConfig(path=node.path)


# -- columns ------------------------------------------------------------------------------------


def test_kvbench_and_vidur_column_names_give_the_same_requests(tmp_path):
    ours = generate(write(tmp_path, KVBENCH_NAMES, "ours.csv"))
    vidur = generate(write(tmp_path, VIDUR_NAMES, "vidur.csv"))
    for w in (ours, vidur):
        assert w.arrival_s.tolist() == [0.5, 1.25, 1.25]
        assert w.prompt_tokens.tolist() == [100, 200, 300] and w.prompt_tokens.dtype == np.int64
        assert w.output_tokens.tolist() == [10, 20, 30] and w.output_tokens.dtype == np.int64
        assert w.s_max_tokens.tolist() == [4096] * 3


def test_arrival_times_are_read_exactly(tmp_path):
    times = [0.1, 1 / 3, 2.000000000000001, 7e-9 + 3]
    rows = "".join(f"{t!r},5,5\n" for t in times)
    w = generate(write(tmp_path, "arrival_s,prompt_tokens,output_tokens\n" + rows))
    assert w.arrival_s.tolist() == times


def test_without_an_arrival_column_every_request_arrives_at_zero(tmp_path):
    w = generate(write(tmp_path, "num_prefill_tokens,num_decode_tokens\n3772,54\n2015,156\n"))
    assert w.arrival_s.tolist() == [0.0, 0.0]
    assert w.prompt_tokens.tolist() == [3772, 2015]


def test_poisson_replaces_the_files_arrivals_reproducibly(tmp_path):
    path = write(tmp_path, "prompt_tokens,output_tokens\n" + "8,8\n" * 2000)
    first = generate(path, seed=3, arrival="poisson", rate_per_s=10.0)
    assert np.array_equal(first.arrival_s, generate(path, seed=3, arrival="poisson", rate_per_s=10.0).arrival_s)
    assert np.all(np.diff(first.arrival_s) >= 0) and first.arrival_s[0] > 0
    assert 2000 / first.arrival_s[-1] == pytest.approx(10.0, rel=0.1)
    assert generate(write(tmp_path, KVBENCH_NAMES), arrival="all_at_once").arrival_s.tolist() == [0.0] * 3


def test_the_workload_shares_the_files_rows_and_cannot_change_them(tmp_path):
    """No copy of a million rows per column: the workload's columns are read-only views of the
    source's, so a second generate gives the same requests even after a write was tried."""
    src = source(
        write(tmp_path, "arrival_s,prompt_tokens,output_tokens,s_max_tokens,priority\n0,5,2,9,1\n1,7,3,12,0\n")
    )
    first = src.generate(np.random.default_rng(0))
    table = src.table
    for column, own in [
        (first.arrival_s, table.arrival_s),
        (first.prompt_tokens, table.prompt_tokens),
        (first.output_tokens, table.output_tokens),
        (first.s_max_tokens, table.s_max_tokens),
        (first.priority, table.priority),
    ]:
        assert np.shares_memory(column, own) and not column.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            column[0] = 99
    second = src.generate(np.random.default_rng(0))
    assert second.prompt_tokens.tolist() == [5, 7] and second.s_max_tokens.tolist() == [9, 12]
    assert second.priority.tolist() == [1, 0] and second.arrival_s.tolist() == [0.0, 1.0]


def test_num_requests_takes_the_first_rows(tmp_path):
    w = generate(write(tmp_path, KVBENCH_NAMES), num_requests=2)
    assert w.prompt_tokens.tolist() == [100, 200]


def test_blank_lines_and_extra_columns_are_ignored(tmp_path):
    w = generate(write(tmp_path, "note,prompt_tokens,output_tokens\nx,7,3\n\ny,9,1\n\n"))
    assert w.prompt_tokens.tolist() == [7, 9] and w.output_tokens.tolist() == [3, 1]


# -- declared S_max -------------------------------------------------------------------------------


def test_s_max_policies_and_the_column(tmp_path):
    path = write(tmp_path, KVBENCH_NAMES)
    assert generate(path, s_max_tokens=512).s_max_tokens.tolist() == [512] * 3
    assert generate(path, s_max_policy="request").s_max_tokens.tolist() == [110, 220, 330]
    with_column = write(tmp_path, "prompt_tokens,output_tokens,s_max_tokens\n10,5,15\n10,5,64\n", "smax.csv")
    assert generate(with_column, s_max_policy="request").s_max_tokens.tolist() == [15, 64]


def test_a_request_longer_than_its_s_max_is_refused_with_its_line(tmp_path):
    message = error(write(tmp_path, KVBENCH_NAMES), s_max_tokens=250)
    assert "requests.csv:4:" in message and "330" in message and "s_max_policy=request" in message
    column = write(tmp_path, "prompt_tokens,output_tokens,s_max_tokens\n10,5,15\n10,5,14\n", "smax.csv")
    assert "smax.csv:3:" in error(column) and "s_max_tokens column" in error(column)


# -- bad input: one line each, naming the file, line and column ----------------------------------


def test_missing_and_empty_files(tmp_path):
    assert "no such file" in error(tmp_path / "absent.csv") and "absent.csv" in error(tmp_path / "absent.csv")
    assert "is empty" in error(write(tmp_path, ""))
    assert "no requests" in error(write(tmp_path, "prompt_tokens,output_tokens\n", "header.csv"))


def test_a_file_that_is_not_csv_text(tmp_path):
    path = tmp_path / "binary.csv"
    path.write_bytes(b"prompt_tokens,output_tokens\n\xff\xfe,1\n")
    assert "not readable as UTF-8 CSV" in error(path)


def test_a_missing_column_names_both_spellings(tmp_path):
    message = error(write(tmp_path, "arrival_s,prompt_tokens\n0,5\n"))
    assert "no output_tokens column" in message and "output_tokens or num_decode_tokens" in message
    message = error(write(tmp_path, "arrival_s,arrived_at,prompt_tokens,output_tokens\n0,0,5,5\n", "two.csv"))
    assert "arrival_s and arrived_at" in message


@pytest.mark.parametrize(
    ("row", "column", "fragment"),
    [
        ("0.5,abc,10", 2, "prompt_tokens='abc'"),
        ("0.5,-3,10", 2, "prompt_tokens='-3'"),
        ("0.5,100,0", 3, "output_tokens='0'"),
        ("0.5,100,2.5", 3, "output_tokens='2.5'"),
        ("0.5,100,99999999999999999999", 3, "output_tokens='99999999999999999999'"),
        ("-1,100,10", 1, "arrival_s='-1'"),
        ("nan,100,10", 1, "arrival_s='nan'"),
        ("0.5,100", 3, "no output_tokens value"),
        # what Python's int() and float() take but no trace writer means as a plain number
        ("0.5,1_000,10", 2, "prompt_tokens='1_000'"),
        ("0.5,+5,10", 2, "prompt_tokens='+5'"),
        ("0.5,\u0665,10", 2, "prompt_tokens='\u0665'"),  # ARABIC-INDIC DIGIT FIVE
        ("0.5,\uff15,10", 2, "prompt_tokens='\uff15'"),  # FULLWIDTH DIGIT FIVE
        ("0.5,100,1e3", 3, "output_tokens='1e3'"),
        ("1_0.5,100,10", 1, "arrival_s='1_0.5'"),
        ("inf,100,10", 1, "arrival_s='inf'"),
        ("0x10,100,10", 1, "arrival_s='0x10'"),
        # a sum that would wrap int64 (and so pass workload.too_long=drop as short)
        (f"0.5,{2**63 - 1},10", 2, f"prompt_tokens='{2**63 - 1}'"),
        (f"0.5,{2**31},10", 2, "in [1, 2147483647]"),
        # latencies would vanish into the arrival time (1e300 + a TTFT == 1e300)
        ("1e300,100,10", 1, "arrival_s='1e300' is beyond 1e+09 s"),
    ],
)
def test_a_bad_value_is_reported_at_its_line_and_column(tmp_path, row, column, fragment):
    path = write(tmp_path, f"arrival_s,prompt_tokens,output_tokens\n0,1,1\n{row}\n")
    message = error(path)
    assert message.startswith(f"{path}:3:{column}: ") and fragment in message


def test_plain_numbers_still_read_as_numbers(tmp_path):
    path = write(tmp_path, "arrival_s,prompt_tokens,output_tokens\n0,1,1\n 2.5 ,007,10\n3e2,2147483647,1\n.5e3,5,5\n")
    workload = generate(path, arrival="all_at_once", s_max_policy="request")
    assert workload.prompt_tokens.tolist() == [1, 7, 2147483647, 5]
    assert source(path, s_max_policy="request").table.arrival_s.tolist() == [0.0, 2.5, 300.0, 500.0]


def test_a_byte_order_mark_does_not_hide_the_arrival_column(tmp_path):
    # Excel's "CSV UTF-8" starts the file with U+FEFF: read as part of the first name, the optional
    # arrival column went missing and every request arrived at t = 0
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufeffarrival_s,prompt_tokens,output_tokens\n0,10,5\n3,10,5\n".encode())
    assert generate(path).arrival_s.tolist() == [0.0, 3.0]


@pytest.mark.parametrize("hidden", ["\u200b", "\ufeff", "\u00a0", "\x1b"])
def test_an_invisible_character_in_a_header_name_is_named(tmp_path, hidden):
    path = write(tmp_path, f"arr{hidden}ival_s,prompt_tokens,output_tokens\n0,10,5\n")
    message = error(path)
    escape = hidden.encode("unicode_escape").decode()
    assert (
        message.startswith(f"{path}:1:1: ")
        and f"invisible characters ({escape})" in message
        and "'arrival_s'" in message
    )


def test_a_folder_or_an_unreadable_file_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "folder.csv").mkdir()
    assert "no such file" in error(tmp_path / "folder.csv")
    path = write(tmp_path, KVBENCH_NAMES)

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("builtins.open", denied)  # root reads any file: the denial is simulated
    assert "cannot be read: Permission denied" in error(path)


def test_unsorted_arrivals_are_refused_at_the_first_row_out_of_order(tmp_path):
    path = write(tmp_path, "arrival_s,prompt_tokens,output_tokens\n0,1,1\n\n2.0,1,1\n1.5,1,1\n")
    message = error(path)
    assert message.startswith(f"{path}:5:1: ") and "sort the file by arrival_s" in message
    assert generate(path, arrival="all_at_once").num_requests == 3  # the file's arrivals are not used


def test_bad_options(tmp_path):
    path = write(tmp_path, KVBENCH_NAMES)
    assert "more than the 3 requests" in error(path, num_requests=4)
    assert "workload.arrival" in error(path, arrival="trace")
    assert "workload.rate_per_s" in error(path, arrival="poisson")
    assert "workload.s_max_policy" in error(path, s_max_policy="model")


# -- the command line ----------------------------------------------------------------------------

# Registers the module by hand until the installed package carries its entry point (the same
# module object, so a later install does not register it twice).
REGISTERED = (
    "from kvbench.plugins import plugin_manager\n"
    "from kvbench_plugins.workloads import request_csv\n"
    "pm = plugin_manager()\n"
    "pm.is_registered(request_csv) or pm.register(request_csv)\n"
    "from kvbench.commands.main import main; main()\n"
)


def test_cli_runs_a_file_and_reports_a_bad_row_in_one_line(tmp_path):
    good = write(tmp_path, VIDUR_NAMES, "good.csv")
    bad = write(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens\n0,12,x\n", "bad.csv")
    common = ["workload=request_csv", "wandb.mode=disabled", "progress=false", "kernel=torch", "output.write=false"]
    ok = kvbench(*common, f"workload.path={good}", cwd=tmp_path, code=REGISTERED)
    assert ok.returncode == 0, ok.stderr
    proc = kvbench(*common, f"workload.path={bad}", cwd=tmp_path, code=REGISTERED)
    assert_one_line_error(proc, f"{bad}:2:3:", "num_decode_tokens='x'", status=2)
