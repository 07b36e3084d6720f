"""event_cost.py: the fitted line and the growers read right, a clear line where it cannot count.

The count itself takes about ten minutes under valgrind, so it is run by hand
(``benchmarks/results/event_cost.md``), not here."""

from __future__ import annotations

import event_cost
import pytest


def row(batch: int, decodes: float, per_turn: float, lines: dict[str, float]) -> dict:
    return {
        "batch_cap": batch,
        "requests": 100,
        "turns": 10,
        "steps": 50,
        "decodes_per_turn": decodes,
        "loop_instructions": int(per_turn * 10),
        "instructions_per_turn": per_turn,
        "lines_per_turn": lines,
    }


ROWS = [
    row(4, 2.0, 1_000 + 2.0 * 50, {"a": 5.0, "b": 1.0}),
    row(16, 8.0, 1_000 + 8.0 * 50, {"a": 5.0, "b": 4.0, "c": 1.0}),
    row(64, 30.0, 1_000 + 30.0 * 50, {"a": 5.0, "b": 30.0, "c": 2.0}),
]


def test_the_fit_recovers_a_line_exactly():
    intercept, slope = event_cost.fit(ROWS)
    assert intercept == pytest.approx(1_000, rel=1e-9)
    assert slope == pytest.approx(50, rel=1e-9)


def test_growers_are_the_functions_whose_lines_grow_most_and_only_those():
    assert event_cost.growers(ROWS) == [("b", 1.0, 30.0), ("c", 0.0, 2.0)]  # "a" did not grow


def test_the_report_states_the_fit_and_the_share_at_ten_sequences():
    text = event_cost.markdown(ROWS, "python benchmarks/event_cost.py")
    assert "**1,000 instructions plus 50 per decoding sequence**" in text
    assert "the per-sequence part is 33% of a turn" in text  # 500 / 1,500
    assert "| 64 | 30.0 | 10 | 50 | 25,000 | 2,500 |" in text
    assert "| `b` | 1.0 | 30.0 |" in text


def test_the_configs_differ_in_the_batch_cap_only():
    small, large = event_cost.overrides(4, 100), event_cost.overrides(128, 100)
    assert [o for o in small if o not in large] == ["scheduler.max_num_seqs=4"]
    assert "workload.arrival=all_at_once" in small and "preemption=recompute" in small


def test_without_valgrind_it_says_so_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert event_cost.main([]) == 2
    assert capsys.readouterr().err.strip() == "event cost: error: valgrind is not installed (apt install valgrind)"


@pytest.mark.parametrize("argv", [["--batch", "8"], ["--batch", "0", "--batch", "4"], ["--requests", "0"]])
def test_bad_arguments_exit_2_with_the_reason(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        event_cost.main(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err.splitlines()[-1]


def test_a_run_that_fails_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/valgrind")

    def failing(batch, num_requests):
        raise event_cost.CannotCount("the plain run failed: ConfigError: no such GPU")

    monkeypatch.setattr(event_cost, "measure", failing)
    assert event_cost.main(["--batch", "4", "--batch", "8"]) == 2
    assert capsys.readouterr().err.strip() == "event cost: error: the plain run failed: ConfigError: no such GPU"


def test_the_plain_run_counts_turns_decodes_and_the_loops_lines():
    """The child that counts turns runs the real loop (a few requests, a cap of 2)."""
    plain = event_cost.plain_run(event_cost.overrides(2, 6))
    assert plain["requests"] == 6
    # at most 2 sequences decode in a turn, and a request's prefill is a turn of its own
    assert 0 < plain["decodes"] <= 2 * plain["turns"]
    assert plain["turns"] >= 6 and plain["steps"] >= plain["turns"]
    assert plain["lines"]["engine.py:Engine._run"] > 0
    assert any(name.startswith("paged.py:PagedAllocator.") for name in plain["lines"])  # plugins are traced too


def test_caps_that_ran_the_same_batch_are_not_fitted(monkeypatch, capsys):
    """Too few requests to fill the larger caps gives every cap the same batch: no line to fit."""
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/valgrind")
    monkeypatch.setattr(event_cost, "measure", lambda batch, num_requests: dict(ROWS[0], batch_cap=batch))
    assert event_cost.main(["--batch", "4", "--batch", "8"]) == 2
    assert (
        capsys.readouterr().err.strip().splitlines()[-1].startswith("event cost: error: every cap ran the same batch")
    )
