"""The synthetic learner: stands in for the GRPO learner when `model.kind: synthetic`.

Training a step takes (tokens of the step) / train_tokens_per_s of wall time and nothing else, so
a live job with synthetic engines exercises the real control plane (coordinator, offload, weight
publication and pull, migration, spot churn) without torch work. Like the real trainer cluster it
cannot generate and train at once: it trains finished groups only after the coordinator has offloaded
the step's remaining generation to remote engines (`train_while_generating`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from rlboost.models.vocab import VOCAB_SIZE
from rlboost.rollout.policies.overlap import busy_between, busy_total, left_to_train, trained_part


class SyntheticLearner:
    def __init__(self, train_tokens_per_s: float, clock=time.monotonic) -> None:
        if train_tokens_per_s <= 0:
            raise ValueError("train_tokens_per_s must be > 0")
        self.rate = train_tokens_per_s
        self.clock = clock
        self.steps_done = 0
        self.pretrained_tokens = 0  # trained during generation (this step)
        self.busy: list[tuple[float, float]] = []  # training intervals of this step
        self.tokens_trained = 0
        # synthetic engines write the tiny vocabulary's ids (rlboost/worker/engines/synthetic.py): nothing
        # else is a token of theirs
        self.vocab_size = VOCAB_SIZE

    def warm_start(self, steps: int) -> dict[str, float]:
        return {"loss": 0.0}

    def checkpoint_state(self) -> dict:
        return {"steps_done": self.steps_done, "tokens_trained": self.tokens_trained}

    def load_checkpoint_state(self, state: dict) -> None:
        self.steps_done, self.tokens_trained = int(state["steps_done"]), int(state["tokens_trained"])

    def state_dict(self) -> dict:
        import torch  # the weight publisher serialises torch tensors; a tiny set exercises the pull path

        return {"synthetic.step": torch.tensor([float(self.steps_done)]), "synthetic.pad": torch.zeros(256)}

    def train_step(self, samples: Sequence) -> dict[str, float]:
        """Train what was not trained during generation (blocking; called in a thread)."""
        total = sum(len(s.response_ids) for s in samples)
        left = left_to_train(total, self.pretrained_tokens, overlap=True)
        t0 = self.clock()
        time.sleep(left / self.rate)
        self.busy.append((t0, self.clock()))
        self.tokens_trained = total
        self.steps_done += 1
        return {"loss": 0.0, "tokens": float(total)}

    async def train_while_generating(self, coord) -> None:
        """Train finished groups once the coordinator has offloaded (cancelled when generation ends)."""
        self.pretrained_tokens = 0
        self.busy = []
        await coord.offloaded.wait()
        while True:
            while not coord.groups_done:
                coord.group_ready.clear()
                await coord.group_ready.wait()
            g = coord.groups_done.popleft()
            tokens = coord.group_tokens.get(g, 0)
            t0 = self.clock()
            try:
                await asyncio.sleep(tokens / self.rate)
            except asyncio.CancelledError:  # generation ended mid-group: keep the part already trained
                done = trained_part(tokens, t0, self.clock(), self.rate)
                self.busy.append((t0, self.clock()))
                self.pretrained_tokens += done
                raise
            self.busy.append((t0, self.clock()))
            self.pretrained_tokens += tokens

    def busy_between(self, a: float | None, b: float | None) -> float:
        """Training time that fell inside [a, b] (the tail: offload -> last response)."""
        return busy_between(self.busy, a, b)

    def busy_total(self) -> float:
        return busy_total(self.busy)
