"""Solvers for large strategy problems: IOPDDL instances (`instance`), their exact evaluation
(`evaluate`), groups of nodes one node decides (`groups`), message passing (`trws`), block moves
(`forest`, `moves`), the lower bound (`bound`) and the solver that combines them (`solver`)."""
