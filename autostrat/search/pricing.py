"""Every entry of a search problem's cost tables priced before the solver's model is built
(`price_tables`), within the refinement's deadline.
"""

from __future__ import annotations

from autostrat.redistribution.parallel import missing_pairs, price_in_parallel, processes
from autostrat.redistribution.polling import polled
from autostrat.search.deadline import Deadline
from autostrat.search.problem import SearchProblem

# Cost-table entries priced between two looks at the deadline: an entry may take a
# redistribution search of tens of milliseconds, so a whole row of a 32-device table could take
# seconds (measured: 80,000 entries in 700 s when a 32-device stack was coarsened).
PRICED_AT_ONCE = 16
PRICING = "pricing the cost tables (every pair of candidates)"


def price_tables(problem: SearchProblem, deadline: Deadline) -> None:
    """Price every entry of every cost table (the model prices every pair), `PRICED_AT_ONCE`
    entries at a time, checking `deadline` in between and inside each entry's redistribution
    search (`redistribution.polling`). When the caller asked for pricing processes
    (`redistribution.parallel.pricing`), they first price the missing entries within the time
    left: the same prices, sooner.

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search.problem import build_problem
        >>> problem = build_problem(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), 8)
        >>> price_tables(problem, Deadline(60.0))
        >>> all(edge.table.computed == edge.table.size for edge in problem.edges)
        True
    """
    deadline.check(PRICING)
    if (count := processes()) > 1:
        price_in_parallel(missing_pairs(edge.table for edge in problem.edges), count, deadline.left())
        deadline.check(PRICING)
    with polled(lambda: deadline.check(PRICING)):  # inside one entry's search too: it may take seconds
        for edge in problem.edges:
            table = edge.table
            if table.computed == table.size:
                continue
            rows, columns = table.shape
            for row in range(rows):
                for column in range(0, columns, PRICED_AT_ONCE):
                    table[row, column:column + PRICED_AT_ONCE]
                    deadline.check(PRICING)
