"""Every user-facing check raises an AutostratError subclass whose message says what was
expected, what was received and where. One case per distinct message."""

from __future__ import annotations

import numpy as np
import pytest

from autostrat.errors import AutostratError, LayoutError, RuleError, UnknownOpError
from autostrat.layout import DeviceMatrix, Layout, Strategy, TensorMap, assemble_tensor, split_tensor
from autostrat.rules import Rule, RuleSpec, make_rule, parse_equation, register
from autostrat.runtime.kernels import kernel, run_kernel
from autostrat.strategies import generate_strategies

MATMUL = make_rule("MatMul", [(64, 32), (32, 16)])


def shard(in_strategy, device_num=8, rule=MATMUL, **kwargs):
    return Strategy.from_tuples(rule, in_strategy, device_num, where="dense1.matmul", **kwargs)


STRATEGY_CASES = {
    "not a tuple of tuples": (lambda: shard((2, 4)), r"dense1.matmul: a strategy is a tuple with one tuple of parts per input.*got \(2, 4\)"),
    "operand count": (lambda: shard(((2, 1),)), r"dense1.matmul: expected 2 input strategies \(one per input\), got 1"),
    "dim count": (lambda: shard(((2,), (1, 4))), r"input 0 has 2 dims \(shape \[64, 32\]\) but its strategy \(2,\) has 1 entries"),
    "zero parts": (lambda: shard(((0, 1), (1, 4))), r"input 0 dim 0: parts must be positive integers, got 0"),
    "negative parts": (lambda: shard(((2, 1), (1, -4))), r"input 1 dim 1: parts must be positive integers, got -4"),
    "uneven split": (lambda: shard(((2, 1), (1, 32)), device_num=64), r"input 1 dim 1 of size 16 cannot be split evenly into 32 parts"),
    "factor split twice": (lambda: shard(((2, 2), (4, 1))), r"factor 'k' is split into 2 parts by input 0 dim 1 but into 4 parts by input 1 dim 0"),
    "above device_num": (lambda: shard(((4, 2), (2, 4))), r"the strategy uses 32 devices but device_num is 8"),
    "not dividing device_num": (lambda: shard(((2, 1), (1, 1)), device_num=6 * 1 + 1), r"uses 2 devices, which does not divide device_num 7"),
    "need-replication split": (
        lambda: shard(((2, 4),), rule=make_rule("Softmax", [(64, 32)])),
        r"input 0 dim 1 \(factor 'b'\) must not be split for Softmax, got 4 parts",
    ),
    "compound not contiguous": (
        lambda: shard(((4,),), rule=make_rule("Reshape", [(12,)], shape=(6, 2)), device_num=4),
        r"input 0 dim 0 is made of factors f0\(6\) f1\(2\); 4 parts would not give every rank one contiguous block",
    ),
    "out_strategy form": (
        lambda: shard(((1,),), rule=make_rule("OneHot", [(8,)], depth=16), out_strategy=((2,),)),
        r"output 0 has 2 dims \(shape \[8, 16\]\) but its strategy \(2,\) has 1 entries",
    ),
    "factor splits count": (lambda: Strategy(MATMUL, (2, 4), 8), r"MatMul: expected 3 factor splits, got \(2, 4\)"),
}

RULE_CASES = {
    "unknown op": (lambda: make_rule("MatMull", [(2, 2)]), UnknownOpError, r"unknown op type 'MatMull'; registered ops: Add, "),
    "unknown attribute": (lambda: make_rule("MatMul", [(2, 2), (2, 2)], transpose_x1=True), RuleError, r"MatMul got unknown attribute 'transpose_x1'; it accepts transpose_a, transpose_b"),
    "input count": (lambda: make_rule("MatMul", [(2, 2)]), RuleError, r"MatMul takes 2 inputs \(m k, k n -> m n\), got 1"),
    "operand rank": (lambda: make_rule("MatMul", [(2, 2, 2), (2, 2)]), RuleError, r"MatMul: input 0 has 3 dims \(shape \[2, 2, 2\]\) but 'm k, k n -> m n' gives it 2"),
    "shared factor sizes differ": (lambda: make_rule("MatMul", [(64, 32), (16, 8)]), RuleError, r"MatMul: input 1 dim 0 has size 16 but its factors give k=32 \(input 0 dim 1\)"),
    "broadcast dim not 1": (lambda: Rule.build("T", RuleSpec("a 1 -> a"), [(4, 3)]), RuleError, r"T: input 0 dim 1 has size 3 but its factors give 1 \(a broadcast dim\)"),
    "shapes not integers": (lambda: make_rule("ReLU", [("x", 2)]), RuleError, r"ReLU: input shapes must be sequences of integers"),
    "builder cannot take shapes": (lambda: make_rule("Softmax", []), RuleError, r"Softmax cannot take input shapes \[\]"),
    "not broadcastable": (lambda: make_rule("Add", [(4, 3), (4, 5)]), RuleError, r"shapes \[\[4, 3\], \[4, 5\]\] cannot be broadcast together \(dim 1\)"),
    "axis out of range": (lambda: make_rule("Softmax", [(4, 3)], axis=2), RuleError, r"Softmax: axis 2 is out of range for a tensor of rank 2"),
    "bad perm": (lambda: make_rule("Transpose", [(4, 3)], perm=(0, 0)), RuleError, r"Transpose: perm must be a permutation of 0..1, got \(0, 0\)"),
    "bad reshape": (lambda: make_rule("Reshape", [(4, 3)], shape=(5, 2)), RuleError, r"Reshape: cannot reshape \[4, 3\] into \[5, 2\]"),
    "squeeze non-1": (lambda: make_rule("Squeeze", [(4, 3)], axis=1), RuleError, r"Squeeze: axis 1 of shape \[4, 3\] is not of size 1"),
    "bad keep_prob": (lambda: make_rule("Dropout", [(4, 3)], keep_prob=0), RuleError, r"Dropout: keep_prob must be in \(0, 1\], got 0"),
    "bad depth": (lambda: make_rule("OneHot", [(4,)], depth=0), RuleError, r"OneHot: depth must be positive, got 0"),
    "bias rank": (lambda: make_rule("BiasAdd", [(4,), (4,)]), RuleError, r"BiasAdd: the input needs 2 or more dims, got shape \[4\]"),
    "bias format": (lambda: make_rule("BiasAdd", [(4, 2), (2,)], data_format="NHWC"), RuleError, r"BiasAdd: data_format must be 'NCHW', got 'NHWC'"),
    "batch matmul rank": (lambda: make_rule("BatchMatMul", [(4, 3), (3, 2)]), RuleError, r"BatchMatMul: needs two operands of rank >= 2, one of rank >= 3"),
    "conv rank": (lambda: make_rule("Conv2D", [(4, 3, 8), (6, 3, 3, 3)]), RuleError, r"Conv2D: needs NCHW input and OIHW weight of rank 4 with group 1"),
    "conv attrs": (lambda: make_rule("Conv2D", [(1, 3, 8, 8), (6, 3, 3, 3)], out_channel=5), RuleError, r"Conv2D: out_channel 5 / kernel_size None disagree with weight shape \[6, 3, 3, 3\]"),
    "conv pad mode": (lambda: make_rule("Conv2D", [(1, 3, 8, 8), (6, 3, 3, 3)], pad_mode="full"), RuleError, r"Conv2D: pad_mode must be 'valid', 'same' or 'pad', got 'full'"),
    "conv pad": (lambda: make_rule("Conv2D", [(1, 3, 8, 8), (6, 3, 3, 3)], pad_mode="pad", pad=-1), RuleError, r"Conv2D: pad must be a non-negative int or 4-tuple, got -1"),
    "conv stride": (lambda: make_rule("Conv2D", [(1, 3, 8, 8), (6, 3, 3, 3)], stride=0), RuleError, r"Conv2D: stride must be a positive int or pair, got 0"),
    "conv kernel too big": (lambda: make_rule("Conv2D", [(1, 3, 2, 2), (6, 3, 3, 3)]), RuleError, r"Conv2D: kernel \[3, 3\] does not fit input \[2, 2\]"),
    "unknown factor size": (lambda: Rule.build("T", RuleSpec("a -> a b"), [(4,)]), RuleError, r"T: the size of factor 'b' in 'a -> a b' is unknown"),
    "compound underdetermined": (lambda: Rule.build("T", RuleSpec("(a b) -> a b"), [(4,)]), RuleError, r"T: compound dim input 0 dim 0 of '\(a b\) -> a b' needs the sizes of \['b'\]"),
    "need-replication not a factor": (lambda: Rule.build("T", RuleSpec("a -> a", need_replication="z"), [(4,)]), RuleError, r"T: need-replication factor 'z' is not in 'a -> a'"),
    "bad reduce op": (lambda: Rule.build("T", RuleSpec("a -> ", reduce_op="prod"), [(4,)]), RuleError, r"T: reduce_op must be one of \('max', 'min', 'sum'\), got 'prod'"),
    "duplicate registration": (lambda: register("ReLU", examples=[object()])(lambda s: None), RuleError, r"op type 'ReLU' is already registered"),
    "registration without examples": (lambda: register("TestNothing", examples=[])(lambda s: None), RuleError, r"op type 'TestNothing' needs at least one example"),
    "duplicate kernel": (lambda: kernel("ReLU")(lambda x: x), RuleError, r"a kernel for 'ReLU' is already registered"),
    "unknown kernel": (lambda: run_kernel("MatMull", []), UnknownOpError, r"no numpy kernel for op type 'MatMull'"),
    "bad device_num": (lambda: generate_strategies(MATMUL, 0), LayoutError, r"device_num must be a positive integer, got 0"),
    "bad broadcast": (lambda: make_rule("BroadcastTo", [(4, 3)], shape=(4, 6)), RuleError, r"BroadcastTo: cannot broadcast \[4, 3\] to \[4, 6\]"),
    "slice outside": (lambda: make_rule("Slice", [(4, 3)], begin=(2, 0), size=(3, 3)), RuleError, r"Slice: begin \(2, 0\) and size \(3, 3\) must give a box inside \[4, 3\]"),
    "grad shapes differ": (lambda: make_rule("ReluGrad", [(4, 3), (4, 1)]), RuleError, r"ReluGrad: every input needs the same shape, got \[\[4, 3\], \[4, 1\]\]"),
    "gather grad size": (lambda: make_rule("GatherGrad", [(4, 3), (4,)], size=0), RuleError, r"GatherGrad: size must be positive, got 0"),
    "conv grad channels": (
        lambda: make_rule("Conv2DBackpropFilter", [(4, 12, 6, 6), (4, 5, 8, 8)], filter_shape=(12, 6, 3, 3)),
        RuleError, r"Conv2DBackpropFilter: needs an NCHW input and an OIHW weight with equal channels, got \[4, 5, 8, 8\] and \[12, 6, 3, 3\]",
    ),
    "conv grad dy": (
        lambda: make_rule("Conv2DBackpropInput", [(4, 12, 5, 5), (12, 6, 3, 3)], input_shape=(4, 6, 8, 8)),
        RuleError, r"Conv2DBackpropInput: dy of shape \[4, 12, 5, 5\] does not match a Conv2D of input \[4, 6, 8, 8\] and weight \[12, 6, 3, 3\] \(expected dy \[4, 12, 6, 6\]\)",
    ),
}

NOTATION_CASES = {
    "unexpected character": ("m k, k n -> m*n", r"unexpected character '\*' at column 13 in 'm k, k n -> m\*n'"),
    "missing arrow": ("m k, k n", r"expected ',' or '->' at the end of 'm k, k n'"),
    "stray parenthesis": ("m k) -> m", r"expected ',' or '->' at column 3 in 'm k\) -> m', got '\)'"),
    "unclosed compound": ("(a b -> a b", r"expected a factor name inside '\( \)' at column 5 in '\(a b -> a b', got '->'"),
    "compound of one": ("(a) -> a", r"a compound dim needs two or more factors, got \(a\) in '\(a\) -> a'"),
    "factor twice": ("a a -> a", r"factor 'a' appears twice in one operand of 'a a -> a'"),
    "second arrow": ("a -> a -> a", r"expected ',' or the end at column 7 in 'a -> a -> a', got '->'"),
    "not a string": (None, r"a factor equation is a string such as 'm k, k n -> m n', got None"),
}

LAYOUT_CASES = {
    "empty device matrix": (lambda: DeviceMatrix(()), r"a device matrix needs one or more positive integer axis sizes, got \[\]"),
    "zero axis": (lambda: DeviceMatrix((2, 0)), r"a device matrix needs one or more positive integer axis sizes, got \[2, 0\]"),
    "axis outside": (lambda: DeviceMatrix((2, 4)).axis_size(2), r"device axis 2 does not exist in device matrix \[2, 4\] \(valid axes: 0..1, counted from the right\)"),
    "rank outside": (lambda: DeviceMatrix((2, 4)).coordinate(8), r"rank 8 is outside device matrix \[2, 4\] of 8 ranks"),
    "coordinate outside": (lambda: DeviceMatrix((2, 4)).rank((2, 0)), r"coordinate \(2, 0\) is outside device matrix \[2, 4\]"),
    "map entry": (lambda: TensorMap((-2, 0)), r"a tensor map entry is -1 or a device axis >= 0, got -2"),
    "map entry type": (lambda: TensorMap(("x",)), r"a tensor map entry is -1, a device axis or a tuple of axes, got 'x'"),
    "map not a tuple": (lambda: TensorMap(3), r"a tensor map is a tuple with one entry per tensor dim, got 3"),
    "axis used twice": (lambda: TensorMap((1, 1)), r"tensor map \(1, 1\) uses a device axis for more than one dim"),
    "map length": (lambda: Layout(DeviceMatrix((8,)), TensorMap((0,)), (64, 32)), r"tensor map \(0,\) has 1 entries but the tensor has 2 dims \(shape \[64, 32\]\)"),
    "map axis outside": (lambda: Layout(DeviceMatrix((8,)), TensorMap((1, -1)), (64, 32)), r"device axis 1 does not exist in device matrix \[8\]"),
    "partial used by map": (lambda: Layout(DeviceMatrix((8,)), TensorMap((0, -1)), (64, 32), (0,)), r"partial axes \(0,\) are also used by tensor map \(0, -1\)"),
    "partial op": (lambda: Layout(DeviceMatrix((8,)), TensorMap((-1,)), (64,), (0,), "prod"), r"partial_op must be one of \('max', 'min', 'sum'\), got 'prod'"),
    "uneven layout": (lambda: Layout(DeviceMatrix((8,)), TensorMap((0,)), (12,)), r"dim 0 of size 12 cannot be split evenly into 8 parts \(shape \[12\], device matrix \[8\], tensor map \(0,\)\)"),
    "split wrong shape": (lambda: split_tensor(np.zeros((4, 4)), Layout(DeviceMatrix((2,)), TensorMap((0,)), (4,))), r"array of shape \[4, 4\] does not match layout \[4\] dm\[2\] tm\(0,\)"),
    "assemble count": (lambda: assemble_tensor([np.zeros(2)], Layout(DeviceMatrix((2,)), TensorMap((0,)), (4,))), r"expected 2 slices for layout \[4\] dm\[2\] tm\(0,\), got 1"),
    "assemble slice shape": (lambda: assemble_tensor([np.zeros(2), np.zeros(3)], Layout(DeviceMatrix((2,)), TensorMap((0,)), (4,))), r"rank 1 holds a slice of shape \[3\], layout \[4\] dm\[2\] tm\(0,\) gives slices of shape \[2\]"),
}


@pytest.mark.parametrize("case", STRATEGY_CASES)
def test_strategy_errors(case):
    call, message = STRATEGY_CASES[case]
    with pytest.raises(LayoutError, match=message):
        call()


@pytest.mark.parametrize("case", RULE_CASES)
def test_rule_errors(case):
    call, error, message = RULE_CASES[case]
    with pytest.raises(error, match=message) as raised:
        call()
    assert isinstance(raised.value, AutostratError)


@pytest.mark.parametrize("case", NOTATION_CASES)
def test_notation_errors(case):
    equation, message = NOTATION_CASES[case]
    with pytest.raises(RuleError, match=message):
        parse_equation(equation)


@pytest.mark.parametrize("case", LAYOUT_CASES)
def test_layout_errors(case):
    call, message = LAYOUT_CASES[case]
    with pytest.raises(LayoutError, match=message):
        call()


def test_errors_are_also_builtins():
    with pytest.raises(ValueError):
        shard(((0, 1), (1, 4)))
    with pytest.raises(LookupError):
        make_rule("MatMull", [])
    assert str(UnknownOpError("plain message")) == "plain message"
