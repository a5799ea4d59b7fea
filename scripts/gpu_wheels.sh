#!/usr/bin/env bash
# Build ./wheels (ignored by git; carried to the device with carry: ["wheels"]) holding what the
# GPU image lacks. Its python3 (3.12) already has torch, triton, transformers, tokenizers,
# safetensors, numpy, rich, tqdm, pytest and hypothesis (device KINDS.md); lab also needs Hydra.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf wheels && mkdir -p wheels
python3 -m pip download --quiet --no-deps --only-binary=:all: -d wheels \
  "hydra-core==1.3.8" "omegaconf==2.3.0"
# antlr4-python3-runtime 4.9.3 (Hydra's parser runtime) is published as an sdist only; it is pure
# Python, so a wheel built here installs anywhere.
python3 -m pip wheel --quiet --no-deps -w wheels "antlr4-python3-runtime==4.9.3"
ls wheels && du -sh wheels
