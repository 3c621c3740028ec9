"""Importing `one_thread` into a test module makes its tests run single-threaded torch: faster for
tiny models, and immune to oversubscription when other processes share this machine's two cores."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
