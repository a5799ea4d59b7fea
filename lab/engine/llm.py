"""`LLM`: the offline API, shaped like vLLM's.

    llm = LLM(model="tiny_llama", attention="torch", num_gpu_blocks=64)
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8))

A keyword named after a config group picks that group's option; any other keyword sets the engine
knob of that name (see README). `model` takes a preset name (a `model` option: lab/conf/model/
or a plug-in's) or a checkpoint directory; `config_path` adds directories of options.

`LLM(..., warmup=True)` warms the engine up before returning (lab/engine/warmup.py). Unlike
run.py and lab serve it does not by default: a generate() call has no clock of its own to keep
clean (a benchmark times its own warm-up generate, lab/bench/workload.py), and tests and
notebooks build many short-lived engines, which would each pay a full-budget prefill.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from lab.config.compose import GROUPS, compose_config, set_knobs, without_loggers_unless_given
from lab.config.plugins import group_options, option_file
from lab.core.sampling_params import RequestOutputKind, SamplingParams, as_sampling_params
from lab.engine.llm_engine import LLMEngine, RequestSpec
from lab.engine.warmup import warm_up_new_engine
from lab.frontend.outputs import RequestOutput
from lab.metrics.base import StatLogger

Prompt = str | list[int]
PromptInput = Prompt | dict  # + vLLM's {"prompt": str} and {"prompt_token_ids": [...]}


class LLM:
    """Generate for a batch of prompts with continuous batching, vLLM style."""

    def __init__(
        self, model: str = "tiny_llama", stat_loggers: Sequence[StatLogger] = (),
        config_path: Sequence[str | Path] = (), **kwargs: object,
    ) -> None:
        """`stat_loggers` receive every StepStats / RequestStats (e.g. an InMemoryLogger for the
        full trace; the engine itself keeps only the latest `recent_steps`). `config_path`:
        directories of config groups (options, presets) besides lab's and installed plug-ins'."""
        groups = {k: v for k, v in kwargs.items() if k in GROUPS}
        knobs = {k: v for k, v in kwargs.items() if k not in GROUPS}
        option = _model_option(model, config_path)
        overrides = [f"{k}={_group_value(v)}" for k, v in groups.items()]
        overrides.append(f"model={option}")
        cfg = compose_config(without_loggers_unless_given(overrides), config_path)
        if option == "hf" and model != "hf":  # a checkpoint directory
            knobs.setdefault("model.path", str(Path(model).resolve()))
        elif option == "hf" and "model.path" not in knobs:
            raise ValueError('model="hf" needs the checkpoint directory: LLM("/path/to/ckpt") or '
                             'LLM("hf", **{"model.path": "/path/to/ckpt"})')
        knobs.setdefault("warmup", False)  # see the module docstring
        self.cfg = set_knobs(cfg, knobs)
        self.engine = LLMEngine(self.cfg, loggers=list(stat_loggers))
        warm_up_new_engine(self.engine)

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self, prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | dict | Sequence[SamplingParams | dict] | None = None,
        use_tqdm: bool = False, priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order.

        A prompt is a string, a list of token ids, or vLLM's `{"prompt": str}` /
        `{"prompt_token_ids": [...]}`. Every prompt is checked before any is queued (all or
        nothing). If a step fails or the call is interrupted (KeyboardInterrupt), the call's
        unfinished requests are aborted, their blocks freed, and the exception propagates; the
        LLM stays usable.
        """
        prompts = [_prompt_of(p, i) for i, p in enumerate(_as_prompt_list(prompts))]
        params = _as_params_list(sampling_params, len(prompts))
        prios = list(priority) if priority is not None else [0] * len(prompts)
        if len(prios) != len(prompts):
            raise ValueError(f"priority has {len(prios)} entries for {len(prompts)} prompts")
        specs = [RequestSpec(p, _final_only(sp, i), priority=pr)
                 for i, (p, sp, pr) in enumerate(zip(prompts, params, prios))]
        return self._run(self.engine.add_requests(specs, label="prompts"), use_tqdm)

    def chat(
        self, messages: list[dict] | Sequence[list[dict]],
        sampling_params: SamplingParams | dict | Sequence[SamplingParams | dict] | None = None,
        use_tqdm: bool = False, chat_template: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Generate replies to conversations ([{"role": ..., "content": ...}, ...], or a list
        of them) rendered with the tokenizer's chat template (or `chat_template`), as vLLM's
        LLM.chat. The tiny models ship a small template of their own."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [{"prompt_token_ids": self._render_chat(c, chat_template, add_generation_prompt)}
                   for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _render_chat(self, conversation, template: str | None, add_generation_prompt: bool,
                     ) -> list[int]:
        tokenizer = self.get_tokenizer()
        if tokenizer is None:
            raise ValueError("chat needs the model's tokenizer, and this model has none")
        if not isinstance(conversation, list) or not all(
                isinstance(m, dict) and "role" in m and "content" in m for m in conversation):
            raise ValueError("a conversation is a list of {'role': ..., 'content': ...} messages")
        return tokenizer.apply_chat_template(conversation, template, add_generation_prompt)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        """Step until every request of `ids` has finished; other requests' final outputs are
        handed back to the engine for whoever added them."""
        done: dict[str, RequestOutput] = {}
        mine = set(ids)
        with tqdm(total=len(ids), desc="generate", disable=not use_tqdm) as bar:
            try:
                while len(done) < len(ids):
                    finished = [o for o in self.engine.step() if o.finished]
                    self.engine.defer_outputs([o for o in finished if o.request_id not in mine])
                    for out in (o for o in finished if o.request_id in mine):
                        done[out.request_id] = out
                        bar.update(1)
                    self._check_owed(len(done) < len(ids))
            except BaseException:
                self.engine.abort_request([i for i in ids if i not in done])
                self.engine.take_outputs(mine)
                raise
        return [done[i] for i in ids]

    def _check_owed(self, owed: bool) -> None:
        """Refuse to spin: step() reports every unreported final output at once, so when outputs
        are still owed and the core holds no request, none can come any more."""
        if owed and not self.engine.core.has_unfinished_requests():
            raise RuntimeError("requests of this call left the engine without a final output "
                               "(aborted behind the engine's back?)")


def _model_option(model: str, config_path: Sequence[str | Path]) -> str:
    """A `model` option's name (lab's or a plug-in's), or "hf" for a checkpoint directory."""
    if option_file("model", model, config_path) is not None:
        return model
    if Path(model).is_dir():
        return "hf"
    presets = group_options("model", config_path)
    raise ValueError(f"model={model!r} is neither a preset ({', '.join(presets)}) nor a directory")


def _group_value(value: object) -> str:
    if isinstance(value, list | tuple):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def _as_prompt_list(prompts) -> list:
    if isinstance(prompts, str | dict):
        return [prompts]
    if not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a prompt or a list of prompts, not "
                        f"{type(prompts).__name__}")
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]  # a single token-id prompt
    return prompts


PROMPT_KEYS = ("prompt", "prompt_token_ids")


def _prompt_of(prompt: PromptInput, index: int) -> Prompt:
    """A text or token-id prompt from any accepted form (vLLM's TextPrompt / TokensPrompt)."""
    if not isinstance(prompt, dict):
        return prompt
    keys = set(prompt)
    if len(keys) != 1 or not keys <= set(PROMPT_KEYS):
        raise ValueError(f"prompts[{index}] has keys {sorted(map(str, keys))}: a dict prompt "
                         f"holds exactly one of {', '.join(PROMPT_KEYS)} (lab has no "
                         "multi-modal inputs)")
    return prompt[keys.pop()]


def _final_only(params: SamplingParams | dict | None, index: int) -> SamplingParams:
    """generate() returns finished outputs only (vLLM's LLM sets FINAL_ONLY as well)."""
    params = SamplingParams() if params is None else as_sampling_params(
        params, f"sampling_params[{index}]")
    return replace(params, output_kind=RequestOutputKind.FINAL_ONLY)


def _as_params_list(sp, n: int) -> list:
    if sp is None:
        return [None] * n
    if isinstance(sp, SamplingParams | dict):
        return [sp] * n
    if isinstance(sp, str) or not isinstance(sp, Sequence):
        raise TypeError(f"sampling_params must be a SamplingParams, a dict of its fields, or a "
                        f"list of them (one per prompt), not {type(sp).__name__}")
    sp = list(sp)
    if len(sp) != n:
        raise ValueError(f"sampling_params has {len(sp)} entries for {n} prompts")
    return sp
