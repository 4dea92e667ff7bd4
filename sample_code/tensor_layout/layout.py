"""The tensor-layout figure of MindSpore's sharding-propagation tutorial, computed by autostrat.

MatMul X[256, 784] . W[784, 64] on 8 devices with strategy ((2, 1), (1, 4)): prints the device
matrix, every rank's coordinate, and which rows of X and columns of W it holds, then checks
that the ranks' local MatMuls assemble into the single-device result.

Run: .venv/bin/python sample_code/tensor_layout/layout.py
"""

import numpy as np

from autostrat.layout import Strategy, assemble_tensor, split_tensor
from autostrat.tables import format_table
from autostrat.rules import make_rule
from autostrat.runtime.kernels import run_kernel

rule = make_rule("MatMul", [(256, 784), (784, 64)])
strategy = Strategy.from_tuples(rule, ((2, 1), (1, 4)), device_num=8)
x_layout, w_layout = strategy.input_layouts
[out_layout] = strategy.output_layouts
print(f"rule {rule}\nstrategy {strategy}: device matrix {strategy.device_matrix}, "
      f"tensor maps X {x_layout.tensor_map}, W {w_layout.tensor_map}, Y {out_layout.tensor_map}\n")

rows = []
for rank in range(8):
    (x_rows, _), (_, w_cols) = x_layout.slice_range(rank), w_layout.slice_range(rank)
    rows.append([str(rank), str(strategy.device_matrix.coordinate(rank)), f"{x_rows[0]}-{x_rows[1] - 1}", f"{w_cols[0]}-{w_cols[1] - 1}"])
print(format_table(["rank", "coordinate", "X rows", "W columns"], rows))

rng = np.random.default_rng(0)
x, w = rng.standard_normal((256, 784)).astype(np.float32), rng.standard_normal((784, 64)).astype(np.float32)
xs, ws = split_tensor(x, x_layout), split_tensor(w, w_layout)
local = [run_kernel("MatMul", [xs[rank], ws[rank]])[0] for rank in range(8)]
y = assemble_tensor(local, out_layout, check_replicas=True)
error = float(np.max(np.abs(y - x @ w)) / np.max(np.abs(x @ w)))
print(f"\nlocal result per rank {list(local[0].shape)}; assembled vs single device: max relative error {error:.1e}")
