"""The tests' change to Triton's interpreter (tests/triton_interpreter.py): a launch patches
`triton.language` once, not again for each call of a `@triton.jit` helper, and the kernel's
result and the language after the launch are what Triton's own interpreter gives."""

import pytest
import torch
import triton
import triton.language as tl

from lab.kernels import interpreter_active

interpreter = pytest.importorskip("triton.runtime.interpreter")


@triton.jit
def _double(x):
    return x * 2


@triton.jit
def _doubled_three_times(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    for _ in tl.static_range(3):
        x = _double(x)
    tl.store(out_ptr + offs, x)


def _launch(monkeypatch) -> tuple[torch.Tensor, int]:
    """The kernel over 4 programs (12 helper calls), and how often Triton's _patch_lang ran."""
    calls = []
    patch = interpreter._patch_lang

    def counted(fn):
        calls.append(fn)
        return patch(fn)

    monkeypatch.setattr(interpreter, "_patch_lang", counted)
    x = torch.arange(32, dtype=torch.float32)
    out = torch.empty_like(x)
    _doubled_three_times[(4,)](x, out, BLOCK=8)
    return out, len(calls)


def _language() -> dict[str, object]:
    return {name: getattr(tl, name) for name in dir(tl)}


@pytest.mark.skipif(not interpreter_active(), reason="Triton's interpreter is off (CUDA)")
def test_a_launch_patches_the_language_once_and_restores_it(monkeypatch):
    if interpreter.GridExecutor.__call__.__name__ != "launch_patching_once":
        pytest.skip(f"triton {triton.__version__}: its interpreter runs unchanged")
    before = _language()
    out, patches = _launch(monkeypatch)
    assert torch.equal(out, torch.arange(32, dtype=torch.float32) * 8)
    assert patches == 1  # Triton's own interpreter: 13 (the launch and each helper call)
    assert _language() == before
    assert interpreter._patch_lang.__name__ == "counted"  # the launch put back what it found


@pytest.mark.skipif(not interpreter_active(), reason="Triton's interpreter is off (CUDA)")
def test_triton_s_own_launch_patches_for_every_helper_call(monkeypatch):
    """What the change removes, counted on Triton's interpreter as it ships."""
    wrapped = interpreter.GridExecutor.__call__
    if wrapped.__name__ == "launch_patching_once":
        monkeypatch.setattr(interpreter.GridExecutor, "__call__", wrapped.__wrapped_launch__)
    out, patches = _launch(monkeypatch)
    assert torch.equal(out, torch.arange(32, dtype=torch.float32) * 8)
    assert patches == 13
