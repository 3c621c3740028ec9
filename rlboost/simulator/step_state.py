"""One step's responses as arrays (index i = prompt i // group_size, sample i % group_size), and their
full lengths. (The step's schedule - its start, offload, end of generation, complete groups - is the
coordinator's: rlboost/rollout/coordinator.py StepMarks.)

A response's length is decided up front (the synthetic workload's LengthModel, keyed by its prompt and
request seed, as the live synthetic engine decides it); the replay tracks where each response is
(queued, on engine `engine_of[i]`, done) and how many tokens it holds.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from rlboost.contracts.lengths import LengthModel, prompt_key
from rlboost.contracts.sampling import request_id, request_seed

# (length model, seed, step, group size, prompt keys) -> the step's full response lengths, shared by
# the replays of one process (a sweep's points replay the same steps); bounded, ~16 kB a step
_LENGTHS_SEEN: dict[tuple, np.ndarray] = {}
_LENGTHS_SEEN_MAX = 8192


def full_lengths(lengths: LengthModel, seed: int, number: int, problems, group_size: int) -> np.ndarray:
    """Every response's full length at step `number` (response j = prompt j // group_size, sample
    j % group_size). Each replay of a sweep draws the same prompts at the same step: the lengths are
    computed once per process (a sha256 per response) and looked up after."""
    keys = tuple(prompt_key(prob.prompt_ids) for prob in problems)
    ck = (lengths, seed, number, group_size, keys)
    full = _LENGTHS_SEEN.get(ck)
    if full is None:
        out: list[int] = []
        for i, pkey in enumerate(keys):
            seeds = [request_seed(seed, request_id(number, i, g)) for g in range(group_size)]
            out.extend(lengths.lengths_from_key(pkey, seeds))
        full = np.asarray(out, np.int64)
        full.flags.writeable = False
        if len(_LENGTHS_SEEN) >= _LENGTHS_SEEN_MAX:
            _LENGTHS_SEEN.clear()
        _LENGTHS_SEEN[ck] = full
    return full


class StepState:
    def __init__(self, number: int, t0: float, n: int, group_size: int, tail_round, problems) -> None:
        self.number, self.t0, self.group_size = number, t0, group_size
        self.tail_round, self.problems = tail_round, problems  # tail_round: TailBatcher's round, or None
        self.length = np.zeros(n, np.int64)  # full length, capped by the budget
        self.length_of: list[int] = [0] * n  # the same, read per response where numpy's element read is slow
        self.eos = np.zeros(n, bool)
        self.prompt_len = np.zeros(n, np.int64)
        self.engine_of = np.full(n, -1, np.int64)  # the engine's index, -1 when queued or done
        self.held_at_admit = np.zeros(n, np.int64)  # tokens it held when its engine took it
        self.held = np.zeros(n, np.int64)  # tokens held while not on an engine
        self.decoded_at_admit = np.zeros(n, np.float64)  # its engine's `decoded` count then
        # the engine's `decoded` count at which each response ends, as a list: read once per heap
        # entry, where a numpy element read costs more than the comparison itself
        self.target: list[float] = [0.0] * n
        self.admit_t = np.zeros(n, np.float64)
        self.done = np.zeros(n, bool)
        self.dropped = np.zeros(n, bool)
        self.left_from: dict[int, str] = {}  # migrated away from this engine: not dispatched back to it
        self.queue: deque[int] = deque()
        self.open = n
        self.groups = n // group_size
        self.busy: list[tuple[float, float]] = []  # the trainer's training intervals
        self.pretrained = 0  # tokens trained during generation (whole groups, and the cut-short part)
        # (start, tokens, id, tokens/s) of the group in training
        self.group_training: tuple[float, int, int, float] | None = None
        self.groups_started = 0
        self.train_busy_until = 0.0
        self.version = 0  # the weights version that generates it (set as its generation begins)
        self.gbase = 0  # its first group's number in the pool's window (weights swapped in flight)

    def joined(self, other: StepState) -> StepState:
        """The engines' window: this one's responses, then another step's (weights swapped in flight, two
        steps generate at once). Indices of this one keep their meaning, the other's are offset by its
        length; the trainer keeps each step's own state."""
        n = len(self.length)
        w = StepState(other.number, other.t0, 0, self.group_size, None, None)
        cat = np.concatenate
        for name in ("length", "eos", "prompt_len", "engine_of", "held_at_admit", "held", "decoded_at_admit",
                     "admit_t", "done", "dropped"):
            setattr(w, name, cat([getattr(self, name), getattr(other, name)]))
        w.length_of = self.length_of + other.length_of
        w.target = self.target + other.target
        w.left_from = dict(self.left_from)
        w.queue = deque(self.queue)
        w.queue.extend(i + n for i in other.queue)
        w.open = self.open + other.open
        w.groups = self.groups + other.groups
        w.version = other.version
        return w
