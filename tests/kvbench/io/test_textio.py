"""Reading users' files: a byte-order mark read past, every failure one ConfigError line, and
what a message may show of a value (escaped, never raw control characters)."""

from __future__ import annotations

import pytest

from kvbench.errors import ConfigError, clip, invisible_characters, visible
from kvbench.io.textio import count_lines, parse_json, read_json, read_json_object, read_text


def test_a_byte_order_mark_is_read_past(tmp_path):
    path = tmp_path / "a.json"
    path.write_bytes('\ufeff{"a": 1}'.encode())
    assert read_json(path, "file") == {"a": 1}
    assert read_text(path, "file") == '{"a": 1}'


@pytest.mark.parametrize(
    "content, fragment",
    [
        (b"\xff\xfe{", "is not UTF-8 text"),
        (b'{"a": ', "not valid JSON (line 1, column 7"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_a_bad_file_is_one_line(tmp_path, content, fragment):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=None) as caught:
        read_json(path, "calibration file")
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_missing_folders_and_the_wrong_json_type_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read: No such file or directory"):
        read_text(tmp_path / "absent", "file")
    with pytest.raises(ConfigError, match="cannot be read: Is a directory"):
        read_text(tmp_path, "file")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ConfigError, match="holds a JSON list, not an object"):
        read_json_object(tmp_path / "list.json", "config")
    assert parse_json("3", "x") == 3


def test_rows_are_counted_without_parsing(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"h\n1\n\n2\n   \n3")  # blank lines are no rows; the last has no newline
    assert count_lines(path, "file") == 4
    big = tmp_path / "big.csv"
    big.write_bytes(b"x,y\n" * 300_000)  # across chunk boundaries
    assert count_lines(big, "file") == 300_000


def test_what_a_message_shows_of_text():
    assert visible("a\tb\x1b[1m\ufeffc\u200b d\n") == "a\\tb\\x1b[1m\\ufeffc\\u200b d\\n"
    assert visible("é ü 日本") == "é ü 日本"  # printable text stays as it is
    assert invisible_characters("\ufeffarrival_s\t\ufeff") == ["\\ufeff", "\\t"]
    assert clip("x" * 10, 4) == "xxxx..." and clip("abc", 4) == "abc"
