#!/usr/bin/env bash
# Bootstrap .venv on first use, then dispatch:
#   bash run.sh test [PYTEST ARGS]   run the whole test suite
#   bash run.sh N                    train the tutorial FFN (sample_code/sharding_propagation) for
#                                    20 Momentum steps on N MPI ranks (planned for N), print the
#                                    plan, the loss curve and the check against one device
#   bash run.sh N CONFIG.yaml [autostrat run options]
#                                    run the config forward on N MPI ranks and check it against
#                                    the single-device result; RANK_TABLE_FILE=... or
#                                    --rank-table F runs on the rank table's hosts
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

venv=.venv
stamp="$venv/.installed-setup.cfg"

bootstrap() {
    if [[ ! -x "$venv/bin/python" ]]; then
        echo "run.sh: creating $venv" >&2
        python3 -m venv "$venv"
    fi
    # Reinstall only when setup.cfg changed since the last successful install.
    if [[ ! -f "$stamp" ]] || ! cmp -s setup.cfg "$stamp"; then
        echo "run.sh: installing autostrat and its dependencies into $venv" >&2
        "$venv/bin/python" -m pip install --quiet --upgrade pip
        "$venv/bin/python" -m pip install --quiet -e '.[test]'
        cp setup.cfg "$stamp"
    fi
    # An editable install leaves autostrat's bytecode to the first import, which an environment
    # with PYTHONDONTWRITEBYTECODE never writes: then every rank and command compiles ~90
    # modules again (0.15-0.3 s each). Compile it here, as pip does for a regular install;
    # up-to-date files are only looked at.
    "$venv/bin/python" -m compileall -q autostrat >/dev/null
}

usage() {
    echo "usage: bash run.sh test [PYTEST ARGS] | bash run.sh N [CONFIG.yaml [autostrat run options]]  (N >= 1 ranks)" >&2
    exit 2
}

[[ $# -ge 1 ]] || usage
bootstrap
case "$1" in
    test)
        shift
        exec "$venv/bin/python" -m pytest "$@"
        ;;
    ''|*[!0-9]*|0*)
        usage  # N is a positive number of ranks (no leading zero)
        ;;
    *)
        device_num=$1
        shift
        if [[ $# -eq 0 ]]; then
            exec bash sample_code/sharding_propagation/run.sh "$device_num"
        fi
        exec "$venv/bin/python" -m autostrat run "${1:-configs/ffn.yaml}" --device-num "$device_num" "${@:2}"
        ;;
esac
