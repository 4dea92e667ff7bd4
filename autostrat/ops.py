"""Primitives, one per registered op, MindSpore style: ``ops.MatMul().shard(((2, 1), (1, 4)))``,
and their functional forms (``ops.matmul(x, w)``).

Example:
    >>> from autostrat import ops
    >>> matmul = ops.MatMul(transpose_b=True)
    >>> matmul.attrs, ops.ReduceSum(True).call_attrs
    ({'transpose_b': True}, ('axis',))
"""

from autostrat.frontend.functional import grad, value_and_grad  # MindSpore: mindspore.ops.value_and_grad as well
from autostrat.frontend.primitive import Flatten, Primitive, Print, functional_ops, primitive_classes

globals().update(primitive_classes())
globals().update(functional_ops())  # MindSpore 2.x's functional forms: ops.matmul(x, w), ops.relu(x)...
__all__ = ["Flatten", "Primitive", "Print", "grad", "value_and_grad", *primitive_classes(), *functional_ops()]
