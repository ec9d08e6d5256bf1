#!/bin/sh
# A stand-in for the loom program, for plan_calibrate_test's "fake" case:
# `launch -n R -- EXE bench CFG --json FILE` writes bench rows whose times
# are exactly latency + size / bandwidth, with figures per op and rank
# count that the test knows; comm ucx gives no rows (as when it is not
# built), so calibration must fall back to mpi. `train CONFIG ...
# --metrics FILE` writes step times 9, 1, 2, ... 12 ms.
set -e
case "$1" in
launch)
    ranks=$3
    while [ "$1" != "--" ]; do shift; done
    shift 2 # "--" and the program
    [ "$1" = bench ] || exit 3
    cfg=$2 json=$4
    if grep -q '"ucx"' "$cfg"; then
        echo "# loom bench: backend ucx unavailable: not built"
        echo "[" > "$json"; echo "]" >> "$json"
        exit 0
    fi
    awk -v ranks="$ranks" 'BEGIN {
        n = split("allreduce broadcast reduce allgather reducescatter alltoall sendrecv", ops, " ")
        print "["
        first = 1
        for (k = 1; k <= n; k++) {
            # latency k + ranks microseconds, bandwidth k / ranks GB/s
            lat = k + ranks; bw = k / ranks * 1e9
            for (size = 4096; size <= 4194304; size *= 2) {
                t = lat + size / bw * 1e6
                printf "%s  {\"backend\": \"mpi\", \"ranks\": %d, \"op\": \"%s\", \"size\": %d, \"count\": %d, \"type\": \"f32\", \"redop\": \"sum\", \"time_us\": %.6f, \"algbw_gbs\": 1, \"busbw_gbs\": 1, \"wrong\": 0}", first ? "" : ",\n", ranks, ops[k], size, size / 4, t
                first = 0
            }
        }
        print "\n]"
    }' > "$json"
    ;;
train)
    while [ "$1" != "--metrics" ]; do shift; done
    out=$2
    : > "$out"
    step=1
    for ms in 9 1 2 3 4 5 6 7 8 9 10 11 12; do # steps 1 to 13 of the 30 asked
        echo "{\"step\": $step, \"loss\": 5.0, \"step_ms\": $ms.000, \"mfu\": 0.5}" >> "$out"
        step=$((step + 1))
    done
    ;;
*)
    exit 3
    ;;
esac
