"""Cell: the MindSpore way to write a model. Subclass, create sub-cells, parameters and
primitives in `__init__`, and say what they compute in `construct`."""

from __future__ import annotations

from typing import Iterator

from autostrat.errors import ConfigError
from autostrat.frontend.primitive import Primitive
from autostrat.frontend.tensor import Parameter


class Cell:
    """Base class of models and layers.

    Attributes that are Cells, Parameters or primitives are registered in assignment order;
    their attribute paths name them in the graph (``dense1.matmul``, ``dense1.weight``).

    Example:
        >>> from autostrat import ops
        >>> class Net(Cell):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.relu = ops.ReLU()
        ...     def construct(self, x):
        ...         return self.relu(x)
        >>> [name for name, _ in Net().primitives_and_names()]
        ['relu']
    """

    def __init__(self):
        object.__setattr__(self, "_children", {})
        object.__setattr__(self, "training", False)

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, (Cell, Parameter, Primitive)):
            if "_children" not in self.__dict__:
                raise ConfigError(f"{type(self).__name__}.__init__ must call super().__init__() before setting {name!r}")
            self._children[name] = value
        object.__setattr__(self, name, value)

    def construct(self, *inputs):
        raise NotImplementedError(f"{type(self).__name__} must define construct()")

    def __call__(self, *inputs):
        return self.construct(*inputs)

    def set_train(self, mode: bool = True) -> Cell:
        """Training mode for this cell and its sub-cells (Dropout drops only in training)."""
        for _, cell in self.cells_and_names():
            object.__setattr__(cell, "training", mode)
        return self

    def recompute(self, **kwargs) -> Cell:
        """Keep only this cell's inputs for the backward and run its forward again there
        (MindSpore's ``Cell.recompute``): less activation memory, one more forward of the cell
        per step (`autodiff.recompute`). MindSpore's options ``mp_comm_recompute`` (the cell's
        redistributions are recomputed too: here they always are) and
        ``parallel_optimizer_comm_recompute`` are accepted; others are refused.

        Example:
            >>> from autostrat.models import FFN
            >>> net = FFN()
            >>> _ = net.dense1.recompute()
            >>> recomputed_cells(net)
            ('dense1',)
        """
        unknown = sorted(set(kwargs) - {"mp_comm_recompute", "parallel_optimizer_comm_recompute", "recompute_slice_activation"})
        if unknown:
            raise ConfigError(f"{type(self).__name__}.recompute: unknown option {unknown[0]!r}; valid options: "
                              "mp_comm_recompute, parallel_optimizer_comm_recompute, recompute_slice_activation")
        object.__setattr__(self, "_recompute", True)
        return self

    def _walk(self, prefix: str = "") -> Iterator[tuple[str, object]]:
        for name, child in self._children.items():
            path = f"{prefix}{name}"
            yield path, child
            if isinstance(child, Cell):
                yield from child._walk(path + ".")

    def cells_and_names(self) -> Iterator[tuple[str, Cell]]:
        yield "", self
        yield from ((p, c) for p, c in self._walk() if isinstance(c, Cell))

    def _unique(self, kind: type) -> Iterator[tuple[str, object]]:
        """Every child of `kind` once, under the first path that reaches it (tied weights)."""
        seen: set[int] = set()
        for path, child in self._walk():
            if isinstance(child, kind) and id(child) not in seen:
                seen.add(id(child))
                yield path, child

    def parameters_and_names(self) -> Iterator[tuple[str, Parameter]]:
        return self._unique(Parameter)

    def trainable_params(self) -> list[Parameter]:
        """The parameters an optimiser updates (``requires_grad``), as MindSpore lists them."""
        return [p for _, p in self.parameters_and_names() if p.requires_grad]

    def primitives_and_names(self) -> Iterator[tuple[str, Primitive]]:
        return self._unique(Primitive)


class CellList(Cell):
    """A list of cells, named by their index (``layers.0.dense``)."""

    def __init__(self, cells):
        super().__init__()
        for index, cell in enumerate(cells):
            setattr(self, str(index), cell)

    def __getitem__(self, index: int) -> Cell:
        return getattr(self, str(index))

    def __len__(self) -> int:
        return len(self._children)

    def __iter__(self):
        return iter(self._children.values())


def recomputed_cells(net: Cell) -> tuple[str, ...]:
    """The paths of `net`'s cells marked with `Cell.recompute` ("" is `net` itself)."""
    return tuple(path for path, cell in net.cells_and_names() if cell.__dict__.get("_recompute", False))
