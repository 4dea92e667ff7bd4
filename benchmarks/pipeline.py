"""Issue #17: pipeline stages on the LLaMA-7B shape, the stage split searched.

The pipeline rows of `benchmarks/quality.py` alone; its docstring says what each row and column
means and why ``m = 8 S`` micro-batches.

Run: .venv/bin/python benchmarks/pipeline.py [--devices 64 1024] [--stages 2 4 8] [--budget 80GB] [--refined]
(the same as .venv/bin/python benchmarks/quality.py --pipeline 64 1024 ...)
"""

from __future__ import annotations

import argparse

from quality import add_pipeline_options, print_pipeline  # the script's directory is on sys.path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[64, 1024])
    add_pipeline_options(parser)
    args = parser.parse_args()
    print_pipeline(args.devices, args)


if __name__ == "__main__":
    main()
