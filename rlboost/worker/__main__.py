"""`python -m rlboost.worker`: a rollout worker. Configured by environment (set by the node's bootstrap):

rlboost/contracts/worker_env.py's WorkerEnv (RLBOOST_TRAINER_URL, RLBOOST_JOB_TOKEN or RLBOOST_ENROL (a spot
worker's single-use enrolment credential, traded for the token), RLBOOST_WORKER_ID,
RLBOOST_WORKER_KIND spot | reserved, RLBOOST_ENGINE, RLBOOST_ACCELERATOR, RLBOOST_CLOUD, RLBOOST_REGION),
RLBOOST_NOTICE (ec2-imds | gce-metadata | file: the source of preemption notices its cloud's record names),
RLBOOST_NOTICE_FILE (the local provider's notice file), RLBOOST_METADATA_URL (metadata server override),
RLBOOST_TLS_FINGERPRINT (sha256 of the trainer's certificate; required when the trainer URL is https).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

from rlboost.contracts.env_names import Env
from rlboost.contracts.heartbeat import start_heartbeat
from rlboost.contracts.worker_env import WorkerEnv, WorkerEnvError
from rlboost.worker.agent import WorkerAgent, WorkerConfig
from rlboost.worker.notice import watcher_from_env


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        env = WorkerEnv.from_env(os.environ)
    except WorkerEnvError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        import torch

        torch.set_num_threads(int(os.environ.get(Env.TORCH_THREADS, "1")))
    except ImportError:
        pass
    # the same fields (no token yet: a spot worker enrols for it); the rest keep the agent's defaults
    cfg = WorkerConfig(**{**env.model_dump(), "token": env.token or ""})
    fp = os.environ.get(Env.TLS_FINGERPRINT) or None
    if fp:
        from rlboost.contracts.tls import normalize_fingerprint

        try:
            cfg.tls_fingerprint = normalize_fingerprint(fp)
        except ValueError as e:
            print(f"error: {Env.TLS_FINGERPRINT}: {e}", file=sys.stderr)
            return 2
    notice = watcher_from_env()
    if os.environ.get(Env.RUN_DIR):  # a local node: when it stops is read from its last beat
        start_heartbeat(Path(os.environ[Env.RUN_DIR]))
    return asyncio.run(WorkerAgent(cfg, notice).run())


if __name__ == "__main__":
    sys.exit(main())
