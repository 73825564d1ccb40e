"""`serve` moves its start-up heap out of the garbage collector's walk (a full collection's pause is a
poll's p99 otherwise)."""

from __future__ import annotations

import gc

from connector.cli.serve_cmd import freeze_startup_heap


def test_the_startup_heap_is_frozen_and_new_objects_are_still_collected() -> None:
    before = len(gc.get_objects())
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() >= before // 2  # what existed is out of every later walk
        assert len(gc.get_objects()) < before // 10

        class Cycle:
            pass

        for _ in range(100):  # cyclic garbage made after start-up is still found
            a, b = Cycle(), Cycle()
            a.other, b.other = b, a  # type: ignore[attr-defined]
        del a, b
        assert gc.collect() >= 200
    finally:
        gc.unfreeze()
