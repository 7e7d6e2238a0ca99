#!/bin/bash
# GPU check and benchmark for tandem-accel. Run from the repository root on the GPU machine:
#   bash carry/accel/run-gpu.sh
# Writes logs under $OUT (or /tmp/accel-out when OUT is unset).
set -u
OUT=${OUT:-/tmp/accel-out}
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>&1 | tee "$OUT/device.txt"
nproc | tee -a "$OUT/device.txt"
# NVRTC ships with the toolkit and with the nvidia-cuda-nvrtc wheel; the loader may not know either.
for directory in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $(find / -xdev -name 'libnvrtc.so*' -printf '%h\n' 2>/dev/null | sort -u | head -5); do
  if ls "$directory"/libnvrtc.so* >/dev/null 2>&1; then export LD_LIBRARY_PATH="$directory:${LD_LIBRARY_PATH:-}"; echo "libnvrtc from $directory" | tee -a "$OUT/device.txt"; break; fi
done
export LD_LIBRARY_PATH="$here:${LD_LIBRARY_PATH:-}"  # libisal.so.2 carried for the comparison
export XDG_CACHE_HOME=/tmp/accel-cache
chmod +x "$here/gpu_matches_cpu" "$here/bench_services"
set -o pipefail
echo "== gpu_matches_cpu"
( time "$here/gpu_matches_cpu" --nocapture --test-threads=1 ) 2>&1 | tee "$OUT/gpu_test.log"
echo "== bench services (first run compiles kernels, second reads the cache)"
"$here/bench_services" --size 256M --gpu-size 1G --rs-shapes 8+2,16+4 --seconds 1 --gpus 1 ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
gpus=$(nvidia-smi -L | wc -l)
if [ "$gpus" -gt 1 ]; then
  echo "== bench services on all $gpus GPUs (host in/out rows split every request over the GPUs)"
  "$here/bench_services" --size 64M --gpu-size 2G --services xts,rs --rs-shapes 8+2 --seconds 1 --no-openssl --no-isal 2>&1 | tee "$OUT/bench-all-gpus.log"
fi
ls -la /tmp/accel-cache/tandemfs/ptx 2>&1 | tee -a "$OUT/bench.log"
if [ -n "${XTS_UNROLL_VARIANTS:-}" ]; then
  for unroll in $XTS_UNROLL_VARIANTS; do
    echo "== XTS kernel with TANDEM_XTS_UNROLL=$unroll"
    TANDEM_XTS_UNROLL=$unroll "$here/bench_services" --size 16M --gpu-size 1G --services xts --seconds 1 --gpus 1 --no-openssl --no-isal 2>&1 | grep -E "gpu|GPU" | tee -a "$OUT/xts-variants.log"
  done
fi
