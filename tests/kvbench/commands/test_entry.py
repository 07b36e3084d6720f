"""The ``kvbench`` console script: an interrupt that arrives while the command is still importing
is one line and 128 + the signal's number, like one that arrives later."""

from __future__ import annotations

import os

import pytest
from kvbench_cli import kvbench

# raises the signal the moment the command imports Hydra (a second or more into a real start),
# deterministically: a finder on sys.meta_path sees the import before it happens
DURING_IMPORT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal (a background shell ignores it)
signame = sys.argv.pop(1)
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "hydra":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), getattr(signal, signame))
        return None
sys.meta_path.insert(0, Interrupt())
from kvbench.commands.entry import main
main()
"""


@pytest.mark.parametrize("signame, status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_an_interrupt_during_the_imports_is_one_line(tmp_path, signame, status):
    proc = kvbench(signame, "workload.num_requests=5", cwd=tmp_path, code=DURING_IMPORT)
    assert proc.returncode == status, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [f"kvbench: interrupted by {signame}; nothing was written"], proc.stderr
    assert not (tmp_path / "results").exists()


def test_the_command_gives_arrow_the_c_library_allocator(monkeypatch, capsys):
    # (pyarrow's mimalloc pool keeps freed memory: a long run's peak was higher with it)
    from kvbench.commands import entry

    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "unset by the test")  # (restored after it)
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL")
    monkeypatch.setattr("sys.argv", ["kvbench", "--version"])
    entry.main()
    assert os.environ["ARROW_DEFAULT_MEMORY_POOL"] == "system"
    assert capsys.readouterr().out.startswith("kvbench")


def test_a_users_own_arrow_allocator_is_kept(monkeypatch):
    from kvbench.commands import entry

    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    monkeypatch.setattr("sys.argv", ["kvbench", "--version"])
    entry.main()
    assert os.environ["ARROW_DEFAULT_MEMORY_POOL"] == "jemalloc"
