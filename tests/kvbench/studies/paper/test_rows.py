"""A reproduced number's verdict is computed from the claim's printed precision, never typed."""

from __future__ import annotations

import pytest

from kvbench.studies.paper.rows import CONFIRMED, DIFFERS, GPU_ONLY, MATCHES, NOT_CONFIRMED, Row, parse_claim


def row(**fields) -> Row:
    base = dict(key="k", section="§1", quantity="q", unit="", claim="1", formula="f", formula_value=1.0)
    return Row(**{**base, **fields})


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("15.2", (15.2, 1)),
        ("2,600", (2600.0, 0)),
        ("≈ 744", (744.0, 0)),
        ("1.7-2.7", (1.7, 1)),
        ("0.39%", (0.39, 2)),
        ("16-128 best", (16.0, 0)),
        ("beam search helps", None),
    ],
)
def test_parse_claim_takes_the_first_printed_number_and_its_decimals(text, parsed):
    assert parse_claim(text) == parsed


def test_a_claim_matches_within_half_a_unit_of_its_last_printed_digit():
    assert row(claim="15.2", formula_value=15.249).verdict == MATCHES
    assert row(claim="15.2", formula_value=15.151).verdict == MATCHES
    assert row(claim="15.2", formula_value=15.26, why="units").verdict == DIFFERS
    assert row(claim="67", formula_value=67.1).verdict == MATCHES
    assert row(claim="2,600", formula_value=5201.0, why="slip").verdict == DIFFERS
    # an explicitly approximate claim may widen the tolerance
    assert row(claim="≈ 744", formula_value=745.06, claim_tol=2.0).verdict == MATCHES


def test_without_a_closed_form_a_claim_is_judged_against_the_run():
    judged = row(claim="37.56", formula_value=None, simulated=48.2, why="an assumed fork rate")
    assert judged.verdict == DIFFERS and judged.judged_value == 48.2
    with pytest.raises(ValueError, match="finite formula_value"):
        row(claim="37.56", formula_value=None)


def test_a_differing_claim_must_say_why():
    with pytest.raises(ValueError, match="say why"):
        row(claim="164", formula_value=159.0)


def test_qualitative_claims_need_a_computed_check():
    with pytest.raises(ValueError, match="set holds="):
        row(claim="swap wins at large blocks", formula_value=None)
    assert row(claim="swap wins at large blocks", formula_value=None, holds=True).verdict == CONFIRMED
    assert row(claim="x", formula_value=None, holds=False, why="it does not").verdict == NOT_CONFIRMED
    with pytest.raises(ValueError, match="say why"):
        row(claim="x", formula_value=None, holds=False)


def test_gpu_only_rows_are_never_judged():
    assert row(claim="2.7", formula_value=None, simulated=3.1, gpu_only=True).verdict == GPU_ONLY


def test_simulation_agreement_is_checked_only_where_asked():
    assert row(simulated=1.2).sim_agrees is None
    assert row(simulated=1.0, sim_tol=0.0).sim_agrees is True
    assert row(simulated=1.005, sim_tol=0.01).sim_agrees is True
    assert row(simulated=1.2, sim_tol=0.01).sim_agrees is False


@pytest.mark.parametrize(
    ("value", "decimals", "shown"),
    [
        (8.0, 0, "8"),
        (6.41, 0, "6.4"),
        (5201.3, 0, "5,201"),
        (0.0039, 1, "0.0039"),
        (0.4, 0, "0.40"),
        (15.57, 1, "15.6"),
        (None, 1, "—"),
        (float("nan"), 1, "—"),
        (0.0, 2, "0.00"),
    ],
)
def test_values_are_shown_at_the_claims_precision_but_never_rounded_to_zero(value, decimals, shown):
    from kvbench.studies.paper.render import fmt_value

    assert fmt_value(value, decimals) == shown
