#!/usr/bin/env bash
# One GPU check: the `gpu` tests and benchmarks/kernels.py on one GPU, within 8 minutes, into one JSON.
#
#   bash benchmarks/gpu_check.sh [OUT.json]    # default: $OUT/gpu_check.json when $OUT is set, else ./gpu_check.json
#
# For an H100/H200-class machine with what such a machine already has: torch with CUDA, triton, jax with CUDA,
# flax, transformers. Nothing is installed or downloaded; the repository is put on PYTHONPATH. It runs
#   1. the `gpu` tests (tests/gpu): the compiled Triton and Pallas kernels against their references with the
#      kernel tolerance table, the whole model with kernels="fused" against kernels="reference" in bfloat16
#      and float32, greedy generation on the GPU against the CPU reference on the default checkpoint;
#   2. benchmarks/kernels.py at bfloat16, width 4096, 4096 and 16384 tokens: each kernel's bandwidth as a
#      fraction of the measured device-to-device copy, beside the plain framework ops it replaces, and the
#      floors (>= 85% of copy, >= 1.3x the plain ops);
# then writes one JSON (benchmarks/gpu_report.py::check_report says what is in it) and prints the figures and
# the floors; the steps' own reports and logs stay in OUT.files/ beside it. Exit status: 0 when every gpu test
# passed (none skipped) and every floor holds, 1 otherwise (the JSON is written either way), 2 when there is no
# GPU: then it refuses before running anything.
#
# Why TRITON_INTERPRET is unset here: Triton decides between interpreting and compiling once per process,
# when a kernel module is imported. The CPU suite's process interprets (tests/conftest.py sets
# TRITON_INTERPRET=1 so that the kernels run on CPU tensors), and a gpu test must check the compiled kernel,
# so the gpu tests run in a pytest process of their own (`-m gpu`, for which tests/conftest.py leaves the
# variable unset on a CUDA machine), with the variable removed from the environment in case the caller set it.
set -u

BUDGET_S=480                                # the whole script, GPU start-up included: 8 minutes
BENCH_MAX_S=170                             # benchmarks/kernels.py's share, at most
out_json=${1:-${OUT:+$OUT/gpu_check.json}}
out_json=$(realpath -m "${out_json:-gpu_check.json}")  # against the caller's directory, before the cd
cd "$(dirname "$0")/.." || exit 2
root=$(pwd)
# python3 first: on the GPU machines' image a plain `python3` is the interpreter that holds torch, triton and JAX.
python=${PYTHON:-$(command -v python3 || command -v python)}
[ -n "$python" ] || { echo "gpu_check: no python3 or python on PATH (or set PYTHON)" >&2; exit 2; }
start=$(date +%s)

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET                      # compile the Triton kernels (see above)
unset JAX_PLATFORMS                         # JAX needs both: the GPU, and the CPU for the CPU reference
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # torch and JAX share the GPU within one process
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# 1. Refuse cleanly without a GPU: nothing here means anything in interpret mode.
# JAX first: where torch loads its CUDA libraries first, a jaxlib built against a newer cuDNN than the one torch
# loaded starts without its GPU (the gpu tests' process and kernels.py start JAX first too). The JSON is the last
# line: a library's own start-up line on stdout is not mistaken for it.
probe=$(timeout 120 "$python" - <<'EOF'
import json
import sys

found = {"torch": None, "jax": None}
try:
    import jax

    found["jax"] = next((d.device_kind for d in jax.devices() if d.platform in ("gpu", "cuda")), None)
except Exception:  # no jax, or a jaxlib that cannot start: no JAX GPU either way
    pass
try:
    import torch

    if torch.cuda.is_available():
        found["torch"] = torch.cuda.get_device_name()
except ImportError:
    pass
print(json.dumps(found))
sys.exit(0 if any(found.values()) else 3)
EOF
)
status=$?
gpus=$(printf '%s\n' "$probe" | tail -n 1)
if [ "$status" -eq 124 ]; then
    echo "gpu_check: looking for a GPU took over 120 s (importing JAX and torch, starting their CUDA clients)" >&2
    exit 2
fi
if [ "$status" -ne 0 ]; then
    echo "gpu_check: no GPU found (torch sees no CUDA device, JAX no GPU backend): refusing to run." >&2
    echo "gpu_check: this script checks and measures the compiled kernels on one GPU; on a CPU machine run" >&2
    echo "gpu_check: 'python -m pytest' instead (the CPU suite runs the same kernel source in interpret mode)." >&2
    exit 2
fi
echo "gpu_check: GPUs $gpus; JSON to $out_json"

# The steps' own files (the pytest report and log, the benchmark's JSON and log) beside the JSON, kept: a step
# that runs out of time still leaves what it measured.
work="${out_json%.json}.files"
mkdir -p "$work" || exit 2
rm -f "$work/tests.xml" "$work/kernels.json"  # a step that leaves none must not be read as an earlier run's
export PYTHONUNBUFFERED=1  # a step KILLed after --kill-after keeps its log to the last line

left() { echo $(( BUDGET_S - ($(date +%s) - start) )); }

# 2. The gpu tests, in their own process (compiled Triton), leaving the benchmark its share and 40 s to spare.
tests_budget=$(( $(left) - BENCH_MAX_S - 40 ))
[ "$tests_budget" -lt 60 ] && tests_budget=60
echo "gpu_check: gpu tests (at most ${tests_budget} s)"
# SIGINT at the budget, not TERM: pytest stops as after Ctrl-C and still writes the report of the tests it ran
# (`timeout` exits 124 all the same); KILL 30 s later only if it does not stop.
timeout --signal=INT --kill-after=30 "$tests_budget" "$python" -m pytest -q -p no:cacheprovider -m gpu -rs \
    --tb=short --durations=30 tests/gpu --junitxml="$work/tests.xml" 2>&1 | tee "$work/tests.log"
tests_status=${PIPESTATUS[0]}

# 3. The kernel benchmark: the floors' shape (bf16, width 4096, >= 4096 tokens), 4096 and 16384 tokens.
bench_budget=$(( $(left) - 40 ))
[ "$bench_budget" -gt "$BENCH_MAX_S" ] && bench_budget=$BENCH_MAX_S
[ "$bench_budget" -lt 60 ] && bench_budget=60
echo "gpu_check: benchmarks/kernels.py (at most ${bench_budget} s)"
# SIGINT again: kernels.py evaluates the floors on what it measured so far and writes its JSON (it also rewrites
# it after every shape). 50 calls a sample: a JAX sample's dispatch and wait are paid once per sample.
timeout --signal=INT --kill-after=30 "$bench_budget" "$python" benchmarks/kernels.py --require-gpu \
    --dtype bfloat16 --widths 4096 --tokens 4096,16384 --warmup 5 --samples 15 --calls 50 \
    --json "$work/kernels.json" 2>&1 | tee "$work/kernels.log"
bench_status=${PIPESTATUS[0]}

# 4. One JSON, the figures and the floors printed, the verdict as the exit status.
"$python" -c 'import sys; from benchmarks.gpu_report import report_main; sys.exit(report_main(sys.argv[1:]))' \
    --tests-xml "$work/tests.xml" --tests-status "$tests_status" \
    --kernels-json "$work/kernels.json" --kernels-status "$bench_status" \
    --gpus "$gpus" --seconds "$(( $(date +%s) - start ))" --budget-seconds "$BUDGET_S" --out "$out_json"
