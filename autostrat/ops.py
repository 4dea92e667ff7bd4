"""Primitives, one per registered op, MindSpore style: ``ops.MatMul().shard(((2, 1), (1, 4)))``.

Example:
    >>> from autostrat import ops
    >>> matmul = ops.MatMul(transpose_b=True)
    >>> matmul.attrs, ops.ReduceSum(True).call_attrs
    ({'transpose_b': True}, ('axis',))
"""

from autostrat.frontend.primitive import Primitive, primitive_classes

globals().update(primitive_classes())
__all__ = ["Primitive", *primitive_classes()]
