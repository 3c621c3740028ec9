"""The models both nodes run: tiny-gpt and Hugging Face causal LMs, and the torch engine that generates
with them (the learner on the trainer, the engine on a worker). Imports only contracts."""
