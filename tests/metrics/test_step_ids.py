"""StepStats names the requests a step scheduled and the queue policy / preemption strategy;
steps.jsonl carries them, the W&B and Prometheus loggers skip them, the console ignores them."""

from __future__ import annotations

import json
from dataclasses import replace

from lab import LLM, SamplingParams
from lab.core.protocol import EngineCoreOutputs
from lab.core.stats import StepStats
from lab.engine.serial import MessageCodec
from lab.metrics.console import ConsoleLogger
from lab.metrics.jsonl import STEPS_FILE, JsonlLogger
from lab.metrics.prometheus import PrometheusLogger
from lab.metrics.stats import RunSummary
from lab.metrics.wandb_logger import merge_steps, wandb_step_record
from lab.scheduler import FCFSQueue
from lab.scheduler.scheduler import plugin_name

STEP = StepStats(step=3, time=1.5, num_scheduled_tokens=7, num_scheduled_reqs=2,
                 scheduled_req_ids=["a", "b"], queue_policy="fcfs",
                 preemption_strategy="recompute")


def test_steps_jsonl_carries_the_ids_and_the_names(tmp_path):
    logger = JsonlLogger()
    logger.on_start(tmp_path)
    logger.on_step(STEP)
    logger.close(RunSummary())
    (record,) = [json.loads(line) for line in (tmp_path / STEPS_FILE).read_text().splitlines()]
    assert record["scheduled_req_ids"] == ["a", "b"]
    assert (record["queue_policy"], record["preemption_strategy"]) == ("fcfs", "recompute")


def test_wandb_and_prometheus_skip_the_list_and_the_names(tmp_path):
    merged = merge_steps(STEP.to_dict(), STEP.to_dict())
    for record in (STEP.to_dict(), merged):
        point = wandb_step_record(record)
        assert not any(k.endswith(("scheduled_req_ids", "queue_policy", "preemption_strategy"))
                       for k in point)
        assert point["sched/num_scheduled_reqs"] in (2, 4)
    prom = PrometheusLogger("m", textfile=None)
    prom.on_start(tmp_path)
    prom.on_step(STEP)
    assert "scheduled_req_ids" not in prom.exposition()
    console = ConsoleLogger(progress=False)
    console.on_start(tmp_path)
    console.on_step(STEP)
    bare = replace(STEP, scheduled_req_ids=[], queue_policy="", preemption_strategy="")
    assert console.format_line(STEP, 1.0) == console.format_line(bare, 1.0)


def test_a_plugin_is_named_by_its_own_class():
    class Mine(FCFSQueue):
        pass

    class Named(FCFSQueue):
        name = "named"

    assert [plugin_name(q) for q in (FCFSQueue(), Mine(), Named())] == ["fcfs", "Mine", "named"]


def test_the_ids_and_names_cross_to_the_frontend():
    """A core in its own process (engine_client=mp) sends them with the outputs."""
    codec = MessageCodec()
    back = codec.decode(codec.encode(EngineCoreOutputs([], STEP)), EngineCoreOutputs)
    assert back.step_stats == STEP


def test_every_step_names_its_requests_and_the_policy():
    llm = LLM("tiny_llama", scheduler="priority", attention="torch", num_gpu_blocks=32,
              block_size=4, max_model_len=64, max_num_batched_tokens=8)
    before = len(llm.engine.recent_steps)
    prompts = [list(range(3, 15)), [5, 6, 7]]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    steps = list(llm.engine.recent_steps)[before:]
    assert steps
    for s in steps:
        assert len(s.scheduled_req_ids) == s.num_scheduled_reqs
        assert (s.queue_policy, s.preemption_strategy) == ("priority", "recompute")
    long_id, short_id = (o.request_id for o in outs)
    assert steps[0].scheduled_req_ids == [long_id]  # 8 tokens of its 12: the budget is spent
    seen = {rid for s in steps for rid in s.scheduled_req_ids}
    assert seen == {long_id, short_id}
