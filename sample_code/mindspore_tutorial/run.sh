#!/usr/bin/env bash
# MindSpore scripts, unchanged but for their imports:
#   bash run.sh [RANK_SIZE]             the sharding-propagation tutorial (train.py, Model.train)
#   bash run.sh RANK_SIZE functional    the MindSpore 2.x functional loop (train_functional.py)
# Launched like ../sharding_propagation (one MPI process per rank, rank i's output in
# device/rank_<i>/log, RANK_TABLE_FILE honoured), with AUTOSTRAT_CHECK=1: the run checks itself
# against one device (Model.train's loss curve and parameters, or every planned functional step).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
script=train.py
if [[ "${2:-}" == functional ]]; then
    script=train_functional.py
elif [[ -n "${2:-}" ]]; then
    echo "usage: bash run.sh [RANK_SIZE] [functional]; got '$2'" >&2
    exit 2
fi
SAMPLE_DIR="$here" TRAIN_SCRIPT="$script" AUTOSTRAT_CHECK=1 exec bash "$here/../sharding_propagation/run.sh" "${1:-8}"
