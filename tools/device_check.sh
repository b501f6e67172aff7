#!/usr/bin/env bash
# The GPU check (issue 61), prepared so a session lent a device machine spends its few minutes of
# device time running it, not writing it. Two steps:
#
#   bash tools/device_check.sh prepare      # here, once: the corpus and flax wheels, in ignored folders
#   run(command="bash tools/device_check.sh", carry=[".devdata", ".whl"], timeout_s=540)   # the device tool
#
# First, in seconds: JAX must see the accelerator asked for (EXPECT=gpu, the default, or tpu; cpu
# for the plumbing on a CPU), else one line and exit 3, before any minute is spent: a CUDA plugin
# that fails to load leaves JAX on the CPU, where the ladder would train until the call's limit.
# On the device machine (its own python3 with jax and a CUDA plugin; nothing can be fetched there)
# it then checks that flax's nnx and this project import and take a gradient on the image's own
# jax, with the image's own flax when that fits, else with the newest carried flax wheel that does
# (flax 0.12.8 needs jax < 0.11, 0.12.10 and later jax >= 0.11.1), and stops with one line when
# none does. Then it prints the versions, the GPU and the estimate for it (experiments/estimates.py:
# the paper ladder's FLOPs at nanoGPT's measured share of the device's peak, and twice that for a
# second try), runs tools/fused_parity.py, trains the paper-preset ladder in the GPU's dtype
# (speed.dtype_for: float16 on a T4, bfloat16 from compute capability 8.0; each row's seconds
# printed as it finishes) and times the one-block step for every attention form and dtype (tokens/s,
# MFU against the GPU's own measured matmul peak). Each step runs under its own limit
# (PARITY_LIMIT, LADDER_LIMIT, THROUGHPUT_LIMIT, in seconds), so a slow ladder still leaves the
# throughput figures. What comes back under $OUT: versions.log, fused_parity.log, ladder.log,
# ladder_table.md, ladder_results.json, throughput.log, throughput_table.md.
# `PRESET=smoke EXPECT=cpu bash tools/device_check.sh` runs the same plumbing on a CPU in a few
# minutes (OUT defaults to a temporary folder).
set -uo pipefail
cd "$(dirname "$0")/.."
FLAX_WHEELS="flax==0.12.8 flax==0.12.10 flax==0.12.12"   # the newest first at run time; each for some jax

if [ "${1:-}" = "prepare" ]; then
  grep -qx '/.devdata/' .git/info/exclude 2>/dev/null || echo '/.devdata/' >> .git/info/exclude
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  mkdir -p .devdata .whl
  data="${ATTENTION_JAX_DATA:-../shared/data}"
  cp "$data/tinyshakespeare.txt" .devdata/ || { echo "error: no tinyshakespeare.txt in $data: set ATTENTION_JAX_DATA"; exit 2; }
  # flax is pure Python: one wheel serves every Python 3 the image may have.
  for wheel in $FLAX_WHEELS; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_17_x86_64 --platform any -d .whl "$wheel" || exit 2
  done
  du -sh .devdata .whl
  exit 0
fi

export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
# What the run needs of flax and the project: nnx's modules and a gradient through them, and every
# module the steps below import. Seconds, on the image's own jax.
FITS='import jax, jax.numpy as jnp
from flax import nnx
m = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
nnx.grad(lambda m: m(jnp.ones((1, 2))).sum())(m)
import attention_jax.train, attention_jax.speed.forms, experiments.ladder, experiments.throughput, experiments.estimates'

# The carried wheels that declare they fit this jax, newest first (a wheel's Requires-Dist: jax>=X).
candidates() {
  python3 - .whl/flax-*.whl <<'PY'
import re, sys, zipfile
from importlib.metadata import version
number = lambda v: tuple(int(x) for x in re.findall(r"\d+", v)[:3])
jax = number(version("jax"))
fits = []
for wheel in sys.argv[1:]:
    try:
        meta = next(zipfile.ZipFile(wheel).read(n).decode() for n in zipfile.ZipFile(wheel).namelist()
                    if n.endswith(".dist-info/METADATA"))
    except (OSError, StopIteration, zipfile.BadZipFile):
        continue
    need = re.search(r"^Requires-Dist: jax\s*>=\s*([0-9.]+)", meta, re.M)
    if need is None or jax >= number(need.group(1)):
        fits.append((number(re.search(r"^Version: (.+)$", meta, re.M).group(1)), wheel))
print("\n".join(w for _, w in sorted(fits, reverse=True)))
PY
}

choose_flax() {
  local why
  if why=$(python3 -c "$FITS" 2>&1); then
    echo "flax: the image's own, $(python3 -c 'import flax; print(flax.__version__)')"
    return 0
  fi
  echo "the image's flax does not fit its jax: $(echo "$why" | tail -1)"
  for wheel in $(candidates 2>/dev/null); do
    local site="/tmp/site-$(basename "$wheel" .whl)"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheel" \
      >/dev/null 2>&1 || continue
    if why=$(PYTHONPATH="$site:$PWD" python3 -c "$FITS" 2>&1); then
      export PYTHONPATH="$site:$PWD"
      echo "flax: carried $(basename "$wheel")"
      return 0
    fi
    echo "carried $(basename "$wheel") does not fit either: $(echo "$why" | tail -1)"
  done
  echo "error: no flax here fits jax $(python3 -c 'import jax; print(jax.__version__)' 2>&1 | tail -1) with this project" \
       "(carried: $(ls .whl 2>/dev/null | tr '\n' ' ')); run 'bash tools/device_check.sh prepare' with a flax for it"
  return 1
}

PRESET="${PRESET:-paper}"
OUT="${OUT:-$(mktemp -d)}"
# Every step below writes under $OUT (tee, cp): made now, or refused before a minute is spent; a
# folder that is not there made tee and cp fail quietly, and the run still said where its results were.
if ! mkdir -p "$OUT" 2>/dev/null || [ ! -w "$OUT" ]; then
  echo "error: cannot write the results folder OUT=$OUT; set OUT to a folder you can write (made if missing)" >&2
  exit 2
fi
RESULTS="$(mktemp -d)"
# The accelerator asked for, or one line and exit 3 (tests/test_device_check.py times it on a CPU).
EXPECT="${EXPECT:-gpu}"
SEEN='import sys, jax
want = sys.argv[1]
try:
    got = jax.default_backend()
except Exception as e:
    got = "none (" + " ".join(str(e).split())[:160] + ")"
print(got, jax.devices()[0].device_kind if got in ("gpu", "tpu", "cpu") else "")'
if ! seen=$(timeout "${SEEN_LIMIT:-60}" python3 -c "$SEEN" "$EXPECT" 2>/dev/null | tail -1); then
  echo "error: python3 here cannot import jax (or took over ${SEEN_LIMIT:-60} s); install jax with its $EXPECT plugin" \
       "(docs/install.md), or set EXPECT=cpu for the plumbing alone" | tee "$OUT/versions.log" >&2
  exit 3
fi
backend=${seen%% *}; kind=${seen#* }
if [ "$backend" != "$EXPECT" ]; then
  echo "error: JAX runs on $backend here, not the $EXPECT asked for (its plugin did not load, or no device is" \
       "attached); nothing trained. Fix the plugin (docs/install.md), or set EXPECT=$backend to check on it" \
       | tee "$OUT/versions.log" >&2
  exit 3
fi
echo "JAX sees the $EXPECT asked for: $kind" | tee "$OUT/versions.log"
choose_flax 2>&1 | tee -a "$OUT/versions.log"
[ "${PIPESTATUS[0]}" = 0 ] || exit 2
site=$(sed -n 's/^flax: carried \(.*\)\.whl$/\1/p' "$OUT/versions.log")    # the pipe's subshell lost the export
[ -n "$site" ] && export PYTHONPATH="/tmp/site-$site:$PWD"
export ATTENTION_JAX_DATA="${ATTENTION_JAX_DATA:-$PWD/.devdata}" ATTENTION_JAX_CACHE="$RESULTS/cache"

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import sys, jax, flax, optax, orbax.checkpoint as o, tokenizers
print('python', sys.version.split()[0], 'jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__,
      'orbax-checkpoint', o.__version__, 'tokenizers', tokenizers.__version__, 'devices', jax.devices())"
  python3 -m experiments.estimates --device "$kind"
  python3 -c "from attention_jax.speed import dtype_for; print('dtype: %s (%s)' % dtype_for())"
} 2>&1 | tee -a "$OUT/versions.log"
DTYPE=$(sed -n 's/^dtype: \([a-z0-9]*\) .*/\1/p' "$OUT/versions.log")

# A step under its own limit: a step past it is stopped (exit 124), the next one still runs.
limited() { local limit=$1; shift; timeout --kill-after=10 "$limit" "$@"; }

# Which kernel the fused backend runs (cuDNN's flash kernel in half precision, by name) and
# its parity with the reference, forward and gradients, with and without an ALiBi bias.
limited "${PARITY_LIMIT:-90}" python3 tools/fused_parity.py 2>&1 | tee "$OUT/fused_parity.log"
parity_status=${PIPESTATUS[0]}

# Each row's line, with its seconds, is printed as the row finishes.
start=$(date +%s)
limited "${LADDER_LIMIT:-270}" python3 -m experiments.ladder --preset "$PRESET" --dtype "${DTYPE:-float32}" \
  --no-progress --out "$RESULTS" 2>&1 | tee "$OUT/ladder.log"
ladder_status=${PIPESTATUS[0]}
echo "ladder --preset $PRESET --dtype ${DTYPE:-float32}: exit $ladder_status$([ "$ladder_status" = 124 ] && echo \
  " (stopped at its ${LADDER_LIMIT:-270} s limit)"), $(( $(date +%s) - start )) s wall including compiles" \
  | tee -a "$OUT/ladder.log"
cp "$RESULTS/ladder/table.md" "$OUT/ladder_table.md" 2>/dev/null
cp "$RESULTS/ladder/results.json" "$OUT/ladder_results.json" 2>/dev/null

start=$(date +%s)
limited "${THROUGHPUT_LIMIT:-150}" python3 -m experiments.throughput --preset "$PRESET" --no-torch \
  --attention causal_halves,reference,chunked,fused --dtype float32,bfloat16 --json --out "$RESULTS" 2>&1 \
  | tee "$OUT/throughput.log"
throughput_status=${PIPESTATUS[0]}
echo "throughput --preset $PRESET: exit $throughput_status$([ "$throughput_status" = 124 ] && echo \
  " (stopped at its ${THROUGHPUT_LIMIT:-150} s limit)"), $(( $(date +%s) - start )) s wall" | tee -a "$OUT/throughput.log"
cp "$RESULTS/throughput/table.md" "$OUT/throughput_table.md" 2>/dev/null

# Say what is there, never more: a step that failed left its file out, and the status says so too.
missing=""
for f in versions.log fused_parity.log ladder.log ladder_table.md ladder_results.json throughput.log throughput_table.md; do
  [ -s "$OUT/$f" ] || missing="$missing $f"
done
echo "results in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
[ -z "$missing" ] || echo "not written:$missing (the logs above say why)" >&2
[ -z "$missing" ] && [ "$parity_status" = 0 ] && [ "$ladder_status" = 0 ] && [ "$throughput_status" = 0 ]
