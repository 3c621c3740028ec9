"""Weight transfer, both ends: the trainer publishes a version (publisher, delta codec and chain, swarm
tracker), a worker pulls it (pull, store) and serves it to peers (peer_server); the transports that
carry a version, the pull among them, are one class each behind one interface and a factory
(transports/). Imports only contracts (the manifest schema, digests, retry, the wire protocol)."""
