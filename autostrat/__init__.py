"""autostrat: automatic parallel-strategy search (MindSpore-style sharding propagation).

Example:
    >>> import autostrat
    >>> from autostrat import nn
    >>> from autostrat.models import FFN
    >>> autostrat.set_auto_parallel_context(parallel_mode="auto_parallel", search_mode="sharding_propagation", device_num=8)
    >>> net = FFN()
    >>> _ = net.dense1.matmul.shard(((2, 1), (1, 4)))
    >>> autostrat.parallelize(net, nn.Tensor(shape=(64, 64))).total_bytes
    6144
    >>> autostrat.reset_auto_parallel_context()
"""

from autostrat.frontend import get_auto_parallel_context, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.frontend.api import parallelize

__all__ = ["get_auto_parallel_context", "parallelize", "reset_auto_parallel_context", "set_auto_parallel_context"]
