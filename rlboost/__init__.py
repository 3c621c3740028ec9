"""rlboost: RL post-training of LLMs on an on-demand trainer plus harvested spot GPUs.

One import namespace: rlboost.contracts (shared by every node), rlboost.trainer, rlboost.worker,
rlboost.weights, rlboost.rollout, rlboost.models (node code), rlboost.providers, rlboost.simulator and
rlboost.cli (the control plane).
"""
