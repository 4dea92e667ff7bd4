"""The ``hardware`` context key: a named hardware profile (`cost.hardware.PROFILES`) or a YAML
file of a profile's fields, read as data.

A file gives every speed of the profile and, optionally, its efficiency factors (1.0 when
absent) and its device memory in bytes (80 GiB, the shipped profiles', when absent: a search
without max_device_memory fits its plan into it); its name is the file's name::

    # my_cluster.yaml
    device_flops: 312e12            # FLOP/s at 16 bits (32-bit ops run at half)
    device_memory_bandwidth: 2.039e12
    intra_server_bandwidth: 300e9   # bytes/s each device sends
    inter_server_bandwidth: 25e9
    intra_server_latency: 2e-6      # seconds per ring message
    inter_server_latency: 4e-6
    devices_per_server: 8
    matmul_efficiency: 0.6          # optional, each in (0, 1]
    attention_efficiency: 0.34      # optional, each in (0, 1]: fused attention's forward and
    attention_backward_efficiency: 0.33  # backward rates (absent: matmul_efficiency's)
    kernel_latency: 5e-6            # optional: seconds per op beyond its flops and bytes (default 0)
    kernel_rates: {Conv2D: 1.8}     # optional: per op type, times the FLOP rate its kernel runs at (default 1)
    collective_latency: 2e-5        # optional: seconds per collective step beyond its messages (default 0)
    cores_per_server: 2             # optional: cores the devices of a server share (default 0: their own)
    collective_wait: 0.05           # optional: share of the compute since a collective the next one waits (default 0)
    crowded:                        # optional: per ranks per core measured (> 1), [message latency s,
      2: [6e-5, 3.5e9, 2.1, 6e-5, 0.4, 1.5e-3]  # bandwidth B/s, kernel slowdown, collective latency s,
                                    #   collective wait, its most s]
    device_memory: 85899345920      # optional, bytes per device
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from autostrat.cost.hardware import INTEGER_FIELDS, OPTIONAL_FIELDS, PROFILES, Hardware
from autostrat.errors import ConfigError
from autostrat.frontend.yaml_text import parse_config_text
from autostrat.reading import read_text

FILE_FIELDS = tuple(f.name for f in fields(Hardware) if f.name != "name")
REQUIRED_FIELDS = tuple(field for field in FILE_FIELDS if field not in OPTIONAL_FIELDS)
_EXAMPLE = PROFILES["h100-sxm-80gb"]


def hardware_number(field: str, value):
    """`value`, or the number a string spells ("989.4e12": YAML reads ``989.4e12`` as a string);
    anything else is left for `Hardware` to refuse.

    Example:
        >>> hardware_number("device_flops", "989.4e12"), hardware_number("devices_per_server", "4")
        (989400000000000.0, 4)
    """
    if isinstance(value, str):
        try:
            return int(value) if field in INTEGER_FIELDS else float(value)
        except ValueError:
            raise ConfigError(f"{field} must be a number such as {getattr(_EXAMPLE, field):g}, got {value!r}") from None
    return value


def resolve_hardware(value) -> Hardware:
    """The profile the ``hardware`` key names: a `Hardware` (kept), a name in `PROFILES`, or
    a ``.yaml``/``.yml`` file (`read_hardware_file`).

    Example:
        >>> resolve_hardware("a100-80gb").device_flops
        312000000000000.0
    """
    if isinstance(value, Hardware):
        return value
    if isinstance(value, str) and value in PROFILES:
        return PROFILES[value]
    if isinstance(value, (str, Path)) and str(value).endswith((".yaml", ".yml")):
        return read_hardware_file(value)
    raise ConfigError(f"hardware must be one of {', '.join(PROFILES)} or a .yaml file of a profile's fields, got {value!r}")


def read_hardware_file(path) -> Hardware:
    """The profile a YAML file at `path` describes (see the module docstring); an unreadable
    file, an unknown or missing field, or a value of the wrong type or range is a `ConfigError`
    naming the file, the field and the value."""
    data = parse_config_text(read_text(path, "hardware profile"), path, keys=", ".join(REQUIRED_FIELDS))
    unknown = sorted(set(data) - set(FILE_FIELDS), key=str)
    if unknown:
        raise ConfigError(f"{path}: unknown field {unknown[0]!r} = {data[unknown[0]]!r}; a hardware profile has "
                          f"{', '.join(FILE_FIELDS)}")
    missing = [field for field in REQUIRED_FIELDS if field not in data]
    if missing:
        raise ConfigError(f"{path}: missing field {missing[0]!r}; a hardware profile gives {', '.join(REQUIRED_FIELDS)} "
                          f"(and optionally {', '.join(OPTIONAL_FIELDS)})")
    try:
        return Hardware(**{field: hardware_number(field, value) for field, value in data.items()}, name=Path(path).name)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
