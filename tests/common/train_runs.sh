# `loom train` runs and their comparison, for the end-to-end test scripts
# (sourced). The script sets LOOM (the program), CFG, DATA and TEST (its
# name, to start messages) and works in a scratch folder.

# run NAME RANKS [--set ...]: metrics in NAME.jsonl, output in NAME.log;
# more than one rank is a dp group of RANKS
run() {
    # POSIX sh has no locals: names of their own, so callers' variables survive
    run_name=$1; run_ranks=$2; shift 2
    if [ "$run_ranks" = 1 ]; then
        "$LOOM" train "$CFG" --set data.train="$DATA" --metrics "$run_name.jsonl" "$@" > "$run_name.log" 2>&1 ||
            { cat "$run_name.log"; echo "$TEST: run $run_name failed"; exit 1; }
    else
        "$LOOM" launch -n "$run_ranks" -- "$LOOM" train "$CFG" --set data.train="$DATA" \
            --set parallel.dp.size="$run_ranks" --metrics "$run_name.jsonl" "$@" > "$run_name.log" 2>&1 ||
            { cat "$run_name.log"; echo "$TEST: run $run_name failed"; exit 1; }
    fi
}

# losses NAME: one loss per line
losses() { sed 's/.*"loss": \([^,]*\),.*/\1/' "$1.jsonl"; }

# step_fields NAME: each step's number, loss, lr, grad norm and skip, as
# written (a resume is the same run when these are, byte for byte)
step_fields() {
    sed 's/\("step": [0-9]*\).*\("loss": [^,]*\).*\("lr": [^,]*\).*\("grad_norm": [^,]*\).*\("skipped": [a-z]*\).*/\1 \2 \3 \4 \5/' "$1.jsonl"
}

# compare A B TOL [FIRST]: per-step relative difference <= TOL from step FIRST on
compare() {
    losses "$1" > a.txt
    losses "$2" > b.txt
    [ "$(wc -l < a.txt)" -gt 0 ] || { echo "$TEST: $1 has no steps"; exit 1; }
    [ "$(wc -l < a.txt)" = "$(wc -l < b.txt)" ] || { echo "$TEST: $1 and $2 ran different step counts"; exit 1; }
    paste a.txt b.txt | awk -v tol="$3" -v first="${4:-1}" -v a="$1" -v b="$2" '
        NR >= first { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1);
                      if (r > worst) worst = r;
                      if (r > tol) { printf "step %d: %s %s, %s %s (relative %.3g > %g)\n", NR, a, $1, b, $2, r, tol; bad = 1 } }
        END { printf "%s vs %s: worst relative difference %.3g over %d steps\n", a, b, worst, NR; exit bad }'
}

# same_tail A B N: the last N losses of A equal all of B's, byte for byte
same_tail() {
    tail -n "$3" "$1.jsonl" | sed 's/.*"loss": \([^,]*\),.*/\1/' > w.txt
    losses "$2" > r.txt
    [ "$(wc -l < r.txt)" = "$3" ] || { echo "$TEST: $2 ran $(wc -l < r.txt) steps, want $3"; exit 1; }
    cmp -s w.txt r.txt || { paste w.txt r.txt; echo "$TEST: $2 differs from the end of $1"; exit 1; }
    echo "$2: steps identical to the last $3 of $1"
}

# bitwise A B: the same losses, byte for byte, and the same weights saved
# in A.bin and B.bin (--save)
bitwise() {
    losses "$1" > a.txt
    losses "$2" > b.txt
    [ "$(wc -l < a.txt)" -gt 0 ] || { echo "$TEST: $1 has no steps"; exit 1; }
    cmp -s a.txt b.txt || { paste a.txt b.txt; echo "$TEST: $2's losses differ from $1's"; exit 1; }
    cmp -s "$1.bin" "$2.bin" || { echo "$TEST: $2's final weights differ from $1's"; exit 1; }
    echo "$1 = $2: $(wc -l < a.txt) losses and the final weights identical"
}

# falls NAME: the loss fell by more than 0.3 over the run
falls() {
    losses "$1" | awk -v n="$1" 'NR == 1 { first = $1 } { last = $1 }
        END { if (!(last < first - 0.3)) { print n ": loss did not fall: " first " -> " last; exit 1 } print n ": loss falls " first " -> " last }'
}

# peak NAME PURPOSE: the host tier's peak bytes of PURPOSE on the last step (rank 0)
peak() { tail -n 1 "$1.jsonl" | sed -n "s/.*\"host\": {[^}]*\"$2\": \([0-9]*\).*/\1/p"; }

# tier_bytes NAME WHICH PURPOSE: bytes of PURPOSE the last step read or
# wrote (WHICH: read or written) in the offload tier (rank 0)
tier_bytes() { tail -n 1 "$1.jsonl" | sed -n "s/.*\"tier_bytes\": {.*\"$2\": {[^}]*\"$3\": \([0-9]*\).*/\1/p"; }
