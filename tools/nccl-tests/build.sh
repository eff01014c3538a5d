#!/usr/bin/env bash
# tools/nccl-tests/build.sh: builds NVIDIA's nccl-tests (a real NCCL client we did not write)
# against our include/nccl.h and libnccl.so.2, for Hopper (sm_90), into target/nccl-tests/, a
# folder that runs on its own on a GPU machine (binaries with $ORIGIN/lib, and lib/ holding
# libnccl.so.2, CUDA's runtime and nccl-tests' verification kernels). Needs no GPU.
#
#   tools/nccl-tests/build.sh SRC   SRC: an nccl-tests checkout (tested: a0b82b2, 2.19.6)
#
# CUDA 13.0's compiler comes from PyPI (pip install --target target/cuda-pip), so the build
# needs the package index once. nccl-tests takes GPU i for rank i; the one change made to its
# source (in a copy under target/) wraps that index modulo the device count, so that several
# ranks run on one GPU (NCCL itself refuses that; oxccl does not). Then, on the GPU machine:
#   bash tools/nccl-tests/run.sh      (the device tool: carry ["target/nccl-tests"])
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
src="${1:?usage: tools/nccl-tests/build.sh NCCL_TESTS_SOURCE_DIR}"
t="$root/target"
cuda="$t/cuda-pip/nvidia/cu13"
work="$t/nccl-tests-work"
b="$t/nccl-tests-build"
out="$t/nccl-tests"

if [ ! -x "$cuda/bin/nvcc" ]; then
  python3 -m pip install -q --no-deps --target "$t/cuda-pip" nvidia-cuda-nvcc==13.0.88 \
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
    'nvidia-cuda-cccl==13.0.*'
  # cccl's headers (<nv/target>, <cuda/...>) go beside the runtime's.
  for d in "$t"/cuda-pip/nvidia/cu13/include/cccl "$t"/cuda-pip/nvidia/cuda_cccl/include; do
    [ -d "$d" ] && cp -rn "$d"/. "$cuda/include/"
  done
fi

(cd "$root" && cargo build --release -p oxccl-nccl)

rm -rf "$work" "$b" "$out"
mkdir -p "$work" "$b/linklib" "$out/lib" "$t/nccl-home/lib"
cp -r "$src/." "$work/"
# Rank i's device: (first + i) modulo the device count, in the test setup and in its report.
sed -i 's|gpus\[i\] = (gpu0 != -1 ? gpu0 : localRank\*nThreads\*nGpus) + i;|gpus[i] = ((gpu0 != -1 ? gpu0 : localRank*nThreads*nGpus) + i) % oxcclDevs;|' "$work/src/common.cu"
sed -i 's|^\(\s*\)int gpu0 = envstr ? atoi(envstr) : -1;$|&\n\1int oxcclDevs = 1; CUDACHECK(cudaGetDeviceCount(\&oxcclDevs));|' "$work/src/common.cu"
sed -i 's|const int cudaDev = (gpu0 != -1 ? gpu0 : localRank\*nThreads\*nGpus) + i;|const int cudaDev = ((gpu0 != -1 ? gpu0 : localRank*nThreads*nGpus) + i) % available_devices;|' "$work/src/util.cu"
grep -q '% oxcclDevs' "$work/src/common.cu" && grep -q '% available_devices' "$work/src/util.cu" ||
  { echo "build.sh: this nccl-tests version differs; the device wrap was not applied" >&2; exit 1; }

ln -sfn "$root/include" "$t/nccl-home/include"
make -C "$work/src" -j"$(nproc)" BUILDDIR="$b" CUDA_HOME="$cuda" CUDA_LIB="$cuda/lib" \
  NCCL_HOME="$t/nccl-home" NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" \
  "$b"/{all_reduce,all_gather,reduce_scatter,broadcast,alltoall,common,util,timer}.o \
  "$b/verifiable/verifiable.o" os.build

cp --dereference "$t/release/libnccl.so.2" "$out/lib/libnccl.so.2"
strip --strip-debug "$out/lib/libnccl.so.2"
cp "$cuda/lib/libcudart.so.13" "$out/lib/"
ln -sf "$cuda/lib/libcudart.so.13" "$b/linklib/libcudart.so"
ln -sf "$out/lib/libnccl.so.2" "$b/linklib/libnccl.so"
# The verification kernels once, in a library, rather than in every binary.
g++ -shared -o "$b/linklib/libverifiable.so.0" "$b/verifiable/verifiable.o" \
  -Wl,-soname,libverifiable.so.0 -L"$b/linklib" -lcudart
ln -sf libverifiable.so.0 "$b/linklib/libverifiable.so"
for c in all_reduce all_gather reduce_scatter broadcast alltoall; do
  "$cuda/bin/nvcc" -o "$out/${c}_perf" -ccbin g++ -gencode=arch=compute_90,code=sm_90 -std=c++17 \
    "$b/$c.o" "$b/common.o" "$b/util.o" "$b/timer.o" -L"$b/linklib" -L"$cuda/lib" -lverifiable \
    -L"$b/os" -lnccl_test_os -lnccl -cudart shared -lrt \
    -Xlinker --disable-new-dtags -Xlinker '-rpath,$ORIGIN/lib'
done
strip --strip-unneeded "$out"/*_perf
cp "$b/linklib/libverifiable.so.0" "$out/lib/"
strip --strip-unneeded "$out/lib/libverifiable.so.0"
du -sh "$out"
