"""engine_client=mp: the engine core in its own process (ZMQ + msgspec) gives what the
in-process core gives — tokens, logprobs, n > 1, stop strings, aborts, step statistics — and
a dead core process fails its callers at once instead of hanging."""

from __future__ import annotations

import itertools
import os
import time

import pytest

from lab import LLM, SamplingParams
from lab.bench.server_process import children_of
from lab.engine.client import EngineDeadError
from lab.engine.core_proc import start_error
from lab.metrics.memory import InMemoryLogger
from tests.procs import start_script
from tests.waits import WAIT_S

KNOBS = dict(attention="torch", num_gpu_blocks=64, block_size=4, max_model_len=128)
PROMPTS = ["Hello world", "The cat sat", [5, 6, 7, 8]]


@pytest.fixture(scope="module")
def inproc():
    return LLM("tiny_llama", **KNOBS)


@pytest.fixture(scope="module")
def trace():
    return InMemoryLogger()


@pytest.fixture(scope="module")
def mp(trace):
    llm = LLM("tiny_llama", engine_client="mp", stat_loggers=[trace], **KNOBS)
    yield llm
    llm.engine.shutdown()
    # the core process exits cleanly once it has sent everything, without tearing its
    # interpreter down (core_proc.run_engine_core)
    assert llm.engine.core.proc.exitcode == 0


def _same(a, b):
    """Ids, text, finish and stop reasons exact; logprobs to 1e-5 (the core process may run
    torch with another thread count, so reductions round differently)."""
    ca, cb = [c for o in a for c in o.outputs], [c for o in b for c in o.outputs]
    fields = lambda c: (c.token_ids, c.text, c.finish_reason, c.stop_reason)  # noqa: E731
    if [fields(c) for c in ca] != [fields(c) for c in cb]:
        return False
    for x, y in zip(ca, cb):
        for dx, dy in zip(x.logprobs or [], y.logprobs or []):
            if list(dx) != list(dy) or any(abs(dx[t].logprob - dy[t].logprob) > 1e-5 or
                                           dx[t].rank != dy[t].rank or
                                           dx[t].decoded_token != dy[t].decoded_token for t in dx):
                return False
    return True


@pytest.mark.parametrize("params", [
    dict(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2),
    dict(temperature=0.8, seed=3, n=3, max_tokens=5, ignore_eos=True),
    dict(temperature=0, max_tokens=24, ignore_eos=True, stop=["e", "a"]),
    dict(temperature=0, max_tokens=6, presence_penalty=1.0, bad_words=["the"]),
])
def test_mp_gives_what_inproc_gives(inproc, mp, params):
    sp = SamplingParams(**params)
    assert _same(mp.generate(PROMPTS, sp), inproc.generate(PROMPTS, sp))


def test_step_statistics_travel_with_the_outputs(mp, trace):
    before = len(trace.steps)
    mp.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    steps = trace.steps[before:]
    assert len(steps) >= 4 and sum(s.num_generated_tokens for s in steps) == 12
    assert trace.requests[-1].num_output_tokens == 4


def test_abort_reaches_the_core_and_reports_the_request(mp):
    engine = mp.engine
    rid = engine.add_request([3, 4, 5], SamplingParams(max_tokens=100, ignore_eos=True))
    engine.step()
    engine.abort_request([rid])
    finals = []
    while engine.has_unfinished_requests():
        finals += [o for o in engine.step() if o.finished]
    assert [(o.request_id, o.outputs[0].finish_reason) for o in finals] == [(rid, "abort")]


def test_a_dead_core_process_fails_its_callers_at_once():
    llm = LLM("tiny_llama", engine_client="mp", **KNOBS)
    engine = llm.engine
    rid = engine.add_request([3, 4, 5], SamplingParams(max_tokens=100, ignore_eos=True))
    engine.step()
    engine.core.proc.kill()
    start = time.monotonic()
    with pytest.raises(EngineDeadError, match="died"):
        while True:
            engine.step()
    assert time.monotonic() - start < 2.0
    (out,) = engine.step()  # the request it held is reported failed
    assert (out.request_id, out.outputs[0].finish_reason) == (rid, "error")
    with pytest.raises(EngineDeadError):
        llm.generate(["again"])
    llm.engine.shutdown()


def test_a_core_process_takes_the_environment_its_frontend_has_at_the_start(mp, monkeypatch):
    """Core processes are forks of one fork server, started with the environment of its
    first use: a variable set since (here OMP_NUM_THREADS, which the core's thread count
    follows) reaches the next core as it would reach a spawned one."""
    monkeypatch.setenv("OMP_NUM_THREADS", str(mp.engine.cpu_threads + 1))
    llm = LLM("tiny_llama", engine_client="mp", **KNOBS)
    try:
        assert llm.engine.cpu_threads == mp.engine.cpu_threads + 1
    finally:
        llm.engine.shutdown()


def test_an_idle_client_is_not_taken_for_a_hung_core(mp, inproc):
    """The synchronous client reads nothing between calls: silence is judged only while a call
    waits, after the heartbeats queued meanwhile were read (a check in add_request would have
    declared this core dead)."""
    core = mp.engine.core
    timeout, core.timeout_s = core.timeout_s, 3.0  # the core beats every second (default 30 s)
    try:
        time.sleep(4)
        sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        assert _same(mp.generate(PROMPTS, sp), inproc.generate(PROMPTS, sp))
        assert core.dead is None
    finally:
        core.timeout_s = timeout


def test_engine_client_is_a_checked_knob():
    with pytest.raises(ValueError, match="engine_client"):
        LLM("tiny_llama", engine_client="threads", **KNOBS)


def test_status_utility_reports_requests_and_blocks(mp, inproc):
    """call_utility("status") crosses to the core process; step results that arrive while it
    waits are kept for step()."""
    engine = mp.engine
    rid = engine.add_request([3, 4, 5, 6, 7], SamplingParams(max_tokens=30, ignore_eos=True))
    engine.step()
    busy = engine.core_status()
    assert busy.num_requests == 1 and busy.num_used_blocks >= 2
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert len([o for o in outs if o.request_id == rid][-1].outputs[0].token_ids) == 30
    assert engine.core_status() == inproc.engine.core_status()  # idle: nothing held
    assert engine.core_status().num_used_blocks == 0
    with pytest.raises(ValueError, match="status"):
        engine.core.call_utility("shutdown")


def test_counts_beyond_64_bits_cross_to_the_core(mp, inproc):
    """top_k / max_tokens / min_tokens past what the model can use are capped where a request
    enters (no output changes), so msgpack can carry them to the core process (before: an
    OverflowError while sending, after the frontend had registered the request)."""
    sp = SamplingParams(temperature=0.5, seed=1, top_k=10**30, max_tokens=10**30,
                        min_tokens=10**25, ignore_eos=True)
    out = mp.generate(["Hello"], sp)
    assert _same(out, inproc.generate(["Hello"], sp))
    assert out[0].outputs[0].finish_reason == "length"
    assert mp.engine.core_status().num_requests == 0


FRONTEND = """
import time
from lab import LLM
if __name__ == "__main__":
    llm = LLM("tiny_llama", engine_client="mp", attention="torch", num_gpu_blocks=16,
              block_size=4, max_model_len=32)
    print(llm.engine.core.proc.pid, flush=True)
    time.sleep(120)
"""


def test_a_killed_frontend_leaves_no_core_process(tmp_path, short_tmp):
    """SIGKILL the frontend (no atexit, no shutdown): its core process ends within seconds
    instead of waiting forever on a socket nobody writes (before: orphans, parent pid 1), and
    removes the IPC directory the frontend made for their sockets (before: one left in the
    temporary directory per killed frontend)."""
    import signal

    tmp = short_tmp  # its TMPDIR
    front = start_script(tmp_path / "frontend.py", FRONTEND, tmpdir=tmp)
    try:
        core_pid = int(front.stdout.readline())
        assert len(list(tmp.glob("lab-core-*"))) == 1
        helpers = children_of(front.pid)  # multiprocessing's fork server and resource tracker
        os.kill(front.pid, signal.SIGKILL)
        front.wait(WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and any(map(_alive, [core_pid, *helpers])):
            time.sleep(0.05)
        assert not _alive(core_pid)
        assert not any(map(_alive, helpers))
        assert list(tmp.glob("lab-core-*")) == []
    finally:
        front.kill()


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: it only waits for its parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_cpu_threads_default_takes_the_free_cores_and_leaves_one_to_a_server():
    """Unset cpu_threads: the cores free of other work (cores minus those other processes keep
    busy now; the environment's OMP_NUM_THREADS instead when set), one fewer in an async_mp
    core (a server frontend works while it steps); the knob wins over both; what was set is
    returned."""
    import torch

    from lab.engine.builder import set_cpu_threads
    from lab.platform import auto_cpu_threads

    assert auto_cpu_threads(cores=2, busy=0.3, env={}) == 2
    assert auto_cpu_threads(cores=2, busy=0.8, env={}) == 1  # another process holds a core
    assert auto_cpu_threads(cores=2, busy=6.0, env={}) == 1  # never 0
    assert auto_cpu_threads(cores=8, busy=0.0, env={}) == 8
    assert auto_cpu_threads(reserve=1, cores=8, busy=2.0, env={}) == 5
    assert auto_cpu_threads(cores=8, busy=7.0, env={"OMP_NUM_THREADS": "3"}) == 3
    assert auto_cpu_threads(reserve=1, cores=2, busy=0.0, env={"OMP_NUM_THREADS": "1"}) == 1
    default = torch.get_num_threads()
    try:
        # the suite sets OMP_NUM_THREADS (tests/conftest.py): it decides
        assert set_cpu_threads(None, "inproc") == auto_cpu_threads() == torch.get_num_threads()
        assert set_cpu_threads(None, "async_mp") == auto_cpu_threads(reserve=1)
        assert set_cpu_threads(1, "mp") == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(default)




def test_busy_cores_sees_another_process_spin_and_not_its_own_past():
    """busy_cores samples the present: a spinning child shows as about one busy core; this
    process's own work in the window does not count."""
    import multiprocessing

    from lab.platform import busy_cores

    spinner = multiprocessing.get_context("spawn").Process(target=_spin, daemon=True)
    spinner.start()
    try:
        time.sleep(0.5)  # the child is up and spinning
        assert busy_cores(0.5) > 0.6
    finally:
        spinner.terminate()
        spinner.join()


def test_busy_cores_takes_the_quietest_part_of_its_window(monkeypatch):
    """A moment's work beside the start (one part of the window: a git commit took a core for
    0.1 s) does not count; work through the whole window does (each part sees it). Before, one
    0.2 s sample counted the moment and a run kept 1 thread of 2 throughout."""
    from lab import platform

    hz = os.sysconf("SC_CLK_TCK")
    clock = iter(range(100))
    monkeypatch.setattr(platform.time, "monotonic", lambda: next(clock) * 0.1)
    monkeypatch.setattr(platform.time, "sleep", lambda s: None)
    monkeypatch.setattr(platform, "_own_ticks", lambda: 0)

    def machine(per_part: list[float]):  # busy cores in each 0.1 s part -> tick counters
        ticks = itertools.accumulate([0, *(round(c * hz * 0.1) for c in per_part)])
        monkeypatch.setattr(platform, "_machine_busy_ticks", lambda: next(ticks))

    machine([1.0, 0.0, 0.0])  # a moment at the start
    assert platform.busy_cores(0.3, 3) == 0.0
    machine([1.0, 1.0, 1.0])  # a process holding a core throughout
    assert platform.busy_cores(0.3, 3) == pytest.approx(1.0)


def _spin() -> None:
    while True:
        pass


def test_closing_the_client_context_closes_a_socket_it_never_kept(tmp_path):
    """A SIGTERM while the core starts can interrupt the client between making a socket and
    keeping it; closing the context must not then wait on that socket forever (it did: the
    server hung in zmq_ctx_term after the signal)."""
    import threading

    import zmq

    from lab.engine.client import close_context

    ctx = zmq.Context()
    orphan = ctx.socket(zmq.PUSH)  # made, bound, never closed
    orphan.bind(f"ipc://{tmp_path}/orphan")
    done = threading.Event()
    threading.Thread(target=lambda: (close_context(ctx), done.set()), daemon=True).start()
    assert done.wait(WAIT_S), "closing the context waited on the orphan socket"
    assert orphan.closed


def test_a_core_s_failed_start_keeps_a_refused_setting_s_type():
    """A core process's start error in its frontend: a refused setting keeps its type with the
    core's message first (run.py and lab serve print that line), anything else is a
    RuntimeError naming the core's exception; the core's traceback follows either way."""
    refused = start_error("FileNotFoundError", "model path '/x' is not a directory", "TB")
    assert type(refused) is FileNotFoundError
    assert str(refused).splitlines()[0] == "model path '/x' is not a directory"
    assert str(refused).endswith("TB")
    crash = start_error("ZeroDivisionError", "division by zero", "TB")
    assert type(crash) is RuntimeError
    assert str(crash).startswith("the engine core could not start: ZeroDivisionError: division")
