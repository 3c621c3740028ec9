"""rlboost's environment variables are named in one module, rlboost/contracts/env_names.py: production code
spells none of them as a string, and the names that the node templates, README.md and the code's own
messages and comments mention are all defined there (read with ast and regular expressions; nothing is run)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from rlboost.contracts.env_names import PREFIX, Env, env_names

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rlboost"
MODULE = PACKAGE / "contracts" / "env_names.py"
# a variable's name in text; not a longer identifier's tail (typer's _RLBOOST_COMPLETE) nor the boot
# template's `# @RLBOOST_ENV@` marker, which bootstrap replaces with the export lines
MENTION = re.compile(r"(?<![A-Za-z0-9_@])RLBOOST_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_@])")


def production_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != MODULE)


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (free text, as comments are)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def spelled_names(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string constant (f-string parts included) outside docstrings that starts
    with the prefix, and of each keyword argument named with it (`dict(RLBOOST_X=...)`)."""
    tree = ast.parse(source)
    skip = docstrings(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if node.value.startswith(PREFIX):
                out.append((node.lineno, node.value))
        elif isinstance(node, ast.keyword) and node.arg and node.arg.startswith(PREFIX):
            out.append((node.lineno, node.arg))
    return out


def test_each_constant_is_its_name() -> None:
    names = {k: v for k, v in vars(Env).items() if k.isupper()}
    assert names, "Env defines no variable"
    assert {k: v for k, v in names.items() if v != PREFIX + k} == {}
    assert env_names() == frozenset(names.values())


def test_no_production_module_spells_a_variable() -> None:
    found = [
        f"{p.relative_to(ROOT)}:{line}: {text!r}"
        for p in production_modules()
        for line, text in sorted(spelled_names(p.read_text()))
    ]
    assert found == [], "name these by rlboost/contracts/env_names.py's Env (and PREFIX):\n" + "\n".join(found)


def test_the_guard_sees_literals_f_strings_and_keywords() -> None:
    source = (
        '"""RLBOOST_DOC is fine."""\n'
        "import os\n"
        "# RLBOOST_COMMENT is fine\n"
        'a = os.environ.get("RLBOOST_A")\n'
        'b = f"RLBOOST_B={a}"\n'
        "c = dict(RLBOOST_C=1)\n"
        'd = "see RLBOOST_D"\n'
        'e = k.startswith("RLBOOST_")\n'
    )
    assert spelled_names(source) == [(4, "RLBOOST_A"), (5, "RLBOOST_B="), (6, "RLBOOST_C"), (8, "RLBOOST_")]


def test_templates_readme_and_code_name_only_defined_variables() -> None:
    files = [p for p in (PACKAGE / "templates").iterdir() if p.suffix in (".sh", ".yaml")]
    files += [ROOT / "README.md", *production_modules()]
    known = env_names()
    unknown = sorted(
        {
            f"{p.relative_to(ROOT)}: {name}"
            for p in files
            for name in MENTION.findall(p.read_text())
            if name not in known
        }
    )
    assert unknown == [], "not defined in rlboost/contracts/env_names.py:\n" + "\n".join(unknown)


def test_the_mention_pattern() -> None:
    text = 'x $RLBOOST_HOME/state.db, RLBOOST_DEBUGs "${RLBOOST_TLS_FINGERPRINT:-}" _RLBOOST_COMPLETE # @RLBOOST_ENV@'
    assert MENTION.findall(text) == ["RLBOOST_HOME", "RLBOOST_DEBUG", "RLBOOST_TLS_FINGERPRINT"]
