"""Every context key on every path a MindSpore script trains or runs by: it changes what runs,
or it is refused (`ConfigError`) before any step, or it says it has nothing to act on (a
warning naming it) — never silently nothing (issue #31).

The keys come from the contexts' own lists (`context.KEYS`, `NO_EFFECT`, `UNSUPPORTED`,
`ms_context.ACTED`, `ACCEPTED`), so a key added without an entry in `SETTINGS` fails
`test_every_context_key_has_a_setting_here`. What "changes what runs" compares: the plans the
path made (strategies, op names and attributes, inputs, predicted time, bytes and peak, the
refinement, optimizer sharding, cost model), the files it wrote and the numbers it returned
(losses, final parameters), against the same path without the key.

The paths: `Model.train`, the functional loop with ``@jit`` and without, and a bare ``net(x)``
call; ranks are threads.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import autostrat as ms
from autostrat import nn, ops
from autostrat.errors import ConfigError
from autostrat.frontend import api, context, mindspore_keys, ms_context

PATHS = ("Model.train", "functional loop with jit", "functional loop", "net(x)")
TRAINING_PATHS = PATHS[:3]
DEVICE_NUM = 4

# key -> (value, the settings both runs share); ("ctx", key) is a set_context key.
SETTINGS = {
    "parallel_mode": ("data_parallel", {}),
    "search_mode": ("integer_programming", {}),
    "auto_parallel_search_mode": ("integer_programming", {}),
    "device_num": (8, {}),
    "global_rank": (1, {("ctx", "save_graphs"): True}),
    "full_batch": (True, {}),
    "dataset_strategy": ("full_batch", {}),
    "fully_use_devices": (True, {}),
    "follow_layers": (False, {}),
    "strategy_ckpt_save_file": ("saved.json", {}),
    "strategy_ckpt_load_file": ("other.json", {}),
    "strategy_ckpt_config": ({"save_file": "saved.json"}, {}),
    "refine": ("cpsat", {}),
    "refine_time_limit": (1e-6, {"refine": "cpsat"}),
    "max_device_memory": ("1GB", {}),
    "coarsen": ("none", {"refine": "cpsat"}),
    "mesh": ((2, 2), {"refine": "cpsat"}),
    "phase": ("train", {}),
    "gradients_mean": (True, {}),
    "cost_model": ("time", {}),
    "enable_parallel_optimizer": (True, {}),
    "parallel_optimizer_config": ({"parallel_optimizer_threshold": 0}, {"enable_parallel_optimizer": True}),
    "auto_recompute": (True, {}),
    "pipeline_stages": (2, {}),
    "pipeline_config": ({"pipeline_scheduler": "gpipe"}, {"pipeline_stages": 2}),
    "pipeline_schedule": ("zero_bubble_h1", {"pipeline_stages": 2}),
    # One device group holding 3 model stages instead of interleaved_1f1b's default 2.
    "pipeline_interleave_num": (3, {"pipeline_schedule": "interleaved_1f1b"}),
    "parameter_broadcast": (True, {}),
    "hardware": ("a100-80gb", {}),
    "precision": ("bf16", {}),
    "loss_scale": (1024, {"precision": "fp16"}),
    "device_flops": (1e12, {}),
    "device_memory_bandwidth": (1e9, {}),
    "intra_server_bandwidth": (1e9, {}),
    "inter_server_bandwidth": (1e6, {"devices_per_server": 2}),
    "intra_server_latency": (1e-3, {}),
    "inter_server_latency": (1e-2, {"devices_per_server": 2}),
    "devices_per_server": (2, {}),
    "bucket_bytes": (64, {}),
    "backward_regathers": (True, {}),
    "pricing_processes": (2, {}),
    # MindSpore's compiler and fusion knobs: accepted, saying they do nothing here.
    "all_reduce_fusion_config": ([2], {}),
    "comm_fusion": ({"allreduce": {"mode": "auto"}}, {}),
    "enable_alltoall": (True, {}),
    "force_fp32_communication": (True, {}),
    "gradient_fp32_sync": (False, {}),
    "group_ckpt_save_file": ("group.ckpt", {}),
    "loss_repeated_mean": (False, {}),
    "pipeline_result_broadcast": (True, {}),
    "grad_accumulation_step": (2, {}),
    "auto_pipeline": (True, {}),
    ("ctx", "save_graphs"): (True, {}),
    ("ctx", "save_graphs_path"): ("elsewhere", {("ctx", "save_graphs"): True}),
    ("ctx", "device_id"): (3, {}),
    ("ctx", "device_target"): ("Ascend", {}),
    ("ctx", "jit_config"): ({"jit_level": "O2"}, {}),
    ("ctx", "max_call_depth"): (2000, {}),
    ("ctx", "max_device_memory"): ("28GB", {}),
    ("ctx", "memory_optimize_level"): ("O1", {}),
    ("ctx", "mode"): (ms.PYNATIVE_MODE, {}),
    ("ctx", "pynative_synchronize"): (True, {}),
    ("ctx", "runtime_num_threads"): (2, {}),
    ("ctx", "deterministic"): ("ON", {}),
}

# (key, path) pairs where the value set is what the path does anyway, with how the test sees it.
ALREADY = {("phase", path): "a training path plans the training step (phase='train') whatever phase says"
           for path in TRAINING_PATHS}


@pytest.fixture(autouse=True)
def _clean():
    yield
    ms.reset_auto_parallel_context()
    ms_context.reset_context()  # save_graphs left set would dump every later test's plans
    mindspore_keys.forget_warnings()


def context_keys() -> set:
    """Every key the two contexts accept or refuse by name, from their own lists."""
    auto = set(context.KEYS) | set(mindspore_keys.NO_EFFECT) | set(mindspore_keys.UNSUPPORTED) | {"auto_parallel_search_mode"}
    return auto | {("ctx", key) for key in ms_context.ACTED + ms_context.ACCEPTED}


def test_every_context_key_has_a_setting_here():
    assert set(SETTINGS) == context_keys()


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(16, 16)
        self.relu = ops.ReLU()

    def construct(self, x):
        return self.relu(self.dense(x))


class PathNet(nn.Cell):
    """Two repeated layers (a CellList: follow_layers, auto_recompute, stages) and a head."""

    def __init__(self):
        super().__init__()
        self.layers = nn.CellList([Block(), Block()])
        self.head = nn.Dense(16, 8)

    def construct(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _data():
    rng = np.random.default_rng(7)
    return [(rng.standard_normal((8, 16)).astype(np.float32), rng.integers(0, 8, 8).astype(np.int32)) for _ in range(2)]


# The seed of layers.0's matmul: 2 of 4 devices (repeated calculation: fully_use_devices acts
# on it); for follow_layers a data-parallel one, which layers.1 can follow at no cost.
SEEDS = {"follow_layers": ((4, 1), (1, 1))}


def _net(key=None):
    ms.set_seed(3)
    net = PathNet()
    net.layers[0].dense.matmul.shard(SEEDS.get(key, ((1, 1), (2, 1))))
    return net


def _loss():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def _run(path: str, net) -> tuple:
    """Run `path` on `net`: its losses (or outputs) and final parameters."""
    data, loss_fn = _data(), _loss()
    optimizer = nn.SGD(net.trainable_params(), 0.1)
    if path == "Model.train":
        seen = []
        ms.Model(net, loss_fn, optimizer).train(1, data, callbacks=[ms.LossMonitor(log=seen.append)])
        numbers = [float(line.split("loss is ")[1]) for line in seen]
    elif path == "net(x)":
        numbers = [net(ms.Tensor(data[0][0])).asnumpy()]
    else:
        grad_fn = ms.value_and_grad(lambda x, y: (loss_fn(net(x), y), net(x)), None, net.trainable_params(), has_aux=True)

        def step(x, y):
            (loss, _), grads = grad_fn(x, y)
            optimizer(grads)
            return loss

        step = ms.jit(step) if "jit" in path else step
        numbers = [float(step(x, y).asnumpy()) for x, y in data]
    return tuple(np.round(np.asarray(n, np.float64), 6).tobytes() for n in numbers) + _parameters(net)


def _parameters(net) -> tuple:
    return tuple(np.round(p.asnumpy().astype(np.float64), 6).tobytes() for p in net.trainable_params())


def _digest(plan) -> tuple:
    """What a plan decided, for comparing two runs."""
    refinement = None if plan.refinement is None else (plan.refinement.result.coarsening, plan.refinement.result.space,
                                                        bool(plan.refinement.result.stopped))
    ops_ = tuple((name, str(op.strategy), op.origin, plan.graph.ops[name].attrs) for name, op in sorted(plan.ops.items()))
    prediction = plan.prediction
    recompute = None if plan.recompute is None else (plan.recompute.layers, plan.recompute.count)
    pipeline = None if plan.pipeline is None else (plan.pipeline.stages, plan.pipeline.schedule)
    return (plan.mode, plan.device_num, ops_, tuple(i.shape for i in plan.graph.inputs()), prediction.step_time_ns,
            prediction.peak_bytes, plan.total_bytes, refinement, repr(plan.optimizer_shard), plan.cost_model, recompute,
            pipeline)


def _set(key, value) -> None:
    if isinstance(key, tuple):
        ms_context.set_context(**{key[1]: value})
    else:
        ms.set_auto_parallel_context(**{key: value})


def name_of(key) -> str:
    return key[1] if isinstance(key, tuple) else key


def _observe(path: str, settings: dict, tmp_path, monkeypatch, key=None, seeds_for=None) -> tuple:
    """(outcome, what ran) of `path` under `settings`: outcome ("refused", message) for a
    ConfigError before any step (the parameters unchanged), ("said", message) for a warning
    naming `key`, else None with the plans the run made, the files it wrote and its numbers.
    The network is seeded as `SEEDS` says for the key `seeds_for`."""
    ms.reset_auto_parallel_context()
    ms_context.reset_context()
    mindspore_keys.forget_warnings()
    plans = []
    finished = api._finished
    monkeypatch.setattr(api, "_finished", lambda plan, ctx: plans.append(plan) or finished(plan, ctx))
    net = _net(seeds_for)
    initial = _parameters(net)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ms.set_auto_parallel_context(parallel_mode="auto_parallel", device_num=DEVICE_NUM)
            for setting, value in settings.items():
                _set(setting, value)
            numbers = _run(path, net)
        except ConfigError as error:
            assert _parameters(net) == initial, f"{error}: refused after a step changed the parameters"
            return ("refused", str(error)), None
    said = [str(w.message) for w in caught if key is not None and name_of(key) in str(w.message)]
    if said:
        return ("said", said[0]), None
    files = tuple(sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() and "other" not in p.name))
    return None, (tuple(_digest(plan) for plan in plans), files, numbers)


def _checkpoint_to_load(path: str, tmp_path, monkeypatch) -> None:
    """other.json: the strategy checkpoint of the same path planned data parallel."""
    outcome, _ = _observe(path, {"parallel_mode": "data_parallel", "strategy_ckpt_save_file": "other.json"}, tmp_path,
                          monkeypatch)
    assert outcome is None and (tmp_path / "other.json").exists(), outcome


def _clear(tmp_path) -> None:
    for leftover in sorted(tmp_path.rglob("*"), reverse=True):
        if leftover.is_file() and "other" not in leftover.name:
            leftover.unlink()


# The run without the key, by (path, shared settings, seeds): most keys share {} and one
# network, and a run is deterministic (seeded parameters, the context reset before it, files
# named relative to the test's folder), so each baseline runs once per module, not once per key.
_BASELINES: dict = {}


def _baseline(path: str, base: dict, key, tmp_path, monkeypatch) -> tuple:
    cache_key = (path, repr(sorted(base.items(), key=str)), SEEDS.get(key))
    if cache_key not in _BASELINES:
        _BASELINES[cache_key] = _observe(path, base, tmp_path, monkeypatch, seeds_for=key)
    return _BASELINES[cache_key]


def _cases():
    for key in sorted(SETTINGS, key=str):
        for path in PATHS:
            yield pytest.param(key, path, id=f"{'set_context.' if isinstance(key, tuple) else ''}{name_of(key)}-{path}")


@pytest.mark.slow
@pytest.mark.parametrize("key, path", list(_cases()))
def test_a_context_key_changes_what_runs_or_says_why_not(key, path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOSTRAT_CHECK", raising=False)
    value, base = SETTINGS[key]
    if key == "strategy_ckpt_load_file":
        _checkpoint_to_load(path, tmp_path, monkeypatch)
    outcome, before = _baseline(path, base, key, tmp_path, monkeypatch)
    _clear(tmp_path)
    keyed, after = _observe(path, base | {key: value}, tmp_path, monkeypatch, key, seeds_for=key)
    if keyed is not None:  # refused or said, naming the key (or refused as the settings it needs are)
        assert name_of(key) in keyed[1] or keyed == outcome, f"{key}={value!r} on {path}: {keyed[0]} without naming it: {keyed[1]}"
        return
    if (key, path) in ALREADY:
        assert any("optimizer/" in str(digest[2]) for digest in after[0]), ALREADY[(key, path)]
        return
    assert outcome is None and after != before, f"{key}={value!r} on {path}: nothing changed and nothing said"
