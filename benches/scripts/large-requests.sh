#!/bin/sh
# Large requests read by the server (RDMA READ) against written into its grant (rendezvous),
# per size, with perftest's READ, WRITE and SEND latencies in the same boot. Run from the
# repository's root in the soft-RoCE VM, after `cargo build --release -p rpc-bench`:
#   cargo xtask vm-run --timeout 1500 -- benches/scripts/large-requests.sh [ROUNDS]
# Prints perftest's result lines and rpc-bench's summary line per size and way.
set -u
rounds=${1:-2}
bench=target/release/rpc-bench
addr=${RDMA_RPC_TEST_ADDR:-192.168.77.1}

# perftest TOOL SIZE ITERATIONS: server and client on rxe0; the client's result line.
perftest() {
  "$1" -d rxe0 -s "$2" -n "$3" -F >/dev/null 2>&1 &
  server=$!
  sleep 1
  echo "== $1 $2 B"
  "$1" -d rxe0 -s "$2" -n "$3" -F "$addr" 2>&1 | grep -A1 '#bytes' | tail -1
  wait "$server"
}

# Iterations and warm-up calls for SIZE: about the same time per size.
iterations() { case $1 in 65536) echo 200 20;; 262144) echo 100 10;; 1048576) echo 40 5;; *) echo 12 2;; esac; }

sizes="65536 262144 1048576 4194304"
for size in $sizes; do
  set -- $(iterations "$size")
  for tool in ib_read_lat ib_write_lat ib_send_lat; do perftest "$tool" "$size" "$1"; done
done
perftest ib_write_bw 1048576 60
perftest ib_read_bw 1048576 60
round=1
while [ "$round" -le "$rounds" ]; do
  for size in $sizes; do
    set -- $(iterations "$size")
    for way in 0 never; do
      echo "== round $round, $size B, --read-from $way"
      timeout 300 "$bench" loopback --url "rdma://$addr:0" --size "$size" \
        --iters "$1" --warmup "$2" --read-from "$way" 2>&1 | grep -v "^\["
    done
  done
  round=$((round + 1))
done
