"""Where the launching machine's cloud credentials are, checked from files and environment only (no
network, no metadata server), for preflight and `rlboost check`.

One check per credential source a cloud's record names (rlboost/contracts/cloud_kinds.py
CredentialSource); a cloud whose record names none is left out (SkyPilot checks its own).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from rlboost.contracts.cloud_kinds import CLOUD_KINDS


def _aws_config(env: dict[str, str]) -> str | None:
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return "environment (AWS_ACCESS_KEY_ID)"
    for var in ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_PROFILE"):
        if env.get(var):
            return f"environment ({var})"
    home = Path(env.get("HOME") or Path.home())
    for var, default in (("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"), ("AWS_CONFIG_FILE", ".aws/config")):
        path = Path(env[var]) if env.get(var) else home / default
        if path.is_file() and any(
            k in path.read_text(errors="replace")
            for k in ("aws_access_key_id", "sso_", "credential_process", "role_arn")
        ):
            return str(path)
    return None


def _gcloud_dir(env: dict[str, str]) -> Path:
    home = Path(env.get("HOME") or Path.home())
    return Path(env["CLOUDSDK_CONFIG"]) if env.get("CLOUDSDK_CONFIG") else home / ".config" / "gcloud"


def _gcloud(env: dict[str, str]) -> str | None:
    if env.get("GOOGLE_APPLICATION_CREDENTIALS"):
        p = Path(env["GOOGLE_APPLICATION_CREDENTIALS"])
        return str(p) if p.is_file() else None
    gcloud = _gcloud_dir(env)
    for name in ("application_default_credentials.json", "credentials.db"):
        if (gcloud / name).is_file():
            return str(gcloud / name)
    return None


CredentialCheck = Callable[[dict[str, str]], str | None]
# credential source (a cloud record's `credentials`) -> where it finds them, or None
CHECKS: dict[str, CredentialCheck] = {"aws-config": _aws_config, "gcloud": _gcloud}


def credentials(clouds: list[str], env: dict[str, str] | None = None) -> dict[str, str | None]:
    """cloud -> where its credentials were found, or None. Clouds we cannot check (or do not know:
    preflight names those) are left out."""
    env = dict(os.environ if env is None else env)
    sources = {c: kind.credentials for c in clouds if (kind := CLOUD_KINDS.get(c)) is not None}
    return {c: CHECKS[source](env) for c, source in sources.items() if source is not None}


def gcp_project(env: dict[str, str] | None = None) -> str | None:
    """GOOGLE_CLOUD_PROJECT / CLOUDSDK_CORE_PROJECT, else gcloud's active configuration."""
    env = dict(os.environ if env is None else env)
    for var in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "GCLOUD_PROJECT"):
        if env.get(var):
            return env[var]
    gcloud = _gcloud_dir(env)
    active = gcloud / "active_config"
    name = active.read_text().strip() if active.is_file() else "default"
    cfg = gcloud / "configurations" / f"config_{name}"
    if cfg.is_file():
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "project" and value.strip():
                return value.strip()
    return None
