"""The estimates of many plans of one config, priced by one process or several: a plan search's
candidates are independent estimates (`report.expert_plans` prices a list of them,
`report.plan_space` prices them by branch and bound).

With `processes` above 1, ``processes - 1`` spawned workers claim the plans from the first,
and this process, whose memos are warm, claims them from the last (by branch and bound: from
the first too, the fastest fitting plan found shared by all), one at a time under one lock,
until they meet: nobody waits while a plan is left (a pool that queues plans ahead left this
process idle for 14 of DeepSeek-V3's 20 s search). Spawned, not forked, as
`redistribution.parallel` spawns its workers; as with any spawning Python program, a script
calling this on several processes keeps its own work under ``if __name__ == "__main__":`` (a
worker imports the main module; one that fails to start leaves its plans to this process, or,
with a deadline, where this process only waits, ends the pricing with an error). A
worker whose parent is gone (killed) claims nothing more; on an error or an interrupt here the
workers are terminated.

Every estimate comes back `detached` (without its plan, which holds closures and does not
pickle), wherever it was priced: the answer does not depend on the process count, and a search
holding a hundred estimates does not hold a hundred plans. Each is what `estimate_given` gives
in any process (the memos are exact), so the figures are the same whichever process priced it.
"""

from __future__ import annotations

import os
import queue
import time
import traceback

from autostrat.errors import AutostratError
from autostrat.report.estimate import Estimate, GivenPlan, estimate_given


def price_plans(data: dict, text: str, path, plans: list[GivenPlan], processes: int = 1, progress=None,
                bounds: list[tuple[int, int]] | None = None, budget: int | None = None, before=None,
                deadline: float | None = None) -> list:
    """Per plan of `plans` (a config's YAML `data`, its `text`, read from `path`), in order, its
    detached `Estimate`, or the reason the estimate refused it (a string); `progress(given,
    estimate or None)` is called here as each is priced, in the order they end.

    With `bounds` (per plan, in increasing order, a lower bound on its step in nanoseconds and
    its tie-break key), branch and bound: a plan is claimed only while its pair does not exceed
    the (step, key) of the fastest priced plan whose peak fits `budget` (or the one `before`
    returns, while none is faster: a job this process runs first, the workers already pricing,
    giving the (step, key) of a plan it priced that fits, or None); the rest are None. On
    several processes the fastest is known later, so more may be priced than by one, never fewer
    (a plan one process prices, every count does: the fastest known then is at least one
    process's): a caller wanting one answer for every count prunes again from what it gets
    (`report.plan_space`).

    With a `deadline` (a `time.time()`), `processes` workers price and this process only waits
    (an estimate under way here could not stop at the deadline): no plan is claimed after it,
    what the workers are still pricing then is dropped, and those plans are None too.

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
    here = deadline is None  # this process prices too (not with a deadline: see above)
    workers = min(processes, len(plans)) - here
    found = [None] * len(plans)
    if workers < 1:
        best = None if before is None else before()
        for index, given in enumerate(plans):
            if (bounds is not None and best is not None and bounds[index] > best) or _past(deadline):
                break
            found[index] = _priced(data, text, path, given)
            best = _faster(best, found[index], bounds[index][1] if bounds else index, budget)
            _told(progress, given, found[index])
        return found
    return _in_processes(data, text, path, plans, workers, here, progress, bounds, budget, before, deadline)


def _in_processes(data: dict, text: str, path, plans: list, workers: int, here: bool, progress, bounds, budget,
                  before, deadline) -> list:
    """`price_plans` on `workers` spawned workers, and on this process too where `here` says."""
    import multiprocessing  # here: a search pricing alone never loads it

    found = [None] * len(plans)
    context = multiprocessing.get_context("spawn")
    claims = _Claims(context, len(plans), bounds, budget, deadline)
    results = context.Queue()
    children = [context.Process(target=_work, args=(claims, results, data, text, path, plans, os.getpid()), daemon=True)
                for _ in range(workers)]
    received = set()
    try:
        for child in children:
            child.start()
        if before is not None:
            claims.offer(before())
        while here and (index := claims.claim(from_back=bounds is None)) is not None:
            found[index] = claims.priced(index, _priced(data, text, path, plans[index]))
            received.add(index)
            _told(progress, plans[index], found[index])
        while not (claims.exhausted() and set(range(claims.claimed())) <= received):
            got = _result(results, children, plans, set(range(claims.claimed())) - received, deadline)
            if got is None:
                break  # the deadline: what the workers are still pricing is dropped
            index, one, failure = got
            if failure:
                raise RuntimeError(f"pricing {plans[index]} in a worker failed:\n{failure}")
            found[index] = one
            received.add(index)
            _told(progress, plans[index], one)
    finally:
        for child in children:
            if child.pid is None:
                continue  # never started (the start failed)
            if child.is_alive():
                child.terminate()  # done, or stopped by an error or an interrupt: nothing is left to price
            child.join()
    return found


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.time() >= deadline


def _faster(best: tuple | None, found, key: int, budget: int | None) -> tuple | None:
    """`best` ((step ns, key) of the fastest fitting plan so far), or `found`'s if it fits and is faster."""
    mine = _fitting(found, key, budget)
    return mine if mine is not None and (best is None or mine < best) else best


def _fitting(found, key: int, budget: int | None) -> tuple | None:
    """(step ns, `key`) of the estimate `found` if its peak fits `budget`, else None."""
    if not isinstance(found, Estimate) or (budget is not None and max(stage.peak_bytes for stage in found.memory) > budget):
        return None
    return sum(found.phases_ns.values()), key


class _Claims:
    """The next plan from the front (the back: none with bounds), and the fastest fitting plan
    priced so far, under one lock shared by every process."""

    def __init__(self, context, count: int, bounds: list | None = None, budget: int | None = None,
                 deadline: float | None = None):
        self.lock, self.bounds, self.budget, self.deadline = context.Lock(), bounds, budget, deadline
        self.front, self.back = context.RawValue("q", 0), context.RawValue("q", count - 1)
        self.stopped = context.RawValue("b", 0)  # a bound passed the fastest: no plan left can be chosen
        self.best = context.RawArray("q", 3)  # known (0 or 1), step ns, key

    def claim(self, from_back: bool = False) -> int | None:
        with self.lock:
            if self.stopped.value or self.front.value > self.back.value or _past(self.deadline):
                return None
            if from_back:
                self.back.value -= 1
                return self.back.value + 1
            index = self.front.value
            if self.bounds is not None and self.best[0] and tuple(self.bounds[index]) > (self.best[1], self.best[2]):
                self.stopped.value = 1
                return None
            self.front.value += 1
            return index

    def exhausted(self) -> bool:
        """Whether no plan can be claimed any more."""
        with self.lock:
            return bool(self.stopped.value) or self.front.value > self.back.value or _past(self.deadline)

    def claimed(self) -> int:
        """How many plans were claimed from the front (once no more can be)."""
        with self.lock:
            return self.front.value

    def priced(self, index: int, found):
        """`found`, the estimate of plan `index`, made the fastest known when it is (then returned)."""
        self.offer(_fitting(found, self.bounds[index][1] if self.bounds is not None else index, self.budget))
        return found

    def offer(self, pair: tuple | None) -> None:
        """A fitting plan's (step ns, key), made the fastest known when it is."""
        with self.lock:
            if pair is not None and (not self.best[0] or pair < (self.best[1], self.best[2])):
                self.best[0], self.best[1], self.best[2] = 1, *pair


def _result(results, children: list, plans: list, missing: set, deadline: float | None = None) -> tuple | None:
    """The next (index, estimate, failure text) a worker sends, or None once past `deadline`;
    raises when every worker has ended with plans still missing (one died: killed, or out of
    memory)."""
    while True:
        try:
            return results.get(timeout=1.0 if deadline is None else max(0.01, min(1.0, deadline - time.time())))
        except queue.Empty:
            if _past(deadline):
                return None
            if not any(child.is_alive() for child in children) and results.empty():
                codes = ", ".join(str(child.exitcode) for child in children)
                what = ", ".join(str(plans[index]) for index in sorted(missing)) or "the plans left"
                raise RuntimeError(f"the pricing workers ended (exit codes {codes}) without the estimates of {what}") from None


def _work(claims: _Claims, results, data: dict, text: str, path, plans: list, parent: int) -> None:
    """A worker: price the plans it claims from the front while its parent lives."""
    while os.getppid() == parent and (index := claims.claim()) is not None:
        try:
            results.put((index, claims.priced(index, _priced(data, text, path, plans[index])), ""))
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
