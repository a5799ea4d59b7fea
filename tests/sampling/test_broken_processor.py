"""A logits processor that returns logits the sampler cannot use (NaN, a row cut short, another
dtype, no tensor) fails the step with an error naming the processor (before: NaN rows and cut
rows were sampled, as token 0 or from the wrong vocabulary, without a word). The engine serves
on. A processor that cannot change the argmax runs on another path (after temperature, random
rows only): checked the same way."""

from __future__ import annotations

import pytest
import torch

from lab import LLM, SamplingParams
from lab.logits_processors.base import BatchUpdate, LogitsProcessor, follow_rows
from lab.sampling.sampler import LogitsProcessorError

KNOBS = dict(attention="torch", num_gpu_blocks=32, block_size=4, max_model_len=64)
PROMPT = [5, 6, 7, 8]
GREEDY = dict(temperature=0, max_tokens=3, ignore_eos=True)
RANDOM = dict(temperature=1.0, seed=0, max_tokens=3, ignore_eos=True)


class BreaksLogits(LogitsProcessor):
    """Breaks the logits as a request's extra_args[KEY] says: "nan" (its row), "shape" (every
    row loses its last token), "dtype" (float64), "none" (returns None)."""

    KEY = "break"

    def __init__(self, context) -> None:
        super().__init__(context)
        self.rows: dict[int, str] = {}  # batch row -> how its request breaks the logits

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        follow_rows(self.rows, batch_update,
                    lambda added: (added.params.extra_args or {}).get(self.KEY))

    def apply(self, logits: torch.Tensor):
        modes = set(self.rows.values())
        for row, mode in self.rows.items():
            if mode == "nan":
                logits[row] = float("nan")
        if "shape" in modes:
            return logits[:, :-1]
        if "dtype" in modes:
            return logits.double()
        return None if "none" in modes else logits


class BreaksSampledLogits(BreaksLogits):
    """The same, as a processor that cannot change the argmax (random rows only)."""

    KEY = "break_sampled"

    def is_argmax_invariant(self) -> bool:
        return True


def _option(cls: type) -> dict:
    return {"_target_": f"{__name__}.{cls.__qualname__}", "_partial_": True}


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny_llama", **KNOBS, **{"logits_processors.breaks": _option(BreaksLogits),
                                         "logits_processors.breaks_sampled":
                                             _option(BreaksSampledLogits)})


@pytest.mark.parametrize("key, params, mode, message", [
    ("break", GREEDY, "nan", r"BreaksLogits\.apply returned NaN logits \(batch rows \[0\]\)"),
    ("break", GREEDY, "shape", r"BreaksLogits\.apply returned logits of shape \(1, \d+\), "
                               r"torch\.float32 .*expected shape \(1, \d+\)"),
    ("break", GREEDY, "dtype", r"BreaksLogits\.apply .*torch\.float64 .*expected .*float32"),
    ("break", GREEDY, "none", r"BreaksLogits\.apply returned NoneType, not the logits tensor"),
    ("break_sampled", RANDOM, "nan", r"BreaksSampledLogits\.apply returned NaN logits"),
], ids=["nan", "shape", "dtype", "none", "nan-after-temperature"])
def test_a_broken_processor_fails_the_step_naming_itself(llm, key, params, mode, message):
    plain = llm.generate([PROMPT], SamplingParams(**params))[0].outputs[0].token_ids
    broken = SamplingParams(**params, extra_args={key: mode})
    with pytest.raises(LogitsProcessorError, match=message):
        llm.generate([PROMPT], broken)
    again = llm.generate([PROMPT], SamplingParams(**params))[0].outputs[0]
    assert again.token_ids == plain and again.finish_reason == "length"
