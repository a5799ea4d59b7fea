"""OutputProcessor: engine-core outputs (token ids, logprobs) -> RequestOutputs (vLLM V1's).

Per request it keeps an incremental detokenizer (text deltas that are exact across multi-byte
characters), checks stop strings on the new text (a hit finishes the request: the engine then
stops it in the core), turns logprob lists into {token id: Logprob} dicts with decoded tokens,
and reports according to the request's `output_kind`: CUMULATIVE (everything so far, each
step), DELTA (only what is new) or FINAL_ONLY (one output, at the end). Parallel-sampling
children are merged into their parent's RequestOutput (`ParentRequest`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.core.protocol import EngineCoreOutput
from lab.core.sampling_params import RequestOutputKind, SamplingParams
from lab.frontend.detokenizer import IncrementalDetokenizer, decode_logprob_tokens
from lab.frontend.outputs import (
    CompletionOutput,
    Logprob,
    PromptLogprobs,
    RequestOutput,
    SampleLogprobs,
)
from lab.frontend.parallel_sampling import ParentRequest
from lab.frontend.tokenizer import Tokenizer

# Preceding positions whose own tokens complete a logprob entry's partial character (vLLM: 4).
_LOGPROB_CONTEXT = 4


class RequestState:
    """The frontend's view of one engine request (a child, for n > 1)."""

    def __init__(
        self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
        params: SamplingParams, tokenizer: Tokenizer | None,
        parent: ParentRequest | None = None, index: int = 0,
        token_texts: dict[int, str] | None = None,
    ) -> None:
        self.request_id = request_id
        self.token_texts = token_texts  # the engine's cache of lone-token texts (logprobs)
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.parent = parent
        self.index = index
        self.tokenizer = tokenizer if params.detokenize else None
        self.detokenizer = IncrementalDetokenizer.from_new_request(
            self.tokenizer, prompt_token_ids, params)
        self.logprobs: SampleLogprobs | None = [] if params.logprobs is not None else None
        self.cumulative_logprob: float | None = 0.0 if params.logprobs is not None else None
        self.prompt_logprobs: PromptLogprobs | None = (
            [None] if params.prompt_logprobs is not None else None)
        self.num_cached_tokens = 0
        self._sent_tokens = 0  # DELTA: tokens (and logprobs) already reported
        self._sent_prompt_logprobs = 0

    @property
    def output_token_ids(self) -> list[int]:
        """The output so far (after a stop string: up to the token that completed it)."""
        return self.detokenizer.output_token_ids

    @property
    def output_kind(self) -> RequestOutputKind:
        return self.params.output_kind

    def add(self, out: EngineCoreOutput) -> str | None:
        """Take one core output; return the stop string it completed, if any.

        As in vLLM the text comes first: a stop string completed by one of several new tokens
        drops the tokens after it, and their logprobs with them (never counted in
        cumulative_logprob)."""
        self.num_cached_tokens = out.num_cached_tokens
        stop_string = None
        num_kept = len(out.new_token_ids)
        if out.new_token_ids:
            num_prev = self.detokenizer.num_output_tokens()
            stop_string = self.detokenizer.update(out.new_token_ids,
                                                  out.finish_reason == "stop")
            num_kept = self.detokenizer.num_output_tokens() - num_prev
        if out.new_logprobs is not None and self.logprobs is not None:
            rows = out.new_logprobs
            self._append_dicts(self.logprobs, rows.token_ids[:num_kept],
                               rows.logprobs[:num_kept], rows.ranks[:num_kept])
            self.cumulative_logprob += sum(row[0] for row in rows.logprobs[:num_kept])
        if out.new_prompt_logprobs is not None and self.prompt_logprobs is not None:
            rows = out.new_prompt_logprobs
            self._append_dicts(self.prompt_logprobs, rows.token_ids, rows.logprobs, rows.ranks)
        return stop_string

    def _append_dicts(self, dest: list[dict[int, Logprob] | None], token_ids: list[list[int]],
                      logprobs: list[list[float]], ranks: list[int]) -> None:
        """Append one {token id: Logprob} dict per position to `dest` (the request's sample or
        prompt logprobs), as vLLM builds them: a dict comprehension over the position's own
        token (its rank) and then the top-k (ranks 1..k), so an own token that is also in the
        top-k keeps its first place in the dict but takes the top-k entry's value (its rank
        there). decoded_token: `decode_logprob_tokens`, with the own tokens of the previous
        positions in `dest` (up to 4, None entries skipped) as context for bytes of a
        character; None without a tokenizer."""
        for ids, values, rank in zip(token_ids, logprobs, ranks, strict=True):
            if self.tokenizer is None:
                texts: list[str | None] = [None] * len(ids)
            else:
                context = [next(iter(row)) for row in dest[-_LOGPROB_CONTEXT:] if row is not None]
                texts = decode_logprob_tokens(self.tokenizer, ids, context, self.token_texts)
            all_ranks = [rank, *range(1, len(ids))]
            dest.append({tok: Logprob(value, r, text)
                         for tok, value, r, text in zip(ids, values, all_ranks, texts)})

    def completion(self, finish_reason: str | None, stop_reason: int | str | None,
                   ) -> CompletionOutput:
        """This request's completion as its output kind reports it now."""
        delta = self.output_kind == RequestOutputKind.DELTA
        finished = finish_reason is not None
        start = self._sent_tokens if delta else 0
        self._sent_tokens = len(self.output_token_ids)
        return CompletionOutput(
            index=self.index,
            text=self.detokenizer.get_next_output_text(finished, delta),
            token_ids=self.output_token_ids[start:],
            cumulative_logprob=self.cumulative_logprob,
            logprobs=None if self.logprobs is None else self.logprobs[start:],
            finish_reason=finish_reason,
            stop_reason=stop_reason,
        )

    def take_prompt_logprobs(self) -> PromptLogprobs | None:
        if self.prompt_logprobs is None:
            return None
        if self.output_kind != RequestOutputKind.DELTA:
            return self.prompt_logprobs
        start, self._sent_prompt_logprobs = self._sent_prompt_logprobs, len(self.prompt_logprobs)
        return self.prompt_logprobs[start:]


@dataclass
class ProcessedOutputs:
    request_outputs: list[RequestOutput] = field(default_factory=list)
    # requests finished here by a stop string: the engine stops them in the core
    reqs_to_stop: list[str] = field(default_factory=list)


class OutputProcessor:
    """Turns each step's EngineCoreOutputs into RequestOutputs; owns the requests' states."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}  # by engine request id (child ids for n > 1)
        self.parents: dict[str, ParentRequest] = {}
        self.token_texts: dict[int, str] = {}  # lone-token texts for logprob entries

    def add_request(
        self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
        params: SamplingParams, parent: ParentRequest | None = None, index: int = 0,
    ) -> None:
        self.states[request_id] = RequestState(request_id, prompt, prompt_token_ids, params,
                                               self.tokenizer, parent, index, self.token_texts)
        if parent is not None:
            self.parents[parent.request_id] = parent

    def has_request(self, request_id: str) -> bool:
        """Whether a live request (or a parallel-sampling parent) holds this id."""
        return request_id in self.states or request_id in self.parents

    def engine_ids(self, request_ids: list[str]) -> list[str]:
        """The engine request ids behind user ids (a parent's children)."""
        out = []
        for rid in request_ids:
            parent = self.parents.get(rid)
            out.extend(parent.child_ids if parent is not None else [rid])
        return out

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> ProcessedOutputs:
        result = ProcessedOutputs()
        for out in outputs:
            state = self.states.get(out.request_id)
            if state is None:
                continue  # already finished here (e.g. by a stop string)
            finish_reason, stop_reason = out.finish_reason, out.stop_reason
            stop_string = state.add(out)
            if stop_string is not None and finish_reason in (None, "stop", "length"):
                if finish_reason is None:
                    result.reqs_to_stop.append(out.request_id)
                finish_reason, stop_reason = "stop", stop_string
            request_output = self._make_output(state, out, finish_reason, stop_reason)
            if finish_reason is not None:
                self._forget(state)
            if request_output is not None:
                result.request_outputs.append(request_output)
        return result

    def _make_output(
        self, state: RequestState, out: EngineCoreOutput, finish_reason: str | None,
        stop_reason: int | str | None,
    ) -> RequestOutput | None:
        finished = finish_reason is not None
        if not finished and (state.output_kind == RequestOutputKind.FINAL_ONLY or (
                not out.new_token_ids and state.output_kind == RequestOutputKind.DELTA
                and out.new_prompt_logprobs is None)):
            return None
        completion = state.completion(finish_reason, stop_reason)
        request_id, completions, done = state.request_id, [completion], finished
        if state.parent is not None:
            request_id = state.parent.request_id
            completions, done = state.parent.get_outputs(state.request_id, completion)
            if not completions:
                return None
        return RequestOutput(
            request_id, state.prompt, state.prompt_token_ids, completions, finished=done,
            metrics=out.stats, prompt_logprobs=state.take_prompt_logprobs(),
            num_cached_tokens=state.num_cached_tokens)

    def _forget(self, state: RequestState) -> None:
        del self.states[state.request_id]
        parent = state.parent
        if parent is not None and not parent.unfinished:
            self.parents.pop(parent.request_id, None)
