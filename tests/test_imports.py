"""Dependencies point one way: each package of the one installed namespace, `rlboost`, imports only the
packages below it (read with ast, so lazy imports inside functions count too, and nothing is run).

    contracts            shared by every node: job file, wire protocol and frames, weight manifest, digests,
                         TLS, sampling, worker environment, status document; imports nothing of ours
    templates            what a node runs at boot (files, read by providers)
    models               the models both nodes run, and the torch engine
    weights              weight transfer, both ends: publish, delta, track, pull, store, serve to peers
    rollout              the rollout coordinator and the scheduling core (pure policies)
    trainer              the trainer node: learner, tasks, the trainer process and its server
    worker               a spot node: the agent, preemption notices, engines
    providers            clouds, prices, spot market
    simulator            replays a job on a trace through the scheduling core
    cli                  the CLI and control plane, on the user's machine or the trainer node's controller
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NS = "rlboost"  # the one top-level package; ALLOWED names its subpackages

ALLOWED: dict[str, set[str]] = {
    "contracts": set(),
    "templates": set(),
    "models": {"contracts", "rollout"},  # the torch engine's draft length: contracts/speculation.py
    "weights": {"contracts"},
    "rollout": {"contracts"},
    "trainer": {"contracts", "models", "weights", "rollout"},
    "worker": {"contracts", "models", "weights"},
    "providers": {"contracts", "templates"},
    "simulator": {"contracts", "models", "weights", "rollout", "trainer", "worker", "providers"},
    "cli": {"contracts", "rollout", "providers", "simulator", "templates"},
}


def imported(tree: ast.AST) -> list[tuple[str, int]]:
    """(rlboost subpackage, line) of every absolute import of the namespace in a module."""
    out = (name.split(".") for name, line in imported_names(tree))
    lines = (line for _, line in imported_names(tree))
    return list(dict.fromkeys((parts[1], line) for parts, line in zip(out, lines) if len(parts) > 1 and parts[0] == NS))


def imported_names(tree: ast.AST) -> list[tuple[str, int]]:
    """(dotted name, line) of every absolute import; `from a import b` gives both `a` and `a.b`
    (b may be a module)."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out += [(a.name, n.lineno) for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            out += [(n.module, n.lineno)] + [(f"{n.module}.{a.name}", n.lineno) for a in n.names]
    return out


def module_cycles(root: Path, pkgs: list[str]) -> list[list[str]]:
    """Circles in the module import graph (Tarjan's strongly connected components). Imports inside
    functions and under TYPE_CHECKING count: a circle that works only because one side imports
    late is still two modules that cannot be read, or moved, apart."""
    mods: dict[str, Path] = {}
    for pkg in pkgs:
        for f in (root / NS / pkg).rglob("*.py"):
            name = ".".join(f.relative_to(root).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = f
    edges = {
        m: {d for d, _ in imported_names(ast.parse(f.read_text(), str(f))) if d in mods and d != m}
        for m, f in mods.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for m in sorted(mods):
        if m not in index:
            visit(m)
    return out


def forbidden(root: Path, allowed: dict[str, set[str]]) -> list[str]:
    """`file:line imports pkg` for every import of a project package its package may not import."""
    bad = []
    for pkg, ok in allowed.items():
        for f in sorted((root / NS / pkg).rglob("*.py")):
            for dst, line in imported(ast.parse(f.read_text(), str(f))):
                if dst in allowed and dst != pkg and dst not in ok:
                    bad.append(f"{f.relative_to(root)}:{line} imports {dst}")
    return bad


def test_every_package_is_layered() -> None:
    pkgs = {p.name for p in (ROOT / NS).iterdir() if (p / "__init__.py").is_file()}
    assert pkgs == set(ALLOWED), f"a package without a layer: add it to ALLOWED ({pkgs ^ set(ALLOWED)})"


def test_one_top_level_package() -> None:
    """What setuptools installs (pyproject's packages.find): rlboost and its subpackages, nothing else."""
    from setuptools import find_packages

    found = find_packages(str(ROOT), include=["rlboost", "rlboost.*"])
    assert {p.split(".")[0] for p in found} == {NS} and {p.split(".")[1] for p in found if "." in p} == set(ALLOWED)
    # tests/ and testkit/ (helpers the tests and benchmarks share) stay in the repository, never installed
    stray = [p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name not in (NS, "tests", "testkit")]
    assert stray == [], f"a package outside {NS}/: {stray}"


def test_allowed_graph_has_no_cycle() -> None:
    seen: list[str] = []  # a topological order exists iff every package's allowed imports come first
    todo = dict(ALLOWED)
    while todo:
        ready = [p for p, deps in todo.items() if deps <= set(seen)]
        assert ready, f"the allowed imports form a cycle among {sorted(todo)}"
        seen += ready
        for p in ready:
            del todo[p]


def test_no_forbidden_import() -> None:
    bad = forbidden(ROOT, ALLOWED)
    assert not bad, "imports against the layering (see this file's docstring):\n" + "\n".join(bad)


def test_no_module_circle() -> None:
    circles = module_cycles(ROOT, list(ALLOWED))
    assert not circles, "modules that import each other (split what both need into a third):\n" + "\n".join(
        " <-> ".join(c) for c in circles
    )


def test_circle_finder_sees_a_late_import(tmp_path: Path) -> None:
    pkg = tmp_path / NS / "trainer"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from rlboost.trainer.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from rlboost.trainer import a\n")
    (pkg / "c.py").write_text("import rlboost.trainer.a\n")
    assert module_cycles(tmp_path, ["trainer"]) == [["rlboost.trainer.a", "rlboost.trainer.b"]]


@pytest.mark.parametrize(
    "code",
    [
        "from rlboost.cli.main import app\n",
        "def f():\n    import rlboost.simulator.core\n",
        "import rlboost.providers.aws as a\n",
    ],
)
def test_checker_catches_an_upward_import(tmp_path: Path, code: str) -> None:
    for pkg in ALLOWED:
        (tmp_path / NS / pkg).mkdir(parents=True)
        (tmp_path / NS / pkg / "__init__.py").write_text("")
    (tmp_path / NS / "worker" / "bad.py").write_text("import json\nfrom rlboost.contracts import spec\n" + code)
    found = [x.split(" imports ")[0].split(":")[0] for x in forbidden(tmp_path, ALLOWED)]
    assert found == ["rlboost/worker/bad.py"]


def test_benchmarks_and_testkit_import_nothing_from_tests() -> None:
    """What benchmarks and tests share lives in testkit/: tests/ is pytest's, not a library."""
    bad = [
        f"{f.relative_to(ROOT)}:{line} imports {name}"
        for d in ("benchmarks", "testkit")
        for f in sorted((ROOT / d).rglob("*.py"))
        for name, line in imported_names(ast.parse(f.read_text(), str(f)))
        if name == "tests" or name.startswith("tests.")
    ]
    assert not bad, "\n".join(bad)
