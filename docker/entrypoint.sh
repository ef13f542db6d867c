#!/usr/bin/env bash
# Entrypoint of the ucxbackend container: one torchrun per container ("node") running the DDP
# demo (examples/train_ddp.py) across all nodes, after a doctor preflight. It first checks that
# ucxbackend and its native extension load from the working directory (exit 1 if not, unless
# BACKEND=gloo).
#
# Environment (compose.yaml sets them):
#   NNODES (2), NODE_RANK (required), NPROC_PER_NODE (1), MASTER_ADDR (required),
#   MASTER_PORT (29500), BACKEND (ucx; or gloo), DEMO_ARGS (extra train_ddp.py arguments),
#   DOCTOR (1: run `python -m ucxbackend doctor` first; a failed check stops the run unless
#   DOCTOR_STRICT=0), APP_DIR (where examples/ lives: /opt/ucxbackend in the image),
#   PYTHON (python3). UCX_*, UCXBACKEND_*, GLOO_SOCKET_IFNAME pass through.
# Extra arguments replace the demo command: `entrypoint.sh python -m ucxbackend bench ...`
# runs that under the same torchrun.
set -euo pipefail

: "${NODE_RANK:?set NODE_RANK (0 .. NNODES-1)}"
: "${MASTER_ADDR:?set MASTER_ADDR (the address of node 0)}"
NNODES=${NNODES:-2}
NPROC_PER_NODE=${NPROC_PER_NODE:-1}
MASTER_PORT=${MASTER_PORT:-29500}
BACKEND=${BACKEND:-ucx}
APP_DIR=${APP_DIR:-/opt/ucxbackend}
PYTHON=${PYTHON:-python3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
read -r -a EXTRA <<<"${DEMO_ARGS:-}"

echo "[entrypoint] node ${NODE_RANK}/${NNODES} on $(hostname), master ${MASTER_ADDR}:${MASTER_PORT}, backend ${BACKEND}"
# The package the job imports, as `python -m` and `-c` see it from this directory (first on
# their sys.path): a source tree here, without its compiled _C, would shadow the installed one.
if ! where=$("$PYTHON" -c 'import sys, ucxbackend as u
print(u.__file__) if u.is_available() else sys.exit(f"{u.__file__}: {u.load_error()}")'); then
    echo "[entrypoint] ucxbackend's native extension does not load from $(pwd)" >&2
    if [[ "$BACKEND" != gloo ]]; then exit 1; fi
else
    echo "[entrypoint] ucxbackend: ${where}"
fi
if [[ "${DOCTOR:-1}" == 1 ]]; then
    if ! "$PYTHON" -m ucxbackend doctor; then
        if [[ "${DOCTOR_STRICT:-1}" == 1 ]]; then
            echo "[entrypoint] doctor found a failing check (DOCTOR_STRICT=0 to run anyway)" >&2
            exit 1
        fi
    fi
fi

if [[ $# -gt 0 ]]; then
    if [[ "$1" == python || "$1" == python3 ]]; then shift; fi
    CMD=("$@")
else
    CMD=("$APP_DIR/examples/train_ddp.py" --backend "$BACKEND" "${EXTRA[@]}")
fi

# Static rendezvous: node 0 hosts the store on MASTER_ADDR:MASTER_PORT.
exec "$PYTHON" -m torch.distributed.run \
    --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$NPROC_PER_NODE" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" --max-restarts 0 \
    "${CMD[@]}"
