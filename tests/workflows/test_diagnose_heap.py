"""A diagnosis runs with the objects that existed before it frozen out of Python's cyclic
collector (gate.workflows.diagnose.core.heap_frozen): a full collection of a process holding a
model scans every one of them (0.18 s on the Qwen3.6 test checkpoint, 20 of its prefills), and
a diagnosis makes enough objects to trigger one now and then. The freeze is given back when it
ends, raised or not, and a caller's own freeze is left as it was."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture
def unfrozen() -> Iterator[None]:
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()


def test_a_diagnosis_runs_on_a_frozen_heap_and_gives_it_back(unfrozen: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from gate.workflows.diagnose import core

    seen: list[int] = []

    class Stop(Exception):
        pass

    def reference_and_band(*args: object, **kwargs: object) -> None:
        garbage: list[object] = []
        garbage.append(garbage)  # a cycle made inside: still the collector's
        seen.append(gc.get_freeze_count())
        seen.append(int(any(o is garbage for o in gc.get_objects())))
        raise Stop

    monkeypatch.setattr(core, "reference_and_band", reference_and_band)
    target = core.Target("p", 1, core.GIVEN, core.DECODE, (1, 2), (1, 2, 3))
    with pytest.raises(Stop):
        core.diagnose_candidate(lambda p, c, path: None, {}, target, "unused", cache=False)  # type: ignore[arg-type, return-value]
    frozen, tracked = seen
    assert frozen > 1000 and tracked  # the process's objects frozen, the diagnosis's own not
    assert gc.get_freeze_count() == 0  # given back, though it raised


def test_a_callers_freeze_is_left_alone(unfrozen: None) -> None:
    from gate.workflows.diagnose.core import heap_frozen

    gc.freeze()
    before = gc.get_freeze_count()
    with heap_frozen():
        assert gc.get_freeze_count() == before
    assert gc.get_freeze_count() == before
