"""Chained block hashes: prefix sharing, sensitivity, partial blocks, cross-process stability."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.cache import ROOT_HASH, encode_value, hash_block_tokens, make_block_hasher, make_root_hash
from lab.core.request import Request
from lab.core.sampling_params import SamplingParams

BS = 4
ROOT = Path(__file__).resolve().parents[2]


def _req(tokens: list[int], bs: int = BS, extra_keys_fn=None, rid: str = "r") -> Request:
    hasher = make_block_hasher(bs, extra_keys_fn)
    return Request(rid, tokens, SamplingParams(), None, 0.0, block_hasher=hasher)


tokens_st = st.lists(st.integers(0, 50_000), min_size=0, max_size=40)


def test_root_hash_is_fixed_and_seeded() -> None:
    assert make_root_hash() == ROOT_HASH and len(ROOT_HASH) == 32
    assert make_root_hash("other") != ROOT_HASH
    assert hash_block_tokens(None, [1, 2]) == hash_block_tokens(ROOT_HASH, [1, 2])


@given(tokens_st, tokens_st)
def test_same_prefix_same_chain(a: list[int], b: list[int]) -> None:
    ha, hb = _req(a).block_hashes, _req(a + b).block_hashes
    assert hb[: len(ha)] == ha


@given(st.lists(st.integers(0, 100), min_size=BS, max_size=40), st.data())
def test_changing_a_token_changes_every_later_hash(tokens: list[int], data) -> None:
    i = data.draw(st.integers(0, (len(tokens) // BS) * BS - 1))
    changed = list(tokens)
    changed[i] += 1
    h1, h2 = _req(tokens).block_hashes, _req(changed).block_hashes
    first = i // BS
    assert h1[:first] == h2[:first]
    assert all(x != y for x, y in zip(h1[first:], h2[first:]))


@given(tokens_st)
def test_only_full_blocks_hashed_and_incremental(tokens: list[int]) -> None:
    r = _req(tokens)
    assert len(r.block_hashes) == len(tokens) // BS
    grown = _req([])
    for t in tokens:
        grown.append_output_token(t)
    assert grown.block_hashes == r.block_hashes


def test_partial_last_block_not_hashed() -> None:
    r = _req(list(range(7)))
    assert len(r.block_hashes) == 1
    r.append_output_token(99)
    assert len(r.block_hashes) == 2
    assert r.block_hashes[1] == hash_block_tokens(r.block_hashes[0], [4, 5, 6, 99])


def test_extra_keys_change_hashes() -> None:
    tokens = list(range(12))
    plain = _req(tokens).block_hashes
    salted = _req(tokens, extra_keys_fn=lambda r, lo, hi: ("salt",) if lo == 0 else None)
    assert all(a != b for a, b in zip(plain, salted.block_hashes))  # chained: all differ
    lora = _req(tokens, extra_keys_fn=lambda r, lo, hi: (7,)).block_hashes
    assert lora != plain and lora != salted.block_hashes
    assert hash_block_tokens(None, [1], ()) == hash_block_tokens(None, [1], None)


def test_encoding_is_injective_on_tricky_values() -> None:
    values = [None, True, False, 0, 1, -1, 255, 256, "1", b"1", 1.0, (1,), (1, 2), ((1,), 2),
              (1, (2,)), "", b"", (), ("a", "b"), ("ab",)]
    encoded = [encode_value(v) for v in values]
    assert len(set(encoded)) == len(values)
    with pytest.raises(TypeError):
        encode_value(object())


_CHILD = (
    "from lab.cache import make_block_hasher; from lab.core.request import Request; "
    "from lab.core.sampling_params import SamplingParams; "
    "r = Request('x', list(range(37)), SamplingParams(), None, 0.0, "
    "block_hasher=make_block_hasher(4, lambda r, lo, hi: ('salt', lo, 1.5, b'\\x00')));"
    "print(','.join(h.hex() for h in r.block_hashes))"
)


def test_hashes_equal_across_processes() -> None:
    mine = _req(list(range(37)), extra_keys_fn=lambda r, lo, hi: ("salt", lo, 1.5, b"\x00"))
    expected = ",".join(h.hex() for h in mine.block_hashes)
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                             env=env, check=True, cwd=ROOT)
        assert out.stdout.strip() == expected
