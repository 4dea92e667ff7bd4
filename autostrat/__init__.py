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
# `import autostrat as ms` gives a MindSpore script the names it uses (`ms.Tensor`, `ms.float32`,
# `ms.set_context`, `ms.nn`...).
_LAZY = {
    "Callback": "autostrat.frontend.model",
    "GRAPH_MODE": "autostrat.frontend.ms_context",
    "Layout": "autostrat.parallel",
    "LossMonitor": "autostrat.frontend.model",
    "Model": "autostrat.frontend.model",
    "PYNATIVE_MODE": "autostrat.frontend.ms_context",
    "Parameter": "autostrat.frontend.tensor",
    "ParallelMode": "autostrat.frontend.ms_context",
    "RunContext": "autostrat.frontend.model",
    "Tensor": "autostrat.frontend.tensor",
    "get_auto_parallel_context": "autostrat.frontend",
    "get_context": "autostrat.frontend.ms_context",
    "grad": "autostrat.frontend.functional",
    "jit": "autostrat.frontend.functional",
    "load_checkpoint": "autostrat.frontend.serialization",
    "load_param_into_net": "autostrat.frontend.serialization",
    "parallelize": "autostrat.frontend.api",
    "reset_auto_parallel_context": "autostrat.frontend",
    "save_checkpoint": "autostrat.frontend.serialization",
    "set_auto_parallel_context": "autostrat.frontend",
    "set_context": "autostrat.frontend.ms_context",
    "set_seed": "autostrat.frontend.tensor",
    "shard": "autostrat.frontend.cell",
    "value_and_grad": "autostrat.frontend.functional",
}
_DTYPES = ("bool_", "float16", "float32", "float64", "int16", "int32", "int64", "int8", "uint8")  # autostrat.common.dtype
_MODULES = ("common", "communication", "context", "dataset", "nn", "ops", "parallel", "train")
__all__ = sorted(_LAZY) + list(_DTYPES)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    if name in _DTYPES:
        return getattr(import_module("autostrat.common.dtype"), name)
    if name in _MODULES:
        return import_module(f"autostrat.{name}")
    raise AttributeError(f"module 'autostrat' has no attribute {name!r}")
