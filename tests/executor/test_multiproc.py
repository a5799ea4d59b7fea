"""executor=multiproc at tensor_parallel_size=2 (two forkserver rank processes, gloo on the CPU).

Parity: per model one TP=2 engine runs the parity workload (tests/executor/tp_utils.py: chunked
prefill, prefix hits and preemption in one run) and its greedy ids must equal transformers' (and
so TP=1's, see the test). Quantized tiny_llama at TP=2 must equal its
TP=1 ids. Then the executor's seams: collective_rpc, engine_client=mp with multiproc ranks under
the core process, and failures — a rank that raises while rank 0 waits in a collective, a rank
SIGKILLed mid-run: a RankFailedError naming rank 1 within seconds, every process gone.

The TP=2 engines are kept for the module (`engines`), so the failure tests reuse two of them
instead of starting ranks of their own."""

from __future__ import annotations

import os
import signal
import time

import pytest

from lab import SamplingParams
from lab.executor.distributed import RankFailedError
from tests.engine.parity_utils import hf_greedy_outputs
from tests.executor import rank_fns
from tests.executor.tp_utils import (
    TP2,
    assert_parity,
    descendants,
    ids_by_prompt,
    kill_rank_1_mid_decode,
    lazy_engines,
    make_llm,
    parity_run,
    wait_gone,
)
from tests.kv import SMALL_KV
from tests.procs import start_script

# the default suite: tiny_llama and tiny_deepseek (MLA, MoE split over the ranks); every
# preset's TP=2 logits equal TP=1's in tests/models/test_tp_models.py, and the other engine runs
# here (tiny_gpt_oss: a hybrid KV cache and sinks on each rank) take -m slow
MODELS = ["tiny_llama", *(pytest.param(m, marks=pytest.mark.slow)
                          for m in ("tiny_qwen3", "tiny_qwen2", "tiny_llama_mqa")),
          "tiny_deepseek", pytest.param("tiny_gpt_oss", marks=pytest.mark.slow)]
MULTIPROC = TP2 | dict(executor="multiproc")


@pytest.fixture(scope="module")
def engines():
    """get(model) -> the module's TP=2 multiproc LLM of that model (built on first use)."""
    with lazy_engines(**MULTIPROC) as get:
        yield get


@pytest.mark.parametrize("model", MODELS)
def test_tp2_greedy_equals_tp1_and_transformers(engines, model):
    """TP=2's ids equal transformers'; TP=1 (uniproc) gives transformers' ids on these prompts
    with these knobs (tests/engine: the engine_client=mp parity runs use MP_KNOBS), so they
    equal TP=1's too; tiny_llama runs TP=1 here as well, to say so in one place."""
    tp2 = parity_run(engines(model))
    assert_parity(tp2, hf_greedy_outputs(model))
    if model == "tiny_llama":
        tp1 = make_llm(model)  # uniproc, the same knobs
        try:
            assert ids_by_prompt(parity_run(tp1)) == ids_by_prompt(tp2)
        finally:
            tp1.engine.shutdown()


# int8 / fp8 quantize activations per token on the fly: a row-parallel layer (o_proj,
# down_proj) quantizes its rank's slice with the whole row's scale (lab/quant/base.py
# activation_amax), so its 8-bit values are TP=1's; without that, on these 10 prompts int8's ids
# differed on 6 and fp8's on 9. w4a16 keeps activations unquantized (its grouped weight scales
# are split with the weight). fp8 quantizes activations as int8 does: -m slow.
@pytest.mark.parametrize("method", ["int8", pytest.param("fp8", marks=pytest.mark.slow), "w4a16"])
def test_quantized_tp2_equals_tp1(method):
    knobs = dict(quant=method) | ({"quant.group_size": 32} if method == "w4a16" else {})
    runs = {}
    for tp, extra in ((1, {}), (2, MULTIPROC)):
        llm = make_llm("tiny_llama", **(knobs | extra))
        try:
            runs[tp] = ids_by_prompt(parity_run(llm, ("default",)))
        finally:
            llm.engine.shutdown()
    assert runs[2] == runs[1]


def test_collective_rpc_reaches_every_rank(engines):
    executor = engines("tiny_llama").engine.executor
    ranks = executor.collective_rpc(rank_fns.rank_and_pid)
    assert [r for r, _ in ranks] == [0, 1]
    assert [pid for _, pid in ranks] == executor.pids
    tp1 = make_llm("tiny_llama", num_gpu_blocks=None)
    try:
        info_tp1 = tp1.engine.executor.collective_rpc("model_info")
    finally:
        tp1.engine.shutdown()
    infos = executor.collective_rpc("model_info")
    assert len(infos) == 2 and infos[0].bytes_per_block == infos[1].bytes_per_block
    # tiny_llama's KV heads are split: each rank caches half of them
    assert 2 * infos[0].bytes_per_block == info_tp1[0].bytes_per_block


def test_a_rank_that_raises_while_rank_0_waits_stops_the_group(engines):
    llm = engines("tiny_llama")
    pids = llm.engine.executor.pids
    t0 = time.monotonic()
    with pytest.raises(RankFailedError, match=r"rank 1 failed: ValueError: boom on rank 1"):
        llm.engine.executor.collective_rpc(rank_fns.raise_on_rank_1_while_rank_0_waits)
    assert time.monotonic() - t0 < 5
    assert wait_gone(pids) == []
    with pytest.raises(RankFailedError, match="rank 1"):  # every later call, at once
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))


def test_killed_rank_is_named_within_seconds_and_nothing_is_left(engines):
    llm = engines("tiny_deepseek")  # alive still (the test above stopped tiny_llama's ranks)
    kill_rank_1_mid_decode(llm, r"rank 1 \(pid {pid}\) died with exit code -9", within_s=5)
    llm.engine.step()  # the failed request's final output (finish reason error)
    assert not llm.engine.has_unfinished_requests()


def test_engine_client_mp_runs_multiproc_ranks_under_the_core_process():
    """The core process is daemonic (multiprocessing forbids it children): its ranks start all
    the same, give the parity ids, and end with the engine."""
    llm = make_llm("tiny_llama", engine_client="mp", **MULTIPROC)
    try:
        tree = descendants(llm.engine.core.proc.pid)
        assert len(tree) >= 2  # the two ranks (and the fork server they are forked from)
        assert_parity(parity_run(llm), hf_greedy_outputs("tiny_llama"))
    finally:
        llm.engine.shutdown()
    assert wait_gone([llm.engine.core.proc.pid, *tree]) == []


def test_uniproc_refuses_tensor_parallel():
    with pytest.raises(ValueError, match=r"UniprocExecutor.*use executor=multiproc .*, "
                       r"executor=ray .* or executor=sim"):
        make_llm("tiny_llama", tensor_parallel_size=2)


ENGINE_SCRIPT = """
import time
from lab import LLM

if __name__ == "__main__":
    llm = LLM("tiny_llama", executor="multiproc", tensor_parallel_size=2, device="cpu",
              **SMALL_KV)
    print(",".join(map(str, llm.engine.executor.pids)), flush=True)
    time.sleep(120)
""".replace("SMALL_KV", repr(SMALL_KV))


def test_a_killed_engine_process_leaves_no_rank(tmp_path, short_tmp):
    """SIGKILL the engine's process (no atexit, no shutdown): its ranks end within seconds
    (each watches the process that started it) instead of lingering as orphans, and remove the
    IPC directory the engine made for their sockets (before: left in the temporary directory)."""
    tmp = short_tmp  # its TMPDIR
    engine = start_script(tmp_path / "engine.py", ENGINE_SCRIPT, tmpdir=tmp)
    try:
        pids = [int(p) for p in engine.stdout.readline().split(",")]
        assert len(pids) == 2
        assert len(list(tmp.glob("lab-ranks-*"))) == 1
        os.kill(engine.pid, signal.SIGKILL)
        engine.wait(10)
        assert wait_gone(pids) == []
        assert list(tmp.glob("lab-ranks-*")) == []
    finally:
        engine.kill()
