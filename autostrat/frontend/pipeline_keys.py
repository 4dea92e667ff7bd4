"""The context keys that choose a pipeline's schedule: `pipeline_schedule`,
`pipeline_interleave_num` and MindSpore's `pipeline_config` (`ParallelContext` documents them).

Cases, in order: MindSpore's ``pipeline_config`` gives a schedule when it names one or
interleaves (``pipeline_interleave = True`` makes 1F1B Megatron's interleaved one; zbv is
interleaved already); `pipeline_schedule` must then be the same one, else both keys are named;
the chunks (model stages per device group) are `pipeline_interleave_num`, checked against what
the schedule runs, or the schedule's default. ``pipeline_schedule: auto`` leaves the schedule
and its chunks to the search (`search.schedule_split.choose_schedule`; MindSpore has no such
value: a MindSpore user names one); `pipeline_interleave_num` then fixes interleaved_1f1b's.
"""

from __future__ import annotations

from autostrat.errors import ConfigError
from autostrat.search.schedule_split import AUTO
from autostrat.search.schedules import SCHEDULE_ORDERS

# MindSpore's pipeline_scheduler names autostrat calls otherwise, and the schedules pipeline_interleave makes of them.
MINDSPORE_SCHEDULES = {"zero_bubble_v": "zbv"}
INTERLEAVED = {"1f1b": "interleaved_1f1b", "interleaved_1f1b": "interleaved_1f1b", "zbv": "zbv"}
CHUNKS = {"interleaved_1f1b": None, "zbv": 2}  # model stages per device group a schedule runs (None: any); others 1


def configured_schedule(pipeline_config) -> str | None:
    """The schedule MindSpore's `pipeline_config` asks for (None: it names none).

    Example:
        >>> configured_schedule({"pipeline_scheduler": "zero_bubble_v"}), configured_schedule(None)
        ('zbv', None)
    """
    config = {} if pipeline_config is None else pipeline_config
    if not isinstance(config, dict) or set(config) - {"pipeline_scheduler", "pipeline_interleave"}:
        raise ConfigError(f"pipeline_config takes the keys pipeline_scheduler and pipeline_interleave, got {config!r}")
    interleave = config.get("pipeline_interleave", False)
    if not isinstance(interleave, bool):
        raise ConfigError(f"pipeline_config.pipeline_interleave must be True or False, got {interleave!r}")
    if "pipeline_scheduler" not in config and not interleave:
        return None
    named = config.get("pipeline_scheduler", "1f1b")
    schedule = MINDSPORE_SCHEDULES.get(named, named) if isinstance(named, str) else None
    if schedule not in SCHEDULE_ORDERS:
        raise ConfigError(f"pipeline_config.pipeline_scheduler must be one of "
                          f"{', '.join(SCHEDULE_ORDERS + tuple(MINDSPORE_SCHEDULES))}; got {named!r}")
    if interleave and schedule not in INTERLEAVED:
        raise ConfigError(f"pipeline_config.pipeline_interleave = True interleaves 1f1b (or runs zbv), but "
                          f"pipeline_config.pipeline_scheduler is {named!r}")
    return INTERLEAVED[schedule] if interleave else schedule


def schedule_and_chunks(pipeline_schedule, pipeline_interleave_num, pipeline_config) -> tuple[str, int | None]:
    """The pipeline's schedule and model stages per device group from the three keys; with
    ``pipeline_schedule: auto`` (the search chooses: `schedule_split.choose_schedule`) the
    chunks are interleaved_1f1b's if given, else None (the search tries several).

    Example (MindSpore's interleave is Megatron's interleaved 1F1B, 2 chunks by default):
        >>> schedule_and_chunks(None, None, {"pipeline_interleave": True}), schedule_and_chunks("zbv", None, None)
        (('interleaved_1f1b', 2), ('zbv', 2))
    """
    configured = configured_schedule(pipeline_config)
    schedule = pipeline_schedule
    if schedule is not None:
        if schedule not in SCHEDULE_ORDERS + (AUTO,):
            raise ConfigError(f"pipeline_schedule must be one of {', '.join(SCHEDULE_ORDERS + (AUTO,))}; got {schedule!r}")
        if configured is not None and configured != schedule:
            raise ConfigError(f"pipeline_schedule is {schedule!r} but pipeline_config asks for {configured!r} "
                              f"({pipeline_config!r}): set one of the two keys")
    schedule = schedule or configured or "1f1b"
    allowed, chunks = CHUNKS.get(schedule, 1), pipeline_interleave_num
    if schedule == AUTO:
        allowed = None  # the search tries interleaved_1f1b with these chunks, else with 2 to MAX_CHUNKS
        if chunks is None:
            return schedule, None
    if chunks is None:
        return schedule, allowed or 2
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ConfigError(f"pipeline_interleave_num must be a positive integer (model stages per device group), got {chunks!r}")
    if allowed is not None and chunks != allowed:
        raise ConfigError(f"pipeline_interleave_num = {chunks}, but the pipeline schedule {schedule} (pipeline_schedule or "
                          f"pipeline_config) runs {allowed} model stage(s) per device group; interleaved_1f1b takes any")
    return schedule, chunks
