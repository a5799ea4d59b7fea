"""SamplingRows (lab/worker/sampling_state.py): the persistent batch's per-row sampling
parameters give, after any sequence of adds, removes, condenses and swaps, exactly
SamplingMetadata.from_params over the requests at rows 0..n-1 — and are rebuilt only when a
row changed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lab.core.sampling_params import SamplingParams
from lab.sampling.metadata import SamplingMetadata, make_generator
from lab.worker.inputs import InputRows
from lab.worker.persistent_batch import ObjectRows, PersistentBatch
from lab.worker.sampling_state import SamplingRows

PARAMS = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.3]),
    top_k=st.sampled_from([-1, 0, 3, 2**63]),
    top_p=st.sampled_from([1.0, 0.9]),
    min_p=st.sampled_from([0.0, 0.1]),
    logprobs=st.sampled_from([None, -1, 0, 3]),
    seed=st.sampled_from([None, 1, 2]),
)
OPS = st.lists(st.sampled_from(["add", "add", "remove", "condense", "swap"]), max_size=8)


def assert_same(got: SamplingMetadata, want: SamplingMetadata) -> None:
    for name in ("temperature", "top_k", "top_p", "min_p", "is_greedy"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    for name in ("all_greedy", "all_random", "no_top_k", "no_top_p", "no_min_p",
                 "max_num_logprobs", "batch_size"):
        assert getattr(got, name) == getattr(want, name), name
    assert all(a is b for a, b in zip(got.generators, want.generators, strict=True))


def check(rows: SamplingRows, batch: PersistentBatch, owners: ObjectRows, inputs: InputRows,
          kept) -> None:
    """The metadata of the (dense) batch against from_params over its requests."""
    n = batch.num_reqs
    reqs = owners.items[:n]
    assert [r[0] for r in reqs] == batch.req_ids  # the object store followed the batch
    serials = [int(r[0][1:]) for r in reqs]  # the input rows did too
    assert inputs.token_row[:n].tolist() == serials
    assert inputs.num_tokens[:n].tolist() == [3 * k for k in serials]
    gens = [g if kept is None or kept[i] else None for i, (_, _, g) in enumerate(reqs)]
    want = SamplingMetadata.from_params([p for _, p, _ in reqs], gens)
    assert_same(rows.metadata(n, kept), want)


@pytest.mark.parametrize("share", [None, False])  # False: host and device tensors apart
@given(data=st.data(), steps=st.lists(OPS, min_size=1, max_size=5),
       max_num_reqs=st.integers(1, 6))
def test_incremental_metadata_equals_from_params(share, data, steps, max_num_reqs):
    rows, owners = SamplingRows(max_num_reqs, torch.device("cpu"), share=share), \
        ObjectRows(max_num_reqs)
    inputs = InputRows(max_num_reqs)
    batch = PersistentBatch(max_num_reqs, [rows, owners, inputs])
    serial = 0
    for ops in steps:
        for op in ops:
            live = [r for r in batch.req_ids if r is not None]
            if op == "add" and len(live) < max_num_reqs:
                serial += 1
                params = data.draw(PARAMS)
                gen = None if params.seed is None else make_generator(params.seed)
                rid = f"r{serial}"
                i = batch.add(rid, params, [serial], [])
                rows.set_row(i, params, gen)
                owners.items[i] = (rid, params, gen)
                inputs.set_row(i, serial, 2 * serial, 3 * serial)
            elif op == "remove" and live:
                batch.remove(data.draw(st.sampled_from(live)))
            elif op == "condense":
                batch.condense()
            elif op == "swap" and live:
                a, b = (batch.index_of(data.draw(st.sampled_from(live))) for _ in range(2))
                batch.swap(a, b)
        batch.condense()  # what the runner does before every step
        n = batch.num_reqs
        kept = data.draw(st.none() | st.lists(st.booleans(), min_size=n, max_size=n).map(
            lambda k: np.array(k, dtype=bool)))
        check(rows, batch, owners, inputs, kept)
    # a removed row is neutral again: nothing of a finished request lingers
    for rid in [r for r in batch.req_ids if r is not None]:
        batch.remove(rid)
    assert rows.generators == [None] * max_num_reqs
    assert (rows.temperature.np == 1).all() and (rows.top_k.np == 0).all()


def test_metadata_is_rebuilt_only_after_a_change():
    rows = SamplingRows(4, torch.device("cpu"))
    batch = PersistentBatch(4, [rows])
    for k, params in enumerate([SamplingParams(temperature=0), SamplingParams(seed=3)]):
        rows.set_row(batch.add(f"r{k}", params, None, []), params, make_generator(3))
    first = rows.metadata(2)
    assert rows.metadata(2) is first  # an unchanged batch: the same metadata, no copies
    # a row that keeps no token this step (a partial prefill) draws no noise from its generator
    partial = rows.metadata(2, np.array([True, False]))
    assert partial.generators == [None, None] and first.generators[1] is not None
    batch.remove("r0")
    batch.condense()
    again = rows.metadata(1)
    assert again is not first and again.all_random and again.batch_size == 1
