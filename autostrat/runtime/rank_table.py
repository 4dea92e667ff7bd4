"""MindSpore's rank table (``RANK_TABLE_FILE``): the servers of a cluster and their devices.

    {"version": "1.0", "server_count": "1", "status": "completed",
     "server_list": [{"server_id": "10.155.111.140", "host_nic_ip": "reserve",
                      "device": [{"device_id": "0", "device_ip": "192.1.27.6", "rank_id": "0"}, ...]}]}

Every value is a string, as in MindSpore's files. Rank ids must be unique, cover
``0 .. device_num - 1``, and run in order through the servers (``mpiexec`` fills a host's slots
with consecutive ranks). Every problem is a `ConfigError` naming the file and the entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autostrat.errors import ConfigError
from autostrat.reading import read_json

TOP_KEYS = ("server_count", "server_list", "status", "version")
DEVICE_KEYS = ("device_id", "device_ip", "rank_id")


@dataclass(frozen=True)
class Device:
    device_id: str
    device_ip: str
    rank_id: int


@dataclass(frozen=True)
class Server:
    server_id: str
    host_nic_ip: str
    devices: tuple[Device, ...]


@dataclass(frozen=True)
class RankTable:
    """A validated rank table.

    Example:
        >>> table = parse_rank_table({"version": "1.0", "server_count": "1", "status": "completed",
        ...     "server_list": [{"server_id": "127.0.0.1", "host_nic_ip": "reserve", "device": [
        ...         {"device_id": str(i), "device_ip": f"192.1.27.{i}", "rank_id": str(i)} for i in range(2)]}]})
        >>> table.device_num, table.hosts()
        (2, [('127.0.0.1', 2)])
    """

    path: str
    version: str
    status: str
    servers: tuple[Server, ...]

    @property
    def device_num(self) -> int:
        return sum(len(server.devices) for server in self.servers)

    def hosts(self) -> list[tuple[str, int]]:
        """One ``(host, slots)`` per server, in rank order: the MPI host list."""
        return [(server.server_id, len(server.devices)) for server in self.servers]

    def mesh(self) -> tuple[int, int] | None:
        """``(servers, devices per server)`` when every server has as many devices, else None."""
        sizes = {len(server.devices) for server in self.servers}
        return (len(self.servers), sizes.pop()) if len(sizes) == 1 else None


def _string(value, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty string (rank table values are strings), got {value!r}")
    return value


def _integer(value, where: str) -> int:
    text = _string(value, where)
    if not text.isdigit():
        raise ConfigError(f"{where}: expected a non-negative integer as a string, got {value!r}")
    return int(text)


def _mapping(value, keys, where: str) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected an object with keys {', '.join(keys)}, got {value!r}")
    missing = [key for key in keys if key not in value]
    if missing:
        raise ConfigError(f"{where}: missing key {missing[0]!r}")
    return value


def _device(value, where: str) -> Device:
    value = _mapping(value, DEVICE_KEYS, where)
    return Device(_string(value["device_id"], f"{where}.device_id"), _string(value["device_ip"], f"{where}.device_ip"),
                  _integer(value["rank_id"], f"{where}.rank_id"))


def _server(value, where: str) -> Server:
    value = _mapping(value, ("server_id", "device"), where)
    devices = value["device"]
    if not isinstance(devices, list) or not devices:
        raise ConfigError(f"{where}.device: expected a non-empty list of devices, got {devices!r}")
    host_nic_ip = value.get("host_nic_ip", "reserve")
    return Server(_string(value["server_id"], f"{where}.server_id"), _string(host_nic_ip, f"{where}.host_nic_ip"),
                  tuple(_device(device, f"{where}.device[{i}]") for i, device in enumerate(devices)))


def _check_ranks(servers: tuple[Server, ...], where: str) -> None:
    expected = 0
    for s, server in enumerate(servers):
        for d, device in enumerate(server.devices):
            if device.rank_id != expected:
                raise ConfigError(
                    f"{where}: server_list[{s}].device[{d}].rank_id: expected {expected} (rank ids are unique and "
                    f"run 0, 1, 2, ... through the servers in order), got {device.rank_id}"
                )
            expected += 1


def parse_rank_table(data, where: str = "rank table", device_num: int | None = None) -> RankTable:
    """Validate a rank table's JSON data; with `device_num`, its device count must equal it."""
    data = _mapping(data, TOP_KEYS, where)
    servers_data = data["server_list"]
    if not isinstance(servers_data, list) or not servers_data:
        raise ConfigError(f"{where}: server_list: expected a non-empty list of servers, got {servers_data!r}")
    servers = tuple(_server(server, f"{where}: server_list[{i}]") for i, server in enumerate(servers_data))
    count = _integer(data["server_count"], f"{where}: server_count")
    if count != len(servers):
        raise ConfigError(f"{where}: server_count is {count} but server_list has {len(servers)} server(s)")
    status = _string(data["status"], f"{where}: status")
    if status != "completed":
        raise ConfigError(f"{where}: status must be 'completed' (a finished rank table), got {status!r}")
    _check_ranks(servers, where)
    table = RankTable(where, _string(data["version"], f"{where}: version"), status, servers)
    if device_num is not None and table.device_num != device_num:
        raise ConfigError(f"{where}: lists {table.device_num} device(s) but device_num is {device_num}")
    return table


def load_rank_table(path, device_num: int | None = None) -> RankTable:
    """Read and validate a rank table file (see `parse_rank_table`)."""
    path = Path(path)
    data = read_json(path, "rank table")
    return parse_rank_table(data, str(path), device_num)
