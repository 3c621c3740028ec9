"""Pull-based weight transfer, both ends: the trainer publishes a version (publisher, delta codec and
chain, swarm tracker), a worker pulls it (pull, store) and serves it to peers (peer_server); the
torch.distributed broadcast is the optional transport inside the trainer's network. Imports only
contracts (the manifest schema, digests, retry)."""
