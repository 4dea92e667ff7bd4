"""Rank tables: the tutorial's table parses; each malformed entry has its own message."""

from __future__ import annotations

import json

import pytest

from autostrat.errors import ConfigError
from autostrat.runtime.launcher import hostfile_text, mpiexec_command
from autostrat.runtime.rank_table import load_rank_table, parse_rank_table

SAMPLE = "sample_code/sharding_propagation/rank_table_8pcs.json"


def two_servers():
    return {
        "version": "1.0", "server_count": "2", "status": "completed",
        "server_list": [
            {"server_id": f"10.0.0.{s + 1}", "host_nic_ip": "reserve", "device": [
                {"device_id": str(d), "device_ip": f"192.1.{s}.{d}", "rank_id": str(4 * s + d)} for d in range(4)]}
            for s in range(2)
        ],
    }


def test_the_tutorial_table_has_8_devices_on_one_server():
    table = load_rank_table(SAMPLE, device_num=8)
    assert table.hosts() == [("127.0.0.1", 8)]


def test_servers_become_host_file_lines():
    table = parse_rank_table(two_servers())
    assert hostfile_text(table.hosts()) == "10.0.0.1:4\n10.0.0.2:4\n"


def test_the_mpiexec_command_runs_ranks_under_mpi4py(tmp_path):
    command = mpiexec_command(tmp_path / "mpiexec", 8, tmp_path, tmp_path / "hostfile")
    assert command[1:5] == ["-f", str(tmp_path / "hostfile"), "-n", "8"]
    assert command[-5:] == ["-m", "mpi4py", "-m", "autostrat.runtime.rank", str(tmp_path)]


def _broken(path, value):
    data = two_servers()
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


BAD = [
    (("status",), None, "rank table: missing key 'status'"),
    (("server_count",), 2, "rank table: server_count: expected a non-empty string (rank table values are strings), got 2"),
    (("server_count",), "3", "rank table: server_count is 3 but server_list has 2 server(s)"),
    (("status",), "initializing", "status must be 'completed'"),
    (("server_list",), [], "server_list: expected a non-empty list of servers"),
    (("server_list", 1, "device"), [], "server_list[1].device: expected a non-empty list of devices"),
    (("server_list", 0, "device", 2, "rank_id"), "x", "server_list[0].device[2].rank_id: expected a non-negative integer"),
    (("server_list", 0, "device", 2, "rank_id"), "1", "server_list[0].device[2].rank_id: expected 2"),
    (("server_list", 1, "device", 0, "device_ip"), None, "server_list[1].device[0]: missing key 'device_ip'"),
]


@pytest.mark.parametrize("path,value,message", BAD, ids=[m[:40] for *_, m in BAD])
def test_a_bad_table_names_the_entry(path, value, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        parse_rank_table(_broken(path, value))


def test_device_count_must_equal_device_num(tmp_path):
    path = tmp_path / "table.json"
    path.write_text(json.dumps(two_servers()))
    with pytest.raises(ConfigError, match="lists 8 device\\(s\\) but device_num is 4"):
        load_rank_table(path, device_num=4)


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read rank table"):
        load_rank_table(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON at line 1"):
        load_rank_table(tmp_path / "bad.json")
