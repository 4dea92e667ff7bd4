"""Automatic differentiation of ir graphs: a bprop per op type composed of registered ops
(MindSpore's bprop style), so the training graph is an ordinary graph the search can shard."""

from autostrat.autodiff import elementwise, matmul, moe, nn, reduce, shape  # noqa: F401  (they register bprops)
from autostrat.autodiff.backward import build_backward, gradient_name
from autostrat.autodiff.builder import Constant, GradBuilder
from autostrat.autodiff.optimizers import OPTIMIZERS, SGD, UPDATE_OP_TYPES, Adam, Momentum
from autostrat.autodiff.training import BACKWARD_PREFIXES, PHASES, build_training, forward_name, op_phase
from autostrat.autodiff.registry import WITHOUT_BPROP, bprop_op_types, get_bprop, register_bprop

__all__ = ["OPTIMIZERS", "PHASES", "SGD", "UPDATE_OP_TYPES", "WITHOUT_BPROP", "Adam", "Constant", "Momentum", "build_training", "forward_name", "op_phase", "BACKWARD_PREFIXES", "GradBuilder", "bprop_op_types", "build_backward", "get_bprop", "gradient_name", "register_bprop"]
