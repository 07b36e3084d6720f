"""Tab completion as a shell runs it: Hydra's installed bash function, which calls
``kvbench -sc query=bash`` with the typed line in COMP_LINE and COMP_POINT on every TAB."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hang import HANG_S

from kvbench.commands.completion import outside_searchpaths
from kvbench.commands.main import SUBCOMMANDS
from kvbench.plugins import config_searchpaths

#: the installed console script, as the shell function finds it on PATH
SCRIPT = Path(sys.executable).parent / "kvbench"
ENV = {**os.environ, "PATH": f"{SCRIPT.parent}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONWARNINGS": "ignore"}
ENV.pop("HYDRA_COMP_DEBUG", None)


def query(line: str, point: int | None = None, shell: str = "bash", cwd: Path | None = None) -> list[str]:
    """What ``kvbench -sc query=<shell>`` answers for ``line`` with the cursor at ``point`` (its end
    by default), as the installed function runs it; nothing may reach the terminal on stderr."""
    env = {**ENV, "COMP_LINE": line, "COMP_POINT": str(len(line) if point is None else point)}
    proc = subprocess.run(
        [str(SCRIPT), "-sc", f"query={shell}"], env=env, cwd=cwd, capture_output=True, text=True, timeout=HANG_S
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return proc.stdout.splitlines() if shell == "fish" else proc.stdout.split()


@pytest.fixture(scope="module")
def bash_completion(tmp_path_factory) -> Path:
    """The script ``eval "$(kvbench -sc install=bash)"`` evaluates (README), in a file."""
    install = subprocess.run([str(SCRIPT), "-sc", "install=bash"], env=ENV, capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    script = tmp_path_factory.mktemp("completion") / "kvbench.bash"
    script.write_text(install.stdout)
    return script


def tab(script: Path, line: str) -> list[str]:
    """COMPREPLY after a TAB at the end of ``line`` in bash with the installed completion."""
    words = line.split()
    cword = len(words) if line.endswith(" ") else len(words) - 1
    program = f"""
source {script}
COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}; COMP_CWORD={cword}
COMP_WORDS=($COMP_LINE)
hydra_bash_completion
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    proc = subprocess.run(["bash", "-c", program], env=ENV, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return [reply for reply in proc.stdout.splitlines() if reply]


def test_a_tab_in_bash_completes_subcommand_names(bash_completion):
    # `kvbench sl<TAB>`: the subcommands, and the slo. key a run takes (kvbench slo.tpot_s=0.05)
    assert sorted(tab(bash_completion, "kvbench sl")) == ["slo-batch", "slo-search", "slo."]
    assert tab(bash_completion, "kvbench diff") == ["diff-engine"]
    assert tab(bash_completion, "kvbench allocator=pag") == ["allocator=paged", "allocator=paged_cached"]


def test_the_first_word_lists_every_subcommand_beside_hydra_s_groups_and_keys():
    found = set(query("kvbench "))
    assert set(SUBCOMMANDS) <= found
    assert {"allocator=", "workload=", "allocator.", "slo.", "seed="} <= found
    assert query("kvbench s") == ["scheduler.", "scheduler=", "seed=", "slo-batch", "slo-search", "slo."]


def test_groups_options_and_keys_complete_as_hydra_completes_them():
    assert query("kvbench allocator=") == [
        f"allocator={name}"
        for name in (
            "naive",
            "orca_max",
            "orca_oracle",
            "orca_pow2",
            "paged",
            "paged_cached",
            "per_request",
            "vattention",
        )
    ]
    assert query("kvbench allocator.bl") == ["allocator.block_size_tokens="]
    # the overrides typed before apply: naive has no block size
    assert query("kvbench allocator=naive allocator.") == ["allocator.name=", "allocator.s_max_tokens="]
    assert "kernel=flashinfer" in query("kvbench -m allocator=naive,paged kernel=")
    assert "kernel=flashinfer" in query("kvbench allocator=naive,paged -m kernel=")  # -m anywhere, as kvbench takes it
    assert query("kvbench hydra/la") == ["hydra/launcher="]
    assert query("kvbench --mu") == ["--multirun"]


def test_after_a_subcommand_its_own_arguments_complete():
    # slo-batch's overrides are a run's; its own --flag and value are skipped, not a parse error
    assert query("kvbench slo-batch --context-tokens 640 allocator=naive allocator.") == [
        "allocator.name=",
        "allocator.s_max_tokens=",
    ]
    assert "slo.tpot_s=" in query("kvbench slo-search --over rate slo.tp")
    # bench-kernels overrides its own config
    assert query("kvbench bench-kernels ker") == ["kernel=", "kernel_options.", "kernels."]
    # compare takes folders: no candidates, so the shell completes file names
    assert query("kvbench compare ") == []


def test_a_tab_mid_line_completes_the_word_under_the_cursor():
    line = "kvbench sl allocator=paged"
    assert query(line, point=len("kvbench sl")) == ["slo-batch", "slo-search", "slo."]


def test_a_line_that_is_not_valid_yet_answers_quietly():
    # before, Hydra printed "an override is not valid" into the middle of the line being typed
    assert "allocator=" in query("kvbench foo ")
    assert query("kvbench compar") == ["compare"]


def test_fish_gets_one_candidate_a_line():
    assert query("kvbench slo-", shell="fish") == ["slo-batch", "slo-search"]


def test_kvbench_s_own_plugins_add_no_config_folder():
    # completion reads only outside plugins' config folders, to spare a TAB importing every
    # built-in plugin (numpy, the schedulers): a built-in that adds a folder must change that
    assert outside_searchpaths() == config_searchpaths()
