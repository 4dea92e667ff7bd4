"""MindSpore's context keys that autostrat takes differently: the compiler and fusion knobs that
have no effect here (`NO_EFFECT`, one warning each: `warn_once`), the keys it refuses
(`UNSUPPORTED`), MindSpore's spellings mapped onto autostrat's (`mindspore_only`), and a config
file's keys with their paths relative to its folder (`keys_from_file`).
"""

from __future__ import annotations

import warnings
from pathlib import Path

from autostrat.cost import PROFILES
from autostrat.cost.overlap import comm_fusion_bytes
from autostrat.errors import ConfigError
from autostrat.io import OutputPath

# MindSpore keys that tune its compiler or its collectives' fusion: accepted, one warning each.
NO_EFFECT = ("all_reduce_fusion_config", "comm_fusion", "enable_alltoall", "force_fp32_communication",
             "gradient_fp32_sync", "group_ckpt_save_file", "loss_repeated_mean", "pipeline_result_broadcast")
# MindSpore keys whose meaning autostrat does not implement: refused, saying why.
UNSUPPORTED = {
    "grad_accumulation_step": "gradient accumulation is not built; nn.PipelineCell's micro_size accumulates micro-batches",
    "auto_pipeline": "the stage split is always searched when pipeline_stages > 1 and no cell has a pipeline_stage",
}
_warned: set[str] = set()  # what `warn_once` has said, by key (both contexts')


def forget_warnings() -> None:
    """Have `warn_once` say everything again (tests that expect a warning a previous one caused)."""
    _warned.clear()


def warn_once(key: str, message: str, stacklevel: int = 3) -> None:
    """`message` as a warning, the first time `key` asks for it in this process: a key that is
    accepted and does nothing is said once, not at every call."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=stacklevel + 1)


def mindspore_only(kwargs: dict) -> dict:
    """`kwargs` without the keys that have no effect here (each warned about once) and with
    MindSpore's deprecated ``auto_parallel_search_mode`` as `search_mode`."""
    kwargs = dict(kwargs)
    fused = comm_fusion_bytes(kwargs.get("comm_fusion"))
    if fused is not None:  # by size: gradient buckets, which autostrat builds
        if kwargs.get("bucket_bytes", fused) != fused:
            raise ConfigError(f"comm_fusion asks for buckets of {fused} bytes and bucket_bytes for {kwargs['bucket_bytes']}: "
                              f"give one of them")
        kwargs.pop("comm_fusion")
        kwargs["bucket_bytes"] = fused
    for key in NO_EFFECT:
        if key in kwargs:
            kwargs.pop(key)
            warn_once(key, f"set_auto_parallel_context: {key} is accepted and has no effect in autostrat "
                           f"(it tunes MindSpore's compiler or collectives)", stacklevel=3)
    if "auto_parallel_search_mode" in kwargs:
        kwargs.setdefault("search_mode", kwargs.pop("auto_parallel_search_mode"))
    if kwargs.get("parameter_broadcast") is True:
        warn_once("parameter_broadcast", "set_auto_parallel_context: parameter_broadcast=True is what autostrat always "
                                         "does (every rank's parameters are made from one seed), nothing to broadcast",
                  stacklevel=3)
    return kwargs


def keys_from_file(keys: dict, path) -> dict:
    """The context `keys` a config file at `path` gives, with its file paths (the checkpoints,
    a `hardware` profile file) relative to the file's folder, ``strategy_ckpt_config``'s paths moved onto the keys they set (so that a
    command-line option replaces them), and a path it writes refused outside that folder: a
    config is data, and data does not choose what to overwrite (see `autostrat.io`).

    Example:
        >>> keys_from_file({"strategy_ckpt_config": {"load_file": "s.json"}}, "configs/ffn.yaml")
        {'strategy_ckpt_config': {}, 'strategy_ckpt_load_file': 'configs/s.json'}
    """
    keys, given, path = dict(keys), {}, Path(path)
    for key in ("strategy_ckpt_save_file", "strategy_ckpt_load_file"):
        if keys.get(key):
            given[key] = (key, keys[key])
    mindspore = keys.get("strategy_ckpt_config")
    if isinstance(mindspore, dict) and set(mindspore) <= {"save_file", "load_file", "only_trainable_params"}:
        keys["strategy_ckpt_config"] = {key: value for key, value in mindspore.items() if key == "only_trainable_params"}
        for key in ("save_file", "load_file"):
            if mindspore.get(key):  # over the plain key, as in `ParallelContext`
                given[f"strategy_ckpt_{key}"] = (f"strategy_ckpt_config.{key}", mindspore[key])
    if isinstance(keys.get("hardware"), str) and keys["hardware"] not in PROFILES:  # a profile file
        keys["hardware"] = str(path.parent / keys["hardware"])
    for key, (name, value) in given.items():
        if isinstance(value, str):  # anything else: refused by `ParallelContext`
            value = str(path.parent / value)
            if key == "strategy_ckpt_save_file":
                OutputPath(value, name, str(path)).check()
        keys[key] = value
    return keys
