"""The rollout coordinator and the scheduling core: the coordinator (on the trainer node) dispatches a
step's requests to engines and holds every token; the policies (pure, clock injected) decide
dispatch, offload, migration, fleet size, placement and reconcile for the coordinator, the controller
and `rlboost simulate` alike. Imports only contracts."""
