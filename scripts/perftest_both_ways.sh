#!/usr/bin/env bash
# The raw UCX limit for what a 2-rank all_reduce does across the namespace rig: ucx_perftest
# tag_bw over TCP one way, then both ways at once (a server and a client on each host), so
# that a collective that moves its tensor both ways at once has a fair reference.
#
# Run inside the rig (it reads the RIG_* variables `netns_rig.py run` exports):
#   python scripts/netns_rig.py run -- scripts/perftest_both_ways.sh [SIZE] [ITERS] [REPS]
# Extra ucx_perftest client/server flags come from PERFTEST_FLAGS (default "-E sleep": the
# two busy-polling pairs would otherwise starve each other on a 2-core machine). UCX_* in the
# environment reach both sides. Prints GB/s (1e9 B/s) per direction.
set -euo pipefail

size=${1:-67108864}
iters=${2:-100}
reps=${3:-3}
flags=${PERFTEST_FLAGS--E sleep}
: "${RIG_ADDR_A:?run me under: python scripts/netns_rig.py run -- $0}"

here=$(cd "$(dirname "$0")" && pwd)
ucx_root=$(python -c "import libucx, os; print(os.path.dirname(libucx.__file__))")
perftest=$ucx_root/bin/ucx_perftest
export LD_LIBRARY_PATH=$ucx_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export UCX_TLS=${UCX_TLS:-tcp}

on() {  # on HOST CMD...: run in the rig's host a or b
  local host=$1
  shift
  python "$here/netns_rig.py" exec "$host" -- "$@"
}

# one_way SERVER_HOST CLIENT_HOST SERVER_ADDR SERVER_IF CLIENT_IF PORT: prints GB/s, or
# fails. Both sides run under a deadline, and the client retries until the server listens.
one_way() {
  local server=$1 client=$2 addr=$3 server_if=$4 client_if=$5 port=$6
  local deadline=$((60 + iters * size / 200000000))
  # shellcheck disable=SC2086  # flags are words
  on "$server" timeout "$deadline" env UCX_NET_DEVICES="$server_if" "$perftest" -t tag_bw \
    -s "$size" -n "$iters" -p "$port" $flags >/dev/null 2>&1 &
  local server_pid=$! result=""
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 0.5
    # shellcheck disable=SC2086
    result=$(on "$client" timeout "$deadline" env UCX_NET_DEVICES="$client_if" "$perftest" \
      "$addr" -t tag_bw -s "$size" -n "$iters" -p "$port" $flags 2>&1 |
      awk '/^Final:/ { printf "%.2f\n", $6 * 1048576 / 1e9 }') || true
    [ -n "$result" ] && break
  done
  wait "$server_pid" || true
  if [ -z "$result" ]; then
    echo "perftest $client -> $server (port $port) gave no result" >&2
    return 1
  fi
  echo "$result"
}

port=$((13400 + RANDOM % 1000))
echo "# ucx_perftest tag_bw, ${size} B, ${iters} iterations, UCX_TLS=$UCX_TLS, flags: $flags"
echo "# rep  one-way b->a  both-ways b->a  both-ways a->b   (GB/s)"
for rep in $(seq "$reps"); do
  single=$(one_way a b "$RIG_ADDR_A" "$RIG_IF_A" "$RIG_IF_B" "$port")
  out=$(mktemp -d)
  one_way a b "$RIG_ADDR_A" "$RIG_IF_A" "$RIG_IF_B" $((port + 1)) >"$out/ba" &
  ba=$!
  one_way b a "$RIG_ADDR_B" "$RIG_IF_B" "$RIG_IF_A" $((port + 2)) >"$out/ab" &
  ab=$!
  wait "$ba" && wait "$ab" || { rm -rf "$out"; exit 1; }
  printf "%5d  %12s  %14s  %14s\n" "$rep" "$single" "$(cat "$out/ba")" "$(cat "$out/ab")"
  rm -rf "$out"
  port=$((port + 3))
done

# The kernel's own TCP limit on the same path, when iperf3 is installed: one stream one way,
# then one stream each way at once, each direction its own iperf3 client and server process
# (iperf3's --bidir drives both directions from one thread and reads about half of what two
# processes carry on a 2-core machine). No UCX is involved, so a backend over TCP cannot beat
# the both-ways figure per direction.
# iperf_to SERVER_HOST SERVER_ADDR CLIENT_HOST PORT: one 5 s stream CLIENT -> SERVER; prints
# the GB/s the server received, or nothing. The client retries until the server listens.
iperf_to() {
  local server=$1 addr=$2 client=$3 iport=$4 rate=""
  on "$server" timeout 40 iperf3 -s -1 -B "$addr" -p "$iport" >/dev/null 2>&1 &
  local server_pid=$!
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 0.5
    rate=$(on "$client" timeout 30 iperf3 -c "$addr" -p "$iport" -t 5 -J 2>/dev/null |
      python -c '
import json, sys
doc = json.load(sys.stdin)
if "error" in doc:
    sys.exit(doc["error"])
print(f"{doc['"'"'end'"'"']['"'"'sum_received'"'"']['"'"'bits_per_second'"'"'] / 8e9:.2f}")') || true
    [ -n "$rate" ] && break
  done
  wait "$server_pid" || true
  echo "$rate"
}

if command -v iperf3 >/dev/null; then
  echo "# iperf3 (kernel TCP, no UCX), 5 s each, one process per direction   (GB/s)"
  iport=$((port + 7))
  printf "  %-9s  %s\n" one-way "$(iperf_to a "$RIG_ADDR_A" b "$iport")"
  out=$(mktemp -d)
  iperf_to a "$RIG_ADDR_A" b $((iport + 1)) >"$out/ba" &
  ba=$!
  iperf_to b "$RIG_ADDR_B" a $((iport + 2)) >"$out/ab" &
  ab=$!
  wait "$ba" "$ab" || true
  printf "  %-9s  b->a %s  a->b %s\n" both-ways "$(cat "$out/ba")" "$(cat "$out/ab")"
  rm -rf "$out"
fi
