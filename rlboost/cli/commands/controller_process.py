"""The hidden commands that run a job's controller as a process of its own: `_controller` (what
`launch -d` starts, and a trainer node's controller serving the control endpoint) and
`_node-controller` (a cloud trainer node's run command, rlboost/templates/node.sky.yaml)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer

from rlboost.cli.controller_run import ControllerRun, job_offers, run_controller, spot_market
from rlboost.cli.launch_options import LaunchOptions
from rlboost.cli.output import console, fail
from rlboost.cli.pids import controller_identity
from rlboost.cli.state import StateStore, job_run_dir, rlboost_home
from rlboost.contracts.env_names import Env
from rlboost.contracts.spec import SpecError, load_spec


def run_detached_controller(
    job_id: Annotated[int, typer.Argument()],
    resume: Annotated[bool, typer.Option("--resume")] = False,
    record_rollouts: Annotated[bool, typer.Option("--record-rollouts")] = False,
    serve_control: Annotated[bool, typer.Option("--serve-control")] = False,
    linger_s: Annotated[float, typer.Option("--linger")] = 600.0,
    trainer_here: Annotated[bool, typer.Option("--trainer-here")] = False,
    control_host: Annotated[str, typer.Option("--control-host")] = "127.0.0.1",
    control_port: Annotated[int, typer.Option("--control-port")] = 0,
) -> None:
    """The background controller `launch -d` starts, for a job that launch already recorded;
    `--serve-control`: the trainer node's controller, answering the launching machine's CLI
    (`--trainer-here`: on a cloud trainer node, running the trainer as a process next to it)."""
    store = StateStore()
    job = store.job_by_id(job_id)
    run_dir = job_run_dir(job)
    # the options too: a trainer node's store is the one the launching machine copies the job's row from
    options = LaunchOptions(record_rollouts=record_rollouts).model_dump_json()
    store.update_job(job_id, **controller_identity(), launch_options=options)
    console.print(f"controller pid {os.getpid()} for job {job.name} (id {job_id})", highlight=False)
    try:  # launch checked all of this a moment ago; a failure now still must not leave the job 'pending'
        spec = load_spec(run_dir / "spec.yaml")
        token = (run_dir / "token").read_text().strip()
        t_offer, s_offers, _ = job_offers(spec)
        market = spot_market(spec)
    except (SpecError, OSError, typer.Exit) as e:
        why = str(e) if not isinstance(e, typer.Exit) else f"could not start (see {run_dir / 'controller.log'})"
        store.update_job(job_id, status="failed", ended_at=time.time(), error=why)
        fail(why, 2)
    run = ControllerRun(spec, store, job_id, run_dir, token, record_rollouts, (t_offer, s_offers), market)
    if not serve_control:
        run_controller(run, resume=resume)
        return
    from rlboost.cli.node_control import ControlServer

    server = ControlServer(job_id, run_dir, token, host=control_host, port=control_port)
    console.print(f"control endpoint {server.start()}", highlight=False, markup=False)
    try:
        run_controller(run, resume=resume, trainer_here=trainer_here)
    finally:
        # the launching machine copies the ended job's records and logs when it next asks: serve until
        # it says it has them (a cloud node would then be terminated with the job)
        server.released.wait(linger_s)
        server.stop()


def run_node_controller(
    job_id: Annotated[int, typer.Argument()],
    name: Annotated[str, typer.Argument()],
    spec_file: Annotated[Path, typer.Argument()],
    resume: Annotated[bool, typer.Option("--resume")] = False,
    control_port: Annotated[int, typer.Option("--control-port")] = 0,
) -> None:
    """A cloud trainer node's run command (rlboost/templates/node.sky.yaml): record the job on this node
    (first start), then run its controller here, the trainer as a process next to it, serving the
    control endpoint on every interface. The job token comes in the environment, never a file."""
    from rlboost.cli.node_host import NodeJob, prepare_node

    token = os.environ.get(Env.JOB_TOKEN, "")
    if not token:
        fail(f"{Env.JOB_TOKEN} is not set: this node was not started by `rlboost launch`", 2)
    spec = load_spec(spec_file)
    # `launch --env` values come as SkyPilot secrets, named in the job file with no value
    secret = {k: os.environ[k] for k, v in spec.envs.items() if v is None and k in os.environ}
    uid = os.environ.get(Env.JOB_UID) or None  # the launching machine's: the node tags instances with it
    prepare_node(rlboost_home(), NodeJob(job_id, name, spec.provider, spec_file.read_text(), token, secret, uid))
    run_detached_controller(
        job_id,
        resume=resume,
        serve_control=True,
        trainer_here=True,
        control_host="0.0.0.0",
        control_port=control_port,
    )
