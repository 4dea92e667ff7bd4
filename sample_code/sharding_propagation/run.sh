#!/usr/bin/env bash
# The tutorial's launch script: bash run.sh RANK_SIZE (default 8), inside this folder.
# Every rank runs train.py under mpiexec (python -m mpi4py aborts the job when a rank raises);
# rank i's output goes to device/rank_<i>/log, rank 0's check is printed at the end.
# RANK_TABLE_FILE=rank_table_8pcs.json bash run.sh 8 starts the ranks on the table's servers.
# (a relative RANK_TABLE_FILE is read from the directory run.sh was called from).
set -euo pipefail
if [[ -n "${RANK_TABLE_FILE:-}" ]]; then
    # A relative path is the caller's: resolve it before moving into this folder.
    if [[ ! -f "$RANK_TABLE_FILE" ]]; then
        echo "run.sh: RANK_TABLE_FILE: expected a rank table file, got '$RANK_TABLE_FILE' (no such file from $PWD)" >&2
        exit 2
    fi
    RANK_TABLE_FILE="$(cd "$(dirname "$RANK_TABLE_FILE")" && pwd)/$(basename "$RANK_TABLE_FILE")"
fi
cd "${SAMPLE_DIR:-$(dirname "${BASH_SOURCE[0]}")}"  # SAMPLE_DIR: another sample folder at this depth (its train.py)
rank_size=${1:-8}
repo=../..
[[ -x "$repo/.venv/bin/mpiexec" ]] || bash "$repo/run.sh" test --collect-only -q >/dev/null  # bootstrap .venv
hosts=()
if [[ -n "${RANK_TABLE_FILE:-}" ]]; then
    "$repo/.venv/bin/python" - "$RANK_TABLE_FILE" "$rank_size" > hostfile <<'PY'
import sys
from autostrat.errors import ConfigError
from autostrat.runtime.launcher import hostfile_text, resolve_hosts
from autostrat.runtime.rank_table import load_rank_table
try:
    hosts = load_rank_table(sys.argv[1], int(sys.argv[2])).hosts()
    resolve_hosts(hosts)
except ConfigError as error:
    sys.exit(f"run.sh: {error}")
print(hostfile_text(hosts), end="")
PY
    hosts=(-f hostfile)
    export MPIR_CVAR_CH4_NETMOD=${MPIR_CVAR_CH4_NETMOD:-ofi} FI_PROVIDER=${FI_PROVIDER:-tcp}
fi
rm -rf device && mkdir -p device
for ((i = 0; i < rank_size; i++)); do mkdir -p "device/rank_$i"; done
export MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-300}
status=0
"$repo/.venv/bin/mpiexec" "${hosts[@]}" -n "$rank_size" -outfile-pattern 'device/rank_%r/log' \
    -errfile-pattern 'device/rank_%r/log' "$repo/.venv/bin/python" -m mpi4py "${TRAIN_SCRIPT:-train.py}" || status=$?
cat device/rank_0/log
[[ $status -eq 0 ]] || echo "run.sh: mpiexec exited with status $status; see device/rank_<i>/log" >&2
exit $status
