"""Exact minimisation over a forest by dynamic programming, and the induced forests it runs on.

A block of nodes whose induced subgraph is a forest can be re-optimised exactly with every other
node fixed: each node's unary cost takes its edges to fixed neighbours, and one pass from the
leaves up (each child's message: the best of its strategies per parent strategy) and one down
(each child's best answer to its parent's choice) give the block's minimum. Cases: a block
node's single in-block neighbour is its parent; a root has none.
"""

from __future__ import annotations

import numpy as np

from autostrat.search.solve.arrays import Arrays


def forest_minimum(arrays: Arrays, order: list, parents: list, unary: dict) -> tuple:
    """The minimum over a forest and each node's strategy at it.

    `order` lists the forest's nodes parents first; `parents[k]` is (parent, edge) of
    `order[k]`, or None for a root; `unary[node]` is the node's cost per strategy.

    Example:
        >>> from autostrat.search.solve.instance import read_instance
        >>> arrays = Arrays(read_instance("configs/iopddl_example.json"))
        >>> unary = {group: arrays.costs[group] for group in (0, 1)}
        >>> value, chosen = forest_minimum(arrays, [0, 1], [None, (0, 0)], unary)
        >>> float(value), chosen
        (115.0, {0: 0, 1: 1})
    """
    belief = {node: np.array(unary[node], dtype=np.float64) for node in order}
    answers = {}
    for node, link in zip(reversed(order), reversed(parents)):
        if link is None:
            continue
        parent, edge = link
        table = arrays.edge_matrix(edge, parent) + belief[node][None, :]
        best = table.argmin(axis=1)
        answers[node] = best
        belief[parent] += table[np.arange(len(best)), best]
    chosen, value = {}, 0.0
    for node, link in zip(order, parents):
        if link is None:
            chosen[node] = int(belief[node].argmin())
            value += belief[node][chosen[node]]
        else:
            chosen[node] = int(answers[node][chosen[link[0]]])
    return value, chosen


def induced_forest(arrays: Arrays, seed: int, size: int) -> tuple:
    """A block of at most `size` nodes grown breadth-first from `seed` whose induced subgraph is a
    tree: a node joins only while exactly one of its neighbours is in the block.

    Returns (order, parents) as `forest_minimum` reads them.

    Example:
        >>> from autostrat.search.solve.instance import read_instance
        >>> arrays = Arrays(read_instance("configs/iopddl_example.json"))
        >>> induced_forest(arrays, 0, 5)  # a triangle: two of it
        ([0, 1], [None, (0, 0)])
    """
    inside = np.zeros(arrays.node_count, dtype=bool)
    touching = np.zeros(arrays.node_count, dtype=np.int64)  # in-block neighbours of each node
    link = {}
    order, parents, queue = [], [], [(seed, None)]
    head = 0
    while head < len(queue) and len(order) < size:
        node, via = queue[head]
        head += 1
        if inside[node] or touching[node] != (0 if via is None else 1):
            continue
        inside[node] = True
        order.append(node)
        parents.append(link.get(node) if via is not None else None)
        for neighbour, edge in arrays.neighbours[node]:
            touching[neighbour] += 1
            link[neighbour] = (node, edge)
            if not inside[neighbour]:
                queue.append((neighbour, node))
    return order, parents


def spanning_block(arrays: Arrays, seed: int, size: int) -> tuple:
    """A connected block of at most `size` nodes grown breadth-first from `seed`, with its
    breadth-first tree: (order, parents, chords), chords being the block's edges off the tree as
    (u, v, edge).

    Example:
        >>> from autostrat.search.solve.instance import read_instance
        >>> arrays = Arrays(read_instance("configs/iopddl_example.json"))
        >>> spanning_block(arrays, 0, 5)
        ([0, 1, 2], [None, (0, 0), (0, 1)], [(1, 2, 2)])
    """
    position = {seed: 0}
    order, parents = [seed], [None]
    head = 0
    while head < len(order) and len(order) < size:
        node = order[head]
        head += 1
        for neighbour, edge in arrays.neighbours[node]:
            if neighbour not in position and len(order) < size:
                position[neighbour] = len(order)
                order.append(neighbour)
                parents.append((node, edge))
    tree = {link[1] for link in parents if link is not None}
    chords = [(node, neighbour, edge) for node in order for neighbour, edge in arrays.neighbours[node]
              if edge not in tree and neighbour in position and position[neighbour] > position[node]]
    return order, parents, chords
