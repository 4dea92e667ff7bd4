"""The estimates of many plans of one config, priced by one process or several: a plan search's
candidates (`report.expert_plans`) are independent estimates.

With `processes` above 1, ``processes - 1`` spawned workers claim the plans from the first,
and this process, whose memos are warm, claims them from the last, one at a time under one
lock, until they meet: nobody waits while a plan is left (a pool that queues plans ahead left
this process idle for 14 of DeepSeek-V3's 20 s search). Spawned, not forked, as
`redistribution.parallel` spawns its workers. A worker whose parent is gone (killed) claims
nothing more; on an error or an interrupt here the workers are terminated.

Every estimate comes back `detached` (without its plan, which holds closures and does not
pickle), wherever it was priced: the answer does not depend on the process count, and a search
holding a hundred estimates does not hold a hundred plans. Each is what `estimate_given` gives
in any process (the memos are exact), so the figures are the same whichever process priced it.
"""

from __future__ import annotations

import os
import queue
import traceback

from autostrat.errors import AutostratError
from autostrat.report.estimate import Estimate, GivenPlan, estimate_given


def price_plans(data: dict, text: str, path, plans: list[GivenPlan], processes: int = 1, progress=None) -> list:
    """Per plan of `plans` (a config's YAML `data`, its `text`, read from `path`), in order, its
    detached `Estimate`, or the reason the estimate refused it (a string); `progress(given,
    estimate or None)` is called here as each is priced, in the order they end.

    Example (two plans of the small GPT, on two processes: the figures of one):
        >>> from autostrat.frontend.yaml_text import parse_config_text
        >>> from autostrat.report.estimate import read_given_plan
        >>> path = "configs/estimate/gpt_small.yaml"
        >>> text = open(path).read()
        >>> data = parse_config_text(text, path)
        >>> given = read_given_plan(data, path)
        >>> one, two = price_plans(data, text, path, [given, given], processes=2)
        >>> one.to_json() == two.to_json(), one.plan
        (True, None)
    """
    workers = min(processes, len(plans)) - 1
    if workers < 1:
        found = []
        for given in plans:
            found.append(_priced(data, text, path, given))
            _told(progress, given, found[-1])
        return found
    import multiprocessing  # here: a search pricing alone never loads it

    context = multiprocessing.get_context("spawn")
    claims = _Claims(context, len(plans))
    results = context.Queue()
    children = [context.Process(target=_work, args=(claims, results, data, text, path, plans, os.getpid()), daemon=True)
                for _ in range(workers)]
    found, missing = [None] * len(plans), set(range(len(plans)))
    try:
        for child in children:
            child.start()
        while (index := claims.last()) is not None:
            found[index] = _priced(data, text, path, plans[index])
            missing.discard(index)
            _told(progress, plans[index], found[index])
        while missing:
            index, one, failure = _result(results, children, plans, missing)
            if failure:
                raise RuntimeError(f"pricing {plans[index]} in a worker failed:\n{failure}")
            found[index] = one
            missing.discard(index)
            _told(progress, plans[index], one)
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()  # done, or stopped by an error or an interrupt: nothing is left to price
            child.join()
    return found


class _Claims:
    """The next plan from the front and from the back, claimed under one lock."""

    def __init__(self, context, count: int):
        self.lock = context.Lock()
        self.front, self.back = context.RawValue("i", 0), context.RawValue("i", count - 1)

    def first(self) -> int | None:
        with self.lock:
            if self.front.value > self.back.value:
                return None
            self.front.value += 1
            return self.front.value - 1

    def last(self) -> int | None:
        with self.lock:
            if self.front.value > self.back.value:
                return None
            self.back.value -= 1
            return self.back.value + 1


def _result(results, children: list, plans: list, missing: set) -> tuple:
    """The next (index, estimate, failure text) a worker sends; raises when every worker has
    ended with plans still missing (one died: killed, or out of memory)."""
    while True:
        try:
            return results.get(timeout=1.0)
        except queue.Empty:
            if not any(child.is_alive() for child in children) and results.empty():
                codes = ", ".join(str(child.exitcode) for child in children)
                raise RuntimeError(f"the pricing workers ended (exit codes {codes}) without the estimates of "
                                   f"{', '.join(str(plans[index]) for index in sorted(missing))}") from None


def _work(claims: _Claims, results, data: dict, text: str, path, plans: list, parent: int) -> None:
    """A worker: price the plans it claims from the front while its parent lives."""
    while os.getppid() == parent and (index := claims.first()) is not None:
        try:
            results.put((index, _priced(data, text, path, plans[index]), ""))
        except BaseException:  # a bug: the parent raises it with this traceback, stopping the search
            results.put((index, None, traceback.format_exc()))
            return


def _priced(data: dict, text: str, path, given: GivenPlan) -> Estimate | str:
    try:
        return estimate_given(data, text, path, given).detached()
    except AutostratError as error:
        return str(error)


def _told(progress, given: GivenPlan, found) -> None:
    if progress is not None:
        progress(given, found if isinstance(found, Estimate) else None)
