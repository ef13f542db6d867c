#!/usr/bin/env bash
# Run examples/train_ddp.py on 2 ranks with the ucx backend, then with gloo, show both results
# side by side and check they agree.
#
# Exit status: 0 when the ucx run succeeds and matches gloo; 1 when the ucx run fails or its
# result differs; 2 when the gloo baseline itself fails (nothing to compare against).
#
# Environment: PYTHON (default python3), NPROC (default 2), RTOL (default 1e-6), and
# DEMO_ARGS (extra arguments for train_ddp.py, e.g. "--epochs 10").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3}
NPROC=${NPROC:-2}
RTOL=${RTOL:-1e-6}
read -r -a EXTRA <<<"${DEMO_ARGS:-}"
export OMP_NUM_THREADS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

logdir=$(mktemp -d "${TMPDIR:-/tmp}/ucxbackend-demo.XXXXXX")
trap 'rm -rf "$logdir"' EXIT

run() { # backend -> exit status of torchrun; output tee'd to $logdir/<backend>.log
    local backend=$1
    echo "=== train_ddp.py --backend $backend ($NPROC ranks) ==="
    # --standalone: rendezvous on a free localhost port picked at run time.
    set +e
    "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" \
        examples/train_ddp.py --backend "$backend" "${EXTRA[@]}" 2>&1 | tee "$logdir/$backend.log"
    local rc=${PIPESTATUS[0]}
    set -e
    echo
    return "$rc"
}

ucx_rc=0
gloo_rc=0
run ucx || ucx_rc=$?
run gloo || gloo_rc=$?

"$PYTHON" - "$logdir/ucx.log" "$logdir/gloo.log" "$ucx_rc" "$gloo_rc" "$RTOL" <<'EOF'
import math
import sys

ucx_log, gloo_log, ucx_rc, gloo_rc, rtol = sys.argv[1:]
rtol = float(rtol)


def result(path: str) -> dict[str, str] | None:
    with open(path, errors="replace") as f:
        lines = [line for line in f if line.startswith("RESULT ")]
    if not lines:
        return None
    return dict(kv.split("=", 1) for kv in lines[-1].split()[1:])


ucx, gloo = result(ucx_log), result(gloo_log)
keys = ["world_size", "steps", "final_loss", "param_checksum", "param_sha256", "in_sync", "seconds"]
print(f"{'':16}{'ucx':>26}{'gloo':>26}")
print(f"{'exit status':16}{ucx_rc:>26}{gloo_rc:>26}")
for k in keys:
    a = ucx.get(k, "-") if ucx else "-"
    b = gloo.get(k, "-") if gloo else "-"
    print(f"{k:16}{a:>26}{b:>26}")
print()

if ucx_rc != "0" or ucx is None:
    print("FAIL: the ucx run failed (see its output above)")
    sys.exit(1)
if gloo_rc != "0" or gloo is None:
    print("ERROR: the gloo baseline failed; nothing to compare against")
    sys.exit(2)

problems = []
for k in ("world_size", "steps"):
    if ucx[k] != gloo[k]:
        problems.append(f"{k}: {ucx[k]} != {gloo[k]}")
if ucx["in_sync"] != "1":
    problems.append("ucx ranks ended with different parameters (in_sync=0)")
for k in ("final_loss", "param_checksum"):
    a, b = float(ucx[k]), float(gloo[k])
    if not math.isclose(a, b, rel_tol=rtol, abs_tol=0.0):
        problems.append(f"{k}: {a!r} vs {b!r} (relative difference {abs(a - b) / abs(b):.3g})")
if problems:
    print(f"FAIL: ucx and gloo disagree (rtol {rtol:g}):")
    for p in problems:
        print(f"  {p}")
    sys.exit(1)
if ucx["param_sha256"] == gloo["param_sha256"]:
    print("OK: ucx and gloo trained bit-identical models")
else:
    print(f"OK: ucx and gloo agree within rtol {rtol:g} (not bit-identical)")
EOF
