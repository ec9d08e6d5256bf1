#!/bin/sh
# Training end to end: the numerics contract and friends. Each case runs
# `loom train` with --metrics and compares per-step losses.
#   usage: train_test.sh LOOM SOURCE_DIR CASE
set -eu
LOOM=$1
SRC=$2
CASE=$3
CFG=$SRC/tests/train/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

TEST=train_test
. "$SRC/tests/common/train_runs.sh"

case "$CASE" in
ddp2|ddp3|ddp4)
    n=${CASE#ddp}
    run single 1
    run "dp$n" "$n"
    compare single "dp$n" 1e-5 ;;
accum)
    run k1 1
    run k2 1 --set train.grad_accum=2
    run k3dp2 2 --set train.grad_accum=3
    compare k1 k2 1e-5
    compare k1 k3dp2 1e-5 ;;
recompute)
    run plain 1 --set model.layers=4
    run recompute 1 --set model.layers=4 --set train.recompute=block
    compare plain recompute 0
    # the activations kept drop: only each block's input survives to backward
    a=$(sed -n '1s/.*"activations": \([0-9]*\).*/\1/p' plain.jsonl)
    b=$(sed -n '1s/.*"activations": \([0-9]*\).*/\1/p' recompute.jsonl)
    awk -v a="$a" -v b="$b" 'BEGIN { if (!(b < 0.6 * a)) { print "activations " a " -> " b ": no drop"; exit 1 }
                                     printf "recompute: activations %d -> %d bytes\n", a, b }' ;;
fp16_overflow)
    # a loss scale far too large: the first steps overflow and are skipped,
    # the scale halves each time (logged), then training proceeds
    run scaled 1 --set train.steps=30 --set train.precision=fp16 --set train.loss_scale=1e12
    grep -q "fp16: gradients overflowed at step 1; loss scale 1e+12 -> 5e+11" scaled.log ||
        { cat scaled.log; echo "train_test: no overflow logged"; exit 1; }
    skipped=$(grep -c '"skipped": true' scaled.jsonl)
    [ "$skipped" -ge 10 ] || { echo "train_test: only $skipped skipped steps"; exit 1; }
    # valid JSON all the same: an overflowed norm is null, not inf
    python3 - scaled.jsonl <<'PY' || { echo "train_test: --metrics is not JSON"; exit 1; }
import json, sys
steps = [json.loads(line) for line in open(sys.argv[1])]
skipped = [s for s in steps if s["skipped"]]
assert skipped and all(s["grad_norm"] is None for s in skipped), "a skipped step's norm is not null"
assert all(isinstance(s["grad_norm"], float) for s in steps if not s["skipped"])
print("metrics: %d lines of JSON, null norms on the %d skipped steps" % (len(steps), len(skipped)))
PY
    tail -n 1 scaled.jsonl | grep -q '"skipped": false' || { echo "train_test: still skipping"; exit 1; }
    losses scaled | awk 'NR == 1 { first = $1 } { last = $1 } END { if (!(last < first - 0.2)) { print "loss did not fall: " first " -> " last; exit 1 } }'
    echo "fp16: $skipped steps skipped while the scale came down, then trained" ;;
diverged)
    # a loss gone infinite stops the run after train.max_skipped steps in a
    # row, naming the step, instead of "training" to the end and exiting 0
    for precision in fp32 fp16; do
        rc=0
        "$LOOM" train "$CFG" --set data.train="$DATA" --set train.lr=1e4 --set train.steps=40 \
            --set train.precision=$precision --metrics $precision.jsonl > $precision.log 2>&1 || rc=$?
        [ $rc = 1 ] || { cat $precision.log; echo "$TEST: $precision exited $rc, want 1"; exit 1; }
        grep -q "^loom train: step 11: loss -*\(inf\|nan\), gradient norm [-0-9.e+naif]*: 10 steps in a row with a loss or gradient norm that is not finite (train.max_skipped = 10); the run diverged: lower train.lr (10000)" $precision.log ||
            { cat $precision.log; echo "$TEST: $precision: no error naming the step"; exit 1; }
        [ "$(wc -l < $precision.jsonl)" = 11 ] || { echo "$TEST: $precision ran past step 11"; exit 1; }
    done
    # the limit is a setting; 0 keeps going
    rc=0
    "$LOOM" train "$CFG" --set data.train="$DATA" --set train.lr=1e4 --set train.steps=20 \
        --set train.max_skipped=3 > three.log 2>&1 || rc=$?
    [ $rc = 1 ] && grep -q "step 4: .*: 3 steps in a row" three.log ||
        { cat three.log; echo "$TEST: train.max_skipped=3 did not stop at step 4"; exit 1; }
    run endless 1 --set train.lr=1e4 --set train.steps=20 --set train.max_skipped=0
    [ "$(wc -l < endless.jsonl)" = 20 ] || { echo "$TEST: train.max_skipped=0 stopped"; exit 1; }
    echo "diverged: stopped at step 11 (fp32, fp16), at step 4 with max_skipped 3; 0 runs on" ;;
resume)
    run whole 2
    run first 2 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ckpt"
    [ -f "$TMP/ckpt/step-5/meta.loom" ] || { echo "train_test: no checkpoint written"; exit 1; }
    [ ! -e "$TMP/ckpt/step-5.tmp" ] || { echo "train_test: the checkpoint's .tmp directory was left behind"; exit 1; }
    run resumed 2 --resume "$TMP/ckpt/step-5"
    # the resumed run's steps are 6..10; they must equal the whole run's exactly
    same_tail whole resumed 5 ;;
bf16|fp16)
    run fp32 1 --set train.steps=20
    run "$CASE" 1 --set train.steps=20 --set train.precision="$CASE"
    compare fp32 "$CASE" 0.02
    losses "$CASE" | awk 'NR == 1 { first = $1 } { last = $1 } END { if (!(last < first - 0.5)) { print "loss did not fall: " first " -> " last; exit 1 } print "loss falls: " first " -> " last }' ;;
gemm)
    # model.gemm against what this build has (LOOM_TEST_ONEDNN, from CMake).
    # OpenBLAS has no bf16 products: a bf16 run on it multiplies in f32,
    # still keeps its parameters in bf16, says so, and trains as fp32 does.
    # Where oneDNN is built, "auto" is oneDNN, in bf16 where the CPU has
    # bf16 instructions; where it is not, "auto" is OpenBLAS, and asking
    # for oneDNN by name is refused before any step by train and plan alike.
    on_blas() { # NAME: the header and the cpu: line say f32 products on OpenBLAS
        grep -q "(OpenBLAS [^ ]* f32 " "$1.log" &&
            grep -qx "cpu: .*; bf16 storage, f32 products: OpenBLAS has no bf16 product" "$1.log" ||
            { head -n 2 "$1.log"; echo "$TEST: $1: a bf16 run on OpenBLAS does not say f32 products"; exit 1; }
    }
    run fp32 1 --set train.steps=20 --set model.gemm=openblas
    run blas 1 --set train.steps=20 --set model.gemm=openblas --set train.precision=bf16
    on_blas blas
    params() { sed -n '$s/.*"peak_bytes": {"host": {"params": \([0-9]*\),.*/\1/p' "$1.jsonl"; }
    a=$(params fp32); b=$(params blas)
    [ -n "$a" ] && [ "$((2 * b))" = "$a" ] ||
        { echo "$TEST: params at peak: fp32 $a bytes, bf16 on OpenBLAS $b (want half)"; exit 1; }
    compare fp32 blas 0.02
    run auto 1 --set train.steps=2 --set train.precision=bf16
    case ${LOOM_TEST_ONEDNN:-} in
    ON)
        if grep -qx "cpu: .*; bf16 storage and products" auto.log; then want=bf16; else want=f32; fi
        grep -q "(oneDNN [^ ]* $want " auto.log ||
            { head -n 2 auto.log; echo "$TEST: auto is not oneDNN multiplying in $want"; exit 1; }
        echo "gemm: auto is oneDNN ($want products here); OpenBLAS multiplies bf16 runs in f32, stores bf16" ;;
    OFF)
        on_blas auto
        want='model.gemm = "onednn", but this loom was built without oneDNN (Debian: apt-get install libdnnl-dev, then rebuild; or use "auto")'
        for cmd in train plan; do
            rc=0 want_rc=1
            [ $cmd = train ] && want_rc=78 # a configuration error: a restart would repeat it
            "$LOOM" $cmd "$CFG" --set data.train="$DATA" --set model.gemm=onednn > refused.log 2>&1 || rc=$?
            [ $rc = $want_rc ] && grep -qF "loom $cmd: --set model.gemm=onednn: $want" refused.log &&
                ! grep -q "step  *1/" refused.log ||
                { cat refused.log; echo "$TEST: loom $cmd with model.gemm=onednn: exit $rc, want $want_rc and: $want"; exit 1; }
        done
        echo "gemm: no oneDNN: auto is OpenBLAS, \"onednn\" refused; bf16 runs multiply in f32, store bf16" ;;
    *)
        echo "$TEST: LOOM_TEST_ONEDNN is \"${LOOM_TEST_ONEDNN:-}\"; want ON or OFF (set by tests/train/CMakeLists.txt)"
        exit 1 ;;
    esac ;;
threads)
    # train.threads splits the kernels' rows (or columns) and attention's
    # heads, never a sum: the same losses and weights, bit for bit. C = 128
    # puts every kernel past the size where it splits; bf16 goes through
    # the threaded conversions, recomputation through forward again.
    for precision in fp32 bf16; do
        run "t1_$precision" 1 --set train.steps=4 --set model.channels=128 --set train.precision=$precision \
            --set train.recompute=block --set train.threads=1 --save "t1_$precision.bin"
        run "t2_$precision" 1 --set train.steps=4 --set model.channels=128 --set train.precision=$precision \
            --set train.recompute=block --set train.threads=2 --save "t2_$precision.bin"
        bitwise "t1_$precision" "t2_$precision"
    done
    run plain1 1 --set train.steps=4 --set model.channels=128 --set train.threads=1 --save plain1.bin
    run plain2 1 --set train.steps=4 --set model.channels=128 --set train.threads=2 --save plain2.bin
    bitwise plain1 plain2 ;;
save)
    run saved 1 --set train.steps=3 --save "$TMP/model.bin"
    [ -s "$TMP/model.bin" ] || { echo "train_test: --save wrote nothing"; exit 1; }
    # a run from the saved weights starts where the first one ended: its first
    # loss is below the first run's first loss
    run loaded 1 --set train.steps=1 --set model.init=checkpoint --set model.checkpoint="$TMP/model.bin"
    a=$(losses saved | head -1); b=$(losses loaded | head -1)
    awk -v a="$a" -v b="$b" 'BEGIN { if (!(b < a)) { print "loaded " b " not below fresh " a; exit 1 } print "checkpoint loads: " a " -> " b }' ;;
trace)
    run traced 2 --set train.steps=2 --set parallel.dp.bucket_mb=0.05 --trace "$TMP/trace.json"
    for want in '"pid":0,"tid":0' '"pid":1,"tid":0' '"name":"forward block 1"' \
                '"name":"backward embedding"' '"name":"ddp bucket 0"' '"name":"allreduce"' \
                '"traceEvents"'; do
        grep -q "$want" "$TMP/trace.json" || { echo "train_test: trace lacks $want"; exit 1; }
    done
    ls "$TMP"/trace.json.rank* 2>/dev/null && { echo "train_test: parts left behind"; exit 1; }
    echo "trace: both ranks, compute and comm lanes" ;;
kernel_times)
    # --metrics' kernel_ms: every kind, none negative, together no more than
    # the step and most of it on one rank (the model and AdamW are nearly
    # all a tiny step does); the summary table; the trace's kernel spans
    # inside the unit spans and its kernel_ms counter
    run timed 1 --set train.steps=6 --trace "$TMP/trace.json"
    run timed_bf16 1 --set train.steps=6 --set train.precision=bf16
    python3 - timed.jsonl timed_bf16.jsonl "$TMP/trace.json" <<'PY' || { cat timed.log; exit 1; }
import json, sys
kinds = ["matmul_fwd", "matmul_dx", "matmul_dw", "lm_head", "attention", "layernorm", "gelu",
         "residual", "crossentropy", "encoder", "convert", "optimizer", "comm", "other"]
gemm = ["matmul_fwd", "matmul_dx", "matmul_dw", "lm_head"]
for path in sys.argv[1:3]:
    bf16 = "bf16" in path
    for s in map(json.loads, open(path)):
        k = s["kernel_ms"]
        assert list(k) == kinds, "%s step %d: kinds %s" % (path, s["step"], list(k))
        assert all(v >= 0 for v in k.values()), "%s step %d: negative %s" % (path, s["step"], k)
        total = sum(k.values())
        assert total <= s["step_ms"] + 0.002, "%s step %d: %.3f ms of kernels in a %.3f ms step" % (path, s["step"], total, s["step_ms"])
        assert total >= 0.5 * s["step_ms"], "%s step %d: kernels %.3f ms, only %.0f%% of the %.3f ms step" % (path, s["step"], total, 100 * total / s["step_ms"], s["step_ms"])
        assert all(k[g] > 0 for g in gemm + ["attention", "layernorm", "gelu", "crossentropy", "optimizer"]), "%s step %d: a kind the step runs is 0: %s" % (path, s["step"], k)
        assert (k["convert"] > 0) == bf16 and k["comm"] == 0, "%s step %d: convert/comm %s" % (path, s["step"], k)
    print("%s: kernel_ms on every step, %.0f%% of the last step (%.2f of %.2f ms), GEMMs %.0f%% of it" %
          (path, 100 * total / s["step_ms"], total, s["step_ms"], 100 * sum(k[g] for g in gemm) / total))
ev = json.load(open(sys.argv[3]))["traceEvents"]
units = [e for e in ev if e["ph"] == "X" and e["name"].split(" ")[0] in ("forward", "backward")]
kernels = [e for e in ev if e["ph"] == "X" and e["name"] in kinds]
assert {e["name"] for e in kernels} >= set(gemm + ["attention", "layernorm", "optimizer"]), "trace: kernel spans missing"
inside = lambda k: any(u["ts"] - 0.001 <= k["ts"] and k["ts"] + k["dur"] <= u["ts"] + u["dur"] + 0.001 for u in units)
model = [k for k in kernels if k["name"] != "optimizer"]
assert all(inside(k) for k in model), "trace: a kernel span outside every unit span"
counters = [e for e in ev if e["ph"] == "C" and e["name"] == "kernel_ms"]
assert len(counters) == 6 and list(counters[0]["args"]) == kinds, "trace: %d kernel_ms counters" % len(counters)
print("trace: %d kernel spans inside the unit spans, %d optimizer spans, a kernel_ms counter per step" % (len(model), len(kernels) - len(model)))
PY
    for log in timed timed_bf16; do
        grep -q "^compute by kernel (mean of the 5 steps after the first): .* ms a step of .* ms" $log.log &&
            grep -q "^  matmul_fwd  *[0-9.]*  *[0-9.]*%$" $log.log && grep -q "^  other  " $log.log ||
            { cat $log.log; echo "$TEST: $log: no kernel summary"; exit 1; }
    done
    sed -n '/^compute by kernel/,$p' timed.log ;;
kernel_times_tp)
    # on a tensor axis the borders' all-reduces are comm, not other
    "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" --set data.train="$DATA" --set parallel.tp.size=2 \
        --set parallel.tp.strategy=tp --set train.steps=3 --metrics tp.jsonl > tp.log 2>&1 ||
        { cat tp.log; echo "$TEST: tp run failed"; exit 1; }
    python3 - tp.jsonl <<'PY'
import json, sys
for s in map(json.loads, open(sys.argv[1])):
    k = s["kernel_ms"]
    assert k["comm"] > 0 and sum(k.values()) <= s["step_ms"] + 0.002, "step %d: %s" % (s["step"], k)
print("tp 2: comm %.3f ms of %.3f ms of kernels in the last step" % (k["comm"], sum(k.values())))
PY
    ;;
output_paths)
    # the files a run will write are checked before step 1, so a bad path
    # fails at once instead of after the run, with its result lost
    fails() { # NAME RANKS WANT ARGS...: exit 78 before any step (1 after: kept), saying WANT
        fails_name=$1; fails_ranks=$2; fails_want=$3; shift 3
        rc=0
        if [ "$fails_ranks" = 1 ]; then
            "$LOOM" train "$CFG" --set data.train="$DATA" "$@" > "$fails_name.log" 2>&1 || rc=$?
        else
            "$LOOM" launch -n "$fails_ranks" -- "$LOOM" train "$CFG" --set data.train="$DATA" \
                --set parallel.dp.size="$fails_ranks" "$@" > "$fails_name.log" 2>&1 || rc=$?
        fi
        fails_rc=78
        [ "$fails_name" = kept ] && fails_rc=1
        [ $rc = $fails_rc ] || { cat "$fails_name.log"; echo "$TEST: $fails_name exited $rc, want $fails_rc"; exit 1; }
        grep -q "$fails_want" "$fails_name.log" || { cat "$fails_name.log"; echo "$TEST: $fails_name does not say: $fails_want"; exit 1; }
        [ "$fails_name" = kept ] || ! grep -q "step  *1/" "$fails_name.log" || { cat "$fails_name.log"; echo "$TEST: $fails_name ran a step"; exit 1; }
    }
    fails save 1 "loom train: --save /nonexistent/d/w.bin: its directory /nonexistent/d does not exist; create it or name another path" \
        --save /nonexistent/d/w.bin
    fails save2 2 "\[[01]\] loom train: --save /nonexistent/d/w.bin: its directory /nonexistent/d does not exist" \
        --save /nonexistent/d/w.bin
    ! grep -q "rank 0 cannot\|timed out" save2.log || { cat save2.log; echo "$TEST: save2 is vague"; exit 1; }
    mkdir adir
    fails save_dir 1 "loom train: --save adir: it is a directory; name a file" --save adir
    fails trace 2 "loom train: --trace /nonexistent/t.json: its directory /nonexistent does not exist" \
        --trace /nonexistent/t.json
    touch afile
    fails checkpoints 1 "loom train: --set train.checkpoint_dir=afile/x: train.checkpoint_dir = \"afile/x\": afile exists and is not a directory" \
        --set train.checkpoint_every=1 --set train.checkpoint_dir=afile/x
    # a nested checkpoint_dir is made with its parents
    run nested 1 --set train.steps=2 --set train.checkpoint_every=1 --set train.checkpoint_dir=a/b/c
    [ -s a/b/c/step-1/meta.loom ] || { echo "$TEST: no checkpoint in a/b/c"; exit 1; }
    # samples pass through it and leave nothing behind, however deep
    run sampled 1 --set train.steps=2 --set train.sample_every=1 --set train.checkpoint_dir=s/t/u
    grep -q "^sample: " sampled.log && [ ! -e s ] || { cat sampled.log; ls -R; echo "$TEST: sampling left s/"; exit 1; }
    # an existing --save file is checked without being touched
    echo keep > kept.bin
    fails kept 1 "loom train: step 2: " --save kept.bin --set train.lr=1e4 --set train.max_skipped=1
    [ "$(cat kept.bin)" = keep ] || { echo "$TEST: the check changed kept.bin"; exit 1; }
    echo "output paths: refused before step 1 at 1 and 2 ranks; checkpoint_dir made with parents" ;;
named_plugins)
    # every plugin the config names is checked, used or not, so a job fails
    # at one rank as it does at two: an unknown backend, a setting the
    # backend does not have, a strategy for another axis
    refused() { # WANT ARGS...: 1 and 2 ranks both exit 78 (a configuration error) saying WANT
        refused_want=$1; shift
        for ranks in 1 2; do
            rc=0
            if [ $ranks = 1 ]; then
                "$LOOM" train "$CFG" --set data.train="$DATA" "$@" > named.log 2>&1 || rc=$?
            else
                "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" --set data.train="$DATA" \
                    --set parallel.dp.size=2 "$@" > named.log 2>&1 || rc=$?
            fi
            [ $rc = 78 ] && grep -q "$refused_want" named.log ||
                { cat named.log; echo "$TEST: $* at $ranks rank(s): exit $rc, want 78 and: $refused_want"; exit 1; }
        done
    }
    refused "loom train: --set comm.default=foo: comm.default: plugin comm 'foo' not found: no libloom-comm-foo.so" \
        --set comm.default=foo
    refused "loom train: --set comm.mpi.bogus=1: comm.mpi.bogus: unknown setting" --set comm.mpi.bogus=1
    refused "loom train: --set comm.tp=nosuch: comm.tp: plugin comm 'nosuch' not found" --set comm.tp=nosuch
    refused "loom train: --set parallel.tp.strategy=zero3: parallel.tp.strategy = \"zero3\" is a strategy for the dp axis, not tp" \
        --set parallel.tp.strategy=zero3
    refused "loom train: --set parallel.pp.schedule=nosuch: plugin schedule 'nosuch' not found" \
        --set parallel.pp.schedule=nosuch
    refused "loom train: --set parallel.sp.bogus=1: parallel.sp.bogus: unknown setting" \
        --set parallel.sp.bogus=1
    # named right, they are fine unused
    run fine 1 --set train.steps=1 --set parallel.tp.strategy=tp --set parallel.sp.strategy=ring \
        --set parallel.pp.schedule=gpipe --set comm.tp=mpi --set comm.mpi.yield_when_idle=true
    echo "named plugins: checked at 1 rank as at 2" ;;
fp16_average)
    # fp16 gradients averaged over 4 dp ranks: summed first, they overflowed
    # where each rank's was in range (steps skipped, the loss left behind
    # one rank's); divided first, 4 ranks skip what 1 rank skips and follow
    # its losses, with ddp's all-reduce and zero's reduce-scatter alike
    run one 1 --set train.steps=20 --set train.precision=fp16
    run ddp 4 --set train.steps=20 --set train.precision=fp16
    sed 's/ bucket_mb = 0.1;//' "$CFG" > zero.cfg
    CFG=zero.cfg
    run zero2 4 --set train.steps=20 --set train.precision=fp16 --set parallel.dp.strategy=zero2
    run hsdp 4 --set train.steps=20 --set train.precision=fp16 --set parallel.dp.strategy=zero3 \
        --set parallel.dp.shard_size=2
    want=$(grep -c '"skipped": true' one.jsonl || true)
    for r in ddp zero2 hsdp; do
        got=$(grep -c '"skipped": true' $r.jsonl || true)
        [ "$got" -le "$want" ] || { grep skipped $r.log; echo "$TEST: $r skipped $got steps, 1 rank $want"; exit 1; }
        compare one $r 1e-4
    done ;;
comm_auto)
    # comm.default = "auto": comm-ucx for the trainer's host memory when it
    # loads on every rank, and the header says so; a name is still obeyed
    run auto 2 --set train.steps=2 --set comm.default=auto
    grep -qx "\[0\] comm: ucx (auto: host memory, comm-ucx loads)" auto.log ||
        { cat auto.log; echo "$TEST: no 'comm: ucx (auto: ...)' line"; exit 1; }
    grep -q "^\[0\] launch: " auto.log || { cat auto.log; echo "$TEST: no 'launch:' line"; exit 1; }
    run named 2 --set train.steps=2 --set comm.default=mpi
    grep -qx "\[0\] comm: mpi (comm.default)" named.log ||
        { cat named.log; echo "$TEST: comm.default=mpi not obeyed or not said"; exit 1; }
    compare named auto 1e-5
    # comm-ucx missing on rank 1 alone (a loom beside a plugin folder
    # without it): every rank falls back to comm-mpi, and says why
    mkdir -p nox/bin nox/lib/loom
    cp "$LOOM" nox/bin/loom
    for f in "$(dirname "$LOOM")"/../lib/loom/*.so; do
        case $f in *comm-ucx*) ;; *) ln -s "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" nox/lib/loom/ ;; esac
    done
    "$LOOM" launch -n 2 -- sh -c 'if [ "$LOOM_RANK" = 1 ]; then unset LOOM_PLUGIN_PATH; exec nox/bin/loom "$@"; fi; exec "$0" "$@"' \
        "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=2 --set parallel.dp.size=2 \
        --set comm.default=auto > partial.log 2>&1 || { cat partial.log; echo "$TEST: partial run failed"; exit 1; }
    grep -q "^\[0\] comm: mpi (auto: host memory, comm-ucx does not load on rank 1: plugin comm 'ucx' not found" partial.log ||
        { cat partial.log; echo "$TEST: no fallback to mpi naming rank 1"; exit 1; }
    echo "comm auto: ucx where it loads, mpi when one rank lacks it; names obeyed" ;;
ompi_server_tmpdir)
    # ompi-server's folder goes under TMPDIR (loom launch makes that the
    # job's own folder, removed at the end whatever became of the ranks),
    # not in /tmp, where every job stopped at its start left one
    mkdir t
    printf '#!/bin/sh\nexec sleep 60\n' > hang.sh
    chmod +x hang.sh
    ls -d /tmp/loom-mpi-* > before.txt 2>/dev/null || true
    TMPDIR="$TMP/t" "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" --set data.train="$DATA" \
        --set parallel.dp.size=2 --set comm.default=mpi --set comm.mpi.ompi_server="$TMP/hang.sh" \
        > hang.log 2>&1 &
    pid=$!
    for i in $(seq 1 200); do
        ls -d t/loom-launch-*/loom-mpi-* > /dev/null 2>&1 && break
        sleep 0.05
    done
    ls -d t/loom-launch-*/loom-mpi-* > /dev/null 2>&1 ||
        { kill $pid; cat hang.log; echo "$TEST: no ompi-server folder under TMPDIR"; exit 1; }
    kill -TERM $pid
    wait $pid || true
    [ -z "$(ls -A t)" ] || { ls -R t; echo "$TEST: files left in TMPDIR"; exit 1; }
    ls -d /tmp/loom-mpi-* > after.txt 2>/dev/null || true
    cmp -s before.txt after.txt || { diff before.txt after.txt; echo "$TEST: a loom-mpi folder left in /tmp"; exit 1; }
    echo "ompi-server's folder under TMPDIR, removed with the job" ;;
*)
    echo "train_test: unknown case $CASE"; exit 2 ;;
esac
