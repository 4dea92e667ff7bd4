"""IOPDDL instances (github.com/google/iopddl): one strategy per node, node costs, edge cost
matrices, and per-strategy memory usage over a half-open time interval under a limit.

`read_instance` reads a file (gzipped or plain JSON) into an `Instance` of numpy arrays; every
malformed part is a `ConfigError` naming the file and the key path, never a traceback.
Parallel edges between one pair of nodes are merged into one matrix (their sum) and an edge from
a node to itself folds its diagonal into the node's costs, so that the solvers see a simple graph.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass

import numpy as np

from autostrat.errors import ConfigError
from autostrat.reading import parse_json, read_bytes

WHAT = "IOPDDL instance"
# Costs at or above this mark choices the instance forbids (the contest's files use about 1e18).
FORBIDDEN = 1e17


@dataclass(frozen=True)
class Instance:
    """A sharding problem as arrays: `costs[i]` and `usages[i]` per strategy of node i,
    `intervals[i] = (start, end)`, `edges[e] = (u, v)` with u < v and `edge_costs[e]` of shape
    (strategies of u, strategies of v), and the memory `limit` (None: unconstrained).

    Example:
        >>> instance = read_instance("configs/iopddl_example.json")
        >>> instance.node_count, len(instance.edges), instance.limit
        (5, 5, 38)
    """

    name: str
    costs: tuple
    usages: tuple
    intervals: np.ndarray
    edges: np.ndarray
    edge_costs: tuple
    limit: int | None

    @property
    def node_count(self) -> int:
        return len(self.costs)

    @property
    def strategy_counts(self) -> np.ndarray:
        return np.array([len(cost) for cost in self.costs], dtype=np.int64)


def read_instance(path) -> Instance:
    """The instance in the file at `path` (gzip is recognised by its magic bytes).

    Example:
        >>> read_instance("/dev/null")
        Traceback (most recent call last):
        ...
        autostrat.errors.ConfigError: cannot read IOPDDL instance /dev/null: a character device, not a regular file
    """
    data = read_bytes(path, WHAT, limit=None)
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as error:
            raise ConfigError(f"{path}: not a readable gzip file: {error}") from None
    return parse_instance(parse_json(data, path, WHAT), path)


def parse_instance(document, path) -> Instance:
    """The instance in a parsed JSON `document` read from `path`."""
    problem = _field(document, "problem", dict, path, "")
    nodes = _field(problem, "nodes", dict, path, "problem")
    costs = _number_lists(_field(nodes, "costs", list, path, "problem.nodes"), path, "problem.nodes.costs")
    node_count = len(costs)
    usages = _number_lists(_field(nodes, "usages", list, path, "problem.nodes"), path, "problem.nodes.usages",
                           lengths=[len(cost) for cost in costs], integers=True)
    intervals = _intervals(_field(nodes, "intervals", list, path, "problem.nodes"), node_count, path)
    edges = problem.get("edges", {"nodes": [], "costs": []})
    if not isinstance(edges, dict):
        raise ConfigError(f"{path}: problem.edges: expected an object, got {type(edges).__name__}")
    pairs = _pairs(_field(edges, "nodes", list, path, "problem.edges"), node_count, path)
    sizes = [len(costs[u]) * len(costs[v]) for u, v in pairs]
    matrices = _number_lists(_field(edges, "costs", list, path, "problem.edges"), path, "problem.edges.costs",
                             lengths=sizes)
    costs, edge_list, edge_costs = _simple_graph(costs, pairs, matrices)
    return Instance(str(problem.get("name", path)), tuple(costs), tuple(usages), intervals, edge_list,
                    tuple(edge_costs), _limit(problem.get("usage_limit"), path))


def _field(mapping, key: str, kind: type, path, where: str):
    place = f"{where}.{key}" if where else key
    if not isinstance(mapping, dict) or key not in mapping:
        raise ConfigError(f"{path}: {WHAT} has no key {place}")
    value = mapping[key]
    if not isinstance(value, kind):
        raise ConfigError(f"{path}: {place}: expected a {'list' if kind is list else 'object'}, "
                          f"got {type(value).__name__}")
    return value


def _number_lists(values: list, path, place: str, lengths: list | None = None, integers: bool = False) -> list:
    if lengths is not None and len(values) != len(lengths):
        raise ConfigError(f"{path}: {place}: expected {len(lengths)} lists (one per "
                          f"{'node' if 'nodes' in place else 'edge'}), got {len(values)}")
    arrays = []
    for index, value in enumerate(values):
        array = _numbers(value, f"{place}[{index}]", path)
        if integers and array.dtype.kind == "f":  # memory is summed exactly, in integers
            raise ConfigError(f"{path}: {place}[{index}]: expected integers, got {_shown(value)}")
        if lengths is not None and len(array) != lengths[index]:
            raise ConfigError(f"{path}: {place}[{index}]: expected {lengths[index]} numbers, got {len(array)}")
        arrays.append(array)
    return arrays


def _numbers(value, place: str, path) -> np.ndarray:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{path}: {place}: expected a non-empty list of numbers, got {_shown(value)}")
    try:
        array = np.asarray(value)
    except (ValueError, OverflowError):
        array = np.asarray([])
    if array.ndim != 1 or array.dtype.kind not in "iuf" or any(isinstance(item, bool) for item in value):
        raise ConfigError(f"{path}: {place}: expected a list of numbers, got {_shown(value)}")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise ConfigError(f"{path}: {place}: expected finite numbers, got {_shown(value)}")
    if (array < 0).any():
        raise ConfigError(f"{path}: {place}: expected numbers >= 0, got {_shown(value)}")
    return array


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _intervals(values: list, node_count: int, path) -> np.ndarray:
    if len(values) != node_count:
        raise ConfigError(f"{path}: problem.nodes.intervals: expected {node_count} intervals (one per node), "
                          f"got {len(values)}")
    for index, value in enumerate(values):
        if not (isinstance(value, list) and len(value) == 2 and all(_is_integer(item) for item in value)):
            raise ConfigError(f"{path}: problem.nodes.intervals[{index}]: expected [start, end] of two integers, "
                              f"got {_shown(value)}")
    return np.array(values, dtype=np.int64).reshape(node_count, 2)


def _pairs(values: list, node_count: int, path) -> list:
    for index, value in enumerate(values):
        if not (isinstance(value, list) and len(value) == 2
                and all(_is_integer(item) and 0 <= item < node_count for item in value)):
            raise ConfigError(f"{path}: problem.edges.nodes[{index}]: expected [u, v], two node indices below "
                              f"{node_count}, got {_shown(value)}")
    return [tuple(value) for value in values]


def _is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _limit(value, path) -> int | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{path}: problem.usage_limit: expected a number >= 0, got {_shown(value)}")
    return value


def _simple_graph(costs: list, pairs: list, matrices: list) -> tuple:
    """Node costs with self-loops folded in, and one matrix per unordered node pair (u < v)."""
    costs = list(costs)
    merged: dict = {}
    for (u, v), flat in zip(pairs, matrices):
        matrix = flat.reshape(len(costs[u]), len(costs[v]))
        if u == v:  # both ends take the same strategy: only the diagonal can occur
            costs[u] = costs[u] + np.diagonal(matrix)
            continue
        if u > v:
            u, v, matrix = v, u, matrix.T
        merged[(u, v)] = merged[(u, v)] + matrix if (u, v) in merged else matrix
    keys = sorted(merged)
    edges = np.array(keys, dtype=np.int64).reshape(len(keys), 2)
    return costs, edges, [np.ascontiguousarray(merged[key]) for key in keys]
