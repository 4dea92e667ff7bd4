"""MindSpore's ``mindspore.parallel``: `Layout` and the functional `shard` (also from
``mindspore.parallel.shard``, as MindSpore's samples import them).

Example:
    >>> from autostrat.parallel import Layout
    >>> Layout((2, 4), ("dp", "mp"))("dp", "None").tensor_map
    (1, -1)
"""

# Importing the submodule first and binding the function after it leaves `parallel.shard` the
# function, as in MindSpore, while ``import autostrat.parallel.shard`` still finds the module.
from autostrat.parallel.shard import Layout, shard

__all__ = ["Layout", "shard"]
