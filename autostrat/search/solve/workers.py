"""Searches on several cores: the calling process searches with the first seed while forked
processes search with the others (each its own step-size schedule, so that their multipliers
take different paths), and the best solution of all is kept. Forking shares the solver's
arrays without copying them; where the system cannot fork, one search runs.
"""

from __future__ import annotations

import multiprocessing

import numpy as np

from autostrat.search.deadline import Deadline


def search_all(make_search, seeds: list, rounds: int | None, deadline: Deadline) -> list:
    """Run `make_search(seed, worker)` (a search with `run(rounds)` -> rounds done,
    `best_solution` and `best_cost`) for every seed, the first here and the others in forked processes; return
    [(best cost, best solution, rounds)] of those that answered by the deadline, ours first.

    Example:
        >>> class Search:
        ...     def __init__(self, seed, worker):
        ...         self.best_cost, self.best_solution = float(seed), np.array([seed])
        ...     def run(self, rounds):
        ...         return 1
        >>> [(cost, best.tolist(), done) for cost, best, done in search_all(Search, [3, 1], None, Deadline(10.0))]
        [(3.0, [3], 1), (1.0, [1], 1)]
    """
    children = []
    if len(seeds) > 1 and "fork" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("fork")
        for worker, seed in enumerate(seeds[1:], start=1):
            receiving, sending = context.Pipe(duplex=False)
            child = context.Process(target=_child, args=(make_search, seed, worker, rounds, sending), daemon=True)
            child.start()
            sending.close()
            children.append((child, receiving))
    search = make_search(seeds[0], 0)
    done = search.run(rounds)
    results = [(search.best_cost, np.array(search.best_solution), done)]
    for child, receiving in children:
        if receiving.poll(max(deadline.left(), 0.0) + 0.5):
            try:
                results.append(receiving.recv())
            except EOFError:  # the child ended without answering
                pass
        child.join(timeout=0.5)
        if child.is_alive():
            child.terminate()
    return results


def _child(make_search, seed: int, worker: int, rounds: int | None, sending) -> None:
    search = make_search(seed, worker)
    done = search.run(rounds)
    sending.send((search.best_cost, np.array(search.best_solution), done))
    sending.close()
