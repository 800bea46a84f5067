#!/usr/bin/env bash
# The checks to run when a session is lent a GPU (docs/benchmarks.md records what they measured), the row not
# yet measured first: benchmarks/gpt.py on a GPT-2-small-sized model with float8 compiled, then the tests marked
# `cuda`, bf16 compiled (regional compile + compiled optimizer step, and blocks only), bf16 / float8 eager with
# the MFU trainwright logs, and the quick suite on a GPU machine.
# Usage: OUT=dir bash benchmarks/gpu_checks.sh      (torchao must be importable for the float8 rows;
#        PARTS names the parts to run (default: all but quick); whatever its order, they run in this one:
#        float8-compiled cuda-tests mfu-batch bf16-compiled eager quick (about 5 + 1 + 2 + 3 + 2 + 5 minutes);
#        GPT_TIMEOUT / COMPILED_TIMEOUT / CUDA_TESTS_TIMEOUT bound them. One device call runs at most 10 minutes:
#        PARTS="float8-compiled cuda-tests mfu-batch" first, the rest in a second call if device time is left.
set -uo pipefail
out=${OUT:-gpu_out}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TMPDIR=${TMPDIR:-/tmp}
py=${PYTHON:-python3}
PARTS=${PARTS:-float8-compiled cuda-tests mfu-batch bf16-compiled eager}
nvidia-smi -L
$py -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(), 'capability', torch.cuda.get_device_capability())"
gpt="$py benchmarks/gpt.py --device cuda --preset gpt2-small --batch-size 8 --steps 30 --warmup 5"
want() { [[ " $PARTS " == *" $1 "* ]]; }
# each run prints a line on stderr when it ends, so a part cut off by its time limit still shows how far it got
if want float8-compiled; then
    echo "== gpt2-small float8 compiled (not yet measured: 180 s on an H100 were not enough for both sides' compilation)"
    timeout ${COMPILED_TIMEOUT:-300} $gpt --precision float8 --sides raw_compiled,tw_compiled --rounds 1 --json "$out/gpt_float8_compiled.json" 2>&1 \
        | grep -v -e Warning -e '"""' | tail -12
fi
if want cuda-tests; then
    echo "== tests marked cuda"
    timeout ${CUDA_TESTS_TIMEOUT:-240} $py -m pytest -q -rs -m cuda -p no:cacheprovider tests 2>&1 | tee "$out/cuda_tests.log" | tail -15
fi
if want mfu-batch; then
    echo "== gpt2-small bf16, blocks compiled, batch 32 (the MFU at a larger batch; batch 8 gave 13-18 % on an H100)"
    timeout ${GPT_TIMEOUT:-120} $py benchmarks/gpt.py --device cuda --preset gpt2-small --batch-size 32 --steps 20 --warmup 5 --precision bf16-mixed \
        --sides raw_blocks,tw_blocks --rounds 1 --json "$out/gpt_bf16_batch32.json" 2>&1 | grep -v Warning | tail -8
fi
if want bf16-compiled; then
    echo "== gpt2-small bf16 compiled (regional compile + compiled optimizer step, and blocks only; recompiles and graph breaks in compiled_logs.txt)"
    TORCH_LOGS=recompiles,graph_breaks timeout ${COMPILED_TIMEOUT:-300} $gpt --precision bf16-mixed --sides raw_eager,raw_compiled,tw_compiled,raw_blocks,tw_blocks --rounds 1 \
        --json "$out/gpt_bf16_compiled.json" 2>"$out/compiled_logs.txt" | tail -10
    grep -E '^\[[0-9:]+\]' "$out/compiled_logs.txt"
    echo "recompiles: $(grep -c "Recompiling function" "$out/compiled_logs.txt")"
fi
if want eager; then
    echo "== gpt2-small bf16 eager"
    timeout ${GPT_TIMEOUT:-120} $gpt --precision bf16-mixed --sides raw_eager,tw_eager --rounds 3 --json "$out/gpt_bf16_eager.json" 2>&1 | tail -6
    echo "== gpt2-small float8 eager"
    timeout ${GPT_TIMEOUT:-120} $gpt --precision float8 --sides raw_eager,tw_eager --rounds 3 --json "$out/gpt_float8_eager.json" 2>&1 | grep -v -e Warning -e '"""' | tail -6
fi
if want quick; then
    echo "== quick suite on a GPU machine (unmarked tests run as on a CPU-only one)"
    timeout 300 $py -m pytest -q -n 12 -m "not slow and not multiprocess and not cuda" -p no:cacheprovider tests 2>&1 | tee "$out/quick.log" | grep -E "FAILED|passed|failed" | tail -15
fi
