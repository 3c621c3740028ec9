"""Scheduling policies: pure code, clock injected, no I/O.

The live coordinator/controller and the simulator call exactly these functions, which is what makes
the simulator's predictions mean something:

- offload.py       how long the reserved (trainer) cluster generates each step before going back to training
- overlap.py       the accounting of training while the tail generates
- tick.py          when the coordinator reconsiders offload and migration
- dispatch.py      which engine gets which queued request
- migration.py     which partial responses move at the tail of a step
- tail_batching.py RollPacker-style over-launch and long rounds
- lengths.py       statistics of finished lengths (remaining-length predictions); the synthetic
                   workload's own lengths are rlboost/contracts/lengths.py
- siblings.py      remaining lengths from a response's finished GRPO siblings (rollout.sibling_scheduling)
- placement.py     which spot candidate to bid for next
- fleet.py         how many spot workers to hold, by the job's objective
- reconcile.py     launching toward the fleet's target, with per-candidate capacity backoff
- views.py         the small read-only views the policies see
"""
