"""What the trainer writes of its steps besides the status: rollouts.jsonl and weight snapshots
(--record-rollouts), and each finished step's log line."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlboost.contracts.step_record import StepRecord


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:  # a full disk: no half-written file left behind
        tmp.unlink(missing_ok=True)
        raise



class RolloutRecorder:
    """Optionally writes every response (rollouts.jsonl) and weight snapshots, for audits and tests."""

    def __init__(self, run_dir: Path | None, from_step: int = 0) -> None:
        self.run_dir = run_dir
        self.from_step = from_step
        self.file = None

    def __enter__(self) -> RolloutRecorder:
        if self.run_dir is not None:
            path = self.run_dir / "rollouts.jsonl"
            if self.from_step and path.exists():  # resumed: steps past the checkpoint are generated again
                keep = [line for line in path.read_text().splitlines() if json.loads(line)["step"] < self.from_step]
                write_atomic(path, "".join(line + "\n" for line in keep))
            self.file = open(path, "a")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.file:
            self.file.close()

    def write(self, responses: list) -> None:
        if self.file is None:
            return
        for r in responses:
            rec = {
                k: getattr(r, k)
                for k in ("rid", "step", "version", "prompt", "tokens", "logprobs", "finish", "engines", "dispatches",
                          "drafted", "accepted", "draft_passes")
            }
            if r.swaps:  # algorithm.weight_swap in_flight: the version that began it, and where it changed
                rec["version"] = r.first_version
                rec["swaps"] = [list(x) for x in r.swaps]
            self.file.write(json.dumps(rec) + "\n")
        self.file.flush()

    def save_weights(self, name: str, tensors: dict) -> None:
        if self.run_dir is not None:
            from safetensors.torch import save_file

            save_file(tensors, str(self.run_dir / name))


def step_line(rec: StepRecord, steps: int) -> str:
    """The trainer's log line of a finished step (the one `rlboost logs -f` shows of it)."""
    optim = ""
    if rec.grad_norm is not None:
        optim = f"  loss {rec.loss:.4f}  pg_loss {rec.pg_loss:.4f}  grad_norm {rec.grad_norm:.3f}  lr {rec.lr:.3g}"
        optim += f"  updates {rec.updates}"
    return (
        f"step {rec.step + 1:>3}/{steps}  reward {rec.reward:.3f}{optim}  tokens {rec.tokens:>5}"
        f"  engines {rec.engines}  migrated {rec.migrated}  {rec.step_s:.2f}s"
    )


def metrics_text(d: dict) -> str:
    """A metrics dict as one line: `loss 2.408, steps 10`."""
    return ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in d.items())
