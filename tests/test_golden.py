"""The golden gates: kvbench's own numbers for two committed scenarios must not move.

Each scenario of tests/golden/scenarios.yaml is re-run by the real CLI and compared with its
committed folder by ``kvbench compare`` with its default tolerances: every count exactly, every
float within 1e-9 relative (``close``: far above the last-bit noise of a sum taken in another
order on another CPU, far below any real change; kvbench/compare/tolerance.py says why). A failure
means a change moved kvbench's numbers; a metric the golden folder lacks means it is stale. Either
way, if the change is intended, regenerate the golden folders (``python tests/golden/regenerate.py``)
and commit them with it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from kvbench.commands.compare import main as compare_main

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
_spec = importlib.util.spec_from_file_location("golden_regenerate", GOLDEN_DIR / "regenerate.py")
regenerate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(regenerate)

REGENERATE = "If the change is intended, run `python tests/golden/regenerate.py` and commit tests/golden/ with it."


@pytest.mark.parametrize("scenario", sorted(regenerate.scenarios()))
def test_golden_scenario_reproduces(scenario, tmp_path, capsys):
    fresh = tmp_path / scenario
    proc = regenerate.run_scenario(scenario, fresh)
    assert proc.returncode == 0, proc.stderr
    with pytest.raises(SystemExit) as stop:  # the default tolerances: wall-clock timings never gated
        compare_main([str(GOLDEN_DIR / scenario), str(fresh), "--out", str(tmp_path / "compare")])
    report = capsys.readouterr()
    assert stop.value.code == 0, (
        f"kvbench compare {GOLDEN_DIR / scenario} {fresh} exited {stop.value.code}: this change moves kvbench's "
        f"numbers for the {scenario} scenario.\n{report.out}{report.err}\n{REGENERATE}"
    )
    verdicts = pd.read_parquet(tmp_path / "compare" / "compare.parquet")
    new = sorted(set(verdicts.loc[verdicts["verdict"] == "new", "metric"]))
    assert not new, f"tests/golden/{scenario} is stale: it lacks the metrics {', '.join(new)}.\n{REGENERATE}"
