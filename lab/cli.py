"""The `lab` command.

    lab serve [HYDRA OVERRIDES...] [--host 127.0.0.1] [--port 8000] [--served-model-name NAME]
              [--run-dir DIR]            # logger=[console,jsonl,wandb] record the live steps
              [--api-key KEY] [--max-body-bytes N] [--max-concurrent-requests N] [--max-n N]
              [--shutdown-timeout S] [--keep-alive-on-engine-death]   # README "Serving"
    lab run [run.py arguments...]              # python run.py ...
    lab knobs [--markdown]                     # every knob: default, allowed values, help
    lab bench NAME [args...]                   # python -m lab.bench.NAME (lab.bench.names())

`lab serve` composes the engine config exactly as run.py and LLM do (compose_config with the
overrides; no loggers unless `logger=...` is given), runs the engine core in its own process
(engine_client=async_mp unless an override says otherwise), warms it up before it accepts a
request (the `warmup` knob, lab/engine/warmup.py) and serves it with uvicorn
(lab/serve/api_server.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import signal
import sys
import time
from pathlib import Path


def serve_config(overrides: list[str]):
    """run.py's config with these overrides; the engine core in its own process
    (engine_client=async_mp, as vLLM serves) unless the overrides choose a client, or
    executor=sim (its virtual clock needs the core in this process)."""
    return serve_config_and_choices(overrides)[0]


def serve_config_and_choices(overrides: list[str]):
    from lab.config.compose import compose_with_choices, without_loggers_unless_given

    cfg, choices = compose_with_choices(without_loggers_unless_given(overrides))
    chosen = any(o.lstrip("+~").startswith("engine_client=") for o in overrides)
    if not chosen and not cfg.executor.get("_target_", "").endswith("sim.SimExecutor"):
        cfg.engine_client = "async_mp"
    return cfg, choices


def default_run_dir() -> Path:
    """Where `lab serve logger=[...]` writes, like run.py's Hydra layout: outputs/serve/DAY/TIME."""
    return Path("outputs") / "serve" / time.strftime("%Y-%m-%d") / time.strftime("%H-%M-%S")


def start_loggers(cfg, choices: dict[str, str], run_dir: Path) -> list:
    """The config's loggers, started on `run_dir` (which gets the run's config.yaml, as a
    run.py run directory does); none when the config has none."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from lab.config.compose import run_config_yaml

    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values()]
    if loggers:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(run_config_yaml(cfg, choices))
        for logger in loggers:
            logger.on_start(run_dir, OmegaConf.to_container(cfg, resolve=True))
    return loggers


def close_loggers(loggers: list, engine, wall_time: float, warmup=None) -> None:
    """Close the loggers with a summary of the engine's recent window (the last
    `stats_window` steps and requests: a server keeps no unbounded history; the loggers
    themselves recorded every step), and the warm-up's seconds and steps (`warmup`)."""
    from lab.engine.replay import record_engine
    from lab.metrics.stats import summarize

    summary = summarize(list(engine.recent_steps), list(engine.recent_requests), wall_time)
    record_engine(summary, engine)
    if warmup is not None:
        summary.warmup_seconds, summary.warmup_steps = warmup.seconds, warmup.num_steps
    for logger in loggers:
        logger.close(summary)


def serve_parser() -> argparse.ArgumentParser:
    from lab.serve.limits import ServerLimits

    default = ServerLimits()
    parser = argparse.ArgumentParser(prog="lab serve", description="OpenAI-compatible server")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=tiny_llama")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--run-dir", default=None, type=Path,
                        help="where logger=[...] writes (default outputs/serve/DAY/TIME)")
    parser.add_argument("--api-key", default=None,
                        help="/v1/* need 'Authorization: Bearer KEY' (default: $LAB_API_KEY; "
                             "none: open)")
    parser.add_argument("--max-body-bytes", type=int, default=default.max_body_bytes,
                        help="refuse larger request bodies with 413 before parsing them")
    parser.add_argument("--max-concurrent-requests", type=int,
                        default=default.max_concurrent_requests,
                        help="refuse completions beyond this many in flight with 429 "
                             "(default: no limit)")
    parser.add_argument("--max-n", type=int, default=default.max_n,
                        help="the most completions one request may ask for (n)")
    parser.add_argument("--shutdown-timeout", type=float, default=5.0,
                        help="on SIGTERM / Ctrl-C, seconds requests in flight get to finish "
                             "before they are aborted")
    parser.add_argument("--keep-alive-on-engine-death", action="store_true",
                        help="keep serving (503 to every request) after the engine died, "
                             "instead of exiting non-zero")
    return parser


def serve(argv: list[str]) -> None:
    args = serve_parser().parse_intermixed_args(argv)  # overrides before or after the options
    import uvicorn
    from omegaconf import OmegaConf

    from lab.config.validate import (
        SETTING_ERRORS,
        check_command_line,
        refuse,
        refuse_setting_error,
    )
    from lab.engine.async_llm import AsyncLLM
    from lab.engine.llm_engine import LLMEngine
    from lab.engine.warmup import warm_up_new_engine
    from lab.metrics.prometheus import model_name_of
    from lab.serve.api_server import build_app

    refusal = check_command_line(args.overrides)
    if refusal is not None:
        refuse("lab serve", refusal)
    try:
        limits = server_limits(args)
    except ValueError as e:
        sys.exit(f"lab serve: {e}")
    signal.signal(signal.SIGTERM, _interrupt)  # while starting: as Ctrl-C (cleans up)
    start = time.monotonic()
    try:
        cfg, choices = serve_config_and_choices(args.overrides)
        name = args.served_model_name or model_name_of(OmegaConf.to_container(cfg))
        loggers = start_loggers(cfg, choices, args.run_dir or default_run_dir())
        engine = LLMEngine(cfg, loggers)
        warmup = warm_up_new_engine(engine)  # before any request: clients pay no first calls
        async_llm = AsyncLLM(engine)
    except KeyboardInterrupt as e:  # Ctrl-C / SIGTERM while loading: the core was cleaned up
        sys.exit(f"lab serve: stopped while the engine was starting ({e or 'SIGINT'})")
    except SETTING_ERRORS as e:  # as run.py reports them: one line, exit code 2
        refuse_setting_error("lab serve", e)
    died: list[str] = []

    def on_engine_death(reason: str) -> None:
        died.append(reason)
        server.should_exit = True

    print(serve_banner(engine, name, args.host, args.port), file=sys.stderr, flush=True)
    app = build_app(async_llm, name, limits,
                    None if args.keep_alive_on_engine_death else on_engine_death)
    server = uvicorn.Server(uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level,
        timeout_graceful_shutdown=args.shutdown_timeout))
    with stop_signals_end_the_server():
        try:
            server.run()
        finally:
            async_llm.shutdown()
            close_loggers(loggers, async_llm.engine, time.monotonic() - start, warmup)
    if died:
        sys.exit(f"lab serve: exiting because the engine died: {died[0]}")


def serve_banner(engine, name: str, host: str, port: int) -> str:
    """What `lab serve` serves, printed once the engine is ready: the served name, what runs
    (the run summary's setup: model, dtype, device, components, the core's threads, commit),
    the KV cache, max_model_len and the URL."""
    from lab.engine.replay import run_setup
    from lab.metrics.console import setup_text

    tokens = (engine.num_blocks - 1) * engine.cfg.block_size
    return (f"lab serve: {name}: {setup_text(run_setup(engine))}; KV cache "
            f"{engine.num_blocks - 1} blocks x {engine.cfg.block_size} tokens ({tokens} tokens), "
            f"max_model_len {engine.max_model_len}; http://{host}:{port}/v1")


def server_limits(args: argparse.Namespace):
    """The ServerLimits of `lab serve`'s options (the key from $LAB_API_KEY when not given)."""

    from lab.serve.limits import ServerLimits

    return ServerLimits(api_key=args.api_key or os.environ.get("LAB_API_KEY") or None,
                        max_body_bytes=args.max_body_bytes,
                        max_concurrent_requests=args.max_concurrent_requests,
                        max_n=args.max_n)


def _interrupt(signum: int, _frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def stop_signals_end_the_server():
    """SIGTERM and SIGINT shut the server down gracefully (uvicorn's handlers), then cleanup
    runs: requests aborted, the core process stopped, its IPC directory removed, the loggers'
    summary written. uvicorn raises the signal again once it stopped; this handler takes it,
    so the process exits normally after the cleanup instead of dying of the signal halfway."""
    taken = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in taken.items():
            signal.signal(sig, handler)


def run(argv: list[str]) -> None:
    """python run.py ARGS (Hydra parses sys.argv)."""
    from lab.run import main as run_main

    sys.argv = ["lab run", *argv]
    run_main()


def bench(argv: list[str]) -> None:
    """lab bench NAME ARGS: `python -m lab.bench.NAME ARGS`; `lab bench --help` lists the names
    (exit 0), an unknown or missing name exits 2 with them."""
    from lab.bench import names

    if argv[:1] in (["-h"], ["--help"]):
        print(f"usage: lab bench NAME [ARGS...]  (lab bench NAME --help)\n"
              f"names: {', '.join(names())}")
        sys.exit(0)
    if not argv or argv[0] not in names():
        print(f"lab bench: name one of {', '.join(names())}", file=sys.stderr)
        sys.exit(2)
    name, rest = argv[0], argv[1:]
    sys.argv = [f"lab.bench.{name}", *rest]
    runpy.run_module(f"lab.bench.{name}", run_name="__main__", alter_sys=True)


def knobs(argv: list[str]) -> None:
    """Every knob from its declaration (lab/config/listing.py)."""
    from lab.config.listing import main as listing_main

    listing_main(argv)


def main(argv: list[str] | None = None) -> None:
    """`lab --help` prints the commands (this module's docstring) and exits 0; no command or an
    unknown one exits 2 with the usage line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"serve": serve, "run": run, "bench": bench, "knobs": knobs}
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        sys.exit(0)
    if not argv or argv[0] not in commands:
        print("usage: lab {serve,run,bench,knobs} ...  (lab --help; lab serve --help)",
              file=sys.stderr)
        sys.exit(2)
    commands[argv[0]](argv[1:])


if __name__ == "__main__":
    main()
