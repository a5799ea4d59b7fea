"""`lab` CLI: serve composes the config like run.py/LLM (no loggers by default); bad commands
exit with a usage line."""

import re
import sys

import pytest
import torch

from lab.cli import main, serve_config
from lab.run import main as run_main


def test_serve_config_defaults_to_no_logger():
    cfg = serve_config(["model=tiny_llama", "attention=torch", "block_size=4"])
    assert cfg.model.name == "tiny_llama" and cfg.block_size == 4
    assert not cfg.get("logger")
    assert list(serve_config(["logger=[prometheus]"]).logger) == ["prometheus"]


@pytest.mark.parametrize("argv", [[], ["nope"], ["bench"], ["bench", "nope"]])
def test_bad_commands_exit(argv):
    with pytest.raises(SystemExit):
        main(argv)


def test_serve_refuses_unknown_knob(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "bogus_knob=1"])
    assert exit_.value.code == 2 and "lab serve: unknown setting" in capsys.readouterr().err


@pytest.mark.parametrize("setting, said", [
    ("model.path=MISSING", "model path '.*missing' is not a directory"),
    ("model=hf", "Missing mandatory value: model.path"),
    ("attention=triton_flash", "attention=triton_flash with dtype=bfloat16 needs CUDA")])
def test_serve_reports_a_setting_the_engine_refuses_in_one_line(setting, said, tmp_path,
                                                                 capsys, monkeypatch):
    """What the engine refuses while it starts (the model's path, missing or not a directory; a
    backend's dtype) is one line and exit code 2, as run.py reports it (before: a traceback and
    exit code 1)."""
    if setting.startswith("attention") and torch.cuda.is_available():
        pytest.skip("bf16 in Triton's interpreter is refused without CUDA only")
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    argv = ["serve", "model=hf", setting.replace("MISSING", str(tmp_path / "missing"))]
    if setting == "model=hf":  # issue 35's example: no model.path at all
        argv = ["serve", "model=hf"]
    if setting.startswith("attention"):
        argv = ["serve", "model=tiny_llama", setting, "dtype=bfloat16"]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    assert len(err) == 1 and re.fullmatch(
        f"lab serve: {said}.* \\(HYDRA_FULL_ERROR=1 shows the traceback\\)", err[0]), err


@pytest.mark.parametrize("option, field", [
    (["--max-body-bytes", "0"], "max_body_bytes"), (["--max-n", "20000"], "max_n"),
    (["--max-concurrent-requests", "-1"], "max_concurrent_requests"),
    (["--api-key", ""], None)])
def test_serve_refuses_bad_limits_before_starting_an_engine(option, field, monkeypatch):
    monkeypatch.setenv("LAB_API_KEY", "")
    if field is None:  # an empty key is no key: the server is open, nothing to refuse
        from lab.cli import serve_parser, server_limits
        assert server_limits(serve_parser().parse_args(option)).api_key is None
        return
    with pytest.raises(SystemExit, match=field):
        main(["serve", "model=tiny_llama", *option])


def test_serve_runs_the_core_in_its_own_process_unless_told():
    assert serve_config(["model=tiny_llama"]).engine_client == "async_mp"
    assert serve_config(["engine_client=inproc"]).engine_client == "inproc"
    assert serve_config(["executor=sim"]).engine_client == "inproc"  # its clock is in-process


def test_serve_loggers_record_the_live_steps(tmp_path):
    """`lab serve logger=[jsonl]`: the steps of a core in its own process reach the frontend's
    loggers (they travel with the outputs) and land in the run directory."""
    import asyncio
    import json

    from lab.cli import close_loggers, serve_banner, serve_config_and_choices, start_loggers
    from lab.core.sampling_params import SamplingParams
    from lab.engine.async_llm import AsyncLLM

    cfg, choices = serve_config_and_choices(["model=tiny_llama", "attention=torch",
                                             "num_gpu_blocks=32", "logger=[jsonl]"])
    loggers = start_loggers(cfg, choices, tmp_path)
    a = AsyncLLM.from_config(cfg, loggers)

    async def main():
        sp = SamplingParams(max_tokens=5, ignore_eos=True)
        return [o for p in ("Hi", "Yo") for o in [x async for x in a.generate(p, sp)]]

    try:
        asyncio.run(main())
    finally:
        a.shutdown()
        close_loggers(loggers, a.engine, 1.0)
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert sum(s["num_generated_tokens"] for s in steps) == 10
    assert len((tmp_path / "requests.jsonl").read_text().splitlines()) == 2
    assert "choices:" in (tmp_path / "config.yaml").read_text()
    banner = serve_banner(a.engine, "tiny_llama", "127.0.0.1", 8000)  # printed at start
    assert banner.startswith("lab serve: tiny_llama: tiny_llama float32 cpu, attention torch")
    assert "31 blocks x" in banner and "max_model_len" in banner and "threads " in banner
    assert banner.endswith("http://127.0.0.1:8000/v1")
    summary = json.loads((tmp_path / "summary.json").read_text())  # it said 0 MiB, 0 blocks
    assert summary["weight_bytes"] > 0 and summary["num_kv_blocks"] == 31
    assert summary["kv_block_size"] > 0 and summary["kv_bytes_per_token"] > 0


def test_help_exits_0_and_a_missing_command_exits_2(capsys):
    """`lab --help` printed one line to stderr and exited 1; `lab bench serve --help` said
    `usage: serve.py`."""
    for argv, code in ((["--help"], 0), ([], 2), (["nope"], 2), (["bench", "--help"], 0),
                       (["bench", "nope"], 2), (["bench", "serve", "--help"], 0)):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == code, argv
    out = capsys.readouterr().out
    assert "lab serve [HYDRA OVERRIDES...]" in out and "names: " in out
    assert "usage: lab bench serve" in out and "--vocab-size" in out


def test_run_help_describes_the_groups_and_every_knob(capsys, monkeypatch):
    """`python run.py --help` / `lab run --help` printed Hydra's generic dump, no knob
    described."""
    from lab.config.plugins import declared_knobs

    for argv in (["lab run", "--help"], ["run.py", "-h"]):
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as exit_:
            run_main()
        assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.count("config groups (GROUP=OPTION):") == 2 and "usage: lab run" in out
    assert "  scheduler          fair, fcfs" in out
    assert all(f"{k.name} = " in out for k in declared_knobs())
