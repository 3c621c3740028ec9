"""Dependencies point one way: each package imports only the packages below it (read with ast, so lazy
imports inside functions count too, and nothing is run).

    contracts            the job file, engine interface, TLS, perf table, shipped data: imports nothing of ours
    trainer              the trainer node: learner, models, coordinator, weights
    worker               a spot node: the agent and engines (runs the trainer's models)
    providers            clouds, prices, spot market
    simulator            replays a job on a trace with the nodes' own policies
    rlboost_cli          the CLI and control plane, on the user's machine or the trainer node's controller
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

ALLOWED: dict[str, set[str]] = {
    "contracts": set(),
    "templates": set(),
    "trainer": {"contracts"},
    "worker": {"contracts", "trainer"},
    "providers": {"contracts"},
    "simulator": {"contracts", "trainer", "worker", "providers"},
    "rlboost_cli": {"contracts", "trainer", "worker", "providers", "simulator", "templates"},
}


def imported(tree: ast.AST) -> list[tuple[str, int]]:
    """(top-level package, line) of every absolute import in a module."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out += [(a.name.split(".")[0], n.lineno) for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            out.append((n.module.split(".")[0], n.lineno))
    return out


def forbidden(root: Path, allowed: dict[str, set[str]]) -> list[str]:
    """`file:line imports pkg` for every import of a project package its package may not import."""
    bad = []
    for pkg, ok in allowed.items():
        for f in sorted((root / pkg).rglob("*.py")):
            for dst, line in imported(ast.parse(f.read_text(), str(f))):
                if dst in allowed and dst != pkg and dst not in ok:
                    bad.append(f"{f.relative_to(root)}:{line} imports {dst}")
    return bad


def test_every_package_is_layered() -> None:
    pkgs = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name not in ("tests", "benchmarks")}
    assert pkgs == set(ALLOWED), f"a package without a layer: add it to ALLOWED ({pkgs ^ set(ALLOWED)})"


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


@pytest.mark.parametrize(
    "code",
    ["from rlboost_cli.main import app\n", "def f():\n    import simulator.core\n", "import providers.aws as a\n"],
)
def test_checker_catches_an_upward_import(tmp_path: Path, code: str) -> None:
    for pkg in ALLOWED:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "worker" / "bad.py").write_text("import json\nfrom contracts import spec\n" + code)
    assert [x.split(" imports ")[0].split(":")[0] for x in forbidden(tmp_path, ALLOWED)] == ["worker/bad.py"]
