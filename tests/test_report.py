"""The plan report: its data adds up to the plan's predictions, the CLI writes it (from a search,
a plan's JSON or a run), and headless Chromium draws it without an error, with the summary, the
op graph and every chart present and non-empty on the screenshot."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from autostrat.cli import main
from autostrat.errors import ConfigError
from autostrat.frontend.config import load_config
from autostrat.frontend.run import plan_config
from autostrat.report.data import device_traffic, report_data
from autostrat.report.html import write_report

ROOT = Path(__file__).resolve().parent.parent
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
WIDTH, HEIGHT = 1440, 3600  # a laptop's width, tall enough for every section in one screenshot


def _plan(name: str, device_num: int | None = None):
    return plan_config(load_config(ROOT / "configs" / f"{name}.yaml"), device_num)[0]


@pytest.mark.parametrize("name", ["ffn", "gpt_train", "gpt_pipeline", "mlp"])
def test_report_data_adds_up_to_the_plan(name):
    plan = _plan(name)
    data = report_data(plan)
    layer_total = sum(sum(phases.values()) for _, phases in data["layer_bytes"])
    assert layer_total == plan.total_bytes
    assert max(data["memory"]["bytes"]) == plan.prediction.peak_bytes
    assert sorted(i for group in data["groups"] for i in group["ops"]) == list(range(len(plan.ops)))
    cells = {(op["group"], op["column"], op["row"]) for op in data["ops"]}
    assert len(cells) == len(plan.ops), "two ops drawn in one place"
    assert sum(edge[2] for edge in data["edges"]) == sum(e.cost for e in plan.redistributions if plan.graph.tensors[e.tensor].producer)
    traffic = device_traffic(plan)
    np.testing.assert_allclose(traffic.sum(axis=1), plan.total_bytes)
    assert np.all(np.diag(traffic) == 0)


def test_report_alternatives_match_explain():
    from autostrat.report.explain import explain

    plan = _plan("ffn")
    data = report_data(plan)
    op = next(op for op in data["ops"] if op["name"] == "dense2.matmul")
    local = {str(a.strategy): a.local_bytes for a in explain(plan, "dense2.matmul", alternatives=3).alternatives}
    shown = [(a["strategy"], a["delta_bytes"]) for a in op["alternatives"]]
    assert len(shown) == 3 and all(local[strategy] == change for strategy, change in shown)
    assert [change for _, change in shown] == sorted(local.values())[:3]


def test_same_plan_same_report(tmp_path):
    plan = _plan("gpt_train")
    first = write_report(plan, tmp_path / "a.html", png_dir=tmp_path / "a", search_seconds=1.25)
    second = write_report(plan, tmp_path / "b.html", png_dir=tmp_path / "b", search_seconds=1.25)
    for path_a, path_b in zip(first, second):
        assert path_a.read_bytes() == path_b.read_bytes(), path_a.name
    assert [p.name for p in first[1:]] == ["bytes_per_layer.png", "memory.png", "device_traffic.png"]
    for png in first[1:]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_report_from_plan_json_equals_search_report(tmp_path, capsys):
    config = ROOT / "configs" / "gpt_train.yaml"
    assert main(["search", str(config), "--device-num", "4", "--out", str(tmp_path / "plan.json"),
                 "--report", str(tmp_path / "search.html")]) == 0
    assert main(["report", str(tmp_path / "plan.json"), "-o", str(tmp_path / "again.html"), "--png", str(tmp_path / "png")]) == 0
    out = capsys.readouterr().out
    assert f"report written to {tmp_path / 'again.html'}" in out and "chart written to" in out
    searched, again = ((tmp_path / name).read_text() for name in ("search.html", "again.html"))
    assert _without_search_time(searched) == _without_search_time(again)
    recorded = json.loads((tmp_path / "plan.json").read_text())
    assert recorded["source"] == {"config": "gpt_train.yaml", "config_text": config.read_text(),
                                  "options": {"device_num": 4}, "imports": []}


def _without_search_time(page: str) -> str:
    page = re.sub(r'"search_seconds":[0-9.]+', '"search_seconds":0', page)
    return re.sub(r'SEARCH</div><div class="value">[0-9.]+ s', "SEARCH", page, flags=re.IGNORECASE)


def test_cli_explain_from_plan_json(tmp_path, capsys):
    assert main(["search", str(ROOT / "configs" / "ffn.yaml"), "--out", str(tmp_path / "plan.json")]) == 0
    capsys.readouterr()
    assert main(["explain", str(tmp_path / "plan.json"), "dense2.matmul", "--alternatives", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dense2.matmul  MatMul  ((2, 4), (4, 1))")
    assert "best alternatives (2 of" in out


def test_plan_json_without_source_or_changed_is_refused(tmp_path):
    from autostrat.cli import replan

    plan = _plan("ffn")
    plan.save(tmp_path / "bare.json")
    with pytest.raises(ConfigError, match=r"bare.json: expected a plan written by autostrat search --out.*has none"):
        replan(tmp_path / "bare.json")
    text = (ROOT / "configs" / "ffn.yaml").read_text()
    recorded = json.loads(plan.to_json()) | {"source": {"config": "ffn.yaml", "config_text": text, "options": {}}}
    recorded["ops"][0]["strategy"] = [[8, 1], [1, 1]]
    (tmp_path / "edited.json").write_text(json.dumps(recorded))
    with pytest.raises(ConfigError, match=r"edited.json: planning its embedded config \(ffn.yaml\) again with the recorded "
                                          r"options gave another plan"):
        replan(tmp_path / "edited.json")
    recorded["source"]["options"] = {"device_count": 8}
    (tmp_path / "unknown.json").write_text(json.dumps(recorded))
    with pytest.raises(ConfigError, match=r"source.options has device_count; expected only device_num"):
        replan(tmp_path / "unknown.json")


def test_cli_report_error_writes_nothing(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{}")
    assert main(["report", str(tmp_path / "bad.json"), "-o", str(tmp_path / "out.html")]) == 2
    assert "autostrat: error:" in capsys.readouterr().err
    assert not (tmp_path / "out.html").exists()


def test_run_report_shows_measured_next_to_predicted(tmp_path, capsys):
    code = main(["run", str(ROOT / "configs" / "ffn.yaml"), "--backend", "local", "--steps", "1",
                 "--report", str(tmp_path / "run.html")])
    assert code == 0
    page = (tmp_path / "run.html").read_text()
    assert 'id="chart-measured"' in page
    data = json.loads(re.search(r'<script type="application/json" id="plan-data">(.*?)</script>', page).group(1))
    measured = data["measured"]
    assert measured["phases"]["forward"]["measured"] == measured["phases"]["forward"]["predicted"] == [6144] * 8
    assert len(measured["peak"]["measured"]) == 8


def _browser() -> str:
    for name in BROWSERS:
        if shutil.which(name):
            return shutil.which(name)
    pytest.fail("the report's browser test needs headless Chromium: install Debian's chromium package "
                "(.ci/run installs it when missing: apt-get install chromium)")


# Chromium's own background traffic (updates, pings, DNS prefetch) is switched off, and anything
# left goes to a closed port on loopback: a test sends nothing off this machine.
OFFLINE = ("--disable-background-networking", "--disable-component-update", "--disable-domain-reliability",
           "--disable-sync", "--no-first-run", "--no-pings", "--dns-prefetch-disable", "--proxy-server=http://127.0.0.1:9")


def _chromium(page: Path, *arguments: str) -> subprocess.CompletedProcess:
    command = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr",
               "--v=0", *OFFLINE, f"--window-size={WIDTH},{HEIGHT}", "--virtual-time-budget=10000", *arguments,
               page.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_gpt_report_in_headless_chromium(tmp_path):
    """The GPT sample's training plan: no console message at all, the summary, the op graph and
    every chart in the DOM and non-empty on the screenshot."""
    page = tmp_path / "gpt.html"
    assert main(["search", str(ROOT / "configs" / "gpt_train.yaml"), "--report", str(page)]) == 0
    dumped = _chromium(page, "--dump-dom")
    console = [line for line in dumped.stderr.splitlines() if ":CONSOLE" in line]
    assert dumped.returncode == 0 and not console, console
    dom = dumped.stdout
    body = re.search(r"<body([^>]*)>", dom).group(1)
    assert "data-errors" not in body and "data-ready-ms" in body, body[:300]
    cards = re.findall(r'<div class="label">([^<]+)</div><div class="value">([^<]+)</div>', dom)
    assert [label for label, _ in cards] == ["devices", "predicted step time", "bytes per device per step",
                                            "peak memory per device", "search"]
    assert all(value.strip() for _, value in cards)
    assert re.search(r'id="lower-bound">communication: [0-9.]+× the per-op lower bounds', dom)
    plan = _plan("gpt_train")
    groups = re.findall(r'<details class="group" data-group="\d+"', dom)
    assert len(groups) == len(report_data(plan)["groups"])
    drawn = re.search(r'<svg class="ops".*?</svg>', dom, re.S).group(0)
    assert drawn.count('class="op') >= 10 and drawn.count("<path") >= 10
    assert "origin:" in re.search(r'<aside id="details">(.*?)</aside>', dom, re.S).group(1)
    for stem in ("bytes_per_layer", "memory", "device_traffic"):
        figure = re.search(rf'<figure id="chart-{stem}">(.*?)</figure>', dom, re.S)
        assert figure and figure.group(1).count("<path") >= 3, stem
    boxes = json.loads(re.search(r'data-boxes="([^"]*)"', body).group(1).replace("&quot;", '"'))

    shot = tmp_path / "gpt.png"
    taken = _chromium(page, f"--screenshot={shot}")
    assert taken.returncode == 0 and shot.exists(), taken.stderr[-2000:]
    from matplotlib.image import imread

    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (HEIGHT, WIDTH)
    for part in ("summary", "graph", "details", "chart-bytes_per_layer", "chart-memory", "chart-device_traffic"):
        left, top, width, height = boxes[part]
        assert width > 200 and height > 100 and top + height <= HEIGHT, (part, boxes[part])
        region = pixels[top:top + height, left:left + width]
        inked = np.mean(np.any(region < 0.8, axis=-1))  # share of pixels darker than the light backgrounds
        assert inked > 0.01, f"{part} looks empty on the screenshot ({inked:.2%} inked)"


def test_search_never_loads_the_drawing_libraries():
    """`autostrat search` (without --report) stays lean: the report's modules and matplotlib
    are imported only by the commands that draw."""
    script = ("import sys; from autostrat.cli import main; "
              "main(['search', 'configs/ffn.yaml', '--out', sys.argv[1]]); "
              "print(sorted(m for m in sys.modules if m.startswith(('matplotlib', 'autostrat.report.'))))")
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run([sys.executable, "-c", script, str(Path(folder) / "plan.json")], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_report_explain_and_diff_work_on_every_shipped_config(config, tmp_path):
    from autostrat.plan_diff import diff_plans
    from autostrat.report.explain import explain

    plan = plan_config(load_config(ROOT / "configs" / config))[0]
    written = write_report(plan, tmp_path / "plan.html")
    assert written == [tmp_path / "plan.html"] and "plan-data" in written[0].read_text()
    products = [name for name, op in plan.ops.items() if op.op_type in ("MatMul", "BatchMatMul")]
    for op in [*products[:1], list(plan.ops)[-1]]:
        text = explain(plan, op, alternatives=1).text
        assert text.startswith(f"{op}  {plan.ops[op].op_type}  {plan.ops[op].strategy}")
    same = diff_plans(plan, plan)
    assert not same.changed and same.totals == (plan.total_bytes, plan.total_bytes)
