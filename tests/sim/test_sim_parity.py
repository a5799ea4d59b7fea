"""The simulator runs the real scheduler: on the same trace and the same (virtual) clock, the real
engine (tiny_llama on the CPU) and `executor=sim` with a constant step time make the same
scheduling decision at every step (tokens per request, preemptions), and VirtualClock waits reach
their deadline exactly. The real engine warms up first (lab/engine/warmup.py; the simulator never
does): its run then decides as a fresh engine would."""

import pytest
from omegaconf import open_dict

from lab.clock import VirtualClock
from lab.config.compose import compose_config
from lab.engine.llm_engine import LLMEngine
from lab.engine.replay import replay
from lab.engine.warmup import PREFIX
from lab.executor.uniproc import UniprocExecutor
from lab.workloads.synthetic import SyntheticWorkload

STEP = 0.01


class VirtualClockUniproc(UniprocExecutor):
    """The real worker, on a virtual clock that each step advances by STEP."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.clock = VirtualClock()

    def execute_model(self, sched):
        out = super().execute_model(sched)
        self.clock.advance(STEP)
        return out


def _decisions(executor: dict | str, preemption: str) -> list[tuple[dict, set]]:
    cfg = compose_config([
        "model=tiny_llama", "attention=torch", "sim/step_time=constant",
        f"sim.step_time.seconds={STEP}", "logger=[]", f"preemption={preemption}",
        "scheduler=priority", "num_gpu_blocks=20", "block_size=4", "max_num_batched_tokens=48",
        "device=cpu", *([f"executor={executor}"] if isinstance(executor, str) else [])])
    if isinstance(executor, dict):
        with open_dict(cfg):
            cfg.executor = executor
    engine = LLMEngine(cfg)
    decisions = []
    schedule = engine.scheduler.schedule

    def recording():
        out = schedule()
        if not any(r.startswith(PREFIX) for r in out.num_scheduled_tokens):  # the run's only
            decisions.append((dict(out.num_scheduled_tokens), set(out.preempted_req_ids)))
        return out

    engine.scheduler.schedule = recording
    workload = SyntheticWorkload(
        num_requests=12, prompt_len={"dist": "uniform", "min": 8, "max": 40},
        output_len={"dist": "uniform", "min": 4, "max": 16}, arrival="poisson", rate=40.0,
        num_prefix_groups=2, prefix_len=6, num_priorities=3, seed=3)
    summary = replay(engine, workload.requests(engine.model_info.vocab_size,
                                               engine.eos_token_id))
    assert summary.num_finished == {"length": 12}
    return decisions


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_sim_schedules_exactly_like_the_real_engine(preemption):
    real = _decisions({"_target_": f"{__name__}.VirtualClockUniproc", "_partial_": True},
                      preemption)
    sim = _decisions("sim", preemption)
    assert any(preempted for _, preempted in real)  # the trace does exercise preemption
    assert len(sim) == len(real)
    assert sim == real


def test_virtual_clock_sleep_until_reaches_the_deadline_exactly():
    clock = VirtualClock(0.43)
    start = clock.now()
    clock.advance(0.1234567)
    for arrival in (0.2, 0.3000001, 0.7):
        clock.sleep_until(start + arrival)
        assert clock.now() >= start + arrival
    clock.sleep_until(0.0)  # the past: no move
    assert clock.now() == start + 0.7
