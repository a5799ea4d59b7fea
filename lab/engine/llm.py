"""`LLM`: the offline API, shaped like vLLM's.

    llm = LLM(model="tiny_llama", attention="torch", num_gpu_blocks=64)
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8))

A keyword named after a config group picks that group's option; any other keyword sets the engine
knob of that name (see README). `model` takes a preset name (a file in conf/model/) or a
checkpoint directory.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from lab.engine.config import CONF_DIR, GROUPS, compose_config, set_knobs
from lab.engine.llm_engine import LLMEngine, validate_metadata
from lab.engine.outputs import RequestOutput
from lab.sampling.params import SamplingParams

Prompt = str | list[int]


class LLM:
    """Generate for a batch of prompts with continuous batching, vLLM style."""

    def __init__(self, model: str = "tiny_llama", **kwargs: object) -> None:
        groups = {k: v for k, v in kwargs.items() if k in GROUPS}
        knobs = {k: v for k, v in kwargs.items() if k not in GROUPS}
        overrides = [f"{k}={_group_value(v)}" for k, v in groups.items()]
        overrides.append(f"model={_model_option(model)}")
        if "logger" not in groups:
            overrides.append("logger=[]")
        cfg = compose_config(overrides)
        if _model_option(model) == "hf":
            knobs["model.path"] = str(Path(model).resolve())
        self.cfg = set_knobs(cfg, knobs)
        self.engine = LLMEngine(self.cfg)

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self, prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False, priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order."""
        prompts = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompts))
        prios = list(priority) if priority is not None else [0] * len(prompts)
        if len(prios) != len(prompts):
            raise ValueError(f"priority has {len(prios)} entries for {len(prompts)} prompts")
        for i, (p, pr) in enumerate(zip(prompts, prios)):  # refuse before anything runs
            self._check_prompt(i, p, pr)
        ids = [self.engine.add_request(p, sp, priority=pr).request_id
               for p, sp, pr in zip(prompts, params, prios)]
        return self._run(ids, use_tqdm)

    def _check_prompt(self, index: int, prompt: Prompt, priority: object) -> None:
        ids = self.engine.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        try:
            self.engine._validate_prompt(ids)
            validate_metadata(priority, None)
        except ValueError as e:
            raise ValueError(f"prompts[{index}]: {e}") from None

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="generate", disable=not use_tqdm)
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
                    bar.update(1)
        bar.close()
        return [done[i] for i in ids]


def _model_option(model: str) -> str:
    if (CONF_DIR / "model" / f"{model}.yaml").exists():
        return model
    if Path(model).is_dir():
        return "hf"
    presets = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
    raise ValueError(f"model={model!r} is neither a preset ({', '.join(presets)}) nor a directory")


def _group_value(value: object) -> str:
    if isinstance(value, list | tuple):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]  # a single token-id prompt
    return prompts


def _as_params_list(sp, n: int) -> list[SamplingParams]:
    if sp is None:
        return [SamplingParams() for _ in range(n)]
    if isinstance(sp, SamplingParams):
        return [sp] * n
    sp = list(sp)
    if len(sp) != n:
        raise ValueError(f"sampling_params has {len(sp)} entries for {n} prompts")
    return sp
