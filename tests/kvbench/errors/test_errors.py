"""The one-line error: what every command prints for bad input."""

from __future__ import annotations

from kvbench.errors import ECHO_CHARS, error_line


def test_a_pasted_100000_character_value_is_cut_and_its_length_said():
    line = error_line("kvbench validate", f"--model {'x' * 100_000!r} matches no admitted row: choose from a, b")
    assert len(line) < ECHO_CHARS + 150
    assert "... (100,000 characters)" in line and line.endswith("matches no admitted row: choose from a, b")


def test_short_values_are_echoed_whole():
    message = "hardware='h100' is not a known hardware; did you mean `h100-sxm`?"
    assert error_line("kvbench", message) == f"kvbench: error: {message}"
    word = "y" * ECHO_CHARS
    assert word in error_line("kvbench", f"value {word} is bad")


def test_an_error_is_one_visible_line():
    assert error_line("kvbench", "a\nb\x1b[2J") == "kvbench: error: a\\nb\\x1b[2J"
