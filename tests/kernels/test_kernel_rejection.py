"""The rejection sampler's Triton kernels (interpreter on CPU) against the reference: the same
tokens, exactly, for greedy, random (draft probabilities or point masses) and mixed batches with
requests of 0 drafts; the rule on hand-built cases, for both; the op's wiring. sm_90 compile:
tests/kernels/test_sm90_compile.py.
The distribution of the emitted tokens: tests/sampling/test_rejection.py."""

from __future__ import annotations

import pytest
import torch

import lab.kernels.rejection as rejection
from lab.kernels.rejection import (
    PLACEHOLDER,
    RejectionNoise,
    rejection_sample_ref,
    rejection_sample_triton,
)
from lab.layers.cpu_ops import CPUOps
from lab.layers.ops import TorchOps, TritonOps
from lab.sampling.rejection import draw_noise

IMPLS = {"ref": rejection_sample_ref, "triton": rejection_sample_triton}
V = 50  # not a multiple of the tests' 16-wide tile: a ragged last tile


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """Several vocab tiles per row, so the running argmax crosses tiles."""
    monkeypatch.setattr(rejection, "_MAX_BLOCK", 16)


def _batch(ks: list[int], greedy: list[bool], with_q: bool, seed: int):
    """Inputs whose drafts are often accepted: a draft is sampled from its q (a noisy copy of
    its target row) or, for point masses, from the target row; greedy rows' drafts are mostly
    their row's argmax."""
    torch.manual_seed(seed)
    num_drafts = sum(ks)
    logits = 2 * torch.randn(num_drafts + len(ks), V)
    target = torch.softmax(logits, dim=-1)
    req_of_draft = torch.arange(len(ks)).repeat_interleave(torch.tensor(ks))
    tested = torch.arange(num_drafts) + req_of_draft  # the target row each draft is tested on
    rows = target[tested]
    q = torch.softmax(logits[tested] + torch.randn(num_drafts, V), -1) if with_q else None
    drafts = (torch.multinomial(q if with_q else rows, 1).squeeze(1) if num_drafts
              else torch.empty(0, dtype=torch.int64))
    is_greedy = torch.tensor(greedy)
    argmax_draft = is_greedy[req_of_draft] & (torch.rand(num_drafts) < 0.7)
    drafts = torch.where(argmax_draft, rows.argmax(-1), drafts)
    return drafts, ks, target, q, is_greedy, draw_noise(ks, V, [None] * len(ks))


CASES = {
    "greedy": ([3, 0, 2, 1], [True] * 4, True),
    "random_q": ([3, 0, 2, 1], [False] * 4, True),
    "random_point_mass": ([3, 1, 0, 2], [False] * 4, False),
    "mixed": ([0, 3, 2, 0], [True, False, True, False], True),
    "mixed_point_mass": ([2, 3, 0, 1], [False, True, False, True], False),
}


@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_reference(case):
    ks, greedy, with_q = CASES[case]
    for seed in range(4):
        args = _batch(ks, greedy, with_q, seed)
        assert torch.equal(rejection_sample_triton(*args), rejection_sample_ref(*args)), seed


def test_no_drafts_at_all():
    """D = 0: every request emits its bonus (greedy: argmax; random: the race of p_0)."""
    args = _batch([0, 0, 0], [True, False, False], True, 0)
    out = rejection_sample_ref(*args)
    assert out.shape == (3, 1) and torch.equal(rejection_sample_triton(*args), out)


def _one_hot_rows(tokens: list[int]) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), V).float()


def _noise(num_drafts: int, num_reqs: int, u: float = 0.5, seed: int = 0) -> RejectionNoise:
    e = torch.empty(num_reqs, V).exponential_(generator=torch.Generator().manual_seed(seed))
    return RejectionNoise(torch.full((num_drafts,), u), e)


@pytest.mark.parametrize("impl", IMPLS)
def test_greedy_accepts_the_run_of_argmaxes_then_emits_the_argmax(impl):
    target = _one_hot_rows([3, 5, 7, 3, 5, 7, 9])  # request 0: rows 0-2, request 1: rows 3-5, 2: 6
    drafts = torch.tensor([3, 6, 3, 5])  # request 0: 3 ok, 6 != 5; request 1: 3, 5 ok
    out = IMPLS[impl](drafts, [2, 2, 0], target, None, torch.tensor([True] * 3), _noise(4, 3))
    assert out.tolist() == [[3, 5, PLACEHOLDER], [3, 5, 7], [9, PLACEHOLDER, PLACEHOLDER]]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("with_q", [True, False])
def test_a_draft_the_target_is_sure_of_is_always_accepted(impl, with_q):
    """p(d) = 1: accepted whatever u and q(d) are; then the bonus token, from p_k."""
    target = _one_hot_rows([4, 8, 11])
    q = torch.softmax(torch.randn(2, V), -1) if with_q else None
    for u in (0.0, 0.5, 0.999999):
        out = IMPLS[impl](torch.tensor([4, 8]), [2], target, q, torch.tensor([False]),
                          _noise(2, 1, u))
        assert out.tolist() == [[4, 8, 11]]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("with_q", [True, False])
def test_a_draft_the_target_rules_out_is_rejected_and_not_recovered(impl, with_q):
    """p(d) = 0: rejected (u > 0); the recovered token is never d: residual(d) = 0."""
    target = torch.softmax(torch.randn(2, V), -1)
    target[0, 6] = 0.0
    q = torch.softmax(torch.randn(1, V), -1) if with_q else None
    for seed in range(20):
        out = IMPLS[impl](torch.tensor([6]), [1], target, q, torch.tensor([False]),
                          _noise(1, 1, 0.3, seed))
        assert out[0, 0] != 6 and out[0, 1] == PLACEHOLDER


@pytest.mark.parametrize("impl", IMPLS)
def test_an_empty_residual_falls_back_to_the_target(impl):
    """p <= q everywhere (q took all of p) yet rejected: the token is drawn from p itself."""
    target = torch.zeros(2, V)
    target[0, :2] = torch.tensor([0.2, 0.3])
    q = torch.zeros(1, V)
    q[0, :2] = 0.5
    for seed in range(10):
        noise = _noise(1, 1, 0.9, seed)  # 0.9 * 0.5 > 0.3: rejected
        out = IMPLS[impl](torch.tensor([1]), [1], target, q, torch.tensor([False]), noise)
        assert out[0, 0] == int((target[0] / noise.exponential[0]).argmax())


def test_float32_only():
    args = list(_batch([1], [False], True, 0))
    args[2] = args[2].half()
    with pytest.raises(ValueError, match="float32"):
        rejection_sample_triton(*args)


def test_the_op_is_on_every_layer_ops():
    """kernels=torch and kernels=cpu (CPU's auto) run the reference; kernels=triton the kernel."""
    for ops, fn in ((TorchOps(), rejection_sample_ref), (CPUOps(), rejection_sample_ref),
                    (TritonOps(), rejection_sample_triton)):
        assert ops.rejection_sample.resolve() is fn


@pytest.mark.gpu
def test_kernel_matches_reference_gpu():
    """A real vocabulary on CUDA (one 1024-wide tile loop), mixed greedy / random rows."""
    torch.manual_seed(0)
    ks = [4, 0, 3, 4, 1, 2, 4, 4] * 8
    vocab, num_drafts = 151936, sum(ks)
    target = torch.softmax(torch.randn(num_drafts + len(ks), vocab, device="cuda"), -1)
    q = torch.softmax(torch.randn(num_drafts, vocab, device="cuda"), -1)
    drafts = torch.multinomial(q, 1).squeeze(1)
    greedy = torch.arange(len(ks), device="cuda") % 3 == 0
    noise = draw_noise(ks, vocab, [None] * len(ks), "cuda")
    for draft_probs in (q, None):
        args = (drafts, ks, target, draft_probs, greedy, noise)
        assert torch.equal(rejection_sample_triton(*args), rejection_sample_ref(*args))
