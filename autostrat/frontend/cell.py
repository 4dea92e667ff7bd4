"""Cell: the MindSpore way to write a model. Subclass, create sub-cells, parameters and
primitives in `__init__`, and say what they compute in `construct`."""

from __future__ import annotations

import warnings
from typing import Iterator

from autostrat.errors import ConfigError
from autostrat.frontend import tracing
from autostrat.frontend.mindspore_keys import warn_once
from autostrat.frontend.primitive import Primitive, primitive_classes
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

    def __init__(self, auto_prefix: bool = True, flags=None):
        object.__setattr__(self, "_children", {})
        object.__setattr__(self, "training", False)
        # MindSpore's auto_prefix: False for wrappers (WithLossCell, TrainOneStepCell,
        # PipelineCell), whose sub-cells' parameters keep the names the wrapped network gave
        # them (``dense1.weight``, not ``backbone.dense1.weight``): strategy and parameter
        # checkpoints then name the same tensors as MindSpore's.
        object.__setattr__(self, "_auto_prefix", auto_prefix)
        if flags:
            warnings.warn(f"{type(self).__name__}: Cell flags {flags!r} are accepted and have no effect in autostrat "
                          f"(they steer MindSpore's graph compiler)", stacklevel=2)

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, (Cell, Parameter, Primitive)):
            if "_children" not in self.__dict__:
                raise ConfigError(f"{type(self).__name__}.__init__ must call super().__init__() before setting {name!r}")
            self._children[name] = value
        object.__setattr__(self, name, value)

    def construct(self, *inputs):
        raise NotImplementedError(f"{type(self).__name__} must define construct()")

    def __call__(self, *inputs):
        if not tracing.is_tracing():
            from autostrat.frontend import bare_call  # it plans with what imports this module

            # A call outside a trace is a whole network's: under a planning parallel mode it is
            # planned and run on the ranks, as MindSpore compiles it; otherwise run eagerly.
            return bare_call.run_planned(self, inputs) if bare_call.is_planned(inputs) else self.construct(*inputs)
        counts = self.__dict__.get("_shard")
        if counts is None:
            return self.construct(*inputs)
        if len(inputs) != counts[0]:
            raise ConfigError(f"{type(self).__name__}.shard: {counts[0]} input strategies for {len(inputs)} inputs")
        inputs = [self._shard_through(f"shard_input_{i}", x) for i, x in enumerate(inputs)]
        outputs = self.construct(*inputs)
        if not counts[1]:
            return outputs
        if isinstance(outputs, tuple):
            return tuple(self._shard_through(f"shard_output_{i}", y) for i, y in enumerate(outputs))
        return self._shard_through("shard_output_0", outputs)

    def _shard_through(self, name: str, tensor):
        identity = self.__dict__.get(name)
        return tensor if identity is None else identity(tensor)

    def shard(self, in_strategy, out_strategy=None, parameter_plan=None, device=None, level: int = 0) -> Cell:
        """MindSpore 2.x's cell-level ``shard``: the cell's inputs enter (and, with `out_strategy`,
        its outputs leave) through Identity ops seeded with one strategy per tensor (None: not
        seeded), named ``<cell>.shard_input_<i>``, so the search propagates from those layouts.
        `device` and `level` are accepted; a `parameter_plan` is refused (seed the ops reading
        the parameters instead).

        Example:
            >>> from autostrat.frontend.tracing import trace
            >>> from autostrat.frontend.tensor import Tensor
            >>> from autostrat.models import FFN
            >>> net = FFN().shard(((8, 1),))
            >>> trace(net, Tensor(shape=(64, 64)), device_num=8).ops["shard_input_0"].in_strategy
            ((8, 1),)
        """
        if parameter_plan is not None:
            raise ConfigError(f"{type(self).__name__}.shard: parameter_plan is not supported; shard the ops reading the "
                              f"parameters instead (op.shard)")
        identity = primitive_classes()["Identity"]
        for kind, strategies in (("input", in_strategy), ("output", out_strategy or ())):
            if not isinstance(strategies, (tuple, list)):
                raise ConfigError(f"{type(self).__name__}.shard: {kind} strategies must be a tuple with one per tensor, "
                                  f"such as ((2, 1), None), got {strategies!r}")
            for index, strategy in enumerate(strategies):
                if strategy is not None:
                    setattr(self, f"shard_{kind}_{index}", identity().shard((tuple(strategy),)))
        object.__setattr__(self, "_shard", (len(in_strategy), len(out_strategy or ())))
        return self

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

    def set_comm_fusion(self, fusion_type: int, recurse: bool = True) -> Cell:
        """MindSpore's gradient-fusion buckets: accepted with one warning, no effect (autostrat
        sends each gradient's collective on its own)."""
        if not isinstance(fusion_type, int) or isinstance(fusion_type, bool) or fusion_type < 0:
            raise ConfigError(f"{type(self).__name__}.set_comm_fusion: fusion_type must be a non-negative integer, got {fusion_type!r}")
        warn_once("set_comm_fusion", "Cell.set_comm_fusion is accepted and has no effect in autostrat (each gradient's "
                  "collective is sent on its own, unfused)", stacklevel=2)
        return self

    def _walk(self, prefix: str = "", parameter_names: bool = False) -> Iterator[tuple[str, object]]:
        for name, child in self._children.items():
            path = f"{prefix}{name}"
            yield path, child
            if isinstance(child, Cell):
                inner = prefix if parameter_names and not self._auto_prefix else path + "."
                yield from child._walk(inner, parameter_names)

    def cells_and_names(self) -> Iterator[tuple[str, Cell]]:
        yield "", self
        yield from ((p, c) for p, c in self._walk() if isinstance(c, Cell))

    def _unique(self, kind: type, parameter_names: bool = False) -> Iterator[tuple[str, object]]:
        """Every child of `kind` once, under the first path that reaches it (tied weights)."""
        seen: set[int] = set()
        paths: set[str] = set()
        for path, child in self._walk(parameter_names=parameter_names):
            if isinstance(child, kind) and id(child) not in seen:
                if path in paths:
                    raise ConfigError(f"{type(self).__name__}: two {kind.__name__}s are both named {path!r} (a cell with "
                                      f"auto_prefix=False holds sub-cells naming their children alike)")
                seen.add(id(child))
                paths.add(path)
                yield path, child

    def parameters_and_names(self) -> Iterator[tuple[str, Parameter]]:
        """Every parameter once, named by its attribute path, without the names of the cells
        between it and a wrapper with ``auto_prefix=False``, as MindSpore names it.

        Example:
            >>> from autostrat import nn
            >>> from autostrat.models import FFN
            >>> loss = nn.WithLossCell(FFN(), nn.SoftmaxCrossEntropyWithLogits(sparse=True))
            >>> [name for name, _ in loss.parameters_and_names()][:2]
            ['dense1.weight', 'dense1.bias']
        """
        return self._unique(Parameter, parameter_names=True)

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


class SequentialCell(Cell):
    """Cells run one after the other (MindSpore's ``nn.SequentialCell``), from a list (named by
    index: ``layers.0.relu``) or a dict of names to cells (an ``OrderedDict``).

    Example:
        >>> from autostrat import nn
        >>> net = SequentialCell([nn.Dense(4, 8), nn.ReLU()])
        >>> [name for name, _ in net.primitives_and_names()]
        ['0.matmul', '0.bias_add', '1.relu']
    """

    def __init__(self, *args):
        super().__init__()
        cells = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple, dict)) else args
        named = cells.items() if isinstance(cells, dict) else ((str(i), cell) for i, cell in enumerate(cells))
        for name, cell in named:
            if not isinstance(cell, Cell):
                raise ConfigError(f"SequentialCell: entry {name!r} must be a Cell, got {type(cell).__name__}")
            setattr(self, name, cell)

    def __getitem__(self, index: int) -> Cell:
        return list(self._children.values())[index]

    def __len__(self) -> int:
        return len(self._children)

    def construct(self, x):
        for cell in self._children.values():
            x = cell(x)
        return x


def shard(fn, in_strategy, out_strategy=None, parameter_plan=None, device=None, level: int = 0) -> Cell:
    """MindSpore 2.x's functional ``ms.shard(cell, in_strategy, ...)``: `Cell.shard` on `fn`.
    MindSpore also shards plain functions; autostrat plans Cells, so a function is refused.

    Example:
        >>> from autostrat.models import FFN
        >>> shard(FFN(), ((8, 1),)).__dict__["_shard"]
        (1, 0)
    """
    if not isinstance(fn, Cell):
        raise ConfigError(f"shard: expected a Cell, got {type(fn).__name__} (autostrat shards Cells, not functions: "
                          f"wrap the function's computation in a Cell's construct)")
    return fn.shard(in_strategy, out_strategy, parameter_plan, device, level)


def recomputed_cells(net: Cell) -> tuple[str, ...]:
    """The paths of `net`'s cells marked with `Cell.recompute` ("" is `net` itself) and of its
    primitives marked with `Primitive.recompute` (an op's name is its primitive's path)."""
    cells = tuple(path for path, cell in net.cells_and_names() if cell.__dict__.get("_recompute", False))
    return cells + tuple(path for path, primitive in net.primitives_and_names() if primitive.recomputed)
