"""The files the `autostrat` command writes, by the options that name them (``--out``,
``--dump-ir``, ``--report``/``-o``, ``--png``): known before anything is planned, so that a clash
is refused before the work (`io.check_outputs`), and written all or nothing afterwards.

A path on the command line may be anywhere; "-" is standard output for a file option (the
command's text then goes to standard error, so that ``autostrat search c.yaml --out - | jq``
reads JSON only), never for a folder option.
"""

from __future__ import annotations

import sys
from pathlib import Path

from autostrat.errors import ConfigError
from autostrat.io import OutputPath, write_files_atomically
from autostrat.search.dump import ANNOTATED, SLICED


def command_line_output(path: str, role: str) -> OutputPath:
    """A path given on the command line under the option `role`: anywhere, "-" standard output.

    Example:
        >>> command_line_output("-", "--out").written("plan")
        'plan written to standard output'
    """
    return OutputPath(path, role, stdout=path == "-")


def planned_outputs(args) -> list[OutputPath]:
    """The files the command's output options name (the report's charts: all it may draw), or
    a `ConfigError` for an option that cannot work: "-" as a folder, --png without --report,
    run --report - (the run's own lines go to standard output)."""
    outputs = [command_line_output(args.out, "--out")] if getattr(args, "out", None) else []
    dump_ir = getattr(args, "dump_ir", None)
    for role, folder in (("--dump-ir", dump_ir), ("--png", args.png)):
        if folder == "-":
            raise ConfigError(f"{role} takes a folder; standard output (-) takes one file")
    if dump_ir:
        outputs += [command_line_output(str(Path(dump_ir) / name), "--dump-ir") for name in (ANNOTATED, SLICED)]
    if args.png and not args.report:
        raise ConfigError(f"--png {args.png} writes the report's charts: give --report FILE too")
    if args.command == "run" and args.report == "-":
        raise ConfigError("run --report: standard output (-) carries the run's own lines; give a file")
    if args.report:
        from autostrat.report.html import CHART_TITLES  # drawing libraries: off the search's import path

        outputs.append(command_line_output(args.report, _report_role(args)))
        stems = [stem for stem in CHART_TITLES if stem != "measured" or args.command == "run"]
        outputs += [command_line_output(str(Path(args.png) / f"{stem}.png"), "--png") for stem in stems if args.png]
    return outputs


def report_outputs(plan, args, seconds, budget, measured=None) -> dict[OutputPath, tuple[str, str | bytes]]:
    """The report's page and charts for `write_outputs`."""
    from autostrat.report.html import report_files  # drawing libraries: off the search's import path

    files = report_files(plan, args.report, args.png, seconds, budget, measured)
    page = Path(args.report)
    return {(command_line_output(args.report, _report_role(args)) if path == page else command_line_output(str(path), "--png")):
            ("report" if path == page else "chart", data) for path, data in files.items()}


def _report_role(args) -> str:
    return "-o" if args.command == "report" else "--report"


def write_outputs(outputs: dict) -> list[str]:
    """Write `outputs` (`OutputPath` -> (what, text or bytes)) all or nothing; returns the lines
    saying where each went."""
    write_files_atomically({output: data for output, (_, data) in outputs.items()})
    return [output.written(what) for output, (what, _) in outputs.items()]


def text_stream(args):
    """Where the command's text goes: standard error when standard output carries an output."""
    return sys.stderr if "-" in (getattr(args, "out", None), getattr(args, "report", None), getattr(args, "json", None)) else sys.stdout
