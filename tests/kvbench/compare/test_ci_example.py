"""docs/examples/kvbench-gate.yml is a workflow that parses, and every kvbench command in it is
one kvbench accepts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from kvbench_cli import kvbench

from kvbench.commands.compare import build_parser, main

ROOT = Path(__file__).resolve().parents[3]
WORKFLOW = ROOT / "docs" / "examples" / "kvbench-gate.yml"


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _commands() -> list[list[str]]:
    """Each ``kvbench ...`` line of the run steps, its $VARIABLES expanded from the workflow's env."""
    data = _workflow()
    env = data["env"]
    commands = []
    for step in data["jobs"]["gate"]["steps"]:
        for line in step.get("run", "").splitlines():
            if line.strip().startswith("kvbench "):
                expanded = re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), m.group(0)), line)
                commands.append(shlex.split(expanded)[1:])
    return commands


def test_the_workflow_parses_and_checks_out_base_and_head():
    data = _workflow()
    # PyYAML reads the bare key `on` as the boolean true (YAML 1.1); GitHub reads it as "on"
    assert "pull_request" in data.get("on", data.get(True))
    steps = data["jobs"]["gate"]["steps"]
    checkouts = [s["with"] for s in steps if s.get("uses", "").startswith("actions/checkout@")]
    refs = [c["ref"] for c in checkouts if c["path"].startswith("plugin-")]
    assert refs == ["${{ github.event.pull_request.base.sha }}", "${{ github.event.pull_request.head.sha }}"]
    [upload] = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload["if"] == "always()"  # a failed comparison is when the artifact matters
    [compare] = [c for c in _commands() if c[0] == "compare"]
    assert upload["with"]["path"].rstrip("/") == compare[compare.index("--out") + 1]


def test_both_sides_install_kvbench_from_one_checkout_of_its_repository():
    """kvbench is not on a package index: the workflow checks out one ref of its repository and
    installs that checkout on both sides, as the README installs it (never ``kvbench==<version>``)."""
    data = _workflow()
    steps = data["jobs"]["gate"]["steps"]
    [checkout] = [s for s in steps if s.get("with", {}).get("path") == "kvbench"]
    assert checkout["with"] == {
        "repository": "${{ env.KVBENCH_REPOSITORY }}",
        "ref": "${{ env.KVBENCH_REF }}",
        "path": "kvbench",
    }
    installs = [line.split() for s in steps for line in s.get("run", "").splitlines() if "pip install" in line]
    assert [words[-2:] for words in installs] == [["./kvbench", "./plugin-base"], ["./kvbench", "./plugin-head"]]
    assert "kvbench==" not in WORKFLOW.read_text()


def test_compare_reads_the_folders_the_two_sweeps_write():
    commands = _commands()
    sweeps = [c for c in commands if c[0] != "compare"]
    [compare] = [c for c in commands if c[0] == "compare"]
    folders = [a.split("=", 1)[1] for c in sweeps for a in c if a.startswith("hydra.sweep.dir=")]
    args = build_parser().parse_args(compare[1:])  # raises (a ConfigError) on any option compare lacks
    assert [str(args.base), str(args.head)] == folders == ["results/base", "results/head"]
    # the two sides run the very same sweep, only into different folders
    assert len({tuple(a for a in c if not a.startswith("hydra.sweep.dir=")) for c in sweeps}) == 1


def test_compare_help_runs(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0 and "usage: kvbench compare" in capsys.readouterr().out


def test_the_sweep_composes_with_kvbench_config(tmp_path):
    """Every override parses with Hydra's grammar; the job of each sweep's first values (the
    plugin's own allocator comes second and is not installed here) composes with kvbench's config."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweep = next(c for c in _commands() if c[0] != "compare")
    assert sweep[0] == "-m"
    overrides = OverridesParser.create().parse_overrides(sweep[1:])
    first_job = [
        f"{o.key_or_group}={next(o.sweep_string_iterator()) if o.is_sweep_override() else o.get_value_element_as_str()}"
        for o in overrides
        if not o.key_or_group.startswith("hydra.")
    ]
    assert "allocator=paged" in first_job
    proc = kvbench(*first_job, "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "name: opt-13b" in proc.stdout and "rate_per_s: 2.0" in proc.stdout  # the sweep's model and workload
