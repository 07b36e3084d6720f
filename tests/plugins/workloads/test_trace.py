"""The trace workload source: each format read exactly, the replay options, and one-line bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pluggy
import pytest
from kvbench_cli import assert_one_line_error, kvbench
from kvbench_plugins.workloads import trace
from kvbench_plugins.workloads.trace import TRACES_DIR, TraceConfig, TraceWorkload
from omegaconf import OmegaConf

from kvbench import hookspecs
from kvbench.app.config import plugin_config, to_dataclass
from kvbench.errors import ConfigError

CONF = Path(__file__).resolve().parents[3] / "conf" / "workload"
PRESETS = ("azure_code", "azure_conv", "mooncake_conversation", "mooncake_synthetic", "sharegpt", "arxiv")
AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:17:03.9799600,100,10\n"
    "2023-11-16 18:17:04.4799600,200,20\n"
    "2023-11-16 18:17:05.2299600,300,30\n"
    "2023-11-17 00:00:00.0000000,400,40\n"
)
AZURE_ARRIVALS_S = [0.0, 0.5, 1.25, 20576.02004]  # the last one crosses midnight


def mooncake_line(timestamp, prompt, output, hashes) -> str:
    return json.dumps({"timestamp": timestamp, "input_length": prompt, "output_length": output, "hash_ids": hashes})


MOONCAKE = (
    "\n".join(
        [
            mooncake_line(0, 1000, 5, [0, 1]),
            mooncake_line(250, 512, 7, [0]),
            mooncake_line(1500, 1100, 9, [0, 1, 2]),
        ]
    )
    + "\n"
)
LENGTHS = (
    "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n74,918,992,0.08\n290,905,1195,0.32\n30,2,32,15\n"
)


def write(tmp_path: Path, text: str, name: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def source(path: Path, fmt: str, **options) -> TraceWorkload:
    """The source built the way the CLI builds it, with llama2-7b's 4,096 positions by default."""
    options = {"model_max_tokens": 4096, **options}
    return TraceWorkload(to_dataclass(TraceConfig, {"format": fmt, "path": str(path), **options}, "workload"))


def generate(path: Path, fmt: str, seed: int = 0, **options):
    return source(path, fmt, **options).generate(np.random.default_rng(seed))


def error(path: Path, fmt: str, **options) -> str:
    with pytest.raises(ConfigError) as caught:
        source(path, fmt, **options)
    message = str(caught.value)
    assert "\n" not in message
    return message


# -- registration and presets ---------------------------------------------------------------------


def test_registers_through_the_hook():
    pm = pluggy.PluginManager("kvbench")
    pm.add_hookspecs(hookspecs)
    pm.register(trace)
    assert pm.hook.kvbench_register_workloads() == [[TraceWorkload]] and TraceWorkload.name == "trace"


@pytest.mark.parametrize("name", ("trace", *PRESETS))
def test_every_yaml_lists_every_option(name):
    node = OmegaConf.load(CONF / f"{name}.yaml")
    assert node.name == "trace" and set(node.keys()) - {"name"} == set(TraceConfig.__dataclass_fields__)


def test_model_max_tokens_follows_the_model_in_the_composed_config():
    root = OmegaConf.create(
        {
            "model": {"hf_config": {"max_position_embeddings": 32768}},
            "workload": OmegaConf.load(CONF / "mooncake_conversation.yaml"),
        }
    )
    cfg = plugin_config(TraceWorkload, root.workload, "workload")
    assert cfg.model_max_tokens == 32768 and cfg.format == "mooncake"
    bare = OmegaConf.create({"workload": OmegaConf.load(CONF / "azure_code.yaml")})  # no model: null, refused
    with pytest.raises(ConfigError, match="model_max_tokens"):
        plugin_config(TraceWorkload, bare.workload, "workload")


def test_every_packaged_trace_is_readable_and_sized_as_documented():
    sizes = {
        "azure_code": 8819,
        "azure_conv": 19366,
        "mooncake_conversation": 12031,
        "mooncake_synthetic": 3993,
        "sharegpt": 30731,
        "arxiv": 28257,
    }
    for name, rows in sizes.items():
        node = OmegaConf.load(CONF / f"{name}.yaml")
        assert (TRACES_DIR / node.path).is_file()
        src = source(
            Path(node.path), node.format, arrival=node.arrival, rate_per_s=node.rate_per_s, model_max_tokens=200_000
        )
        assert src.num_read == rows and src.num_dropped == 0


# -- formats --------------------------------------------------------------------------------------


def test_azure_arrivals_are_seconds_after_the_first_row(tmp_path):
    w = generate(write(tmp_path, AZURE, "azure.csv"), "azure")
    assert w.arrival_s.tolist() == AZURE_ARRIVALS_S
    assert w.prompt_tokens.tolist() == [100, 200, 300, 400] and w.output_tokens.tolist() == [10, 20, 30, 40]
    assert w.s_max_tokens.tolist() == [4096] * 4 and w.prefix_hashes is None and w.hash_block_tokens == 0


def test_mooncake_reads_milliseconds_and_hash_ids(tmp_path):
    w = generate(write(tmp_path, MOONCAKE, "mc.jsonl"), "mooncake")
    assert w.arrival_s.tolist() == [0.0, 0.25, 1.5]
    assert w.prompt_tokens.tolist() == [1000, 512, 1100] and w.output_tokens.tolist() == [5, 7, 9]
    assert w.prefix_hashes == [(0, 1), (0,), (0, 1, 2)] and w.hash_block_tokens == 512


def test_the_workload_shares_the_traces_rows_and_cannot_change_them(tmp_path):
    """The replayed lengths are read-only views of the source's rows, not copies."""
    src = source(write(tmp_path, AZURE, "azure.csv"), "azure")
    first = src.generate(np.random.default_rng(0))
    for column, own in [(first.prompt_tokens, src.rows.prompt_tokens), (first.output_tokens, src.rows.output_tokens)]:
        assert np.shares_memory(column, own) and not column.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            column[0] = 1
    assert not first.s_max_tokens.flags.writeable
    again = src.generate(np.random.default_rng(0))
    assert again.prompt_tokens.tolist() == first.prompt_tokens.tolist()


def test_lengths_take_kvbench_arrivals(tmp_path):
    path = write(tmp_path, LENGTHS, "len.csv")
    w = generate(path, "lengths", arrival="all_at_once")
    assert w.prompt_tokens.tolist() == [74, 290, 30] and w.output_tokens.tolist() == [918, 905, 2]
    assert w.arrival_s.tolist() == [0.0] * 3
    poisson = generate(path, "lengths", seed=4, arrival="poisson", rate_per_s=5.0)
    expected = np.cumsum(np.random.default_rng(4).exponential(1 / 5.0, 3))
    assert poisson.arrival_s.tolist() == expected.tolist()
    assert "no timestamps" in error(path, "lengths")  # arrival=trace


def test_request_csv_is_read_by_its_reader(tmp_path):
    path = write(
        tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens,s_max_tokens\n2,10,5,64\n2.5,20,5,30\n", "r.csv"
    )
    w = generate(path, "request_csv", s_max_policy="request")
    assert w.arrival_s.tolist() == [0.0, 0.5] and w.prompt_tokens.tolist() == [10, 20]
    assert w.s_max_tokens.tolist() == [64, 30]  # the trace's own declaration
    assert generate(path, "request_csv", s_max_policy="request", model_max_tokens=40).s_max_tokens.tolist() == [40, 30]


def test_a_packaged_trace_is_found_by_name(tmp_path):
    w = generate(Path("azure_llm_2023_code.csv"), "azure", num_requests=3, model_max_tokens=8192)
    assert w.prompt_tokens.tolist() == [4808, 3180, 110] and w.arrival_s.tolist() == [0.0, 0.052, 0.098189]


# -- replay options -------------------------------------------------------------------------------


@pytest.mark.parametrize(("scale", "factor"), [(0.5, 2.0), (2.0, 0.5), (4.0, 0.25)])
def test_rate_scale_divides_every_arrival_exactly(tmp_path, scale, factor):
    w = generate(write(tmp_path, MOONCAKE, "mc.jsonl"), "mooncake", rate_scale=scale)
    assert w.arrival_s.tolist() == [0.0, 0.25 * factor, 1.5 * factor]


def test_offset_and_limit_pick_a_window_rebased_to_its_first_request(tmp_path):
    path = write(tmp_path, AZURE, "azure.csv")
    w = generate(path, "azure", start_offset=1, num_requests=2)
    assert w.prompt_tokens.tolist() == [200, 300] and w.arrival_s.tolist() == [0.0, 0.75]
    assert "start_offset=4 skips every one of the 4" in error(path, "azure", start_offset=4)
    assert "num_requests=3 is more than the 2 requests after start_offset=2" in error(
        path, "azure", start_offset=2, num_requests=3
    )


def test_s_max_policies(tmp_path):
    path = write(tmp_path, AZURE, "azure.csv")
    assert generate(path, "azure", model_max_tokens=8192).s_max_tokens.tolist() == [8192] * 4
    assert generate(path, "azure", s_max_policy="fixed", s_max_tokens=512).s_max_tokens.tolist() == [512] * 4
    assert generate(path, "azure", s_max_policy="request").s_max_tokens.tolist() == [110, 220, 330, 440]
    assert generate(path, "azure", s_max_policy="request", model_max_tokens=None).s_max_tokens.tolist()[-1] == 440
    assert "model_max_tokens" in error(path, "azure", model_max_tokens=None)


def test_too_long_drop_counts_and_keeps_the_rest_in_order(tmp_path):
    src = source(write(tmp_path, AZURE, "azure.csv"), "azure", s_max_policy="fixed", s_max_tokens=250)
    w = src.generate(np.random.default_rng(0))
    assert (src.num_dropped, src.num_clipped) == (2, 0)
    assert w.prompt_tokens.tolist() == [100, 200] and w.arrival_s.tolist() == [0.0, 0.5]


def test_too_long_drop_rebases_to_the_first_kept_request(tmp_path):
    src = source(write(tmp_path, MOONCAKE, "mc.jsonl"), "mooncake", model_max_tokens=600)
    w = src.generate(np.random.default_rng(0))
    assert src.num_dropped == 2 and w.arrival_s.tolist() == [0.0] and w.prefix_hashes == [(0,)]
    assert "all 3 replayed requests are longer" in error(
        write(tmp_path, MOONCAKE, "m2.jsonl"), "mooncake", model_max_tokens=500
    )


def test_too_long_clip_shortens_output_then_prompt_and_its_hashes(tmp_path):
    src = source(write(tmp_path, MOONCAKE, "mc.jsonl"), "mooncake", model_max_tokens=1003, too_long="clip")
    w = src.generate(np.random.default_rng(0))
    assert (src.num_dropped, src.num_clipped) == (0, 2)
    assert w.prompt_tokens.tolist() == [1000, 512, 1002] and w.output_tokens.tolist() == [3, 7, 1]
    assert w.prefix_hashes == [(0, 1), (0,), (0, 1)]  # 1,002 tokens: two 512-token granules
    assert w.s_max_tokens.tolist() == [1003] * 3


def test_too_long_error_names_the_line(tmp_path):
    path = write(tmp_path, AZURE, "azure.csv")
    message = error(path, "azure", s_max_policy="fixed", s_max_tokens=250, too_long="error")
    assert message.startswith(f"{path}:4: prompt + output = 330") and "workload.s_max_tokens=250" in message


# -- bad input: one line each ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "column", "fragment"),
    [
        ("2023-11-16 18:17:05,abc,1", 2, "ContextTokens='abc'"),
        ("2023-11-16 18:17:05,-3,1", 2, "ContextTokens='-3'"),
        ("2023-11-16 18:17:05,5,0", 3, "GeneratedTokens='0'"),
        ("2023-11-16 18:17:05,5", 3, "no GeneratedTokens value"),
        ("2023-11-16T18:17:05,5,1", 1, "TIMESTAMP='2023-11-16T18:17:05' is not a time as YYYY-MM-DD HH:MM:SS.fffffff"),
        ("2023-02-30 18:17:05.0,5,1", 1, "TIMESTAMP='2023-02-30 18:17:05.0'"),
        ("\u0662\u0660\u0662\u0663-11-16 18:17:05,5,1", 1, "TIMESTAMP='\u0662\u0660\u0662\u0663-11-16"),  # Arabic-Indic
        ("2023-11-16 18:17:05,1_000,1", 2, "ContextTokens='1_000'"),
        ("2023-11-16 18:17:05,5,+5", 3, "GeneratedTokens='+5'"),
        (f"2023-11-16 18:17:05,{2**63 - 1},1", 2, "ContextTokens='9223372036854775807'"),
    ],
)
def test_a_bad_azure_row_names_file_line_column(tmp_path, row, column, fragment):
    path = write(tmp_path, f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:04.0,1,1\n{row}\n", "a.csv")
    message = error(path, "azure")
    assert message.startswith(f"{path}:3:{column}: ") and fragment in message


def test_unsorted_timestamps_are_refused_at_the_row(tmp_path):
    azure = write(tmp_path, AZURE.replace("18:17:05.2299600", "18:17:01.0000000"), "a.csv")
    assert error(azure, "azure").startswith(f"{azure}:4:1: TIMESTAMP is earlier than the row above it (line 3)")
    mooncake = write(tmp_path, MOONCAKE.replace('"timestamp": 1500', '"timestamp": 100'), "m.jsonl")
    assert error(mooncake, "mooncake").startswith(f"{mooncake}:3: timestamp is earlier")
    request = write(tmp_path, "arrival_s,prompt_tokens,output_tokens\n1,1,1\n0.5,1,1\n", "r.csv")
    assert error(request, "request_csv").startswith(f"{request}:3:1: arrival_s=0.5 is earlier")


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('{"timestamp": 5, "input_length": 10', ":2:36: not valid JSON"),
        ("[1, 2]", ":2: a JSON list, not an object"),
        ('{"timestamp": 5, "input_length": 10, "output_length": 1}', ":2: no hash_ids key"),
        (mooncake_line(5, -10, 1, [0]), ":2: input_length=-10 is not a whole number of tokens"),
        (mooncake_line(5, 10, 1.5, [0]), ":2: output_length=1.5"),
        (mooncake_line(-1, 10, 1, [0]), ":2: timestamp=-1 is not a time in milliseconds"),
        (mooncake_line(5, 10, 1, ["a"]), ":2: hash_ids="),
        (mooncake_line(5, 513, 1, [0]), ":2: hash_ids has 1 ids, expected 2"),
        (mooncake_line(5, "7", 1, [0]), ":2: input_length='7' is not a whole number"),
        (mooncake_line(5, 2**63 - 1, 1, [0]), ":2: input_length=9223372036854775807 is not a whole number"),
        ("[" * 100_000 + "]" * 100_000, ":2: JSON nested too deeply"),
    ],
)
def test_a_bad_mooncake_line_names_file_and_line(tmp_path, line, fragment):
    path = write(tmp_path, mooncake_line(0, 10, 1, [0]) + "\n" + line + "\n", "m.jsonl")
    message = error(path, "mooncake")
    assert message.startswith(f"{path}{fragment}"), message


def test_a_byte_order_mark_is_read_past_in_every_format(tmp_path):
    azure = tmp_path / "a.csv"
    azure.write_bytes(("\ufeff" + AZURE).encode())
    assert generate(azure, "azure").arrival_s.tolist() == pytest.approx(AZURE_ARRIVALS_S)
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_bytes(("\ufeff" + MOONCAKE).encode())
    assert generate(mooncake, "mooncake").prompt_tokens.tolist() == [1000, 512, 1100]
    hidden = write(tmp_path, "TIMESTAMP\u200b,ContextTokens,GeneratedTokens\n2023-11-16 18:17:04.0,1,1\n", "z.csv")
    assert "invisible characters (\\u200b)" in error(hidden, "azure")


def test_a_too_long_request_cannot_wrap_past_drop(tmp_path):
    # prompt + output of 2**63 - 1 + 1 wrapped to a negative int64: shorter than any limit, kept
    path = write(tmp_path, f"prompt_tokens,output_tokens\n10,10\n{2**63 - 1},1\n", "l.csv")
    assert "is not a whole number of tokens in [1, 2147483647]" in error(path, "lengths", arrival="all_at_once")
    path = write(tmp_path, f"prompt_tokens,output_tokens\n10,10\n{2**31 - 1},{2**31 - 1}\n", "l2.csv")
    kept = source(path, "lengths", arrival="all_at_once", too_long="drop")
    assert kept.num_dropped == 1 and kept.rows.prompt_tokens.tolist() == [10]


def test_a_relative_path_reaches_the_packaged_traces_by_bare_name_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # relative to the packaged folder this is kvbench's own textio.py: no longer read from there
    assert "no such file here or among kvbench's traces" in error(
        Path("../textio.py"), "lengths", arrival="all_at_once"
    )
    (tmp_path / "folder.csv").mkdir()
    assert "is a folder, not a trace file" in error(Path("folder.csv"), "azure")


def test_arrivals_beyond_any_trace_span_are_refused(tmp_path):
    from kvbench.api import run

    with pytest.raises(ConfigError, match=r"the last request arrives .* s after the start, beyond the 1e\+09 s"):
        run(
            [
                "workload=azure_conv",
                "workload.num_requests=20",
                "workload.rate_scale=1e-300",
                "wandb.mode=disabled",
                "progress=false",
            ]
        )


def test_a_bad_lengths_row_and_missing_columns(tmp_path):
    path = write(tmp_path, "num_prefill_tokens,num_decode_tokens\n5,5\n7,-1\n", "l.csv")
    assert error(path, "lengths", arrival="all_at_once").startswith(f"{path}:3:2: num_decode_tokens='-1'")
    azure = write(tmp_path, "TIMESTAMP,ContextTokens\n2023-11-16 18:17:04.0,1\n", "a.csv")
    assert "no GeneratedTokens column" in error(azure, "azure")


def test_missing_and_empty_traces(tmp_path):
    assert "no such file here or among kvbench's traces" in error(tmp_path / "absent.csv", "azure")
    assert "is empty" in error(write(tmp_path, "", "e.csv"), "azure")
    assert "holds no requests" in error(write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n", "h.csv"), "azure")
    assert "holds no requests" in error(write(tmp_path, "\n\n", "e.jsonl"), "mooncake")
    assert "no requests" in error(
        write(tmp_path, "prompt_tokens,output_tokens\n", "r.csv"), "lengths", arrival="all_at_once"
    )


def test_bad_options(tmp_path):
    path = write(tmp_path, AZURE, "azure.csv")
    assert "workload.format" in error(path, "sharegpt")
    assert "workload.rate_scale" in error(path, "azure", rate_scale=0.0)
    assert "workload.start_offset" in error(path, "azure", start_offset=-1)
    assert "workload.too_long" in error(path, "azure", too_long="truncate")
    assert "workload.s_max_policy" in error(path, "azure", s_max_policy="model")
    assert "workload.rate_per_s" in error(path, "azure", arrival="poisson")


# -- the command line ----------------------------------------------------------------------------

# Registers the module by hand until the installed package carries its entry point.
REGISTERED = (
    "from kvbench.plugins import plugin_manager\n"
    "from kvbench_plugins.workloads import trace\n"
    "pm = plugin_manager()\n"
    "pm.is_registered(trace) or pm.register(trace)\n"
    "from kvbench.commands.main import main; main()\n"
)
COMMON = ("wandb.mode=disabled", "progress=false", "kernel=torch", "output.write=false")


def test_cli_replays_a_packaged_trace(tmp_path):
    proc = kvbench("workload=azure_code", "workload.num_requests=40", *COMMON, cwd=tmp_path, code=REGISTERED)
    assert proc.returncode == 0, proc.stderr
    # 10 of the first 40 requests exceed llama2-7b's 4,096 positions and are dropped
    assert "30 / 30" in proc.stdout


def test_cli_reports_a_bad_row_in_one_line_and_writes_nothing(tmp_path):
    bad = write(tmp_path, MOONCAKE.replace('"output_length": 7', '"output_length": "7"'), "bad.jsonl")
    proc = kvbench(
        "workload=trace",
        "workload.format=mooncake",
        f"workload.path={bad}",
        "wandb.mode=disabled",
        "progress=false",
        "kernel=torch",
        cwd=tmp_path,
        code=REGISTERED,
    )
    assert_one_line_error(proc, f"{bad}:2: output_length='7'", status=2)
    assert not list((tmp_path / "results").rglob("summary.parquet")), "a failed run left results"
