"""What the CLI, the trainer node and the spot nodes share: the job file's model, the engine interface,
TLS pinning, file mounts and the data files shipped with the package. Imports nothing of the project,
so every other package can depend on it (tests/test_imports.py holds that)."""
