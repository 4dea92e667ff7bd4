"""Execution: plans lowered to per-rank programs (`program`), numpy kernels (`kernels`), the
`Backend` protocol with `LocalBackend` threads (`local`) and `MpiBackend` (`mpi`), the executor
and its report, rank tables, the mpiexec launcher and the per-rank watchdog."""
