#!/bin/sh
# The memcached example on each transport (--io io_uring, epoll, node)
# against memcached -t 1, under memcaslap (-T 1 -c 16 -B: one load thread,
# 16 connections, the binary protocol), in alternating rounds within one run;
# then syscalls per request of each server under strace -c -f.
#
#   sh bench/native-io.sh [ROUNDS=6] [SECONDS=5]      (after npm run build and transport/native/build.sh)
#   NO_STRACE=1 sh bench/native-io.sh ...             (throughput only)
#
# Prints one line per run and, per round, each server's TPS / memcached's.
# Hold the bench lock: flock /tmp/nyala-bench.lock sh bench/native-io.sh
set -eu
rounds=${1:-6}
secs=${2:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
example="$root/dist/examples/memcached/main.js"
tmp=$(mktemp -d)
pids=""
cleanup () { for p in $pids; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM

# start NAME COMMAND...: starts a server, waits for its port, records NAME's port in $tmp/NAME.port and pid in $tmp/NAME.pid.
start_example () {
  name=$1; io=$2
  NYALA_LOG_LEVEL=info node "$example" --port 0 --io "$io" > "$tmp/$name.out" 2>"$tmp/$name.err" &
  echo $! > "$tmp/$name.pid"; pids="$pids $!"
  for _ in $(seq 100); do grep -q listening "$tmp/$name.out" 2>/dev/null && break; sleep 0.1; done
  grep -o '[0-9]*$' "$tmp/$name.out" > "$tmp/$name.port"
}
start_memcached () {
  port=$(node -e "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})")
  memcached -t 1 -p "$port" -l 127.0.0.1 -U 0 -m 64 -u nobody &
  echo $! > "$tmp/memcached.pid"; pids="$pids $!"
  echo "$port" > "$tmp/memcached.port"
  sleep 0.5
}
tps () {
  memcaslap -s "127.0.0.1:$(cat "$tmp/$1.port")" -T 1 -c 16 -B -t "${secs}s" 2>&1 | awk '/TPS:/ { for (i = 1; i <= NF; i++) if ($i == "TPS:") v = $(i + 1) } END { print v + 0 }'
}

start_memcached
start_example io_uring io_uring
start_example epoll epoll
start_example node node
for s in io_uring epoll node; do printf '%s: %s\n' "$s" "$(grep -o 'io [a-z_]*' "$tmp/$s.err" | head -1 || true)"; done
[ -s "$tmp/memcached.port" ] && kill -0 "$(cat "$tmp/memcached.pid")" || { echo "memcached did not start" >&2; exit 1; }
servers="memcached io_uring epoll node"
echo "round $servers (TPS) | io_uring epoll node (x memcached)"
r=1
while [ "$r" -le "$rounds" ]; do
  # Rotate the order each round.
  order=$(echo $servers | tr ' ' '\n' | awk -v r="$r" '{ a[NR] = $0 } END { for (i = 0; i < NR; i++) print a[(i + r) % NR + 1] }')
  for s in $order; do eval "t_$s=$(tps "$s")"; done
  awk -v r="$r" -v m="$t_memcached" -v u="$t_io_uring" -v e="$t_epoll" -v n="$t_node" \
    'BEGIN { printf "%d %d %d %d %d | %.3f %.3f %.3f\n", r, m, u, e, n, u / m, e / m, n / m }'
  r=$((r + 1))
done

# Syscalls per request: strace -c -f on each server during a fixed number of requests (NO_STRACE=1: skipped).
[ "${NO_STRACE:-}" = 1 ] && exit 0
requests=200000
echo "syscalls per request ($requests requests, memcaslap -T 1 -c 16 -B -x $requests)"
for s in memcached io_uring epoll node; do
  strace -c -f -p "$(cat "$tmp/$s.pid")" -o "$tmp/$s.strace" &
  spid=$!
  sleep 1
  memcaslap -s "127.0.0.1:$(cat "$tmp/$s.port")" -T 1 -c 16 -B -x "$requests" > /dev/null 2>&1
  sleep 0.5
  kill -INT "$spid"; wait "$spid" 2>/dev/null || true
  awk -v s="$s" -v n="$requests" '/total/ { printf "%s %.3f\n", s, $4 / n }' "$tmp/$s.strace"
done
