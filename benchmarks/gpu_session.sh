#!/usr/bin/env bash
# The checks of a lent CUDA machine (issue 30), in the order a short lease affords them.
#
#   bash benchmarks/gpu_session.sh OUT STEP...
#   STEP: setup tests tests-cuda smoke bench-2.6 bench-8.8 bench-process bench-8.8-slowdown
#
# setup: the packages the machine's image lacks, from wheels carried in .whl/ (downloaded for
# its Python 3.12 as docs/benchmarks.md says), then ckptstore itself, built there with its C
# extensions (an editable install into the image's Python). tests: the CUDA tests and the
# device paths' CPU tests; tests-cuda: the CUDA tests alone. smoke: benchmarks/gpu.py on a small model. bench-2.6 / bench-8.8:
# the measurements on the 2.6 GB and 8.8 GB states (the 8.8 GB one: its first commit);
# bench-process: the persist thread against a persist process (the GIL shared with the loop or
# not); bench-8.8-slowdown: the 8.8 GB state's training slowdown. Each step's output goes to
# OUT/STEP.log as well.
set -u
OUT=$1
shift
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
PY=python3
PER_RUN=("bare copy" "commit_async lossless" "commit_async lossless, staged on the host"
         "commit_async 8-bit uniform, on the GPU" "commit_async 4-bit adaptive, on the GPU"
         "commit_async incremental + 4-bit adaptive" "dcp.async_save")

step() {
    case $1 in
    setup)
        nvidia-smi -L && $PY --version && df -h /tmp /dev/shm | tail -2
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl || return 1
        $PY -m pip install -q --no-build-isolation --no-deps --no-index -e . || return 1
        $PY -c "import torch, ckptstore, ckptcodecs._native, ckptstore.storage._files
print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" ;;
    tests)
        timeout 200 $PY -m pytest -q -n 8 -p no:cacheprovider -rfEs \
            tests/store/test_cuda.py tests/store/test_device_decode.py \
            tests/store/test_device_encode.py tests/store/test_device_rows.py \
            tests/store/test_placement.py tests/store/test_checkout_into.py \
            tests/store/test_async.py tests/store/test_persist_process.py \
            tests/codecs/test_kernel_selector.py tests/compat/test_can_read_old.py \
            tests/compat/test_can_read_old_chains.py tests/compat/test_zarr_interop.py ;;
    tests-cuda)
        timeout 120 $PY -m pytest -q -n 8 -p no:cacheprovider -rfEs tests/store/test_cuda.py \
            tests/store/test_device_decode.py tests/store/test_async.py \
            tests/store/test_checkout_into.py -k "cuda or device or in_place" ;;
    smoke)
        timeout 90 $PY benchmarks/gpu.py --layers 2 --width 512 --every 5 --checkpoints 2 \
            --repeat 1 --first-commit ;;
    bench-2.6)
        timeout 240 $PY benchmarks/gpu.py --repeat 2 --checkpoints 3 --profile-restore \
            --only "${PER_RUN[@]}" ;;
    bench-8.8)
        timeout 110 $PY benchmarks/gpu.py --layers 26 --width 1536 --first-commit \
            --no-restore --root /dev/shm --only ;;
    bench-process)
        timeout 200 $PY benchmarks/gpu.py --repeat 2 --checkpoints 3 --no-restore --only \
            "bare copy" "commit_async lossless" "commit_async lossless, in a persist process" \
            "commit_async 8-bit uniform, on the GPU" \
            "commit_async 8-bit uniform, in a persist process" ;;
    bench-8.8-slowdown)
        timeout 240 $PY benchmarks/gpu.py --layers 26 --width 1536 --no-restore --repeat 1 \
            --checkpoints 3 --root /dev/shm --only "${PER_RUN[@]}" ;;
    *) echo "unknown step $1"; return 2 ;;
    esac
}

for s in "$@"; do
    echo "=== $s ($(date +%T))"
    step "$s" 2>&1 | tee "$OUT/$s.log"
    rc=${PIPESTATUS[0]}
    echo "=== $s: rc $rc ($(date +%T))"
    [ "$s" = setup ] && [ "$rc" != 0 ] && exit 1
done
exit 0
