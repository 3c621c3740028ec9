"""Helpers the tests and the benchmarks share (never installed: the wheel holds only rlboost/):
hf_fixtures.py makes tiny Hugging Face models, tokenizers and data files on the spot; weight_origin.py
is a real weight publisher serving a version over HTTP on a thread of its own; live_rollout.py is a
coordinator behind its real HTTP app with synthetic workers connected over sockets."""
