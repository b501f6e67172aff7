#!/usr/bin/env bash
# The GPU check of issue 13, prepared so a session lent a device machine spends its few
# minutes of device time running it, not writing it. Two steps:
#
#   bash tools/device_check.sh prepare      # here, once: the corpus and a flax wheel, in ignored folders
#   run(command="bash tools/device_check.sh", carry=[".devdata", ".whl"], timeout_s=540)   # the device tool
#
# On the device machine (its own python3 with jax and a CUDA plugin; nothing can be fetched
# there) it prints the versions and the GPU, trains the paper-preset ladder (all ten rows,
# the issue's goal: under 2 minutes of wall time including compiles) and times the one-block
# step for every attention backend and dtype (tokens/s, MFU against the GPU's own measured
# matmul peak). What comes back under $OUT: versions.log, fused_parity.log, ladder.log, ladder_table.md,
# ladder_results.json, throughput.log, throughput_table.md. `PRESET=smoke bash
# tools/device_check.sh` runs the same plumbing on a CPU in about two minutes (OUT defaults to a
# temporary folder).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "prepare" ]; then
  grep -qx '/.devdata/' .git/info/exclude 2>/dev/null || echo '/.devdata/' >> .git/info/exclude
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  mkdir -p .devdata .whl
  data="${ATTENTION_JAX_DATA:-../shared/data}"
  cp "$data/tinyshakespeare.txt" .devdata/ || { echo "error: no tinyshakespeare.txt in $data: set ATTENTION_JAX_DATA"; exit 2; }
  # flax 0.12.8 is pure Python; the device image's own flax may be older than this project needs.
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform any -d .whl "flax==0.12.8" || exit 2
  du -sh .devdata .whl
  exit 0
fi

PRESET="${PRESET:-paper}"
OUT="${OUT:-$(mktemp -d)}"
RESULTS="$(mktemp -d)"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
else
  echo "note: no wheels in .whl/ ('bash tools/device_check.sh prepare' was not run here): the image's own flax is used"
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
export ATTENTION_JAX_DATA="${ATTENTION_JAX_DATA:-$PWD/.devdata}" ATTENTION_JAX_CACHE="$RESULTS/cache"

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import sys, jax, flax, optax, orbax.checkpoint as o, tokenizers
print('python', sys.version.split()[0], 'jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__,
      'orbax-checkpoint', o.__version__, 'tokenizers', tokenizers.__version__, 'devices', jax.devices())"
} 2>&1 | tee "$OUT/versions.log"

# Which kernel the fused backend runs (cuDNN's flash kernel in half precision, by name) and
# its parity with the reference, forward and gradients, with and without an ALiBi bias.
python3 tools/fused_parity.py 2>&1 | tee "$OUT/fused_parity.log"
parity_status=${PIPESTATUS[0]}

start=$(date +%s)
python3 -m experiments.ladder --preset "$PRESET" --no-progress --out "$RESULTS" 2>&1 | tee "$OUT/ladder.log"
ladder_status=${PIPESTATUS[0]}
echo "ladder --preset $PRESET: exit $ladder_status, $(( $(date +%s) - start )) s wall including compiles" | tee -a "$OUT/ladder.log"
cp "$RESULTS/ladder/table.md" "$OUT/ladder_table.md" 2>/dev/null
cp "$RESULTS/ladder/results.json" "$OUT/ladder_results.json" 2>/dev/null

start=$(date +%s)
python3 -m experiments.throughput --preset "$PRESET" --no-torch --attention causal_halves,reference,chunked,fused \
  --dtype float32,bfloat16 --json --out "$RESULTS" 2>&1 | tee "$OUT/throughput.log"
throughput_status=${PIPESTATUS[0]}
echo "throughput --preset $PRESET: exit $throughput_status, $(( $(date +%s) - start )) s wall" | tee -a "$OUT/throughput.log"
cp "$RESULTS/throughput/table.md" "$OUT/throughput_table.md" 2>/dev/null

echo "results in $OUT"
[ "$parity_status" = 0 ] && [ "$ladder_status" = 0 ] && [ "$throughput_status" = 0 ]
