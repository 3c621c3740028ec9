"""`rlboost simulate`: replay a spot trace and prices through the scheduling policies on a virtual clock.

The simulator runs the same pure code as a live job - the placement policy and capacity backoff of
the controller, the spot market's victim choice, dispatch, tail migration, adaptive offload, tail
batching, the length statistics the policies learn from - against models of what it does not run:
engines (rlboost/contracts/perf.py: decode rate by batch size, prefill), training (tokens/s), and
platform timings (boot, weight pull, step overhead; `simulate:` in the job file).
"""

from rlboost.simulator.core import simulate_job
from rlboost.simulator.presets import PRESETS, SimPolicy
from rlboost.simulator.result import SimResult

__all__ = ["PRESETS", "SimPolicy", "SimResult", "simulate_job"]
