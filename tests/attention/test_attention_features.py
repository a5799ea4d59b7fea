"""attention=torch, the reference of the per-layer ATTENTION_FEATURES (sliding window, sinks, soft
cap), equals a dense per-request softmax written in the test (paged_steps.dense_step) on decode,
fresh prefill, chunked prefill over a cached context and mixed steps, with GQA, for windows of
1, smaller than, equal to and larger than the context; a backend lacking a feature refuses a
model whose layers use it, naming the feature."""

import pytest
import torch

from lab.attention.base import AttentionSpec, PagedKVBackend
from lab.attention.spec import ATTENTION_FEATURES
from lab.attention.torch_backend import TorchAttentionBackend
from lab.attention.triton_flash import TritonFlashBackend
from tests.attention.paged_steps import dense_step, paged_step, run_features, sink_logits

D = 8
# (num_computed, query_lens): paged_step's requests hold up to 12 tokens (3 blocks of 4)
STEPS = {
    "decode": ([5, 11, 0], [1, 1, 1]),
    "prefill": ([0, 0], [9, 4]),
    "chunked": ([6, 3], [5, 6]),  # chunks after a cached context
    "mixed": ([8, 0, 4], [1, 7, 3]),  # a decode, a fresh prefill, a chunk
}
# 1: a query sees itself only; 3: smaller than every context; 9: equal to a request's whole
# sequence (prefill, chunked) or between; 64: larger than any (the causal mask alone)
WINDOWS = [None, 1, 3, 9, 64]
FEATURES = {"window": {}, "sinks": {"sinks": True}, "softcap": {"softcap": 0.7},
            "all": {"sinks": True, "softcap": 0.7}}
# (window, features) pairs that use at least one feature (the plain causal case:
# test_torch_backend.py)
CASES = [(w, f) for w in WINDOWS for f in FEATURES if w is not None or f != "window"]


def feature_args(step, features: str) -> tuple:
    """(sinks, softcap) of a FEATURES entry for this step's heads."""
    sinks = sink_logits(step[1].shape[1]) if FEATURES[features].get("sinks") else None
    return sinks, FEATURES[features].get("softcap")


@pytest.mark.parametrize(("window", "features"), CASES)
@pytest.mark.parametrize("kind", STEPS)
def test_torch_backend_features_equal_dense(kind, window, features):
    step = paged_step(*STEPS[kind], d=D, group=2)
    sinks, softcap = feature_args(step, features)
    out, _ = run_features(TorchAttentionBackend(), step, window, sinks, softcap)
    want = dense_step(step, D ** -0.5, window, sinks, softcap)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("group", [1, 4])
def test_features_with_mha_and_wider_groups(group):
    """Every feature at once, MHA (group 1) and 4 query heads per KV head."""
    step = paged_step([7, 0, 2], [1, 6, 5], group=group, d=D)
    sinks = sink_logits(step[1].shape[1])
    out, _ = run_features(TorchAttentionBackend(), step, 4, sinks, 1.5)
    torch.testing.assert_close(out.double(), dense_step(step, D ** -0.5, 4, sinks, 1.5),
                               atol=1e-5, rtol=1e-5)


def test_the_features_change_the_output():
    """Each feature matters at these shapes (the dense check is not vacuous)."""
    step = paged_step(*STEPS["chunked"], d=D)
    plain = dense_step(step, D ** -0.5)
    sinks = sink_logits(step[1].shape[1])
    for kw in ({"window": 3}, {"sinks": sinks}, {"softcap": 0.7}):
        assert not torch.allclose(dense_step(step, D ** -0.5, **kw), plain, atol=1e-3)


class _WindowOnly(PagedKVBackend):
    name = "window_only"
    supported_features = frozenset({"sliding_window"})

    def forward(self, *args, **kwargs):
        raise AssertionError("never called")


@pytest.mark.parametrize("missing", ["sinks", "softcap"])
def test_a_backend_without_a_feature_refuses_it_by_name(missing):
    assert set(ATTENTION_FEATURES) == {"sliding_window", "sinks", "softcap"}
    uses = {"sinks": {"sinks": True}, "softcap": {"logit_softcap": 30.0}}[missing]
    spec = AttentionSpec(num_heads=4, num_kv_heads=2, head_dim=8, sliding_window=128, **uses)
    assert spec.features == {"sliding_window", missing}
    with pytest.raises(ValueError, match=rf"attention=window_only does not implement {missing} "
                                         r".*supports sliding_window.*attention=torch"):
        _WindowOnly().check_supported(spec)
    _WindowOnly().check_supported(AttentionSpec(4, 2, 8, sliding_window=128))  # what it has
    TorchAttentionBackend().check_supported(spec)  # the reference implements every feature


def _triton_flash(step, **knobs) -> TritonFlashBackend:
    inputs, q, k, _, _ = step
    backend = TritonFlashBackend(**knobs)
    backend.kv_cache_spec(AttentionSpec(q.shape[1], k.shape[1], q.shape[2]), inputs.block_size,
                          q.dtype)
    return backend


@pytest.mark.parametrize(("window", "features"),
                         [(3, "window"), (None, "sinks"), (None, "softcap"), (5, "all")])
@pytest.mark.parametrize("kind", STEPS)
def test_triton_flash_features_equal_the_torch_backend(kind, window, features):
    """attention=triton_flash (Triton's interpreter here) gives attention=torch's output and
    cache with each feature; decode steps forced into splits (3 of them: the sink counted
    once over the merge, the splits covering the window only)."""
    step = paged_step(*STEPS[kind], d=16, group=2)
    sinks, softcap = feature_args(step, features)
    backend = _triton_flash(step, num_sms=132, min_keys_per_split=1, max_splits=3)
    out, cache = run_features(backend, step, window, sinks, softcap)
    want, want_cache = run_features(TorchAttentionBackend(), step, window, sinks, softcap)
    assert torch.equal(cache, want_cache)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=2e-5)
    assert (backend.workspace.out is not None) == (kind == "decode")  # split-KV + merge ran
