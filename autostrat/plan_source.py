"""Where a plan came from, as its JSON records it ("source"), and the same plan made again from
that record alone, for `autostrat report` and `autostrat explain`.

A plan's JSON holds strategies, not the model, so the report plans again. It does so from the
plan file's own content, never from a file the plan names: ``source`` embeds the config's YAML
text (only its file name is kept, so no path of the author's machine leaks and the plan may
move), the search options, a strategy checkpoint the config seeds from, and the modules the
search was given with ``--import`` (as a hint only: the reader must pass ``--import`` again,
since importing runs code). Planning again writes nothing: a config's
``strategy_ckpt_save_file`` is ignored. A hardware profile read from a file (``hardware:
FILE.yaml`` or ``--hardware FILE.yaml``) is embedded by value under ``hardware``, as the plan's
JSON names it, for the same reason.

    "source": {"config": "ffn.yaml", "config_text": "device_num: 8\\n...", "options": {"device_num": 4},
               "imports": [], "strategy_ckpt": {"name": "seeds.json", "base64": "..."}}
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import asdict, fields, replace
from pathlib import Path

from autostrat.cost import PROFILES, Hardware
from autostrat.cost.hardware import ATTENTION_EFFICIENCIES, HOST_FIELDS
from autostrat.errors import ConfigError
from autostrat.frontend.config import parse_config
from autostrat.io import write_atomically

# The `autostrat search` options a plan's JSON records, and the context keys they override.
from autostrat.reading import read_bytes

# The `autostrat search` options a plan's JSON records, and the context keys they override.
SOURCE_OPTIONS = {"device_num": None, "refine": "refine", "time_limit": "refine_time_limit",
                  "max_device_memory": "max_device_memory", "coarsen": "coarsen", "phase": "phase", "mesh": "mesh",
                  "cost_model": "cost_model", "precision": "precision", "hardware": "hardware", "parallel_optimizer": "enable_parallel_optimizer",
                  "pipeline_stages": "pipeline_stages", "pipeline_schedule": "pipeline_schedule",
                  "pipeline_interleave_num": "pipeline_interleave_num", "micro_size": None, "recompute": None}


def context_overrides(options: dict) -> dict:
    """The context keys that search `options` (named as in `SOURCE_OPTIONS`) override.

    Example:
        >>> context_overrides({"time_limit": 5.0, "device_num": 4, "parallel_optimizer": True})
        {'refine_time_limit': 5.0, 'enable_parallel_optimizer': True}
    """
    overrides = {key: options[option] for option, key in SOURCE_OPTIONS.items() if key and options.get(option) is not None}
    if "pipeline_schedule" in overrides:  # the command line's schedule replaces the file's (MindSpore's pipeline_config)
        overrides["pipeline_config"] = {}
    return overrides


def plan_source(config, options: dict, imports=()) -> dict:
    """The "source" record of a plan searched from `config` (a loaded `Config`) with the
    search `options` that were given (None values left out), the config's strategy
    checkpoint embedded.

    Example:
        >>> from autostrat.frontend.config import load_config
        >>> source = plan_source(load_config("configs/ffn.yaml"), {"device_num": 4, "refine": None})
        >>> source["config"], source["options"], source["config_text"].startswith("# MindSpore")
        ('ffn.yaml', {'device_num': 4}, True)
    """
    source = {"config": Path(config.path).name, "config_text": config.text,
              "options": {key: value for key, value in options.items() if value is not None}, "imports": list(imports)}
    hardware = config.context.hardware
    if PROFILES.get(hardware.name) != hardware:  # read from a file: kept by value
        source["hardware"] = asdict(hardware)
    seeds_file = config.context.strategy_ckpt_load_file
    if seeds_file:
        data = read_bytes(seeds_file, "strategy checkpoint")
        source["strategy_ckpt"] = {"name": Path(seeds_file).name, "base64": base64.b64encode(data).decode("ascii")}
    return source


def source_config(source, where: str, work: Path):
    """The `Config` a "source" record describes, with the options applied and the embedded
    strategy checkpoint written into the private folder `work`; its strategy checkpoint is
    never saved. A record of another shape is a `ConfigError` at `where`."""
    _check_shape(source, where)
    options = {key: None for key in SOURCE_OPTIONS} | source["options"]
    if isinstance(options["mesh"], list):
        options["mesh"] = tuple(options["mesh"])
    where_text = f"{where}: source.config_text ({source['config']})"
    overrides = context_overrides(options)
    if "hardware" in source:
        overrides["hardware"] = _embedded_hardware(source["hardware"], where)
    try:
        config = parse_config(source["config_text"], where_text, options["micro_size"], **overrides)
    except ConfigError as error:
        imports = source.get("imports") or []
        hint = f" (it was searched with --import {' --import '.join(map(str, imports))}: give the same)" if imports else ""
        raise ConfigError(f"{error}{hint}") from None
    context = _without_checkpoint_files(config.context)
    if "strategy_ckpt" in source:
        context = replace(context, strategy_ckpt_load_file=str(_embedded_checkpoint(source["strategy_ckpt"], where, work)))
    return replace(config, context=context), options


def _check_shape(source, where: str) -> None:
    expected = ("expected a plan written by autostrat search --out, which records the config it was planned from under "
                "\"source\" (config, config_text, options)")
    if not isinstance(source, dict) or not isinstance(source.get("options"), dict) or not isinstance(
            source.get("config_text"), str) or not isinstance(source.get("config"), str):
        raise ConfigError(f"{where}: {expected}; this file has {'none' if source is None else 'another shape'}")
    unknown = sorted(set(source["options"]) - set(SOURCE_OPTIONS))
    if unknown:
        raise ConfigError(f"{where}: source.options has {', '.join(unknown)}; expected only {', '.join(SOURCE_OPTIONS)}")
    extra = sorted(set(source) - {"config", "config_text", "options", "imports", "strategy_ckpt", "hardware"})
    if extra:
        raise ConfigError(f"{where}: source has {', '.join(extra)}; expected config, config_text, options, imports, "
                          f"strategy_ckpt and hardware")


def _embedded_hardware(record, where: str) -> Hardware:
    """The hardware profile a "source" record embeds (`Hardware`'s fields by name; a record
    written before the host fields or the attention efficiencies existed has none of them: 0 and
    None, as then)."""
    names, later = {field.name for field in fields(Hardware)}, (*HOST_FIELDS, *ATTENTION_EFFICIENCIES)
    required = names - set(later)
    if not isinstance(record, dict) or not required <= set(record) <= names:
        raise ConfigError(f"{where}: source.hardware: expected a mapping of {', '.join(sorted(required))} "
                          f"(and optionally {', '.join(later)}), got {record!r}")
    try:
        return Hardware(**record)
    except ConfigError as error:
        raise ConfigError(f"{where}: source.hardware: {error}") from None


def _without_checkpoint_files(context):
    """`context` reading and writing no strategy checkpoint (planning again writes nothing)."""
    config = context.strategy_ckpt_config
    if isinstance(config, dict):
        config = {key: value for key, value in config.items() if key not in ("save_file", "load_file")}
    return replace(context, strategy_ckpt_config=config, strategy_ckpt_save_file="", strategy_ckpt_load_file="")


def _embedded_checkpoint(record, where: str, work: Path) -> Path:
    name = record.get("name") if isinstance(record, dict) else None
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", "..") or not isinstance(
            record.get("base64"), str):
        raise ConfigError(f"{where}: source.strategy_ckpt: expected {{name: FILE NAME, base64: TEXT}}, got {record!r}")
    try:
        data = base64.b64decode(record["base64"], validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{where}: source.strategy_ckpt.base64: not valid base64") from None
    path = work / name
    write_atomically(path, data, private=True)
    return path
