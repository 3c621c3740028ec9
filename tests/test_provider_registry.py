"""The provider and cloud registries: one record per provider (rlboost/contracts/provider_kinds.py) naming
one class (providers/), one record per cloud (rlboost/contracts/cloud_kinds.py) whose mechanisms each have
an implementation, a provider registered from outside the package, and no code outside providers/ that
branches on a provider's or a cloud's name (it asks the record)."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from rlboost.contracts.cloud_kinds import (
    CLOUD_KINDS,
    METADATA_URLS,
    AddressSource,
    CredentialSource,
    NoticeSource,
    cloud_kind,
    cloud_names,
)
from rlboost.contracts.provider_kinds import (
    PROVIDER_KINDS,
    ProviderKind,
    UnknownProviderError,
    provider_kind,
    provider_names,
)
from rlboost.contracts.spec import SpecError, parse_spec
from rlboost.providers import PreflightError, make_provider, provider_class
from rlboost.providers.base import Owner
from rlboost.providers.credentials import CHECKS
from rlboost.providers.node_address import READERS
from rlboost.worker.notice import WATCHERS

ROOT = Path(__file__).resolve().parent.parent
# not project code: the providers themselves (they may know their own names), tests, build output
LOCAL_JOB = {"name": "reg", "rollout": {"max_workers": 0}}
SKIP_DIRS = {"providers", "tests", ".venv", "venv", "build", "dist", ".git", "node_modules"}


def test_every_provider_has_one_record_and_the_job_file_takes_exactly_those() -> None:
    assert provider_names() == ("local", "skypilot", "aws", "gcp")
    for name, kind in PROVIDER_KINDS.items():
        assert isinstance(kind, ProviderKind) and kind.name == name
        assert all(c in CLOUD_KINDS for c in kind.clouds), name
        assert parse_spec({**LOCAL_JOB, "provider": name}).provider == name
    expected = "input should be 'local', 'skypilot', 'aws' or 'gcp'"
    for bad in ("nope", 3, None, "LOCAL"):
        with pytest.raises(SpecError, match=f"provider: invalid value .*; {expected}$"):
            parse_spec({**LOCAL_JOB, "provider": bad})


@pytest.mark.parametrize("name", sorted(PROVIDER_KINDS))
def test_each_provider_class_declares_its_registry_kind(name: str) -> None:
    cls = provider_class(name)
    module, _, attr = provider_kind(name).provider_class.partition(":")
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


def test_every_mechanism_a_cloud_names_has_its_implementation() -> None:
    """A cloud's record names where its notices, its node's address and its credentials come from;
    each such source is implemented once, where it is used (worker, node, launching machine)."""
    assert set(WATCHERS) == set(typing.get_args(NoticeSource))
    assert set(READERS) == set(typing.get_args(AddressSource))
    assert set(CHECKS) == set(typing.get_args(CredentialSource))
    assert set(READERS) <= set(METADATA_URLS)
    for name in cloud_names():
        kind = cloud_kind(name)
        assert kind.notice in (None, *WATCHERS) and kind.address in (None, *READERS), name
        assert kind.credentials in (None, *CHECKS) and bool(kind.credentials) == bool(kind.credential_hint), name
    assert provider_kind("skypilot").trainer_node_clouds == ("aws", "gcp")  # those with an address source
    assert provider_kind("aws").trainer_node_clouds == provider_kind("local").trainer_node_clouds == ()


def test_the_job_file_rules_follow_the_records() -> None:
    """`controller:` defaults to `trainer` exactly where the record says a trainer node can host it."""
    trainer = {"cloud": "aws", "region": "us-east-1", "accelerators": "A100:8"}
    for name, kind in PROVIDER_KINDS.items():
        if kind.runs_here:
            continue
        spec = parse_spec({"name": "reg", "provider": name, "trainer": trainer, "rollout": {"max_workers": 0}})
        assert (spec.controller == "trainer") == ("aws" in kind.trainer_node_clouds), name


# ---- the guard: no branch on a provider's or a cloud's name outside providers/ -----------------------
NAMED = ("provider", "provider_name", "cloud", "clouds", "cloud_name")
# files that still compare a name, each with who removes the comparisons; an entry whose file is clean
# fails the test, so that it is removed with them
KNOWN: dict[str, str] = {}


def _is_provider(node: ast.expr) -> bool:
    """`x.provider` or `x.cloud` (or `.clouds`), a variable of such a name (or `provider_name`,
    `cloud_name`), or the name of either (`x.provider.name`)."""
    if isinstance(node, ast.Attribute) and node.attr == "name":
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr in NAMED
    return isinstance(node, ast.Name) and node.id in NAMED


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


def test_nothing_outside_providers_branches_on_a_provider_or_cloud_name() -> None:
    files = project_files(ROOT)
    assert any(f.relative_to(ROOT).parts[:2] == ("rlboost", "cli") for f in files)
    hits = {str(f.relative_to(ROOT)): name_branches(f.read_text(), str(f.relative_to(ROOT))) for f in files}
    bad = [hit for f, found in hits.items() if f not in KNOWN for hit in found]
    assert not bad, (
        "branches on a provider's or a cloud's name (ask contracts.provider_kinds.provider_kind(name) or "
        "contracts.cloud_kinds.cloud_kind(name) instead):\n" + "\n".join(bad)
    )
    clean = [f for f in KNOWN if not hits.get(f)]
    assert not clean, f"no longer compares a name: remove it from KNOWN: {clean}"


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
        'ok = spec.trainer.cloud == "local"\n',
        'ok = req.cloud in ("aws", "gcp")\n',
        'def f(cloud):\n    return "gcp" != cloud\n',
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
        "ok = cloud_kind(spec.trainer.cloud).shares_machine\n",
        'ok = kind.notice == "file"\n',
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
