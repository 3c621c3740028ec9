"""Every environment variable rlboost sets or reads, by name, in one place.

Code names a variable as `Env.JOB_TOKEN`, never as the string: a grep for the constant finds every
process that sets or reads it. Each line says who sets it and who reads it, grouped by who uses it.
The node templates (rlboost/templates/) name the same variables from shell as `$RLBOOST_...`;
tests/test_env_names.py holds the templates, README.md and every production module to this list.

A plain class of `Final` strings, not an Enum: the values are the names themselves, so an f-string or a
dict key gives "RLBOOST_JOB_TOKEN" (a str-mixin Enum formats as "Env.JOB_TOKEN" on Python >= 3.11).
"""

from __future__ import annotations

from typing import Final

PREFIX: Final = "RLBOOST_"  # rlboost's own variables; a job file's `envs:` may not use it


class Env:
    """The variables, as constants: `Env.X == "RLBOOST_X"` (tests/test_env_names.py holds that)."""

    # ---- a rollout worker's start (rlboost/contracts/worker_env.py WorkerEnv) --------------------
    # set by the controller for each spot worker and by the trainer for its reserved engine (and by
    # templates/*.sky.yaml for a trainer cluster's other nodes); read by the worker (`python -m rlboost.worker`)
    TRAINER_URL: Final = "RLBOOST_TRAINER_URL"  # where the worker dials
    # set by the controller (local and SkyPilot trainers, as a task secret) and the trainer (its reserved
    # engine); read by the trainer, the worker and a trainer node's controller (`_node-controller`)
    JOB_TOKEN: Final = "RLBOOST_JOB_TOKEN"
    ENROL: Final = "RLBOOST_ENROL"  # controller -> spot worker: its single-use credential, traded for the token
    WORKER_ID: Final = "RLBOOST_WORKER_ID"  # controller/trainer -> worker
    WORKER_KIND: Final = "RLBOOST_WORKER_KIND"  # controller/trainer -> worker: spot | reserved
    # controller/trainer -> worker (its engine), trainer node (bootstrap and SkyPilot pick the pip extra)
    ENGINE: Final = "RLBOOST_ENGINE"
    ACCELERATOR: Final = "RLBOOST_ACCELERATOR"  # controller/trainer -> worker, synthetic engine: e.g. "A100:8"
    # controller/bootstrap -> worker (told in hello) and its peer server: the region weights are traded in
    CLOUD: Final = "RLBOOST_CLOUD"
    REGION: Final = "RLBOOST_REGION"  # as CLOUD

    # ---- preemption notices and the node's address (providers set, node processes read) -----------
    NOTICE: Final = "RLBOOST_NOTICE"  # provider (from the cloud's record) -> worker's notice watcher
    NOTICE_FILE: Final = "RLBOOST_NOTICE_FILE"  # local provider -> worker: the spot market's notice file
    # override of a metadata service's base URL (tests, a proxy) -> worker notices, node_address
    METADATA_URL: Final = "RLBOOST_METADATA_URL"
    # user override on a trainer node (a proxy, a load balancer) -> node_address.public_host
    PUBLIC_HOST: Final = "RLBOOST_PUBLIC_HOST"

    # ---- TLS (rlboost/contracts/tls.py) ------------------------------------------------------------
    TLS_CERT: Final = "RLBOOST_TLS_CERT"  # controller (local) or `--tls-cert` -> trainer: a PEM file's path
    TLS_KEY: Final = "RLBOOST_TLS_KEY"  # as TLS_CERT, for its private key
    TLS_CERT_PEM: Final = "RLBOOST_TLS_CERT_PEM"  # controller -> a trainer on another machine: PEM text
    TLS_KEY_PEM: Final = "RLBOOST_TLS_KEY_PEM"  # as TLS_CERT_PEM; a secret, never in a task file in clear
    # controller/trainer -> worker, its pulls and peer server, node templates: the pin (sha256 of the DER, hex)
    TLS_FINGERPRINT: Final = "RLBOOST_TLS_FINGERPRINT"

    # ---- enrolment and the trainer process (rlboost/contracts/enrolment.py, rlboost/trainer) ------------
    ENROL_COMMITMENT: Final = "RLBOOST_ENROL_COMMITMENT"  # controller -> trainer node: sha256 of its key
    ENROL_WAIT_S: Final = "RLBOOST_ENROL_WAIT_S"  # user/tests override -> trainer: how long it awaits delivery
    # bootstrap, local provider -> trainer (its workers' credentials' audience), local provider (finds its
    # processes by it), templates/*.sky.yaml (worker ids)
    INSTANCE_ID: Final = "RLBOOST_INSTANCE_ID"
    # local provider -> trainer and worker (heartbeat, default --run-dir); local provider finds stragglers by it
    RUN_DIR: Final = "RLBOOST_RUN_DIR"
    MOUNT_ROOT: Final = "RLBOOST_MOUNT_ROOT"  # local provider -> node processes: what stands in for `~` and `/`
    CHECKPOINT_DIR: Final = "RLBOOST_CHECKPOINT_DIR"  # controller (local trainer) -> trainer
    RECORD_DIR: Final = "RLBOOST_RECORD_DIR"  # controller (local trainer) -> trainer: --record-rollouts output
    # user/tests override -> trainer and worker processes: torch's intra-op threads (default 1)
    TORCH_THREADS: Final = "RLBOOST_TORCH_THREADS"

    # ---- weight transfer, read by a worker's pull and peer server (rlboost/weights/peer_server.py) --------
    # user overrides (the reserved engine's defaults differ: local map, no serving)
    PULL_PARALLEL: Final = "RLBOOST_PULL_PARALLEL"  # connections per pull (default 4)
    WEIGHTS_LOCAL: Final = "RLBOOST_WEIGHTS_LOCAL"  # 1: map the trainer's buffer
    PEER_HOST: Final = "RLBOOST_PEER_HOST"  # the peer server's bind address (default 127.0.0.1)
    PEER_PORT: Final = "RLBOOST_PEER_PORT"  # its port (default: any)
    PEER_URL: Final = "RLBOOST_PEER_URL"  # the URL it advertises
    PEER_UPLOADS: Final = "RLBOOST_PEER_UPLOADS"  # chunks it sends at once (default 4)
    PEER_SERVE: Final = "RLBOOST_PEER_SERVE"  # 0: do not serve peers

    # ---- engines (rlboost/worker/engines), user overrides per node ----------------------------------
    ENGINE_SPEED: Final = "RLBOOST_ENGINE_SPEED"  # -> synthetic engine: relative speed (default 1)
    VLLM_ARGS: Final = "RLBOOST_VLLM_ARGS"  # -> vllm engine: extra EngineArgs, as JSON

    # ---- node boot (rlboost/providers/bootstrap.py and skypilot.py set; templates/ read) -------------
    ROLE: Final = "RLBOOST_ROLE"  # bootstrap -> node_boot.sh: trainer | worker
    JOB: Final = "RLBOOST_JOB"  # bootstrap -> node_boot.sh, node.sky.yaml: the job's name
    # bootstrap -> node_boot.sh, *.sky.yaml (the trainer's port); read by a trainer node's controller
    TRAINER_PORT: Final = "RLBOOST_TRAINER_PORT"
    SPEC_B64: Final = "RLBOOST_SPEC_B64"  # bootstrap -> node_boot.sh: the trainer's job file, base64
    # user override where you launch (read by bootstrap.pip_spec); bootstrap/SkyPilot -> templates: what a node installs
    PIP_SPEC: Final = "RLBOOST_PIP_SPEC"
    EXTRAS: Final = "RLBOOST_EXTRAS"  # controller -> bootstrap.pip_spec: the job's extra pip extras, comma-separated
    SETUP_B64: Final = "RLBOOST_SETUP_B64"  # controller -> templates: the job file's `setup:` script, base64
    JOB_ID: Final = "RLBOOST_JOB_ID"  # SkyPilot provider -> node.sky.yaml: the job's id on its node
    JOB_UID: Final = "RLBOOST_JOB_UID"  # SkyPilot provider -> the node's controller: the launching machine's uid
    CONTROL_PORT: Final = "RLBOOST_CONTROL_PORT"  # SkyPilot provider -> node.sky.yaml: the control endpoint's port
    RESUME_FLAG: Final = "RLBOOST_RESUME_FLAG"  # SkyPilot provider -> node.sky.yaml: "--resume" or ""

    # ---- the CLI and the controller, on the launching machine --------------------------------------
    HOME: Final = "RLBOOST_HOME"  # user override (default ~/.rlboost); the CLI sets a node's own for its controller
    DEBUG: Final = "RLBOOST_DEBUG"  # user: 1 shows the traceback of any error
    ENV_FROM_ARGV: Final = "RLBOOST_ENV_FROM_ARGV"  # the CLI -> itself, run again: `--env` values moved off argv
    AWS_AMI: Final = "RLBOOST_AWS_AMI"  # user override -> AWS provider: the image
    GCP_IMAGE: Final = "RLBOOST_GCP_IMAGE"  # user override -> GCP provider: the image
    SKY_SDK: Final = "RLBOOST_SKY_SDK"  # tests -> SkyPilot provider: `module:attribute` of a stand-in sky client

    # ---- tests and benchmarks only (rlboost never sets them) -------------------------------------------
    WAIT_ENGINES: Final = "RLBOOST_WAIT_ENGINES"  # -> trainer: start a step once N remote engines hold its weights
    WAIT_ENGINES_S: Final = "RLBOOST_WAIT_ENGINES_S"  # -> trainer: how long it waits for them (default 300)
    # -> controller: stop for good at this pause point (rlboost/cli/pause_points.py), for a test to kill it there
    TEST_PAUSE_AT: Final = "RLBOOST_TEST_PAUSE_AT"


def env_names() -> frozenset[str]:
    """Every name Env defines."""
    return frozenset(v for k, v in vars(Env).items() if k.isupper() and isinstance(v, str))
