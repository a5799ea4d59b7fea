#!/usr/bin/env bash
# Download the pure-Python (and manylinux) wheels the GPU machine lacks into ./wheels (ignored by
# git; carried to the device with `carry: ["wheels"]`). The device has torch and triton only.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf wheels && mkdir -p wheels
python3 -m pip download --quiet --only-binary=:all: --python-version 3.11 -d wheels \
  "hydra-core>=1.3,<1.4" omegaconf "transformers>=4.56" safetensors tokenizers numpy rich tqdm \
  pytest hypothesis --no-deps
python3 -m pip download --quiet --only-binary=:all: --python-version 3.11 -d wheels \
  antlr4-python3-runtime==4.9.3 pyyaml regex huggingface-hub packaging filelock fsspec \
  typing-extensions markdown-it-py mdurl pygments pluggy iniconfig sortedcontainers attrs \
  hf-xet httpx anyio h11 httpcore idna certifi sniffio --no-deps 2>/dev/null || true
du -sh wheels
