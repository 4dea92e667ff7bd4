"""MindSpore's high-dimension tensor parallel (``MatMul().add_prim_attr("enable_nd_tp", True)``):
a MatMul whose Layouts split the activation and the weight on more axes than one product can
use; MindSpore gathers the extra axes before the product and reduce-scatters its partial sum after.

    layout = Layout((2, 4), ("x", "y"))
    matmul.add_prim_attr("enable_nd_tp", True)
    matmul.shard(in_strategy=(layout("None", ("x", "y")), layout("x", "y")))

Here the activation's reduction dim lies on (x, y) and the weight's on x only: the activation is
gathered over y (AllGather), the product runs on k over x and n over y, and its partial sum
over x is scattered into n (ReduceScatter), which leaves n on (y, x). autostrat says the same
with three seeds (`nd_tp_layouts`): the layout the activation arrives in, the product's own
layouts (an ordinary MatMul strategy), and the layout its output leaves in; the edges between
them are the gathers and the scatter. Cases of a factor of the product (batch b, rows m,
reduction k, columns n):

- k (and b) on the axes both operands give it, in the activation's order;
- m on the activation's axes that the weight does not give n (an axis splits one factor);
- n on the weight's axes;
- the output: as the product, but the reduction axes follow m's when the product splits m (the
  3-D form: MindSpore scatters the rows), else n's (the 2-D form: it scatters the columns); the
  scatter splits each block again, so they come last.

MindSpore 2.10's IR shows both forms (tests/fixtures/mindspore/README.md, ``layout2d``).
"""

from __future__ import annotations

from autostrat.errors import LayoutError
from autostrat.layout.named import NONE, NamedLayout

INPUT, OUTPUT = ".nd_tp_input", ".nd_tp_output"  # the seeded Identity ops around the product: <op>.nd_tp_input


def gathers_by_design(producer: str, consumer: str) -> bool:
    """Whether the edge from op `producer` to op `consumer` is one of a ``enable_nd_tp`` MatMul's
    own gathers or scatters (its seeds differ there on purpose).

    Example:
        >>> gathers_by_design("matmul1.nd_tp_input", "matmul1"), gathers_by_design("relu", "matmul1")
        (True, False)
    """
    return producer == consumer + INPUT or consumer == producer + OUTPUT


def _factor_names(layout: NamedLayout, dims) -> dict[str, tuple[str, ...]]:
    """Per factor of the operand whose dims are `dims` (one factor each), its axis names."""
    found = {}
    for factors, name in zip(dims, layout.names):
        if len(factors) != 1:
            raise LayoutError(f"enable_nd_tp: each dim must be one factor of the MatMul, got {factors}")
        found[factors[0]] = () if name == NONE else tuple(name) if isinstance(name, tuple) else (name,)
    return found


def _names(axes: tuple[str, ...]):
    return NONE if not axes else axes[0] if len(axes) == 1 else axes


def nd_tp_layouts(rule, in_strategy, where: str) -> tuple[NamedLayout, tuple[NamedLayout, NamedLayout], NamedLayout]:
    """The activation's layout, the product's two input layouts, and the output's layout of a
    MatMul (or BatchMatMul) sharded by `in_strategy` with ``enable_nd_tp``.

    Example (high_dimension_tensor_parallel.py's first MatMul):
        >>> from autostrat.rules import make_rule
        >>> layout = NamedLayout((2, 4), ("x", "y"))
        >>> rule = make_rule("MatMul", [(1024, 256), (256, 512)])
        >>> given, product, out = nd_tp_layouts(rule, (layout("None", ("x", "y")), layout("x", "y")), "matmul1")
        >>> given.names, [p.names for p in product], out.names
        (('None', ('x', 'y')), [('None', 'x'), ('x', 'y')], ('None', ('y', 'x')))
    """
    if len(in_strategy) != 2 or not all(isinstance(layout, NamedLayout) and layout.names for layout in in_strategy):
        raise LayoutError(f"{where}: enable_nd_tp needs two Layouts (activation, weight) as in_strategy, "
                          f"got {in_strategy!r}")
    activation, weight = in_strategy
    if (activation.device_matrix, activation.alias_name) != (weight.device_matrix, weight.alias_name):
        raise LayoutError(f"{where}: enable_nd_tp: both Layouts must name one device matrix, got {activation} and {weight}")
    if len(activation.names) != len(rule.inputs[0]) or len(weight.names) != len(rule.inputs[1]):
        raise LayoutError(f"{where}: enable_nd_tp: the Layouts name {len(activation.names)} and {len(weight.names)} dims; "
                          f"the inputs have {len(rule.inputs[0])} and {len(rule.inputs[1])}")
    given, held = _factor_names(activation, rule.inputs[0]), _factor_names(weight, rule.inputs[1])
    columns = {axis for factor, axes in held.items() if factor not in given for axis in axes}
    product = {}
    for factor in rule.factors:
        if factor in given and factor in held:  # k, and a batch factor
            product[factor] = tuple(axis for axis in given[factor] if axis in held[factor])
        elif factor in given:  # m
            product[factor] = tuple(axis for axis in given[factor] if axis not in columns)
        else:  # n
            product[factor] = held.get(factor, ())
    reduced = tuple(axis for factor in rule.reduction for axis in product[factor])
    rows = [factor for factor in rule.factors if factor in given and factor not in held and product[factor]]
    scattered = rows[0] if rows else next(factor for factor in rule.factors if factor in held and factor not in given)
    out = {factor: product[factor] + (reduced if factor == scattered else ()) for factor in rule.factors}

    def layout_of(dims, axes_of):
        return activation(*(_names(axes_of[factors[0]]) for factors in dims))
    return (activation, (layout_of(rule.inputs[0], product), layout_of(rule.inputs[1], product)),
            layout_of(rule.outputs[0], out))
