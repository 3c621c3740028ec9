"""The provider registry: one record per provider (rlboost/contracts/provider_kinds.py), one class per record
(providers/), and no code outside providers/ that branches on a provider's name (it asks the record)."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from rlboost.contracts.provider_kinds import PROVIDER_KINDS, ProviderKind, UnknownProviderError, provider_kind
from rlboost.contracts.spec import PROVIDERS, JobSpec, parse_spec
from rlboost.providers import PROVIDER_CLASSES, PROVIDER_CLOUDS, PreflightError, make_provider, provider_class
from rlboost.providers.base import Owner

ROOT = Path(__file__).resolve().parent.parent
# not project code: the providers themselves (they may know their own names), tests, build output
LOCAL_JOB = {"name": "reg", "rollout": {"max_workers": 0}}
SKIP_DIRS = {"providers", "tests", ".venv", "venv", "build", "dist", ".git", "node_modules"}


def test_every_provider_has_one_record_and_one_class() -> None:
    assert tuple(PROVIDER_KINDS) == PROVIDERS
    assert set(PROVIDER_CLASSES) == set(PROVIDER_KINDS)
    assert typing.get_args(JobSpec.model_fields["provider"].annotation) == PROVIDERS
    for name, kind in PROVIDER_KINDS.items():
        assert isinstance(kind, ProviderKind) and kind.name == name
        assert PROVIDER_CLOUDS[name] == kind.clouds


@pytest.mark.parametrize("name", sorted(PROVIDER_KINDS))
def test_each_provider_class_declares_its_registry_kind(name: str) -> None:
    cls = provider_class(name)
    module, _, attr = PROVIDER_CLASSES[name].partition(":")
    assert (cls.__module__, cls.__name__) == (module, attr)  # type: ignore[attr-defined]
    assert cls.kind is PROVIDER_KINDS[name]
    assert cls.name == name  # type: ignore[attr-defined]  # what the state store records for it
    for template in cls.kind.boot_templates:
        assert (ROOT / "rlboost" / "templates" / template).is_file(), f"{name}: no rlboost/templates/{template}"


def test_factory_builds_the_class_the_registry_names(tmp_path: Path) -> None:
    spec = parse_spec(LOCAL_JOB)
    assert spec.provider == "local"
    p = make_provider(spec, tmp_path, owner=Owner(spec.name, 1, "uid"))
    try:
        assert type(p) is provider_class("local")
        assert p.kind is PROVIDER_KINDS["local"]
    finally:
        p.close()


def test_an_unknown_provider_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UnknownProviderError, match=r"unknown provider 'nope' \(known: local, skypilot, aws, gcp\)"):
        provider_kind("nope")
    with pytest.raises(UnknownProviderError, match="unknown provider 'nope'"):
        provider_class("nope")
    spec = parse_spec(LOCAL_JOB).model_copy(update={"provider": "nope"})
    with pytest.raises(PreflightError, match="provider: unknown provider 'nope'"):
        make_provider(spec, tmp_path, owner=Owner(spec.name, 1, "uid"))


def test_the_job_file_rules_follow_the_records() -> None:
    """`controller:` defaults to `trainer` exactly where the record says a trainer node can host it."""
    trainer = {"cloud": "aws", "region": "us-east-1", "accelerators": "A100:8"}
    for name, kind in PROVIDER_KINDS.items():
        if kind.runs_here:
            continue
        spec = parse_spec({"name": "reg", "provider": name, "trainer": trainer, "rollout": {"max_workers": 0}})
        assert (spec.controller == "trainer") == ("aws" in kind.trainer_node_clouds), name


# ---- the guard: no branch on a provider's name outside providers/ -----------------------------------
def _is_provider(node: ast.expr) -> bool:
    """`x.provider`, a variable `provider` (or `provider_name`), or the name of either (`x.provider.name`)."""
    if isinstance(node, ast.Attribute) and node.attr == "name":
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr in ("provider", "provider_name")
    return isinstance(node, ast.Name) and node.id in ("provider", "provider_name")


def _is_literal(node: ast.expr) -> bool:
    """A string literal, or a tuple/list/set of them."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_is_literal(e) for e in node.elts)
    return False


def name_branches(source: str, filename: str = "<source>") -> list[str]:
    """`file:line` of every comparison of a provider (or its name) with a string literal, and of every
    `match` on a provider with string cases."""
    out = []
    for n in ast.walk(ast.parse(source, filename)):
        if isinstance(n, ast.Compare):
            sides = [n.left, *n.comparators]
            for left, op, right in zip(sides, n.ops, sides[1:]):
                if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)):
                    continue
                if (_is_provider(left) and _is_literal(right)) or (_is_provider(right) and _is_literal(left)):
                    out.append(f"{filename}:{n.lineno}")
        elif isinstance(n, ast.Match) and _is_provider(n.subject):
            for case in n.cases:
                if any(isinstance(p, ast.MatchValue) and _is_literal(p.value) for p in ast.walk(case.pattern)):
                    out.append(f"{filename}:{case.pattern.lineno}")
    return out


def project_files(root: Path) -> list[Path]:
    return sorted(f for f in root.rglob("*.py") if not SKIP_DIRS.intersection(f.relative_to(root).parts[:-1]))


def test_nothing_outside_providers_branches_on_a_provider_name() -> None:
    files = project_files(ROOT)
    assert any(f.relative_to(ROOT).parts[:2] == ("rlboost", "cli") for f in files)
    bad = [hit for f in files for hit in name_branches(f.read_text(), str(f.relative_to(ROOT)))]
    assert not bad, (
        "branches on a provider's name (ask contracts.provider_kinds.provider_kind(name) instead):\n" + "\n".join(bad)
    )


@pytest.mark.parametrize(
    "code",
    [
        'if spec.provider == "local":\n    pass\n',
        'x = 60 if job.provider != "local" else 900\n',
        'ok = self.provider in ("aws", "gcp")\n',
        'ok = "skypilot" == row.provider\n',
        'ok = self.provider.name == "local"\n',
        'def f(provider):\n    return provider not in ["aws"]\n',
        'match spec.provider:\n    case "local":\n        pass\n    case _:\n        pass\n',
    ],
)
def test_the_guard_catches_a_name_branch(tmp_path: Path, code: str) -> None:
    mod = tmp_path / "rlboost" / "cli" / "bad.py"
    mod.parent.mkdir(parents=True)
    mod.write_text(code)
    assert project_files(tmp_path) == [mod]
    assert name_branches(mod.read_text(), "rlboost/cli/bad.py"), code


@pytest.mark.parametrize(
    "code",
    [
        "ok = provider_kind(spec.provider).runs_here\n",
        'ok = spec.trainer.cloud == "local"\n',
        'ok = kind.billing_clock == "trace"\n',
        'print(f"provider {spec.provider}")\n',
    ],
)
def test_the_guard_lets_a_registry_question_through(code: str) -> None:
    assert not name_branches(code)


def test_the_guard_skips_providers_and_tests(tmp_path: Path) -> None:
    for d in ("providers", "tests"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "p.py").write_text('ok = spec.provider == "local"\n')
    assert project_files(tmp_path) == []
