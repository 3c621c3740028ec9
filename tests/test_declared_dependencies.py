"""Every third-party module rlboost imports is declared in pyproject.toml (issue 40).

Read with ast (tests/test_imports.py's walker: lazy imports inside functions count too, nothing is
run): each import's distribution (importlib.metadata.packages_distributions, resolved to the one that
holds the module where a namespace such as `google` is shared) must be in `dependencies` or in an extra
(`dev` does not count: it is what the tests need, not what rlboost ships). An import that runs when its
module is imported (the module's top level, outside TYPE_CHECKING and outside `try: ... except
ImportError`) must be a plain dependency, so that `pip install rlboost` imports what it ships; a module
that needs an extra at its top level is named in EXTRA_ONLY with why, and nothing else may.
"""

from __future__ import annotations

import ast
import re
import sys
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest

from tests.test_imports import NS, ROOT, imported_names

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli", reason="Python 3.10 without tomli: pyproject.toml cannot be read")

# Modules that import an extra's module at their top level: honest because nothing a plain install
# runs imports them (the CLI, contracts and providers import them lazily, where a job needs them), and
# `launch` refuses a job whose extras are missing (rlboost/cli/node_extras.py, providers.preflight).
EXTRA_ONLY: dict[str, str] = {
    "torch": "local",  # models/, trainer/, the torch engine: the trainer's and a worker's runtime
}
# distributions of modules that may not be installed where the tests run (packages_distributions cannot
# see them): vllm's CPU build is an opt-in tier (.ci/run)
NOT_INSTALLED: dict[str, str] = {"vllm": "vllm"}
NOT_SHIPPED = {"dev"}  # extras that are not part of what rlboost ships


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(req: str) -> str:
    m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req.strip())
    assert m, f"unreadable requirement {req!r}"
    return norm(m.group(0))


def declared(pyproject: Path) -> tuple[set[str], dict[str, set[str]]]:
    """(the plain dependencies, each shipped extra's), as normalized distribution names."""
    project = tomllib.loads(pyproject.read_text())["project"]
    core = {requirement_name(r) for r in project.get("dependencies", [])}
    extras = {
        name: {requirement_name(r) for r in reqs}
        for name, reqs in project.get("optional-dependencies", {}).items()
        if name not in NOT_SHIPPED
    }
    return core, extras


@cache
def _files(dist: str) -> tuple[str, ...]:
    try:
        return tuple(str(f) for f in metadata.distribution(dist).files or ())
    except metadata.PackageNotFoundError:
        return ()


def distribution(dotted: str, packages: dict[str, list[str]]) -> str | None:
    """The distribution that installs module `dotted`; None if unknown here."""
    top = dotted.split(".")[0]
    dists = sorted(set(packages.get(top, []))) or ([NOT_INSTALLED[top]] if top in NOT_INSTALLED else [])
    if len(dists) <= 1:
        return norm(dists[0]) if dists else None
    parts = dotted.split(".")  # a shared namespace (google): the distribution whose files hold the module
    while parts:
        rel = "/".join(parts)
        owners = [d for d in dists if any(f == f"{rel}.py" or f.startswith(f"{rel}/") for f in _files(d))]
        if len(owners) == 1:
            return norm(owners[0])
        parts.pop()
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _catches_import_error(t: ast.Try) -> bool:
    names = {"ImportError", "ModuleNotFoundError", "Exception"}
    for h in t.handlers:
        types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
        if h.type is None or any(isinstance(x, ast.Name) and x.id in names for x in types):
            return True
    return False


def deferred(tree: ast.AST) -> set[tuple[str, int]]:
    """Imports that do not run when the module is imported: inside a function, under TYPE_CHECKING,
    or guarded by `try: ... except ImportError`."""
    out: set[tuple[str, int]] = set()
    for n in ast.walk(tree):
        body: list[ast.stmt] = []
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = [n]
        elif (isinstance(n, ast.If) and _is_type_checking(n.test)) or (
            isinstance(n, ast.Try) and _catches_import_error(n)
        ):
            body = n.body
        out |= set(imported_names(ast.Module(body=body, type_ignores=[])))
    return out


def third_party_imports(root: Path) -> list[tuple[str, int, str, bool]]:
    """(file, line, module, at the module's top level) of every import of a module outside the standard
    library and rlboost; one row per statement, naming its longest dotted name (`from a import b`: a.b)."""
    rows = []
    for f in sorted((root / NS).rglob("*.py")):
        tree = ast.parse(f.read_text(), str(f))
        late = deferred(tree)
        by_line: dict[int, list[tuple[str, bool]]] = {}
        for name, line in imported_names(tree):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top in (NS, "__future__"):
                continue
            by_line.setdefault(line, []).append((name, (name, line) not in late))
        for line, names in by_line.items():
            name = max((n for n, _ in names), key=len)
            rows.append((str(f.relative_to(root)), line, name, any(top for _, top in names)))
    return rows


def undeclared(
    root: Path, extra_only: dict[str, str], packages: dict[str, list[str]] | None = None
) -> tuple[list[str], list[str]]:
    """(imports of a distribution pyproject.toml does not declare, top-level imports of an extra's
    module that `extra_only` does not name), one `file:line module (why)` each."""
    packages = packages if packages is not None else metadata.packages_distributions()
    core, extras = declared(root / "pyproject.toml")
    in_extra = set().union(*extras.values())
    missing, top_level = [], []
    for f, line, name, at_top in third_party_imports(root):
        dist = distribution(name, packages)
        where = f"{f}:{line} {name}"
        if dist is None:
            missing.append(f"{where} (no installed distribution; name it in NOT_INSTALLED if it is an extra's)")
        elif dist not in core and dist not in in_extra:
            missing.append(f"{where} ({dist} is in neither dependencies nor a shipped extra)")
        elif at_top and dist not in core:
            allowed = extra_only.get(name.split(".")[0])
            if allowed is None or dist not in extras.get(allowed, set()):
                top_level.append(f"{where} ({dist} comes with an extra only; import it where it is used)")
    return missing, top_level


def test_every_imported_distribution_is_declared() -> None:
    missing, _ = undeclared(ROOT, EXTRA_ONLY)
    assert not missing, "imports pyproject.toml does not declare:\n" + "\n".join(missing)


def test_a_plain_install_imports_every_module_not_named_as_needing_an_extra() -> None:
    _, top_level = undeclared(ROOT, EXTRA_ONLY)
    assert not top_level, "top-level imports of an extra's module (EXTRA_ONLY names the allowed):\n" + "\n".join(
        top_level
    )


def test_extra_only_is_honest() -> None:
    """Each entry is used, and its module's distribution is in that extra and not a plain dependency."""
    packages = metadata.packages_distributions()
    core, extras = declared(ROOT / "pyproject.toml")
    used = {name.split(".")[0] for _, _, name, at_top in third_party_imports(ROOT) if at_top}
    for module, extra in EXTRA_ONLY.items():
        dist = distribution(module, packages)
        assert module in used, f"EXTRA_ONLY names {module}, which no module imports at its top level"
        assert dist in extras.get(extra, set()) and dist not in core, f"{module}: {dist} is not extra {extra}'s only"
    for dist in NOT_INSTALLED.values():
        assert any(norm(dist) in reqs for reqs in extras.values()), f"NOT_INSTALLED: {dist} is in no extra"


def test_the_extras_launch_checks_are_the_extras_that_install_them() -> None:
    """`launch` names `pip install 'rlboost[X]'` for a missing module: X must install it."""
    from rlboost.cli.node_extras import EXTRA_MODULES
    from rlboost.contracts.provider_kinds import provider_kind, provider_names

    packages = metadata.packages_distributions()
    _, extras = declared(ROOT / "pyproject.toml")
    pairs = [(x, m) for x, modules in EXTRA_MODULES.items() for m in modules]
    pairs += [(provider_kind(p).extra, m) for p in provider_names() for m in provider_kind(p).libraries]
    for extra, module in pairs:
        assert distribution(module, packages) in extras.get(extra, set()), f"rlboost[{extra}] does not install {module}"


def test_cryptography_is_a_plain_dependency() -> None:
    """contracts/tls.py makes the trainer's certificate for every job that leaves the machine."""
    core, _ = declared(ROOT / "pyproject.toml")
    assert "cryptography" in core


def test_the_check_flags_what_it_should(tmp_path: Path) -> None:
    """A planted package: an undeclared import, a top-level import of an extra's module, and the
    same import inside a function (fine) or under `except ImportError` (fine)."""
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["PyYAML>=6"]\n'
        '[project.optional-dependencies]\nhf = ["transformers"]\ndev = ["pytest"]\n'
    )
    pkg = tmp_path / NS
    pkg.mkdir()
    (pkg / "ok.py").write_text(
        "import yaml\n\ndef f():\n    import transformers\n\ntry:\n    import transformers.utils\n"
        "except ImportError:\n    pass\n"
    )
    (pkg / "bad.py").write_text("import transformers\n\n\ndef g():\n    import pytest\n")
    packages = {"yaml": ["PyYAML"], "transformers": ["transformers"], "pytest": ["pytest"]}
    missing, top_level = undeclared(tmp_path, {}, packages)
    assert missing == [f"{NS}/bad.py:5 pytest (pytest is in neither dependencies nor a shipped extra)"]
    assert top_level == [
        f"{NS}/bad.py:1 transformers (transformers comes with an extra only; import it where it is used)"
    ]
    assert undeclared(tmp_path, {"transformers": "hf"}, packages)[1] == []  # named as needing its extra
    assert undeclared(tmp_path, {"transformers": "vllm"}, packages)[1] != []  # named with the wrong extra
