import numpy as np
import pytest

from rlboost.contracts.spec import TaskSpec
from rlboost.models.vocab import BOS, EOS, PAD, SEP, SYMBOLS, VOCAB_SIZE, decode, encode
from rlboost.trainer.tasks import make_task


def test_vocab_layout() -> None:
    assert (PAD, BOS, EOS, SEP) == (0, 1, 2, 3)
    assert VOCAB_SIZE == 4 + len(SYMBOLS) == 41
    assert encode("09az+") == [4, 13, 14, 39, 40]
    assert decode([BOS, *encode("ab"), SEP, *encode("ba"), EOS, PAD, 99]) == "^ab=ba$_?"


@pytest.mark.parametrize(
    ("name", "answer"),
    [
        ("reverse", lambda q: q[::-1]),
        ("copy", lambda q: q),
        ("sort", lambda q: "".join(sorted(q))),
        ("add", lambda q: str(int(q.split("+")[0]) + int(q.split("+")[1]))),
    ],
)
def test_problems_are_well_formed_and_correct(name: str, answer) -> None:
    task = make_task(TaskSpec(name=name, min_len=2, max_len=4))
    problems = task.sample(np.random.default_rng(0), 200)
    lengths = set()
    for p in problems:
        assert p.prompt_ids[0] == BOS and p.prompt_ids[-1] == SEP
        question = decode(p.prompt_ids[1:-1])
        assert decode(p.answer_ids) == answer(question)
        assert p.text == decode(task.demo_ids(p))
        assert len(p.answer_ids) <= task.max_answer_len
        if name == "add":
            a, b = question.split("+")
            assert all(2 <= len(x) <= 4 and not x.startswith("0") for x in (a, b))
            lengths.add(len(a))
        else:
            lengths.add(len(question))
    assert lengths == {2, 3, 4}  # the whole length range is drawn


def test_sampling_is_deterministic_given_rng() -> None:
    task = make_task(TaskSpec())
    a = task.sample(np.random.default_rng(7), 20)
    b = task.sample(np.random.default_rng(7), 20)
    c = task.sample(np.random.default_rng(8), 20)
    assert a == b
    assert a != c


def test_reward_is_exact_match_including_eos() -> None:
    task = make_task(TaskSpec(name="reverse"))
    p = task.sample(np.random.default_rng(1), 1)[0]
    good = [*p.answer_ids, EOS]
    assert task.reward(p, good) == 1.0
    assert task.reward(p, p.answer_ids) == 0.0  # stopped on length, not EOS
    assert task.reward(p, [*good, EOS]) == 0.0
    assert task.reward(p, [*p.answer_ids[:-1], EOS]) == 0.0
    assert task.reward(p, [EOS]) == 0.0


def test_demo_ids_are_prompt_answer_eos() -> None:
    task = make_task(TaskSpec(name="sort"))
    p = task.sample(np.random.default_rng(2), 1)[0]
    assert task.demo_ids(p) == [*p.prompt_ids, *p.answer_ids, EOS]


def test_add_answer_may_carry() -> None:
    task = make_task(TaskSpec(name="add", min_len=1, max_len=1))
    assert task.max_answer_len == 2
    ps = task.sample(np.random.default_rng(3), 300)
    assert any(len(p.answer_ids) == 2 for p in ps)
