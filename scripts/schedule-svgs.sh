#!/bin/sh
# Regenerate the schedule drawings of docs/pipeline.md with `loom schedule`
# (simulated with forward = backward-input = backward-weight = 1, backward
# = 2): 1f1b, zb-h1 and gpipe at p = 4, m = 8, and interleaved with v = 2.
#   usage: sh scripts/schedule-svgs.sh [LOOM]     (default build/bin/loom)
set -eu
cd "$(dirname "$0")/.."
LOOM=${1:-build/bin/loom}
[ -x "$LOOM" ] || { echo "schedule-svgs.sh: $LOOM not built; run: bash scripts/setup.sh" >&2; exit 1; }
mkdir -p docs

# draw SCHEDULE VIRTUAL_STAGES FILE
draw() {
    "$LOOM" schedule examples/pipeline.cfg --set parallel.pp.size=4 \
        --set parallel.pp.microbatches=8 --set parallel.pp.schedule="$1" \
        --set parallel.pp.virtual_stages="$2" --svg "docs/$3" > /dev/null
    echo "docs/$3"
}
draw 1f1b 1 schedule-1f1b-p4-m8.svg
draw zb-h1 1 schedule-zb-h1-p4-m8.svg
draw gpipe 1 schedule-gpipe-p4-m8.svg
draw interleaved 2 schedule-interleaved-p4-m8.svg
