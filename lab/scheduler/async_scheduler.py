"""AsyncScheduler (`async_scheduling=true`): schedules step N+1 while step N still runs.

The engine (EngineCore, async mode) schedules and submits step N+1 before it has step N's
sampled tokens. A request that step N samples for therefore owes the next step a token nobody
knows yet: a *placeholder* (vLLM V1's `num_output_placeholders`). The worker runs steps in order
and appends each step's sampled tokens to its own token buffer, so when step N+1 runs, the token
its placeholder stands for is there.

    | prompt ....... | outputs ... | placeholders |
    | computed (KV written or in flight)   | owed |
    0       num_computed_tokens     num_tokens + placeholders

- owed tokens count the placeholders (`_num_tokens_ahead`); a step that computes up to the end
  of them samples, so it adds one (`_on_scheduled`); its token resolves one (`_on_token`);
- a request whose tokens in flight end it whatever they are (max_tokens, max_model_len) is not
  scheduled again: no wasted step. One that stops on a token (EOS, a stop token id) is known
  only when that token arrives; the step already scheduled behind it computes one token more,
  which update_from_output drops (the request has finished), and its blocks are freed at once;
- a preempted request waits for its tokens in flight before it is admitted again;
- with speculative decoding (lab/speculative) a request that samples in a step in flight is not
  scheduled again until its tokens arrive: how many of its drafts were accepted decides where
  its next step starts. Other requests still overlap with the step in flight.

Only the mechanism changes: the queue policy and the preemption strategy are the same plug-ins.
"""

from __future__ import annotations

from lab.core.request import Request, RequestStatus
from lab.scheduler.scheduler import Scheduler


class AsyncScheduler(Scheduler):
    """The Scheduler with output placeholders for the tokens of steps in flight."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # tokens sampled by steps in flight and not arrived yet, per request (absent: none)
        self.placeholders: dict[Request, int] = {}

    def _num_tokens_ahead(self, req: Request) -> int:
        return super()._num_tokens_ahead(req) + self.placeholders.get(req, 0)

    def _tokens_owed(self, req: Request, budget: int) -> int:
        if req in self.placeholders and (self.config.num_speculative_tokens
                                         or self._ends_in_flight(req)):
            return 0
        return super()._tokens_owed(req, budget)

    def _ends_in_flight(self, req: Request) -> bool:
        """Whether the tokens in flight finish `req` by length, whatever they are."""
        pending = self.placeholders[req]
        max_tokens = req.sampling_params.max_tokens
        return (req.num_tokens + pending >= self.config.max_model_len
                or (max_tokens is not None and req.num_output_tokens + pending >= max_tokens))

    def _may_admit(self, req: Request) -> bool:
        return req not in self.placeholders

    def _on_scheduled(self, req: Request) -> None:
        if req.num_computed_tokens >= self._num_tokens_ahead(req):  # the step samples for it
            self.placeholders[req] = self.placeholders.get(req, 0) + 1

    def _on_token(self, req: Request) -> None:
        left = self.placeholders.pop(req, 1) - 1
        if left:
            self.placeholders[req] = left

    def _forget_in_flight(self, req: Request) -> None:
        self.placeholders.pop(req, None)

    def _finish(self, req: Request, status: RequestStatus) -> None:
        self.placeholders.pop(req, None)
        super()._finish(req, status)
