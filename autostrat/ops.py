"""Primitives, one per registered op, MindSpore style: ``ops.MatMul().shard(((2, 1), (1, 4)))``,
and their functional forms (``ops.matmul(x, w)``).

Example:
    >>> from autostrat import ops
    >>> matmul = ops.MatMul(transpose_b=True)
    >>> matmul.attrs, ops.ReduceSum(True).call_attrs
    ({'transpose_b': True}, ('axis',))
"""

from autostrat.frontend.primitive import Primitive, functional_ops, primitive_classes

globals().update(primitive_classes())
globals().update(functional_ops())  # MindSpore 2.x's functional forms: ops.matmul(x, w), ops.relu(x)...
__all__ = ["Primitive", *primitive_classes(), *functional_ops()]
