"""``scipy.special`` for the kernels that need it (erf, expit, softmax), imported on first use.

Every MPI rank imports the kernels when it starts; importing ``scipy.special`` was 0.21 s of a
rank's 0.57 s (``python -X importtime -c "import autostrat.runtime.job_file"``), paid by all 8
ranks of every job, though most programs run no op that needs it. A rank calls
`registry.prepare_kernels` with its program's op types before its first timed step, so the
import never lands inside a measured step.

Example:
    >>> float(special.erf(0.0))
    0.0
"""

from __future__ import annotations

import importlib


class _LazySpecial:
    """Forwards attribute reads to ``scipy.special``, importing it on the first."""

    def __getattr__(self, name: str):
        return getattr(importlib.import_module("scipy.special"), name)


special = _LazySpecial()
