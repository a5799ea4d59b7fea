"""lab/attention/spec.py: the attention spec as plain data (no torch, no kernels behind it) and
how tensor parallelism splits or replicates the KV heads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lab.attention.spec import AttentionSpec, kv_heads_per_rank, mla_attention_spec

REPO = Path(__file__).resolve().parents[2]  # `python -c` imports the lab of its cwd


def test_kv_heads_are_split_then_replicated():
    assert kv_heads_per_rank(8, 1) == (8, 1)
    assert kv_heads_per_rank(8, 4) == (2, 1)
    assert kv_heads_per_rank(2, 8) == (1, 4)  # each kv head on 4 ranks
    with pytest.raises(ValueError, match="num_key_value_heads=6 is not divisible by "
                                         "tensor_parallel_size=4"):
        kv_heads_per_rank(6, 4)
    with pytest.raises(ValueError, match="tensor_parallel_size=6 is not a multiple of "
                                         "num_key_value_heads=4"):
        kv_heads_per_rank(4, 6)


def test_kv_elements_per_token():
    assert AttentionSpec(8, 2, 16).kv_elems_per_token == 2 * 2 * 16
    assert mla_attention_spec(8, 32, 16, 8, 16).kv_elems_per_token == 32 + 8  # one latent row


def test_the_package_and_its_spec_import_neither_torch_nor_kernels():
    code = (
        "import sys\n"
        "from lab.attention import AttentionSpec, mla_attention_spec\n"
        "mla_attention_spec(4, 8, 4, 4, 4)\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] == 'torch'\n"
        "         or m.startswith(('lab.kernels', 'lab.attention.base'))]\n"
        "assert not heavy, heavy\n"
        "from lab.attention import AttentionBackend\n"  # the seam, resolved when asked for
        "assert AttentionBackend.__module__ == 'lab.attention.base'\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO)
    assert run.returncode == 0, run.stderr
