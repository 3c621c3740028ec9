"""Scheduling policies: pure code, clock injected, no I/O.

The live coordinator/controller and the simulator call exactly these functions, which is what makes
the simulator's predictions mean something:

- offload.py       how long the reserved (trainer) cluster generates each step before going back to training
- dispatch.py      which engine gets which queued request
- migration.py     which partial responses move at the tail of a step
- tail_batching.py RollPacker-style over-launch and long rounds
- placement.py     which spot candidate to bid for next
- lengths.py       response-length models (synthetic workload) and statistics (predictions)
- views.py         the small read-only views the policies see
"""
