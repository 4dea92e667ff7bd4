"""The AutostratError hierarchy.

Every user-facing check raises one of these. Each class is also the matching builtin
(``ValueError``, ``LookupError``, ``RuntimeError``) so callers that already catch builtins keep
working. Messages say what was required, what was received, and where.

Example:
    >>> from autostrat.errors import LayoutError, AutostratError
    >>> try:
    ...     raise LayoutError("dim 0 of size 6 cannot be split into 4 parts")
    ... except ValueError as error:
    ...     isinstance(error, AutostratError)
    True
"""


class AutostratError(Exception):
    """Base class of every error autostrat raises on bad input or an impossible request."""


class ConfigError(AutostratError, ValueError):
    """A context key, YAML config, rank table or strategy checkpoint is malformed."""


class CheckpointError(ConfigError):
    """A parameter checkpoint cannot be read, or does not fit the plan it is loaded into (names,
    shapes, dtypes). It is a `ConfigError` too: a bad input file, like a bad strategy checkpoint."""


class LayoutError(AutostratError, ValueError):
    """A device matrix, tensor map, layout or strategy is invalid for the tensor it describes."""


class RuleError(AutostratError, ValueError):
    """A factor equation is malformed, or an op is applied to operands its rule does not accept."""


class UnknownOpError(AutostratError, LookupError):
    """An op type has no registered rule or kernel."""

    def __str__(self) -> str:  # LookupError would quote the message like a dict key.
        return str(self.args[0]) if self.args else ""


class InfeasibleError(AutostratError, RuntimeError):
    """No plan satisfies the constraints (for example the per-device memory budget)."""


class RedistributionError(AutostratError, ValueError):
    """No redistribution turns the source layout into the destination layout."""


class SolverError(AutostratError, RuntimeError):
    """The global solver failed for a reason other than infeasibility."""


class RuntimeBackendError(AutostratError, RuntimeError):
    """A backend cannot run the program (rank count, missing MPI runtime, a failed rank)."""
