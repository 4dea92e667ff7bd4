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

from importlib import import_module

# The front end (and the search and solver under it) is imported on first use, so a runtime rank
# that only imports `autostrat.runtime` starts without loading the solver.
_LAZY = {
    "Callback": "autostrat.frontend.model",
    "LossMonitor": "autostrat.frontend.model",
    "Model": "autostrat.frontend.model",
    "RunContext": "autostrat.frontend.model",
    "get_auto_parallel_context": "autostrat.frontend",
    "parallelize": "autostrat.frontend.api",
    "reset_auto_parallel_context": "autostrat.frontend",
    "set_auto_parallel_context": "autostrat.frontend",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autostrat' has no attribute {name!r}")
