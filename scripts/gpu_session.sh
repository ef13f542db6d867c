#!/usr/bin/env bash
# Everything a session lent a GPU runs for issue #20, in one bounded command (docs/cuda.md,
# "A lent GPU session"):
#
#   bash scripts/gpu_session.sh            # writes to $OUT (the device tool's), else /tmp/gpu-session
#
# Steps, most telling first; each has its own time cap and a failing step does not stop the
# rest (a later step may still say what is wrong):
#   facts   the machine: GPU, driver, Python, torch, UCX, compilers
#   wheels  installs the carried wheels (GPU_SESSION_WHEELS, .whl: libucx-cu13, ninja) into
#           GPU_SESSION_SITE (/tmp/site), on PYTHONPATH, its bin/ (ninja's binary) on PATH
#   build   make gpu-build: checks, the build against this torch, the link tests, `info`
#   smoke   make gpu-smoke: two ranks stage by stage, wait()'s host block on both cuda_wait modes
#   bench   all_reduce 1-64 MiB on cuda: ucx, Gloo host-staged, nccl (skipped: one GPU), the
#           device-to-device copy limit (issue #20's "Done means" table)
#   bench_mps the same bench with --mps: the two ranks under a private MPS server (one CUDA
#           context instead of two the GPU switches between); its JSON to GPU_SESSION_SCRATCH
#           ($OUT keeps 8 files), its table to session.log; skipped without nvidia-cuda-mps-control
#   tests   make gpu-tests over GPU_TESTS in importance order, JUnit to $OUT, in the time left
#   peer_bench the bench_mps command at 16-64 MiB on ucx alone with device_peer_map=on (the
#           peer-mapped all_reduce, off by default until it is measured): issue #20's 0.5x the
#           d2d copy at 64 MiB; its table to session.log; skipped without nvidia-cuda-mps-control
#   timeline scripts/gpu_timeline.py under the settings that tell apart where a CUDA op's
#           millisecond goes (docs/cuda.md), one run each, most telling first
#   summary scripts/gpu_session_summary.py: the verdicts and the #20 figures, $OUT/summary.md
# The whole run stays within GPU_SESSION_BUDGET_S (420 s: with a machine's start that leaves
# room in a 15-minute device budget to rerun a part); the tests leave GPU_SESSION_RESERVE_S
# (150 s) of it to the timeline. GPU_SESSION_STEPS (all) names the steps to run after facts
# and wheels (build smoke bench bench_mps tests peer_bench timeline): a rerun on the warm machine may
# take only the build (seconds then) and the timeline. Exit status: 0 when every step passed.
set -u -o pipefail

cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-session}
PYTHON=${PYTHON:-python3}
export OUT PYTHON
BUDGET_S=${GPU_SESSION_BUDGET_S:-420}
RESERVE_S=${GPU_SESSION_RESERVE_S:-150}
STEPS_WANTED=${GPU_SESSION_STEPS:-all}
WHEELS=${GPU_SESSION_WHEELS:-.whl}
SITE=${GPU_SESSION_SITE:-/tmp/site}
# What the summary reads but the device tool need not bring back (it returns 8 files of $OUT).
SCRATCH=${GPU_SESSION_SCRATCH:-/tmp/gpu-session-scratch}
export WHEELS SITE SCRATCH
mkdir -p "$OUT" "$SCRATCH"
rm -f "$SCRATCH/bench_mps.json" # a warm machine's earlier run must not stand in for this one
# The in-place build, importable by the bench and its ranks as by make's steps.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# A hung world is failed after this many seconds (tests/gpu/cuda_harness.py; default 150).
export UCXB_GPU_WORLD_TIMEOUT=${UCXB_GPU_WORLD_TIMEOUT:-90}
START=$(date +%s)
STEPS="$OUT/steps.tsv"
: >"$STEPS"
exec > >(tee -a "$OUT/session.log") 2>&1

left() { echo $((BUDGET_S - ($(date +%s) - START))); }

# Whether GPU_SESSION_STEPS asks for step NAME.
wants() {
    case " $STEPS_WANTED " in *" all "* | *" $1 "*) return 0 ;; esac
    return 1
}

# step NAME CAP_S COMMAND...: runs COMMAND with its output in $OUT/NAME.log (or session.log
# for the short steps), capped at CAP_S or the time left, whichever is less; records the
# outcome in steps.tsv.
step() {
    local name=$1 cap=$2 log rc t0 t1
    shift 2
    local avail
    avail=$(($(left) - 30)) # the kill's grace and the summary's time
    if [ "$avail" -lt "$cap" ]; then cap=$avail; fi
    if [ "$cap" -le 5 ]; then
        echo "== $name: skipped, no time left"
        printf '%s\tskipped\t0\n' "$name" >>"$STEPS"
        return 1
    fi
    # $OUT keeps at most 8 files for the device tool: the bench's table goes to session.log.
    case $name in facts | wheels | bench | bench_mps | peer_bench | timeline) log="" ;; *) log="$OUT/$name.log" ;; esac
    echo "== $name (cap ${cap} s) $(date -u +%H:%M:%S)"
    t0=$(date +%s)
    export STEP_CAP=$cap
    # timeout runs programs, not this script's functions: a function runs in a child bash.
    local run=("$@")
    # Every function goes along: one may call others (timeline, the MPS helpers).
    if declare -F "$1" >/dev/null; then
        run=(bash -c "$(declare -f); \"\$@\"" "$1" "$@")
    fi
    # SIGINT first: pytest then still writes its JUnit file for the tests that ended (timeout
    # signals the step's whole process group, the ranks included); SIGKILL 15 s later.
    if [ -n "$log" ]; then
        timeout -s INT -k 15 "$cap" "${run[@]}" >"$log" 2>&1
    else
        timeout -s INT -k 15 "$cap" "${run[@]}"
    fi
    rc=$?
    t1=$(date +%s)
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((t1 - t0))" >>"$STEPS"
    echo "== $name: exit $rc in $((t1 - t0)) s"
    if [ "$rc" -ne 0 ] && [ -n "$log" ]; then tail -n 25 "$log"; fi
    return "$rc"
}

facts() {
    date -u +"date %Y-%m-%d %H:%M:%S UTC"
    uname -r
    nproc
    # compute_mode: the two ranks share GPU 0, which Exclusive_Process refuses to the second.
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,compute_mode \
        --format=csv,noheader || echo "nvidia-smi failed"
    "$PYTHON" - <<'EOF'
import importlib.metadata as md
import sys

import torch

print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl available",
      torch.distributed.is_nccl_available())
for name in ("pytest", "pytest-xdist", "numpy", "ninja", "libucx-cu12", "libucx-cu13"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "missing")
EOF
    for c in g++ gcc "${CXX:-}"; do [ -n "$c" ] && command -v "$c" >/dev/null && echo "$c: $($c --version | head -1)"; done
    echo "ninja on PATH: $(command -v ninja || echo none)"
    git log -1 --format="commit %H %s" 2>/dev/null || true
}

wheels() {
    shopt -s nullglob
    local found=("$WHEELS"/*.whl)
    if [ ${#found[@]} -eq 0 ]; then
        echo "no $WHEELS/*.whl carried"
        return 0
    fi
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "${found[@]}" || return 1
    echo "installed into $SITE: ${found[*]}"
    # torch's build finds ninja by running `ninja --version`: the wheel's binary is in bin/,
    # which --target does not put on PATH (without it the build falls back to compiling one
    # unit at a time and outlasts its cap).
    if [ -x "$SITE/bin/ninja" ]; then
        echo "ninja $(PATH="$SITE/bin:$PATH" ninja --version) at $SITE/bin/ninja"
    fi
}

# bench_cmd JSON [ARG...]: issue #20's all_reduce 1-64 MiB on cuda, the results to JSON.
bench_cmd() {
    local json=$1
    shift
    "$PYTHON" -m ucxbackend bench --device cuda --nproc 2 -b 1M -e 64M -f 4 -n 20 -w 5 \
        --timeout "$((STEP_CAP - 10))" --json "$json" "$@" all_reduce
}
bench() { bench_cmd "$OUT/bench.json"; }
# The same under a private MPS server that the bench starts and stops itself (--mps;
# ucxbackend/mps.py): both ranks' work in one CUDA context (docs/cuda.md, "Ranks sharing a
# GPU: run MPS": 16 -> 125 GB/s at 64 MiB in the second run).
bench_mps() { bench_cmd "$SCRATCH/bench_mps.json" --mps; }
has_mps() { command -v nvidia-cuda-mps-control >/dev/null; }
# The peer-mapped all_reduce (device_peer_map=on: it fails rather than falls back, so a table
# means it ran), under MPS as bench_mps, where it competes with the copy column.
peer_bench() {
    echo "-- peer_bench: UCXBACKEND_DEVICE_PEER_MAP=on, under a private MPS server"
    UCXBACKEND_DEVICE_PEER_MAP=on "$PYTHON" -m ucxbackend bench --device cuda --nproc 2 -b 16M \
        -e 64M -f 4 -n 20 -w 5 --backends ucx --mps --timeout "$((STEP_CAP - 10))" all_reduce
}

# scripts/gpu_timeline.py once per setting (docs/cuda.md, "Where a CUDA op's millisecond
# goes"): label|environment|arguments, most telling first. default and chunk_4m record the
# device timeline, default and mps run the contention probe, every run times its sizes and
# splits each op's waits. mps runs the two ranks as clients of a private MPS server
# (`python -m ucxbackend.mps`, what bench --mps uses: its pipe directory private to the run,
# the server quit after it; skipped where the image has no nvidia-cuda-mps-control): one
# context for both ranks, so no switching between two. chunk_4m: device memory in the old
# default's 4 MiB chunks (UCXBACKEND_DEVICE_CHUNK_BYTES; 64 MiB now), for comparison.
# GPU_TIMELINE_RUNS (all) keeps the runs it names by label.
timeline_runs() {
    cat <<'EOF'
default||--sizes 4,64K,1M,16M
mps||--sizes 4,1M,16M --no-profile
get_zcopy|UCX_RNDV_SCHEME=get_zcopy|--sizes 4,1M,16M --no-profile --no-probe
put_zcopy|UCX_RNDV_SCHEME=put_zcopy|--sizes 4,1M,16M --no-profile --no-probe
no_cuda_ipc|UCX_TLS=^cuda_ipc|--sizes 4,1M,16M --no-profile --no-probe
poll|UCXBACKEND_PROGRESS_MODE=poll|--sizes 4,1M,16M --no-profile --no-probe
chunk_4m|UCXBACKEND_DEVICE_CHUNK_BYTES=4M|--sizes 16M --no-probe
ipc_cache_off|UCX_CUDA_IPC_CACHE=n|--sizes 1M,16M --no-profile --no-probe
proto_v1|UCX_PROTO_ENABLE=n|--sizes 4,1M,16M --no-profile --no-probe
peer_map|UCXBACKEND_DEVICE_PEER_MAP=on|--sizes 1M,16M --no-probe
EOF
}

# Each run capped at 45 s (the script kills its ranks 5 s before), none begun with less than
# 20 s of the step left; the output goes to session.log ($OUT's 8 files are taken).
timeline() {
    local began label env args cap what
    began=$(date +%s)
    while IFS='|' read -r label env args; do
        case " ${GPU_TIMELINE_RUNS:-all} " in *" all "* | *" $label "*) ;; *) continue ;; esac
        cap=$((STEP_CAP - ($(date +%s) - began) - 5))
        if [ "$cap" -lt 20 ]; then
            echo "-- timeline $label: skipped, no time left"
            continue
        fi
        if [ "$cap" -gt 45 ]; then cap=45; fi
        local under=()
        what=${env:-"UCX's and the backend's defaults"}
        if [ "$label" = mps ]; then
            if ! has_mps; then
                echo "-- timeline mps: skipped, no nvidia-cuda-mps-control on PATH"
                continue
            fi
            # The server starts before the ranks and quits after them, however they end.
            under=("$PYTHON" -m ucxbackend.mps --)
            what="the defaults under a private MPS server (python -m ucxbackend.mps)"
        fi
        echo "-- timeline $label: $what ($(date -u +%H:%M:%S))"
        # shellcheck disable=SC2086 # env and args are word lists
        env $env ${under[@]+"${under[@]}"} timeout -s INT -k 5 "$cap" "$PYTHON" \
            scripts/gpu_timeline.py --device "${GPU_TIMELINE_DEVICE:-cuda}" \
            --timeout "$((cap - 5))" $args || echo "-- timeline $label: exit $?"
    done < <(timeline_runs)
}

# xdist's handing out of whole files in the order given needs --no-loadscope-reorder
# (pytest-xdist 3.6); an older one hands them out its own way, and none runs them in turn.
xdist_args() {
    if ! "$PYTHON" -c 'import xdist' 2>/dev/null; then
        echo ""
    elif "$PYTHON" -m pytest --help 2>/dev/null | grep -q -- --no-loadscope-reorder; then
        echo "-n ${GPU_TEST_JOBS:-4} --dist loadfile --no-loadscope-reorder"
    else
        echo "-n ${GPU_TEST_JOBS:-4} --dist loadfile"
    fi
}

# The stream semantics and the reductions decide most (test_cuda_stream_hold: whether
# cuda_wait=stream may become the default); the rest follows. Each file is one or a few
# two-rank worlds (test_cuda_routing four, in turn: it starts early so it does not end last).
GPU_TESTS=${GPU_TESTS:-"tests/gpu/test_cuda_streams.py tests/gpu/test_cuda_stream_hold.py \
tests/gpu/test_cuda_reductions.py \
tests/gpu/test_cuda_routing.py tests/gpu/test_cuda_host_paths.py tests/gpu/test_cuda_consumers.py \
tests/gpu/test_cuda_signed_zero.py tests/gpu/test_cuda_movement.py tests/gpu/test_cuda_chunked.py tests/gpu/test_cuda_peer_map.py \
tests/gpu/test_cuda_issue_failure.py"}

step facts 30 facts
if step wheels 60 wheels && [ -d "$SITE" ]; then
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
    export PATH=$SITE/bin:$PATH
fi
echo "ninja for the build: $(command -v ninja || echo "none (torch then compiles one unit at a time)")"
# Without "build" in GPU_SESSION_STEPS the extension already built in place is used (a CPU
# dry run of the later steps: tests/test_gpu_session.py).
built=0
if wants build; then
    step build 240 make gpu-build PYTHON="$PYTHON"
    built=$?
fi
if [ "$built" -eq 0 ]; then
    if wants smoke; then step smoke 70 make gpu-smoke PYTHON="$PYTHON"; fi
    if wants bench; then step bench 150 bench; fi
    # Right after the bench, so that the two tables come from the same warm machine and the
    # tests' time, not this figure, is what a slow start costs.
    if wants bench_mps; then
        if has_mps; then
            step bench_mps 90 bench_mps
        else
            echo "== bench_mps: skipped, no nvidia-cuda-mps-control on PATH (bench --mps needs it)"
            printf 'bench_mps\tskipped\t0\n' >>"$STEPS"
        fi
    fi
    # The rest of the budget, less the summary's time and RESERVE_S for the timeline, is the
    # tests'; the harness fails a hung world after UCXB_GPU_WORLD_TIMEOUT.
    if wants tests; then
        step tests "$(($(left) - 30 - RESERVE_S))" make gpu-tests PYTHON="$PYTHON" \
            GPU_TESTS="$GPU_TESTS" GPU_XDIST="$(xdist_args)" \
            PYTEST_ARGS="-p no:cacheprovider -rfE --durations=15 --junitxml=$OUT/junit.xml"
    fi
    # From the timeline's reserve: the figure that decides device_peer_map's default.
    if wants peer_bench; then
        if has_mps; then
            step peer_bench 60 peer_bench
        else
            echo "== peer_bench: skipped, no nvidia-cuda-mps-control on PATH (bench --mps needs it)"
            printf 'peer_bench\tskipped\t0\n' >>"$STEPS"
        fi
    fi
    if wants timeline; then step timeline 100000 timeline; fi
else
    echo "== the build failed: no smoke, bench or tests"
fi
"$PYTHON" scripts/gpu_session_summary.py "$OUT" "$SCRATCH" | tee "$OUT/summary.md"
awk -F'\t' '$2 != 0 { bad = 1 } END { exit bad }' "$STEPS"
