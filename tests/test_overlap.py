"""rollout/policies/overlap.py: the accounting of training during the tail, shared by the live
synthetic learner and the simulator."""

from rlboost.rollout.policies.overlap import busy_between, left_to_train, may_train_group, trained_part


def test_may_train_group_only_between_offload_and_last_response():
    assert may_train_group(True, 5.0, None)
    assert not may_train_group(True, None, None)  # not offloaded: the trainer's GPUs generate
    assert not may_train_group(True, 5.0, 9.0)  # generation over: the step's update trains the rest
    assert not may_train_group(False, 5.0, None)  # a learner that cannot stream


def test_trained_part_and_left_to_train():
    assert trained_part(1000, 10.0, 10.5, 1000.0) == 500
    assert trained_part(1000, 10.0, 12.0, 1000.0) == 1000  # never more than the group
    assert trained_part(1000, 10.0, 9.0, 1000.0) == 0
    assert left_to_train(3000, 1200, overlap=True) == 1800
    assert left_to_train(3000, 1200, overlap=False) == 3000
    assert left_to_train(3000, 5000, overlap=True) == 0


def test_busy_between():
    busy = [(0.0, 2.0), (3.0, 5.0), (6.0, 7.0)]
    assert busy_between(busy, 1.0, 6.5) == 1.0 + 2.0 + 0.5
    assert busy_between(busy, None, 6.5) == 0.0
