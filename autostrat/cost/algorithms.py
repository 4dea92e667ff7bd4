"""Collective algorithms as choices: their bytes per member and α–β time, and the choice per step.

A collective step (kind, group, local piece of ``s`` bytes) can run as one of several
algorithms, all moved as point-to-point messages by `runtime.wire` (which never reads this
module). For a group of g members; ``m × k`` when it spans m servers with k members on each:

- ``ring`` (every kind; DESIGN §3's formulas, `collective.collective_bytes`): ``g - 1`` messages
  per member (AllReduce ``2(g - 1)``), timed at the slowest link the group spans.
- ``doubling`` (AllReduce): recursive doubling. With ``p`` the largest power of two ≤ g and
  ``r = g - p``, the first ``2r`` members fold in: each odd one sends its piece to the even one
  before it and later takes the result back; the ``p`` remaining members exchange whole pieces
  with the member ``2^j`` away in round j. ``log2 p`` rounds (``+2`` when r > 0) of ``s`` bytes
  each, at the slowest link: latency-bound steps (small pieces, large groups) are its case. It
  sends more bytes than a ring (``(log2 p + [r > 0])·s`` at the busiest member).
- ``hierarchical:K`` (AllReduce, AllGather, ReduceScatter), servers of K devices (ranks
  ``K·i .. K·i + K - 1``), for a group with the same k > 1 members on each of m > 1 servers:
  AllReduce is a ring ReduceScatter inside each server (its k chunks, `numpy.array_split`), a
  ring AllReduce of the member's chunk across servers (the members of one index inside their
  server), and a ring AllGather inside; AllGather gathers across servers first, then the
  bundles of m pieces inside; ReduceScatter reduces super-blocks (the m blocks of one index
  inside a server) inside first, then across. The same bytes as a ring (AllReduce: up to the
  chunks' rounding), of which only ``1/k`` cross servers, each phase timed at its own link.

Time of an algorithm: per phase, its messages along the critical path times α (whole
nanoseconds) plus the bytes of the phase's busiest member over β, rounded up (`ceil_nanoseconds`);
a ring is exactly `AlphaBeta.step_nanoseconds`. Choice (`choose_algorithm`): under the time
objective the fastest (then fewer bytes, then the order above); under the bytes objective the
ring or a hierarchical algorithm, the fewest bytes, then the fastest: recursive doubling, which
sends more bytes (as many for 2 members), is chosen only under the time objective, so plans of
the bytes objective inside one server keep their rings, and the bytes objective keeps counting
bytes sent per device. Non-power-of-two groups fold in as above (recursive doubling is never refused for them).
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache

from autostrat.cost.collective import collective_bytes
from autostrat.cost.time_model import AlphaBeta, ceil_nanoseconds
from autostrat.errors import LayoutError
from autostrat.layout import DeviceMatrix

ALGORITHMS = {"AllGather": ("ring", "hierarchical"), "AllReduce": ("ring", "doubling", "hierarchical"),
              "ReduceScatter": ("ring", "hierarchical")}


def algorithm_name(algorithm: str) -> str:
    """The name of an algorithm spec: ``"hierarchical:4"`` -> ``"hierarchical"``."""
    return algorithm.split(":")[0]


def server_size(algorithm: str) -> int:
    """Devices per server of a ``hierarchical:K`` spec.

    Example:
        >>> server_size("hierarchical:4")
        4
    """
    name, _, size = algorithm.partition(":")
    if name != "hierarchical" or not size.isdigit() or int(size) < 1:
        raise LayoutError(f"a hierarchical algorithm is written 'hierarchical:K' (K devices per server), got {algorithm!r}")
    return int(size)


def _doubling_bytes(g: int, s: int, position: int | None) -> int:
    if g == 1:
        return 0
    power = 1 << (g.bit_length() - 1)
    rounds, extra = power.bit_length() - 1, g - power
    if position is None:
        return (rounds + (extra > 0)) * s
    if position < 2 * extra:
        return s if position % 2 else (rounds + 1) * s
    return rounds * s


def _chunks(n: int, parts: int) -> list[int]:
    """Element counts of `numpy.array_split` of n elements into `parts`."""
    q, r = divmod(n, parts)
    return [q + (i < r) for i in range(parts)]


def hierarchical_bytes(kind: str, servers: int, per_server: int, local_bytes: int, itemsize: int = 1,
                       position: tuple[int, int] | None = None) -> int:
    """Bytes one member sends in a hierarchical `kind` over `servers` × `per_server` members;
    `position` is (its server's index, its index inside the server), None for the busiest.

    Example (2 servers of 4; the ring sends the same bytes):
        >>> hierarchical_bytes("AllGather", 2, 4, 100), collective_bytes("AllGather", 8, 100)
        (700, 700)
        >>> hierarchical_bytes("AllReduce", 2, 4, 32, 4), collective_bytes("AllReduce", 8, 32, 4)
        (56, 56)
    """
    m, k, s = servers, per_server, local_bytes
    if kind == "AllGather":
        return (m - 1) * s + (k - 1) * m * s
    if kind == "ReduceScatter":
        block = -(-s // (m * k))
        return (k - 1) * m * block + (m - 1) * block
    if kind != "AllReduce":
        raise LayoutError(f"no hierarchical {kind}: only {sorted(ALGORITHMS)}")
    if s % itemsize:
        raise LayoutError(f"AllReduce of {s} bytes is no whole number of {itemsize}-byte elements")
    return max(_hierarchical_member(m, k, s // itemsize, q, i) for q, i in _positions(m, k, position)) * itemsize


def _positions(m: int, k: int, position):
    return [position] if position is not None else [(q, i) for q in range(m) for i in range(k)]


def _hierarchical_member(m: int, k: int, n: int, server: int, index: int) -> int:
    """Elements member (server, index) sends: inside ReduceScatter, across AllReduce, inside AllGather."""
    chunks = _chunks(n, k)
    across = collective_bytes("AllReduce", m, chunks[index], 1, server)
    return (n - chunks[index]) + across + (n - chunks[(index + 1) % k])


def algorithm_bytes(kind: str, algorithm: str, group_size: int, local_bytes: int, itemsize: int = 1,
                    position=None, servers: int = 1) -> int:
    """Bytes one member sends in `kind` run as `algorithm` over `group_size` members on
    `servers` servers (hierarchical: equally many on each); `position` is the member's index in
    the group (ring, doubling) or (server index, index inside) (hierarchical), None for the busiest.

    Example (an AllReduce of 1 KiB over 8 members: recursive doubling sends 3 KiB, the ring 1.75):
        >>> algorithm_bytes("AllReduce", "doubling", 8, 1024), algorithm_bytes("AllReduce", "ring", 8, 1024)
        (3072, 1792)
    """
    name = algorithm_name(algorithm)
    if name not in ALGORITHMS.get(kind, ("ring",)):
        raise LayoutError(f"{kind} has no algorithm {algorithm!r}; it has {ALGORITHMS.get(kind, ('ring',))}")
    if name == "ring":
        return collective_bytes(kind, group_size, local_bytes, itemsize, position)
    if name == "doubling":
        return _doubling_bytes(group_size, local_bytes, position)
    return hierarchical_bytes(kind, servers, group_size // servers, local_bytes, itemsize, position)


@lru_cache(maxsize=1 << 12)
def placement(model: AlphaBeta, matrix: DeviceMatrix, axes: tuple[int, ...]) -> tuple[int, int, int] | None:
    """``(servers, members per server, devices per server)`` of the groups over `axes` of
    `matrix` when every group has the same k > 1 members on each of m > 1 servers of `model`
    (a two-axis model: servers × devices per server); None when no hierarchy applies."""
    if model.device_matrix.ndim != 2:
        return None
    size = model.device_matrix.shape[1]
    shapes = set()
    for group in matrix.groups(axes):
        counts = set(Counter(rank // size for rank in group).values())
        if len(counts) != 1:
            return None
        shapes.add((len(group) // counts.pop(), len(group)))
    if len(shapes) != 1:
        return None
    servers, members = shapes.pop()
    if servers < 2 or members // servers < 2:
        return None
    return servers, members // servers, size


def _phase(messages: int, sent: int, link: tuple[float, float]) -> int:
    return messages * round(link[0] * 1e9) + ceil_nanoseconds(sent, link[1])


def algorithm_nanoseconds(model: AlphaBeta, kind: str, algorithm: str, matrix: DeviceMatrix, axes, local_bytes: int,
                          itemsize: int = 1) -> int:
    """Whole nanoseconds of one step of `kind` over `axes` of `matrix` run as `algorithm` under
    `model`, for a local piece of `local_bytes` (module docstring).

    Example (small AllReduce over 16 devices, 2 servers of 8: the ring pays 30 messages across
    servers, recursive doubling 4, the hierarchical 14 inside and 2 across):
        >>> from autostrat.cost import Hardware
        >>> model, matrix = Hardware().alpha_beta(16), DeviceMatrix((16,))
        >>> [algorithm_nanoseconds(model, "AllReduce", a, matrix, (0,), 64, 4) for a in ("ring", "doubling", "hierarchical:8")]
        [120003, 16006, 36003]
    """
    axes, name = tuple(axes), algorithm_name(algorithm)
    group = math.prod(matrix.axis_size(axis) for axis in axes)
    if name == "ring":
        return model.step_nanoseconds(kind, matrix, axes, collective_bytes(kind, group, local_bytes, itemsize))
    if name == "doubling":
        power = 1 << (group.bit_length() - 1)
        rounds = power.bit_length() - 1 + 2 * (group > power)
        return model.fixed_nanoseconds() + _phase(rounds, rounds * local_bytes, model.link(matrix, axes))
    found = placement(model, matrix, axes)
    if found is None or found[2] != server_size(algorithm):
        raise LayoutError(f"{algorithm} needs groups spread evenly over servers of {server_size(algorithm)}; "
                          f"axes {axes} of {matrix} are not")
    return model.fixed_nanoseconds() + _hierarchical_nanoseconds(model, kind, found[0], found[1], local_bytes, itemsize)


def _hierarchical_nanoseconds(model: AlphaBeta, kind: str, m: int, k: int, s: int, itemsize: int) -> int:
    inside, across = (model.latency[0], model.bandwidth[0]), (model.latency[1], model.bandwidth[1])
    if kind == "AllGather":
        return _phase(m - 1, (m - 1) * s, across) + _phase(k - 1, (k - 1) * m * s, inside)
    if kind == "ReduceScatter":
        block = -(-s // (m * k))
        return _phase(k - 1, (k - 1) * m * block, inside) + _phase(m - 1, (m - 1) * block, across)
    n = s // itemsize
    chunks = _chunks(n, k)
    scatter = (n - min(chunks)) * itemsize  # the busiest member of each inside phase
    across_bytes = collective_bytes("AllReduce", m, max(chunks)) * itemsize
    return 2 * _phase(k - 1, scatter, inside) + _phase(2 * (m - 1), across_bytes, across)


def candidate_algorithms(model: AlphaBeta, kind: str, matrix: DeviceMatrix, axes) -> tuple[str, ...]:
    """The algorithms a step of `kind` over `axes` of `matrix` can run as, in the order of the
    module docstring (ties go to the first)."""
    found = []
    for name in ALGORITHMS.get(kind, ("ring",)):
        if name == "hierarchical":
            spread = placement(model, matrix, tuple(axes))
            if spread is not None:
                found.append(f"hierarchical:{spread[2]}")
        else:
            found.append(name)
    return tuple(found)


@lru_cache(maxsize=1 << 14)
def choose_algorithm(model: AlphaBeta, kind: str, matrix: DeviceMatrix, axes: tuple[int, ...], local_bytes: int,
                     itemsize: int, objective: str) -> tuple[str, int, int]:
    """``(algorithm, nanoseconds, bytes of the busiest member)`` of the best way to run one step
    under `objective` ("time": fastest first; "bytes": fewest bytes first; module docstring).

    Example (a 64-byte AllReduce over one 8-device server: the time objective takes recursive
    doubling, the bytes objective keeps the ring):
        >>> from autostrat.cost import Hardware
        >>> model, matrix = Hardware().alpha_beta(8), DeviceMatrix((8,))
        >>> choose_algorithm(model, "AllReduce", matrix, (0,), 64, 4, "time")
        ('doubling', 6001, 192)
        >>> choose_algorithm(model, "AllReduce", matrix, (0,), 64, 4, "bytes")
        ('ring', 28001, 112)
    """
    if objective not in ("bytes", "time"):
        raise LayoutError(f"an algorithm is chosen for objective 'bytes' or 'time', got {objective!r}")
    group = math.prod(matrix.axis_size(axis) for axis in axes)
    options = []
    for order, algorithm in enumerate(candidate_algorithms(model, kind, matrix, axes)):
        if objective == "bytes" and algorithm == "doubling":
            continue  # a latency choice only (module docstring)
        servers = placement(model, matrix, axes)[0] if algorithm.startswith("hierarchical") else 1
        sent = algorithm_bytes(kind, algorithm, group, local_bytes, itemsize, None, servers)
        time = algorithm_nanoseconds(model, kind, algorithm, matrix, axes, local_bytes, itemsize)
        options.append(((time, sent, order) if objective == "time" else (sent, time, order), algorithm, time, sent))
    _, algorithm, time, sent = min(options)
    return algorithm, time, sent
