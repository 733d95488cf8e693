#!/bin/sh
# Builds ./bench from this folder against the kernels of this checkout (flags as native_build.py's).
set -e
cd "$(dirname "$0")"
D=$(cd ../../../jaxpaged/kernels/cpu_native && pwd)
I=$(${PYTHON:-python} -c "import jax; print(jax.ffi.include_dir())")
F="-O3 -march=native -std=c++17 -fno-math-errno -fno-tree-loop-distribute-patterns -I$I -I$D -w"
g++ $F -c -DVNNI_SOURCE="\"$D/vnni_matmul.cc\"" h_vnni.cc -o vnni.o
g++ $F -ffp-contract=fast -c -DPACKED_SOURCE="\"$D/packed_matmul.cc\"" h_bf16.cc -o bf16.o
g++ $F -c -DI8BF16_SOURCE="\"$D/int8_bf16_matmul.cc\"" h_i8bf16.cc -o i8.o
g++ $F main.cc vnni.o bf16.o i8.o -o bench -lpthread
rm -f vnni.o bf16.o i8.o
