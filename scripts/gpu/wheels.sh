#!/usr/bin/env bash
# Run HERE (it needs PyPI), before the GPU machine: fetch into .whl/ (git-ignored) what that machine's
# image lacks for this project: fairseq-fixed's CPython 3.12 wheel and the needs it pins that the image
# does not have (hydra-core, omegaconf, antlr4-python3-runtime, bitarray, fairscale). The image has torch,
# torchaudio, numpy, regex, sacrebleu, scikit-learn, tqdm, pytest, pytest-xdist and the test extras.
# fairseq's cffi and cython are build needs only; nothing imports them at run time.
# About 21 MB, within the 64 MiB a device call carries: name .whl in `carry`.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
rm -rf .whl && mkdir -p .whl
# the device's platform, whatever this machine's is
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl fairseq-fixed==0.12.3.1 hydra-core==1.3.2 omegaconf==2.3.0 bitarray==3.12.3
# antlr4-python3-runtime 4.9.3 (omegaconf's pin) and fairscale 0.4.13 (the `sharded` extra: ZeRO and the
# fsdp stage) are published as sdists only: build their pure-Python wheels
$PY -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3 fairscale==0.4.13
ls -l .whl
