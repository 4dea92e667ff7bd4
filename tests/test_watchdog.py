"""A rank's watchdog (runtime/watchdog.py): start-up is watched with its own, longer limit."""

from __future__ import annotations

import time

from autostrat.runtime.watchdog import START_UP_LIMIT, Watchdog


def _wait_until(condition, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def test_start_up_gets_its_own_limit_then_the_stall_limit_rules():
    ended = []
    dog = Watchdog(2, 0.1, lambda: ended.append(True), fd=None, grace=0.0, pause=0.0, start_up=1.0)
    time.sleep(0.5)  # five stall limits, but still inside the start-up limit: the watchdog never ends a job early
    assert ended == []
    assert _wait_until(lambda: ended)
    dog.stop()
    assert dog.message == "rank 2: no progress for 1.0 s in start-up"


def test_after_the_first_instruction_the_stall_limit_applies():
    ended = []
    dog = Watchdog(0, 0.1, lambda: ended.append(True), fd=None, grace=0.0, pause=0.0, start_up=1000.0)
    dog.progress("MatMul")
    assert _wait_until(lambda: ended)
    dog.stop()
    assert dog.message == "rank 0: no progress for 0.1 s in MatMul"


def test_a_stall_limit_longer_than_the_start_up_limit_covers_start_up_too():
    dog = Watchdog(0, 2 * START_UP_LIMIT, lambda: None, fd=None)
    dog.stop()
    assert dog.start_up == 2 * START_UP_LIMIT
