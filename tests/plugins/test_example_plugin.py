"""The example plug-in (examples/plugin, a package of its own, installed by scripts/test.sh) works
from outside the repository through run.py and LLM(...), with no edit to lab: its scheduling
policy with token caps, its KV-aware victim rule, its eviction policy, its logits processor
reading extra_args, its step-time model, its model preset and its knob."""

from __future__ import annotations

import json

import pytest

from lab import LLM, SamplingParams
from lab.config.listing import main as list_knobs
from lab.config.plugins import group_options, installed_plugins
from lab.config.validate import check_command_line
from tests.kv import SMALL_KV
from tests.procs import run_python
from tests.waits import WAIT_S

INSTALLED = any(p.name == "example" for p in installed_plugins())
pytestmark = pytest.mark.skipif(not INSTALLED, reason="the example plug-in is not installed: "
                                "pip install -e examples/plugin (scripts/test.sh does)")

DEFAULT_PROCESSORS = ["allowed_token_ids", "bad_words", "min_tokens", "logit_bias", "penalties"]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [[3 + (7 * i + j) % 500 for j in range(40 + 9 * i)] for i in range(6)]


def test_its_options_presets_and_knob_join_lab_s(capsys):
    assert {"las", "frees_most"} <= set(group_options("scheduler"))
    assert "mru" in group_options("cache/eviction")
    assert "banned_tokens" in group_options("logits_processors")
    assert "linear" in group_options("sim/step_time")
    assert "wide_llama" in group_options("model")
    assert check_command_line(["background_chunk_tokens=3"]) is None
    list_knobs([])
    assert "background_chunk_tokens = 64" in capsys.readouterr().out


RUNS = {  # every option the plug-in adds, through `lab run`
    "real": ["scheduler=las", "background_chunk_tokens=16", "cache/eviction=mru",
             "model=wide_llama", f"logits_processors=[{','.join(DEFAULT_PROCESSORS)},banned_tokens]",
             "workload.num_requests=8", "num_gpu_blocks=40"],
    "sim": ["executor=sim", "sim/step_time=linear", "scheduler=frees_most", "num_gpu_blocks=24",
            "workload.num_requests=16"],
}


@pytest.mark.parametrize("run", RUNS)
def test_lab_run_runs_every_option_from_outside_the_repo(tmp_path, run):
    """`lab run` (run.py's job, as an installed lab has it) in a directory outside the
    repository: the plug-in is found through its entry point alone."""
    cmd = ["-m", "lab.cli", "run", *RUNS[run], "logger=[jsonl]",
           "hydra.run.dir=run"]
    proc = run_python(cmd, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "run"
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    policy = next(a.split("=")[1] for a in RUNS[run] if a.startswith("scheduler="))
    assert {s["queue_policy"] for s in steps} == {policy}
    config = (run_dir / "config.yaml").read_text()
    assert CONFIG_SAYS[run] in config


CONFIG_SAYS = {"real": "background_chunk_tokens: 16", "sim": "LinearStepTime"}


def test_its_knob_is_refused_outside_its_rule():
    with pytest.raises(ValueError, match="background_chunk_tokens=0 is invalid: must be an "
                                         "integer >= 1"):
        LLM("tiny_llama", background_chunk_tokens=0)


@pytest.fixture(scope="module")
def fcfs_ids():
    llm = LLM("tiny_llama", num_gpu_blocks=16, max_num_seqs=4)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


def test_its_victim_rule_preempts_and_keeps_the_ids(fcfs_ids):
    llm = LLM("tiny_llama", scheduler="frees_most", num_gpu_blocks=12, max_num_seqs=4)
    ids = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    steps = list(llm.engine.recent_steps)
    assert ids == fcfs_ids
    assert sum(s.num_preempted for s in steps) > 0
    assert {s.queue_policy for s in steps} == {"frees_most"}


def test_its_policy_caps_a_background_request_s_tokens_per_step(fcfs_ids):
    """Priority 1 is background: its 40-token prompt is prefilled 8 tokens a step."""
    llm = LLM("tiny_llama", scheduler="las", background_chunk_tokens=8, num_gpu_blocks=16,
              max_num_seqs=4)
    outs = llm.generate(PROMPTS, GREEDY, priority=[1, 0, 0, 0, 0, 0])
    assert [o.outputs[0].token_ids for o in outs] == fcfs_ids
    rid = outs[0].request_id
    served = [s for s in llm.engine.recent_steps if rid in s.scheduled_req_ids]
    assert len(served) >= 40 // 8 + GREEDY.max_tokens - 1


def test_its_eviction_policy_keeps_the_ids(fcfs_ids):
    llm = LLM("tiny_llama", num_gpu_blocks=16, max_num_seqs=4, **{"cache/eviction": "mru"})
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == fcfs_ids


@pytest.mark.parametrize("engine_client", ["inproc", "mp"])
def test_its_processor_bans_the_tokens_a_request_names_in_extra_args(engine_client):
    llm = LLM("tiny_llama", engine_client=engine_client,
              logits_processors=[*DEFAULT_PROCESSORS, "banned_tokens"], **SMALL_KV)
    try:
        free = llm.generate([PROMPTS[0]], GREEDY)[0].outputs[0].token_ids
        banned = sorted(set(free))[:3]
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                extra_args={"banned_token_ids": banned})
        out = llm.generate([PROMPTS[0], PROMPTS[1]], [params, GREEDY])
    finally:
        llm.engine.shutdown()
    assert not set(out[0].outputs[0].token_ids) & set(banned)
    assert out[1].outputs[0].token_ids == LLM("tiny_llama", **SMALL_KV).generate(
        [PROMPTS[1]], GREEDY)[0].outputs[0].token_ids  # a row without extra_args: untouched


def test_its_processor_reads_vllm_xargs_through_the_server():
    """lab serve's `vllm_xargs` (vLLM's field) reach the processor as extra_args: the served
    text is the one LLM.generate gives with those extra_args, not the unbanned one."""
    import httpx

    from lab.engine.async_llm import AsyncLLM
    from lab.serve.api_server import build_app
    from tests.serve.uvicorn_thread import serving

    llm = LLM("tiny_llama", logits_processors=[*DEFAULT_PROCESSORS, "banned_tokens"], **SMALL_KV)
    free = llm.generate([PROMPTS[0]], GREEDY)[0].outputs[0]
    banned = sorted(set(free.token_ids))[:3]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                            extra_args={"banned_token_ids": banned})
    expected = llm.generate([PROMPTS[0]], params)[0].outputs[0].text
    a = AsyncLLM(llm.engine)
    try:
        with serving(build_app(a, "tiny_llama")) as url:
            r = httpx.post(url + "/v1/completions", timeout=WAIT_S, json={
                "prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                "vllm_xargs": {"banned_token_ids": banned}})
            bad = httpx.post(url + "/v1/completions", timeout=WAIT_S, json={
                "prompt": PROMPTS[0], "max_tokens": 1, "vllm_xargs": {"x": {"nested": 1}}})
    finally:
        a.shutdown()
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == expected != free.text
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "vllm_xargs"


def test_its_preset_and_step_time_model_drive_the_simulator():
    llm = LLM("wide_llama", executor="sim", **{"sim/step_time": "linear"})
    llm.generate([PROMPTS[0]], SamplingParams(max_tokens=1))
    first = llm.engine.recent_steps[0]
    assert first.time == pytest.approx(0.002 + 1e-5 * len(PROMPTS[0]))
