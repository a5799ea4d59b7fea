"""`lab` CLI: serve composes the config like run.py/LLM (no loggers by default); bad commands
exit with a usage line."""

import pytest

from lab.cli import main, serve_config


def test_serve_config_defaults_to_no_logger():
    cfg = serve_config(["model=tiny_llama", "attention=torch", "block_size=4"])
    assert cfg.model.name == "tiny_llama" and cfg.block_size == 4
    assert not cfg.get("logger")
    assert list(serve_config(["logger=[prometheus]"]).logger) == ["prometheus"]


@pytest.mark.parametrize("argv", [[], ["nope"], ["bench"], ["bench", "nope"]])
def test_bad_commands_exit(argv):
    with pytest.raises(SystemExit):
        main(argv)


def test_serve_refuses_unknown_knob():
    with pytest.raises(SystemExit, match="unknown setting"):
        main(["serve", "bogus_knob=1"])
