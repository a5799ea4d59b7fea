"""The `lab` command.

    lab serve [HYDRA OVERRIDES...] [--host 127.0.0.1] [--port 8000] [--served-model-name NAME]
    lab run [run.py arguments...]              # python run.py ...
    lab bench serve|throughput|overhead|kernels [arguments...]   # python -m lab.bench.<name>

`lab serve` composes the engine config exactly as run.py and LLM do (compose_config with the
overrides; no loggers unless `logger=...` is given) and serves it with uvicorn
(lab/serve/api_server.py).
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

BENCHES = ("serve", "throughput", "overhead", "kernels")
ROOT = Path(__file__).resolve().parents[1]


def serve_config(overrides: list[str]):
    from lab.engine.config import compose_config, without_loggers_unless_given

    return compose_config(without_loggers_unless_given(overrides))


def serve(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="lab serve", description="OpenAI-compatible server")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=tiny_llama")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    import uvicorn
    from omegaconf import OmegaConf

    from lab.engine.async_llm import AsyncLLM
    from lab.engine.knobs import check_command_line
    from lab.metrics.prometheus import model_name_of
    from lab.serve.api_server import build_app

    refusal = check_command_line(args.overrides)
    if refusal is not None:
        sys.exit(f"lab serve: {refusal}")
    cfg = serve_config(args.overrides)
    name = args.served_model_name or model_name_of(OmegaConf.to_container(cfg))
    async_llm = AsyncLLM.from_config(cfg)
    try:
        uvicorn.run(build_app(async_llm, name), host=args.host, port=args.port,
                    log_level=args.log_level)
    finally:
        async_llm.shutdown()


def run(argv: list[str]) -> None:
    """python run.py ARGS (Hydra parses sys.argv)."""
    sys.argv = [str(ROOT / "run.py"), *argv]
    runpy.run_path(str(ROOT / "run.py"), run_name="__main__")


def bench(argv: list[str]) -> None:
    if not argv or argv[0] not in BENCHES:
        sys.exit(f"lab bench: name one of {', '.join(BENCHES)}")
    name, rest = argv[0], argv[1:]
    sys.argv = [f"lab.bench.{name}", *rest]
    runpy.run_module(f"lab.bench.{name}", run_name="__main__", alter_sys=True)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"serve": serve, "run": run, "bench": bench}
    if not argv or argv[0] not in commands:
        sys.exit("usage: lab {serve,run,bench} ...  (lab serve --help)")
    commands[argv[0]](argv[1:])


if __name__ == "__main__":
    main()
