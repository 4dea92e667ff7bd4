"""Execution: numpy kernels now; rank tables, backends and the executor as they land."""
