"""YAML configs: the context keys, a model, its input shapes, and strategies by op name.

    parallel_mode: auto_parallel
    search_mode: sharding_propagation
    device_num: 8
    model:
      name: FFN                 # a registered model: a built-in, or a Cell of --import MODULE
      params: {}                # constructor arguments
    # or model: {hf_config: models/llama.json, params: {seq: 16, batch: 8}}: GPT or LLaMA from a
    # HuggingFace config.json (relative to this file; `models.from_hf_config`)
    inputs:
      - {shape: [64, 64], dtype: float32}
    strategies:
      dense1.matmul: [[2, 1], [1, 4]]          # in_strategy
      loss.one_hot: {in: [[8]], out: [[8, 1]]} # with an out_strategy
      relu:                                    # a MindSpore Layout: named device axes in any order,
        layout: {device_matrix: [4, 2], alias_name: [mp, dp]}
        in: [[[dp, mp], None]]                 #   a dim over two axes ([dp, mp]) or none (None)
    optimizer: {name: adam, learning_rate: 0.001}  # optional: plan (and run) a training step
    recompute: [blocks.0, blocks.1]            # optional: cells whose forward runs again in the backward,
                                               # or auto: the search chooses them under max_device_memory
    pipeline_stages: 2                         # optional, with an optimizer: stages of device_num / 2 devices,
    micro_size: 4                              #   4 micro-batches per step (nn.PipelineCell's micro_size),
    pipeline_stage: {blocks.0: 0, blocks.1: 1} #   cells' stages (default: the split is searched)

An `optimizer` (sgd, momentum or adam, with its settings) implies ``phase: train``; ``phase:
train`` without one trains with Momentum(0.01, 0.9).

File paths in a config (``strategy_ckpt_save_file``, ``strategy_ckpt_load_file``,
``strategy_ckpt_config``'s ``save_file`` and ``load_file``, and a ``hardware`` profile file) are relative to the config's folder, and
a path it writes must stay inside that folder (``../x``, ``/tmp/x`` or a linked folder leading out
are refused): a config is data and does not choose what to overwrite. The command line
(``--strategy-ckpt-save-file``) and Python calls may write anywhere.

Every error names the file and the key path (``model.params.layers``).
"""

from __future__ import annotations

import difflib
import functools
import inspect
from dataclasses import dataclass, fields, replace
from pathlib import Path

from autostrat.autodiff import OPTIMIZERS
from autostrat.errors import AutostratError, ConfigError, LayoutError
from autostrat.frontend.context import KEYS, ParallelContext
from autostrat.frontend.mindspore_keys import keys_from_file
from autostrat.frontend.registry import model_class, model_file_builder, model_file_keys
from autostrat.frontend.tensor import Tensor
from autostrat.frontend.yaml_text import parse_config_text
from autostrat.io import OutputPath, check_outputs
from autostrat.reading import read_text
from autostrat.ir import Graph
from autostrat.layout import Strategy
from autostrat.layout.named import NamedLayout

SECTIONS = ("inputs", "micro_size", "model", "optimizer", "pipeline_stage", "recompute", "strategies")
AUTO_RECOMPUTE = "auto"  # ``recompute: auto`` / ``--recompute auto``: the search chooses (`auto_recompute`)


@dataclass(frozen=True)
class Config:
    """A loaded config: the context, the model instance, its inputs and the seeds by op name."""

    path: str
    context: ParallelContext
    net: object
    inputs: tuple[Tensor, ...]
    strategies: dict
    optimizer: object = None
    recompute: tuple[str, ...] = ()  # cell paths recomputed in the backward (`Cell.recompute`)
    micro_size: int = 1  # micro-batches per step (`nn.PipelineCell`)
    seed_devices: int = 0  # the devices the seeds are written for: the file's device_num / pipeline_stages
    text: str = ""  # the YAML it was read from (a plan's JSON embeds it: `autostrat report` plans it again)

    def network(self):
        """The net to plan: wrapped in `nn.PipelineCell` when the config asks for micro-batches."""
        from autostrat.frontend.pipeline import PipelineCell

        return PipelineCell(self.net, self.micro_size) if self.micro_size > 1 else self.net


def _fail(where: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {message}")


def _build_model(section, where: str, folder: Path):
    """``{name: NAME, params: {...}}``, or ``{hf_config: FILE, params: {...}}`` (a model file,
    relative to the config's `folder`, read by the builder `models` registered for the key)."""
    kinds = ("name",) + model_file_keys()
    present = [key for key in kinds if isinstance(section, dict) and key in section]
    if len(present) != 1:
        raise _fail(where, f"expected a mapping with one of {', '.join(repr(k) for k in kinds)} (and optional 'params'), got {section!r}")
    unknown = sorted(set(section) - {present[0], "params"})
    if unknown:
        raise _fail(f"{where}.{unknown[0]}", f"unknown key; a model has {present[0]!r} and 'params'")
    params = section.get("params") or {}
    if not isinstance(params, dict):
        raise _fail(f"{where}.params", f"expected a mapping of constructor arguments, got {params!r}")
    if present[0] == "name":
        build, owner = model_class(section["name"], f"{where}.name"), section["name"]
    else:
        file = section[present[0]]
        if not isinstance(file, str) or not file:
            raise _fail(f"{where}.{present[0]}", f"expected a file path, got {file!r}")
        build, owner = functools.partial(model_file_builder(present[0]), folder / file), f"the {present[0]} model"
    try:
        return build(**params)
    except TypeError as error:
        raise _fail(f"{where}.params", f"{owner} rejects these arguments: {error}") from None
    except AutostratError as error:
        raise _fail(f"{where}.params" if present[0] == "name" else f"{where}.{present[0]}", str(error)) from None


def _build_inputs(section, where: str) -> tuple[Tensor, ...]:
    if not isinstance(section, list) or not section:
        raise _fail(where, f"expected a list of inputs such as [{{shape: [64, 64], dtype: float32}}], got {section!r}")
    tensors = []
    for index, item in enumerate(section):
        place = f"{where}[{index}]"
        if not isinstance(item, dict) or "shape" not in item or set(item) - {"shape", "dtype"}:
            raise _fail(place, f"expected {{shape: [...], dtype: ...}}, got {item!r}")
        try:
            tensors.append(Tensor(shape=item["shape"], dtype=item.get("dtype", "float32")))
        except (AutostratError, TypeError) as error:
            raise _fail(place, str(error)) from None
    return tuple(tensors)


def _check_input_count(net, inputs, where: str) -> None:
    """The model's construct must accept the configured inputs (trace would fail on a TypeError)."""
    try:
        signature = inspect.signature(net.construct)
    except (AttributeError, TypeError, ValueError):
        return  # no inspectable construct: tracing reports what is wrong
    try:
        signature.bind(*inputs)
    except TypeError:
        names = [name for name, p in signature.parameters.items() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        raise _fail(where, f"{type(net).__name__} takes {len(names)} input(s) ({', '.join(names)}), got {len(inputs)}") from None


def _check_strategies(section, where: str) -> dict:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise _fail(where, f"expected a mapping from op name to strategy, got {section!r}")
    strategies = {}
    for name, value in section.items():
        if not isinstance(name, str):
            raise _fail(f"{where}.{name}", f"expected an op name (text) as the key, got {type(name).__name__} {name!r}")
        if isinstance(value, dict) and "layout" in value:
            strategies[name] = _layouts(value, f"{where}.{name}")
        elif isinstance(value, dict):
            if set(value) - {"in", "out"} or "in" not in value:
                raise _fail(f"{where}.{name}", f"expected {{in: [[...]], out: [[...]]}}, got {value!r}")
            strategies[name] = (_tuples(value["in"]), _tuples(value.get("out")))
        else:
            strategies[name] = (_tuples(value), None)
    return strategies


def _layouts(value: dict, where: str) -> tuple:
    """``{layout: {device_matrix, alias_name}, in: [...], out: [...]}`` as MindSpore Layouts:
    per tensor, per dim an axis name, None, or a list of names."""
    layout = value["layout"]
    if set(value) - {"layout", "in", "out"} or "in" not in value or not isinstance(layout, dict) or set(layout) != {
            "device_matrix", "alias_name"}:
        raise _fail(where, f"expected {{layout: {{device_matrix: [...], alias_name: [...]}}, in: [[...]], out: [[...]]}}, "
                           f"got {value!r}")
    try:
        named = NamedLayout(tuple(layout["device_matrix"]), tuple(layout["alias_name"]))
        tensors = [value[key] for key in ("in", "out") if key in value]
        if not all(isinstance(t, list) and all(isinstance(dims, list) for dims in t) for t in tensors):
            raise LayoutError(f"expected per tensor a list of axis names per dim, got {value!r}")

        def called(dims):
            return named(*(tuple(d) if isinstance(d, list) else "None" if d in (None, "None") else d for d in dims))

        ins = tuple(called(dims) for dims in value["in"])
        outs = tuple(called(dims) for dims in value["out"]) if "out" in value else None
    except (LayoutError, TypeError) as error:
        raise _fail(where, str(error)) from None
    return ins, outs


def _tuples(value):
    """YAML lists as strategy tuples; anything else is left for the strategy check to reject."""
    if isinstance(value, list):
        return tuple(tuple(v) if isinstance(v, list) else v for v in value)
    return value


def load_config(path, micro_size: int | None = None, **overrides) -> Config:
    """Load a YAML config; `overrides` replace context keys (``device_num=64``), `micro_size`
    the config's.

    Example:
        >>> config = load_config("configs/ffn.yaml")
        >>> config.context.device_num, type(config.net).__name__, config.strategies["dense1.matmul"]
        (8, 'FFN', (((2, 1), (1, 4)), None))
    """
    path = Path(path)
    config = parse_config(read_text(path, "config"), path, micro_size, **overrides)
    check_config_outputs(config)
    return config


def parse_config(text: str, path, micro_size: int | None = None, **overrides) -> Config:
    """`load_config` of a config's YAML `text`; `path` names it in errors (and in `Config.path`).

    Example:
        >>> parse_config("model: {name: FFN}\\ninputs: [{shape: [64, 64]}]\\n", "inline.yaml").context.device_num
        1
    """
    return config_from_data(parse_config_text(text, path), text, path, micro_size, **overrides)


def config_from_data(data: dict, text: str, path, micro_size: int | None = None, example_inputs: bool = False,
                     **overrides) -> Config:
    """`parse_config` of a config's parsed YAML `data` (read from `text`); with `example_inputs`,
    a config without ``inputs`` takes its model's (`example_inputs()`: `autostrat estimate`).

    Example:
        >>> config = config_from_data({"model": {"name": "GPT", "params": {"batch": 2}}}, "", "inline.yaml", example_inputs=True)
        >>> [tensor.shape for tensor in config.inputs]
        [(2, 16), (32,)]
    """
    unknown = sorted(set(data) - set(KEYS) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r}; valid keys: {', '.join(sorted(KEYS + SECTIONS))}")
    file_keys = keys_from_file({key: data[key] for key in KEYS if key in data}, path)
    overrides = {key: value for key, value in overrides.items() if value is not None}
    from_file = bool(file_keys.get("strategy_ckpt_save_file")) and "strategy_ckpt_save_file" not in overrides
    try:
        context = ParallelContext(**file_keys | overrides, output_paths_from=str(path) if from_file else "")
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    if "model" not in data:
        raise ConfigError(f"{path}: missing key 'model'")
    net = _build_model(data["model"], f"{path}: model", Path(path).parent)
    if "inputs" in data or not (example_inputs and hasattr(net, "example_inputs")):
        if "inputs" not in data:
            raise ConfigError(f"{path}: missing key 'inputs'")
        inputs = _build_inputs(data["inputs"], f"{path}: inputs")
    else:
        inputs = tuple(net.example_inputs())
    _check_input_count(net, inputs, f"{path}: inputs")
    optimizer = _build_optimizer(data.get("optimizer"), f"{path}: optimizer")
    if optimizer is not None:
        context = replace(context, phase="train")
    strategies = _check_strategies(data.get("strategies"), f"{path}: strategies")
    micro_size = micro_size or data.get("micro_size", 1)
    if isinstance(micro_size, bool) or not isinstance(micro_size, int) or micro_size < 1:
        raise ConfigError(f"{path}: micro_size: expected a positive integer (micro-batches per step), got {micro_size!r}")
    _mark_stages(net, data.get("pipeline_stage"), f"{path}: pipeline_stage")
    file_context = ParallelContext(**file_keys | {"hardware": context.hardware})  # the profile is read once
    seed_devices = file_context.device_num // file_context.pipeline_stages
    config = Config(str(path), context, net, inputs, strategies, optimizer, micro_size=micro_size, seed_devices=seed_devices,
                    text=text)
    return with_recompute(config, _recompute_list(data.get("recompute"), f"{path}: recompute"), f"{path}: recompute")


def check_config_outputs(config: Config, outputs=(), inputs: dict | None = None) -> None:
    """Refuse, before anything is planned, outputs that would clobber (`io.check_outputs`): the
    config's strategy checkpoint and `outputs` against each other and against the inputs (the
    config, its strategy_ckpt_load_file, and `inputs`: role -> path).

    Example:
        >>> check_config_outputs(load_config("configs/ffn.yaml"), [OutputPath("configs/ffn.yaml", "--out")])
        Traceback (most recent call last):
        ...
        autostrat.errors.ConfigError: --out configs/ffn.yaml is the config configs/ffn.yaml: an output never replaces an input; ...
    """
    context = config.context
    read = {"the config": config.path} | (inputs or {})
    if context.strategy_ckpt_load_file:
        read["strategy_ckpt_load_file"] = context.strategy_ckpt_load_file
    own = [context.strategy_output()] if context.strategy_ckpt_save_file else []
    check_outputs(own + list(outputs), read)


def with_recompute(config: Config, paths, where: str = "--recompute") -> Config:
    """`config` with the cells at `paths` recomputed too (checked like the YAML list); "auto"
    among them turns the context's ``auto_recompute`` on (the search chooses more layers).

    Example:
        >>> with_recompute(load_config("configs/transformer_stack.yaml"), ["blocks.1"]).recompute
        ('blocks.1',)
        >>> with_recompute(load_config("configs/transformer_stack.yaml"), ["auto"]).context.auto_recompute
        True
    """
    if not paths:
        return config
    paths = list(paths)
    if AUTO_RECOMPUTE in paths:
        config = replace(config, context=replace(config.context, auto_recompute=True))
    added = _check_recompute(config.net, [path for path in paths if path != AUTO_RECOMPUTE], where)
    return replace(config, recompute=config.recompute + tuple(p for p in added if p not in config.recompute))


def _recompute_list(section, where: str) -> list:
    """A YAML ``recompute`` value as a list: cell paths, or "auto" alone."""
    if section is None:
        return []
    if section == AUTO_RECOMPUTE:
        return [section]
    if not isinstance(section, list):
        raise ConfigError(f"{where}: expected a list of cell paths such as [blocks.0, blocks.1], or auto, got {section!r}")
    return section


def _check_recompute(net, section, where: str) -> tuple[str, ...]:
    """The cell paths of a ``recompute`` list, each a cell of `net`."""
    if not isinstance(section, list) or not all(isinstance(path, str) for path in section):
        raise ConfigError(f"{where}: expected a list of cell paths such as [blocks.0, blocks.1], or auto, got {section!r}")
    cells = {path for path, _ in net.cells_and_names()}
    for path in section:
        if path not in cells:
            close = difflib.get_close_matches(path, sorted(cells), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: {path!r} is not a cell of {type(net).__name__}{hint}")
    return tuple(section)


def _mark_stages(net, section, where: str) -> None:
    """Set ``pipeline_stage`` on the cells a ``pipeline_stage`` mapping (cell path: stage) names."""
    if section is None:
        return
    if not isinstance(section, dict) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in section.values()):
        raise _fail(where, f"expected a mapping of cell paths to stages such as {{blocks.0: 0, blocks.1: 1}}, got {section!r}")
    cells = dict(net.cells_and_names())
    _check_recompute(net, list(section), where)  # every key a cell path, with the same hint
    for path, stage in section.items():
        cells[path].pipeline_stage = stage


def _build_optimizer(section, where: str):
    if section is None:
        return None
    if not isinstance(section, dict) or not isinstance(section.get("name"), str) or section["name"] not in OPTIMIZERS:
        raise _fail(where, f"expected {{name: {' | '.join(OPTIMIZERS)}, <its settings>}}, got {section!r}")
    settings = {key: value for key, value in section.items() if key != "name"}
    kind = OPTIMIZERS[section["name"]]
    try:
        return kind(**settings)
    except TypeError:
        accepted = ", ".join(f.name for f in fields(kind))
        raise _fail(where, f"{section['name']} accepts {accepted}; got {', '.join(sorted(settings))}") from None
    except AutostratError as error:
        raise _fail(where, str(error)) from None


def check_op_names(graph: Graph, names, where: str = "strategies") -> None:
    """A `ConfigError` for the first of `names` that is no op of `graph`, suggesting the closest."""
    for name in names:
        if name not in graph.ops:
            close = difflib.get_close_matches(name, list(graph.ops), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"{where}.{name}: the graph has no op named {name!r}{hint}")


def apply_seeds(graph: Graph, strategies: dict, device_num: int, where: str = "strategies") -> Graph:
    """A copy of `graph` whose named ops carry the given ``(in_strategy, out_strategy)`` seeds,
    each validated against its op; an unknown op name suggests the closest ones."""
    check_op_names(graph, strategies, where)
    ops = dict(graph.ops)
    for name, (in_strategy, out_strategy) in strategies.items():
        try:
            Strategy.from_tuples(ops[name].rule, in_strategy, device_num, out_strategy, where=f"{where}.{name}")
        except AutostratError as error:
            raise ConfigError(str(error)) from None
        ops[name] = replace(ops[name], in_strategy=in_strategy, out_strategy=out_strategy)
    return replace(graph, ops=ops)
