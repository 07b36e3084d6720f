"""kvbench's rooms and the order they stand in: every import points down (or within its room),
the core imports no plugin, the studies use only the public API. Read from the source with
``ast``, so a new upward import fails here, in the suite, with the file and the line.

The order, from the ground floor up (the engine is ``core`` to ``engine``; everything above it is
a client of what is below):

- ``errors`` (the one-line errors, the near-miss names they suggest, the extras they name);
  ``io`` (text files read strictly, a run's tables as numpy columns and as Arrow's, CSV written
  fast, every file written atomically); ``specs``; ``workload``; ``core``: values and the files
  they come from;
- ``memory``, ``kernels``, ``exec``, ``sched``, ``metrics``, ``engine``: the engine;
- ``output``: results written and read; ``slo``: the SLO questions' closed forms and search;
  ``registry`` (``kvbench.plugins``, ``kvbench.hookspecs``); ``app`` (a run's config and setup);
  ``api`` (the public API);
- ``compare``, ``calibrate``, ``kernelbench``: what the commands do;
- ``plugins`` (the built-in plugins, ``kvbench_plugins``: clients of the interfaces, loaded by entry
  point, imported by nothing in kvbench); ``studies`` (built on ``api`` alone); ``commands`` (one
  thin module per command); ``testing`` (the conformance suites plugin authors import).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ORDER = [
    "errors",
    "io",
    "specs",
    "workload",
    "core",
    "memory",
    "kernels",
    "exec",
    "sched",
    "metrics",
    "engine",
    "deploy",
    "output",
    "slo",
    "registry",
    "app",
    "api",
    "validation",
    "compare",
    "calibrate",
    "kernelbench",
    "plugins",
    "studies",
    "commands",
    "testing",
]
RANK = {room: i for i, room in enumerate(ORDER)}
#: data, not code: a config tree and the package root (its hook markers stand below everything)
NOT_ROOMS = ("conf",)


def room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "kvbench_plugins":
        return "plugins"
    if parts[0] != "kvbench" or len(parts) == 1 or parts[1] in NOT_ROOMS:
        return None
    return {"plugins": "registry", "hookspecs": "registry"}.get(parts[1], parts[1])


def modules() -> list[tuple[Path, str]]:
    found = [(p, ".".join(p.relative_to(ROOT).with_suffix("").parts)) for p in (ROOT / "kvbench").rglob("*.py")]
    found += [
        (p, "kvbench_plugins." + ".".join(p.relative_to(ROOT / "plugins").with_suffix("").parts))
        for p in (ROOT / "plugins").rglob("*.py")
    ]
    return [(p, m.removesuffix(".__init__")) for p, m in found]


def imports(path: Path) -> list[tuple[int, str]]:
    """Every absolute import of the file, TYPE_CHECKING and function-level ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, node.module)]
            if node.module == "kvbench":  # from kvbench import calibrate: a room, not the root's hook markers
                found += [
                    (node.lineno, f"kvbench.{alias.name}")
                    for alias in node.names
                    if (ROOT / "kvbench" / alias.name).is_dir() or (ROOT / "kvbench" / f"{alias.name}.py").is_file()
                ]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def test_every_room_has_a_place_in_the_order():
    rooms = {room_of(m) for _, m in modules()} - {None}
    assert rooms <= set(ORDER), f"rooms without a place in ORDER: {sorted(rooms - set(ORDER))}"


def test_every_import_points_down_or_within_its_room():
    upward = []
    for path, module in modules():
        src = room_of(module)
        for line, target in imports(path):
            dst = room_of(target)
            if src is None or dst is None or dst == src:
                continue
            if RANK[dst] >= RANK[src]:
                upward.append(f"{path.relative_to(ROOT)}:{line}: {src} imports {target} ({dst} stands at or above it)")
    assert not upward, "\n".join(upward)


def test_the_core_and_the_engine_import_no_plugin():
    engine = {"core", "memory", "kernels", "exec", "sched", "metrics", "engine"}
    found = [
        f"{path.relative_to(ROOT)}:{line}: {target}"
        for path, module in modules()
        if room_of(module) in engine
        for line, target in imports(path)
        if target.startswith("kvbench_plugins")
    ]
    assert not found, found


def test_the_studies_use_only_the_public_api():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {target}"
        for path, module in modules()
        if room_of(module) == "studies"
        for line, target in imports(path)
        if target.startswith("kvbench") and not target.startswith(("kvbench.api", "kvbench.studies"))
    ]
    assert not found, found


@pytest.mark.parametrize("room", ["core", "memory", "sched", "exec", "engine"])
def test_the_engine_rooms_hold_no_command_suite_benchmark_or_study(room):
    files = [p.name for p in (ROOT / "kvbench" / room).rglob("*.py")] if room != "engine" else ["engine.py"]
    suspects = [name for name in files if name.startswith(("cli", "conformance", "bench", "test_", "fit"))]
    assert not suspects, suspects


def _module_graph() -> dict[str, set[str]]:
    """module -> the kvbench modules it imports (function-level imports included: a lazy import
    is still a dependency a reader has to follow)."""
    known = {module for _, module in modules()}
    graph: dict[str, set[str]] = {}
    for path, module in modules():
        targets = set()
        for _, target in imports(path):
            # `from kvbench.output import provenance` names a module; `from x.y import name` its module
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_the_cycle_finder_finds_a_cycle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_two_modules_import_each_other_even_lazily():
    """A circle (``main`` <-> ``completion``, ``figures`` <-> ``report``) means neither module can
    be read, or moved, without the other: what both need goes to a module below both."""
    cycles = import_cycles(_module_graph())
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)
