"""The graph a model traces into (networkx underneath), and its text dumps."""

from autostrat.ir.dtypes import dtype_name, output_dtype, output_dtypes
from autostrat.ir.graph import Graph, OpNode, TensorInfo

__all__ = ["Graph", "OpNode", "TensorInfo", "dtype_name", "output_dtype", "output_dtypes"]
