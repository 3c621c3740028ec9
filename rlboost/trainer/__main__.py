"""`python -m rlboost.trainer --run-dir DIR`: the trainer process. The job token comes from RLBOOST_JOB_TOKEN, or,
for a trainer booted with only an enrolment commitment (RLBOOST_ENROL_COMMITMENT), from the controller
once the trainer proved itself (rlboost/trainer/enrolment.py)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from rlboost.contracts.enrolment import TRAINER_WAIT_S
from rlboost.contracts.env_names import Env
from rlboost.contracts.spec import SpecError, load_spec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlboost.trainer")
    ap.add_argument("--spec", type=Path, required=True, help="the job file (validated again here)")
    ap.add_argument(
        "--run-dir",
        type=Path,
        default=Path(os.environ.get(Env.RUN_DIR, ".")),
        help=f"endpoint, logs and recorded rollouts go here (default: ${Env.RUN_DIR})",
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--record-rollouts", action="store_true", help="write rollouts.jsonl + final weights")
    ap.add_argument("--linger", type=float, default=60.0, help="seconds to keep serving status when done")
    ap.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=Path(os.environ[Env.CHECKPOINT_DIR]) if os.environ.get(Env.CHECKPOINT_DIR) else None,
        help=f"resume from / write checkpoints here (default: ${Env.CHECKPOINT_DIR}, the job file's "
        "trainer.checkpoint_dir, else RUN_DIR/checkpoints)",
    )
    ap.add_argument("--tls-cert", type=Path, help=f"PEM certificate to serve HTTPS with (default: ${Env.TLS_CERT})")
    ap.add_argument("--tls-key", type=Path, help=f"its private key (default: ${Env.TLS_KEY})")
    args = ap.parse_args(argv)
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            print("error: --tls-cert and --tls-key go together", file=sys.stderr)
            return 2
        # read by TrainerRuntime.serve (rlboost/contracts/tls.py server_files); TLS is then on unless trainer.tls: off
        os.environ[Env.TLS_CERT], os.environ[Env.TLS_KEY] = str(args.tls_cert), str(args.tls_key)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    token = os.environ.get(Env.JOB_TOKEN)
    commitment = os.environ.get(Env.ENROL_COMMITMENT)
    if not (token or commitment):
        print(
            f"error: neither {Env.JOB_TOKEN} nor {Env.ENROL_COMMITMENT} is set (the controller passes one)",
            file=sys.stderr,
        )
        return 2
    try:
        spec = load_spec(args.spec, on_node=True)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from rlboost.trainer import distributed

    if distributed.launched():  # under torchrun: rank 0 runs the trainer, the others follow it
        if not token:  # the followers would never get the token or the job's secret variables
            print(f"error: a trainer under torchrun needs {Env.JOB_TOKEN} (it does not enrol)", file=sys.stderr)
            return 2
        ctx = distributed.init(spec.trainer.strategy)
        if ctx.rank != 0:
            return distributed.run_follower(spec, ctx)
    from rlboost.trainer.enrolment import NoDelivery, await_delivery, listen
    from rlboost.trainer.runtime import main_async

    args.run_dir.mkdir(parents=True, exist_ok=True)
    if os.environ.get(Env.RUN_DIR):  # a local node: when it stops is read from its last beat
        from rlboost.contracts.heartbeat import start_heartbeat

        start_heartbeat(Path(os.environ[Env.RUN_DIR]))
    ckpt_dir = args.checkpoint_dir or (
        Path(spec.trainer.checkpoint_dir).expanduser() if spec.trainer.checkpoint_dir else args.run_dir / "checkpoints"
    )
    try:
        sock = listen(args.host, args.port)
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    if not token:  # booted with a commitment only: the controller delivers the token (and secrets) first
        wait_s = float(os.environ.get(Env.ENROL_WAIT_S) or TRAINER_WAIT_S)
        try:
            grant = asyncio.run(await_delivery(sock, spec, args.host, args.run_dir, commitment or "", wait_s))
        except NoDelivery as e:
            print(f"error: {e}; stopping (the controller gave up on this trainer or never reached it)", file=sys.stderr)
            return 2
        os.environ.update(grant.env)  # before the model loads (HF_TOKEN); the reserved engine inherits them
        os.environ.pop(Env.ENROL_COMMITMENT, None)
        token = grant.token
    try:
        return asyncio.run(
            main_async(spec, token, args.host, sock, args.run_dir, args.record_rollouts, args.linger, ckpt_dir)
        )
    finally:
        distributed.finish()


def exit_now(code: int | None) -> None:
    """Leave without the interpreter's teardown: everything worth keeping is written and closed by now,
    and tearing down torch and the native libraries took up to a second after a SIGTERM - billed
    trainer time at the end of every job."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code or 0))


if __name__ == "__main__":
    exit_now(main())
