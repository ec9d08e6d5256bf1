#!/bin/sh
# The cuda compute plugin on a machine without a GPU (run through
# `gpu_or_skip --no-gpu`):
#   (a) model.device = "cuda" is refused: a non-zero status and one line,
#       naming cuda and saying no device is visible;
#   (b) model.device = "auto" trains on the cpu, and the header's compute
#       line says why cuda was not chosen;
#   (c) `loom plugins` lists compute cuda as ok, and `loom plugins --check`
#       passes its load checks and says the probe declined.
#   usage: cuda_no_gpu_test.sh LOOM SOURCE_DIR PLUGIN_FILE
set -eu
LOOM=$1
SRC=$2
PLUGIN=$3
CFG=$SRC/tests/zero/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

fail() { echo "cuda_no_gpu_test: $*"; exit 1; }

# (a)
echo "+ loom train tiny.cfg --set model.device='\"cuda\"'"
status=0
"$LOOM" train "$CFG" --set data.train="$DATA" --set model.device='"cuda"' > refused.log 2>&1 ||
    status=$?
cat refused.log
[ "$status" != 0 ] || fail "(a) model.device = cuda trained without a GPU (exit 0)"
[ "$status" -lt 128 ] || fail "(a) exit status $status: killed by a signal, not refused"
[ "$(wc -l < refused.log)" = 1 ] || fail "(a) the refusal is $(wc -l < refused.log) lines, want one"
grep -qi cuda refused.log || fail "(a) the refusal does not name cuda"
grep -Eqi 'no (cuda |nvidia )?(device|gpu)' refused.log ||
    fail "(a) the refusal does not say that no device is visible"
echo "(a) refused, status $status, one line"

# (b)
echo "+ loom train tiny.cfg --set model.device='\"auto\"' --set train.steps=2"
"$LOOM" train "$CFG" --set data.train="$DATA" --set model.device='"auto"' --set train.steps=2 \
    > auto.log 2>&1 || { cat auto.log; fail "(b) model.device = auto failed, not using the cpu"; }
line=$(grep '^compute:' auto.log) || { cat auto.log; fail "(b) no compute: line in the header"; }
echo "$line"
echo "$line" | grep -q '^compute: cpu: .*(model.device = "auto": cpu (cuda: ' ||
    fail "(b) the compute line does not say auto chose the cpu because of cuda"
echo "$line" | grep -Eqi 'device|gpu' || fail "(b) the compute line does not say why not cuda"
grep -q '^step    2/2 ' auto.log || { cat auto.log; fail "(b) the auto run did not train 2 steps"; }
echo "(b) auto trained on the cpu and said why"

# (c)
"$LOOM" plugins > plugins.log 2>&1 || { cat plugins.log; fail "(c) loom plugins failed"; }
grep -Eq '^compute +cuda +[0-9]+\.[0-9]+ +.*libloom-compute-cuda\.so +ok' plugins.log ||
    { cat plugins.log; fail "(c) compute cuda is not listed as ok"; }
grep -E '^compute +cuda ' plugins.log
"$LOOM" plugins --check "$PLUGIN" > check.log 2>&1 ||
    { cat check.log; fail "(c) loom plugins --check $PLUGIN failed"; }
cat check.log
grep -q '^note: probe: cuda cannot run here: ' check.log ||
    fail "(c) --check does not say the probe declined"
echo "(c) listed ok; --check passes its load checks and says why it cannot run here"
