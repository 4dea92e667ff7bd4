#!/usr/bin/env bash
# MindSpore's tutorial script, unchanged but for its imports: bash run.sh RANK_SIZE (default 8).
# Launched like ../sharding_propagation (one MPI process per rank, rank i's output in
# device/rank_<i>/log, RANK_TABLE_FILE honoured), with AUTOSTRAT_CHECK=1: Model.train checks
# the run against the stand-alone run of the same steps and prints the check.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SAMPLE_DIR="$here" AUTOSTRAT_CHECK=1 exec bash "$here/../sharding_propagation/run.sh" "$@"
