"""The SLO studies' output folder: every file whole or absent, and the set whole or absent."""

from __future__ import annotations

import errno

import matplotlib.pyplot as plt
import pandas as pd
import pytest

import kvbench.io.atomic as atomic
import kvbench.slo.common as common

CURVE = pd.DataFrame({"rate": [1.0, 2.0], "attainment": [1.0, 0.5]})


def write(out_dir):
    fig = plt.figure()
    try:
        common.write_folder(out_dir, {"curve": CURVE}, {"curve.png": fig}, {"search.json": {"answer": 1.0}})
    finally:
        plt.close(fig)


@pytest.mark.parametrize("fail_at", ["curve.csv", "curve.png", "search.json", "COMPLETE"])
def test_a_full_disk_part_way_leaves_none_of_the_files(tmp_path, monkeypatch, fail_at):
    real = common.write_file

    def write_file(path, writer):
        if path.name == fail_at:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, writer)

    monkeypatch.setattr(common, "write_file", write_file)  # the figure
    monkeypatch.setattr(atomic, "write_file", write_file)  # the tables, the JSON and the marker
    out = tmp_path / "search"
    with pytest.raises(OSError):
        write(out)
    assert not out.exists()  # made for this result and left empty: removed too


def test_a_user_s_folder_stays_with_its_own_files(tmp_path, monkeypatch):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(common, "write_json", full)
    with pytest.raises(OSError):
        write(out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_whole_write_is_complete(tmp_path):
    write(tmp_path / "ok")
    assert sorted(p.name for p in (tmp_path / "ok").iterdir()) == sorted(
        ["curve.parquet", "curve.csv", "curve.png", "search.json", "COMPLETE"]
    )
