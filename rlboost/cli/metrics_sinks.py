"""Where each metrics row goes: `metrics.jsonl` always, and the job file's optional sinks
(`logging: {tensorboard: DIR, wandb: {project: ...}}`).

A row is what metrics.jsonl holds (rlboost/cli/metrics_log.py): `step` plus named figures. Sinks take
its numbers under the same names (a nested key flattened with `/`); `step` is their x-axis.

TensorBoard and W&B are optional libraries (`pip install 'rlboost[logging]'`), imported only by a job
that asks for them; `sink_problems` names a missing one before the job starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from rlboost.contracts.spec import JobSpec

INSTALL_HINT = "pip install 'rlboost[logging]'"
WANDB_RUN_ID_FILE = "wandb-run-id"


class MetricsSink(Protocol):
    name: str

    def write(self, row: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def flat_numbers(row: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The row's numbers by name, nested mappings flattened with `/`; nulls, flags and text left out
    (a dashboard plots numbers)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_numbers(value, f"{name}/"))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = value
    return out


class JsonlSink:
    """metrics.jsonl: one JSON object per line, appended."""

    name = "metrics.jsonl"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._opened = False

    def write(self, row: Mapping[str, Any]) -> None:
        with open(self.path, "a+b") as f:
            lead = b""
            if not self._opened:  # a line an earlier controller left cut short stays a line of its own
                self._opened = True
                if f.seek(0, os.SEEK_END) > 0:
                    f.seek(-1, os.SEEK_END)
                    lead = b"" if f.read(1) == b"\n" else b"\n"
            f.write(lead + (json.dumps(row, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        pass


class TensorBoardSink:
    """Scalars in a TensorBoard event file, written with tensorboard's own writer (the one
    torch.utils.tensorboard uses), so the machine running the controller needs no torch."""

    name = "logging.tensorboard"

    def __init__(self, logdir: Path) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        logdir.mkdir(parents=True, exist_ok=True)
        self._event, self._summary = Event, Summary
        self.writer = EventFileWriter(str(logdir))

    def write(self, row: Mapping[str, Any]) -> None:
        step = int(row["step"])
        values = [
            self._summary.Value(tag=tag, simple_value=float(v)) for tag, v in flat_numbers(row).items() if tag != "step"
        ]
        self.writer.add_event(self._event(wall_time=time.time(), step=step, summary=self._summary(value=values)))
        self.writer.flush()  # a dashboard follows the job as it runs

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A W&B run named after the job (`NAME-ID`), its config the job file. `step` is logged as the
    run's x-axis metric rather than as wandb's own step: wandb drops a row whose step is below one it
    has seen, and an evaluation (or a step run again after a trainer restart) can arrive after a
    later step."""

    name = "logging.wandb"

    def __init__(self, spec: JobSpec, run_dir: Path, run_name: str, environ: Mapping[str, str]) -> None:
        import wandb

        w = spec.logging.wandb
        assert w is not None
        self.mode = w.mode or ("online" if environ.get("WANDB_API_KEY") else "offline")
        root = Path(environ["WANDB_DIR"]) if environ.get("WANDB_DIR") else run_dir
        root.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(
            console="off",  # the controller's terminal stays its own: no stdout capture
            silent=True,
            x_disable_meta=True,  # no host metadata: it would record the command line, `--env NAME=VALUE` too
            x_disable_stats=True,  # the controller's machine is not the trainer's: its usage says nothing
            disable_git=True,
            save_code=False,
        )
        self.run = wandb.init(
            project=w.project,
            entity=w.entity,
            name=run_name,
            id=_run_id(run_dir, run_name),  # a resumed controller continues the same run
            resume="allow",
            mode=self.mode,
            dir=str(root),
            config=wandb_config(spec),
            settings=settings,
        )
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def write(self, row: Mapping[str, Any]) -> None:
        self.run.log(flat_numbers(row))

    def close(self) -> None:
        self.run.finish()


def _run_id(run_dir: Path, run_name: str) -> str:
    """The job's W&B run id, kept in its run directory. Not the name alone: job ids count per
    machine, and with resume="allow" a name another machine used in the project would append to that run."""
    path = run_dir / WANDB_RUN_ID_FILE
    if not path.exists():
        path.write_text(f"{run_name}-{secrets.token_hex(4)}")
    return path.read_text().strip()


def wandb_config(spec: JobSpec) -> dict[str, Any]:
    """The job file as W&B config, without any variable's value: `envs:` gives names only (a secret's
    value is never in the spec, and a plain one may still be a credential written into the file)."""
    config = spec.model_dump(mode="json", exclude={"logging"})
    config["envs"] = sorted(spec.envs)
    return config


def sink_problems(spec: JobSpec) -> list[str]:
    """One line per sink the job asks for whose library is missing here, with the fix."""
    wanted = {
        "logging.tensorboard": (spec.logging.tensorboard, "tensorboard"),
        "logging.wandb": (spec.logging.wandb, "wandb"),
    }
    return [
        f"{key}: needs the {module} package, which is not installed; install it with {INSTALL_HINT} (or remove {key})"
        for key, (setting, module) in wanted.items()
        if setting is not None and importlib.util.find_spec(module) is None
    ]


SinkError = Callable[[str, Exception], None]


def open_sinks(
    spec: JobSpec,
    run_dir: Path,
    run_name: str,
    on_error: SinkError,
    environ: Mapping[str, str] | None = None,
) -> list[MetricsSink]:
    """The job's optional sinks, started (metrics.jsonl is MetricsLog's own). A relative TensorBoard
    directory is relative to the run directory. A sink that cannot start is reported to `on_error` and
    left out: a dashboard is not worth stopping the training for."""
    environ = os.environ if environ is None else environ
    starts: list[tuple[str, Callable[[], MetricsSink]]] = []
    tb = spec.logging.tensorboard
    if tb is not None:
        tb = tb.expanduser()
        logdir = tb if tb.is_absolute() else run_dir / tb
        starts.append((TensorBoardSink.name, lambda: TensorBoardSink(logdir)))
    if spec.logging.wandb is not None:
        starts.append((WandbSink.name, lambda: WandbSink(spec, run_dir, run_name, environ)))
    sinks: list[MetricsSink] = []
    for name, start in starts:
        try:
            sinks.append(start())
        except Exception as e:  # a missing library, a bad W&B key or project: the job goes on without it
            on_error(name, e)
    return sinks
