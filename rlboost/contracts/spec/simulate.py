"""The job file's `perf:` and `simulate:` sections: accelerator performance and the replay's platform timings."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from rlboost.contracts.spec.base import Hours, Seconds, Strict, TokenRate


class PerfSpec(Strict):
    """One accelerator's performance (per GPU); unset fields keep the built-in value (see README)."""

    tokens_per_s: TokenRate | None = None  # decode, aggregate at ref_batch
    seq_tokens_per_s: TokenRate | None = None  # decode, one sequence alone
    prefill_tokens_per_s: TokenRate | None = None
    train_tokens_per_s: TokenRate | None = None
    ref_batch: Annotated[int, Field(ge=1, le=100_000)] | None = None


class SimulateSpec(Strict):
    """`rlboost simulate`: platform timings the replay needs beyond `perf` (defaults: a 7B model on a cloud)."""

    boot_s: Seconds = 120.0  # spot launch -> worker dialled in (before its first pull)
    trainer_boot_s: Seconds | None = None  # trainer launch -> serving (None: boot_s)
    reserved_boot_s: Seconds | None = None  # trainer serving -> its engine dialled in
    pull_s: Seconds = 5.0  # a worker pulls each new weight version
    reserved_pull_s: Seconds = 1.0  # the trainer's own engine reloads weights
    step_overhead_s: Seconds = 2.0  # optimizer step + publish, after the last group
    # trainer serving -> weights version 0 published (the supervised warm start, algorithm.warm_start_steps)
    warm_start_s: Seconds = 0.0
    hours: Hours | None = None  # trace hours (default: the job's steps; see bound_to_trace)
    poll_s: Annotated[float, Field(gt=0, le=3600)] = 0.25  # controller loop period (as `rlboost launch`)
    # an engine that batches statically (torch): from one batch's end to its next batch starting (ends
    # reported, the coordinator's dispatch, the requests received); a calibrated local job measures it
    dispatch_s: Seconds = 0.0
    # the trainer's CPU seconds per response it serves (the dispatch, the streamed tokens, the completion):
    # on shared cores (cpu_cores) one more busy process while the engines generate; a calibrated local
    # job measures it
    serve_s: Seconds = 0.0
    # The job's processes share this many CPU cores (a local job's trainer, engines and workers on one
    # machine: each busy one runs at min(1, cores / busy) of its own rate; a fraction where other work
    # takes part of the machine). None: a node each.
    cpu_cores: Annotated[float, Field(gt=0, le=100_000)] | None = None
    # Per-token acceptance of drafted tokens where the job speculates (rollout.speculative), whatever the
    # siblings. None: the cited model (contracts/speculation_perf.py); `--lengths` from a recorded run
    # that drafted sets it to that run's accepted / drafted.
    acceptance: Annotated[float, Field(ge=0, lt=1)] | None = None
