"""startup.py and its floors: the minimal Hydra app writes what it is asked to, with no kvbench and no
pandas, and each 1-request kvbench run is paired with the app writing the same kinds of output."""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq
import startup


def _app_imports(out, *overrides: str) -> list[str]:
    """Run the floor app as its own script; the pandas and kvbench modules it left imported."""
    probe = (
        "import runpy, sys\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kvbench', 'pandas')))\n"
    )
    argv = [sys.executable, "-c", probe, str(startup.MINIMAL_HYDRA_APP), *overrides, f"hydra.run.dir={out}"]
    child = subprocess.run(argv, capture_output=True, text=True, check=True)
    return child.stdout.splitlines()[-1]


def test_the_floor_app_writes_a_table_and_a_figure_with_the_libraries_alone(tmp_path):
    out = tmp_path / "run"
    imported = _app_imports(out, "workload.num_requests=3", "output.tables=true", "output.figure=true")
    # Hydra's scan of installed plugins imports kvbench's sweeper in any Hydra app where kvbench is
    # installed; writing the outputs adds nothing of kvbench's, and no pandas
    assert imported == _app_imports(tmp_path / "plain")
    assert "pandas" not in imported
    table = pq.read_table(out / "table.parquet")
    assert table.column_names == ["num_requests", "prompt_tokens", "output_tokens"]
    assert table.column("num_requests").to_pylist() == [3]
    assert (out / "table.csv").read_text() == "num_requests,prompt_tokens,output_tokens\n3,512,128\n"
    assert (out / "figure.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plain_floor_writes_nothing(tmp_path):
    out = tmp_path / "run"
    subprocess.run([*startup.command("minimal_hydra"), f"hydra.run.dir={out}"], capture_output=True, check=True)
    assert not {"table.parquet", "table.csv", "figure.png"} & {p.name for p in out.iterdir()}


def test_each_goal_run_is_paired_with_its_own_floor(tmp_path):
    names = ["minimal_hydra", "minimal_hydra_tables", "run_1_request_no_figures", "run_1_request_no_output"]
    measured = startup.measure(names, 1, tmp_path)
    assert measured["run_1_request_no_figures"]["own_floor"] == "minimal_hydra_tables"
    assert measured["run_1_request_no_output"]["own_floor"] == "minimal_hydra"
    for name in ("run_1_request_no_figures", "run_1_request_no_output"):
        row = measured[name]
        floor = measured[row["own_floor"]]
        assert row["vs_own_floor"] == row["walls_s"][0] / floor["walls_s"][0]  # one round: its own ratio
    assert "vs_own_floor" not in measured["minimal_hydra_tables"]
    text = startup.markdown(
        {
            "measured_utc": "now",
            "invocation": "python benchmarks/startup.py",
            "machine": "x",
            "cpu_cores": 2,
            "python": "3",
            "repeat": 1,
            "commands": measured,
            "top_imports": [],
        }
    )
    assert "| `minimal Hydra app workload.num_requests=1 output.tables=true` |" in text
    assert f"| {measured['run_1_request_no_figures']['vs_own_floor']:.2f}x |" in text
