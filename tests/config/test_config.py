"""Every option of every config group composes and instantiates; bad options list the choices."""

import functools
import os
import re

import pytest
import torch
from hydra.errors import ConfigCompositionException, InstantiationException
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from lab.config.compose import (
    CONF_DIR,
    GROUP_BASES,
    GROUPS,
    _compose_once,
    compose_config,
    set_knobs,
)
from lab.config.validate import validate_knobs
from lab.logits_processors.base import LogitsProcessor, LogitsProcessorContext
from lab.metrics.base import StatLogger
from tests.options import options
from tests.procs import run_python
from tests.waits import WAIT_S

LISTS = ("logger", "logits_processors")  # the multi-choice groups
SINGLE = [g for g in GROUPS if g not in LISTS]
OPTIONS = [(g, option) for g in SINGLE for option in options(g)]
EXTRA = {"model": {"hf": ["model.path=/nonexistent"]},
         "sim/step_time": {"profiled": ["sim.step_time.path=/nonexistent.json"]}}
PARTIAL_ARGS = {"cache": dict(num_blocks=8, max_model_len=64)}


@functools.cache
def composed_round(k: int) -> DictConfig:
    """One composition choosing the k-th option of every group that has one (and the others'
    defaults): each option is composed once, in ~17 compositions instead of ~70 (a Hydra
    composition costs ~0.2 CPU-s). Options of different groups compose independently; an
    option that picks another group's default (attention=triton_mla's model) yields to an
    explicit choice, as on the command line. The EXTRA options, set up to fail, are left out."""
    overrides = []
    for group in SINGLE:
        if k < len(options(group)) and options(group)[k] not in EXTRA.get(group, {}):
            overrides.append(f"{group}={options(group)[k]}")
    return compose_config(overrides)


def composed_with(group: str, option: str) -> DictConfig:
    """A composition that chose `option` for `group`: its round's, or its own for an EXTRA
    option (its settings fail on purpose, and executor=sim would build a failing step-time
    model with it)."""
    if option in EXTRA.get(group, {}):
        return compose_config([f"{group}={option}", *EXTRA[group][option]])
    return composed_round(options(group).index(option))


@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_every_option_instantiates(group, option):
    cfg = composed_with(group, option)
    node = OmegaConf.select(cfg, group.replace("/", "."))  # sim/step_time lives at sim.step_time
    assert "_target_" in node
    if group == "model" and option == "hf":
        with pytest.raises(FileNotFoundError, match="/nonexistent"):
            instantiate(node).path()
        return
    if group == "sim/step_time" and option == "profiled":
        with pytest.raises(InstantiationException, match="no such profile"):
            instantiate(node)
        return
    obj = instantiate(node)
    if group in PARTIAL_ARGS:
        obj = obj(**PARTIAL_ARGS[group])
    if (group, option) == ("attention", "auto"):  # the worker completes it (lab/attention/auto.py)
        obj = obj(device=torch.device("cpu"), mla=False)
    base = get_class(GROUP_BASES[group])
    # partials a worker completes: with its config; with the target model (a draft loads beside)
    if group in ("executor", "speculative"):
        assert issubclass(obj.func, base), f"{group}={option} -> {obj.func}"
        return
    assert isinstance(obj, base), f"{group}={option} -> {type(obj)} is not a {base.__name__}"


def test_loggers_compose_together():
    """logger is the one multi-choice group: every option at once composes and instantiates."""
    cfg = compose_config([f"logger=[{','.join(options('logger'))}]"])
    loggers = {name: instantiate(node) for name, node in cfg.logger.items()}
    assert sorted(loggers) == options("logger")
    for name, logger in loggers.items():
        assert isinstance(logger, StatLogger), name


def test_unknown_option_lists_choices():
    with pytest.raises(ConfigCompositionException) as e:
        compose_config(["attention=nope"])
    assert "torch" in str(e.value.__cause__ or e.value)


def test_unknown_option_on_the_command_line_prints_choices(tmp_path):
    proc = run_python(["run.py", "scheduler=nope", f"hydra.run.dir={tmp_path}"],
                      cwd=CONF_DIR.parents[1], timeout=WAIT_S)
    assert proc.returncode == 2  # one line, before Hydra (whose own error is its search path)
    assert "scheduler=nope is not an option of scheduler: " in proc.stderr
    assert "fcfs" in proc.stderr and "Traceback" not in proc.stderr


def test_unknown_knob_names_the_knobs():
    cfg = compose_config()
    with pytest.raises(ValueError, match="max_num_seqs"):
        set_knobs(cfg, {"max_num_sequences": 4})


def test_logits_processors_compose_together_in_the_listed_order():
    """logits_processors is a list too: every option composes, in the order given, and each is
    a partial the runner completes with a LogitsProcessorContext."""
    names = list(reversed(options("logits_processors")))
    cfg = compose_config([f"logits_processors=[{','.join(names)}]"])
    assert list(cfg.logits_processors) == names
    context = LogitsProcessorContext(vocab_size=32, max_num_reqs=4)
    for name, node in cfg.logits_processors.items():
        processor = instantiate(node)(context=context)
        assert isinstance(processor, LogitsProcessor), name


def _processor_option(directory, name: str, header: bool) -> None:
    (directory / "logits_processors").mkdir(parents=True, exist_ok=True)
    text = ("_target_: tests.sampling.example_processor.BanTokenForSeededRequests\n"
            "_partial_: true\ntoken: 5\n")
    if header:
        text = f"# @package logits_processors.{name}\n" + text
    (directory / "logits_processors" / f"{name}.yaml").write_text(text)


def test_a_list_group_option_from_lab_config_path_composes_beside_lab_s(tmp_path, monkeypatch):
    _processor_option(tmp_path, "ban5", header=True)
    monkeypatch.setenv("LAB_CONFIG_PATH", str(tmp_path))
    cfg = compose_config(["logits_processors=[penalties,ban5]"])
    assert list(cfg.logits_processors) == ["penalties", "ban5"]
    validate_knobs(cfg)


def test_a_list_group_option_without_its_package_header_is_refused_naming_it(tmp_path,
                                                                             monkeypatch):
    """Without the header Hydra merges the chosen options into one node (penalties vanished);
    the refusal names the file and the header to add."""
    _processor_option(tmp_path, "ban5", header=False)
    monkeypatch.setenv("LAB_CONFIG_PATH", str(tmp_path))
    cfg = compose_config(["logits_processors=[penalties,ban5]"])
    with pytest.raises(ValueError, match=r"ban5.yaml with `# @package logits_processors"):
        validate_knobs(cfg)


def test_llm_takes_a_config_path_of_options_and_presets(tmp_path):
    """LLM(config_path=[DIR]): options and model presets kept in a directory of one's own, for
    this engine only (the tiny preset is lab's tiny_llama under another name)."""
    from lab import LLM, SamplingParams

    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "my_fcfs.yaml").write_text(
        "_target_: lab.scheduler.queues.FCFSQueue\n")
    (tmp_path / "model").mkdir()
    preset = OmegaConf.load(CONF_DIR / "model" / "tiny_llama.yaml")
    (tmp_path / "model" / "my_tiny.yaml").write_text(OmegaConf.to_yaml(preset))
    llm = LLM("my_tiny", scheduler="my_fcfs", executor="sim", config_path=[tmp_path])
    out = llm.generate(["Hello"], SamplingParams(max_tokens=3))
    assert len(out[0].outputs[0].token_ids) == 3
    with pytest.raises(ValueError, match="neither a preset .*tiny_llama"):
        LLM("my_tiny", executor="sim")  # without the directory: not a preset


@pytest.mark.parametrize("settings", [
    ["seed=7", "block_size=4", "max_num_seqs=5"],
    ["max_model_len=${block_size}", "workload.num_requests=3", "sim.device=h100"],
    ["workload.prompt_len=[3,4]"],  # not a setting of this workload: Hydra's error
    ["model.nosuch=1"],             # nor of this model: Hydra's error
    ["seed=1,2"],                   # a sweep: Hydra's error
])
def test_settings_are_set_on_the_remembered_composition_of_the_group_choices(settings):
    """`key=value` settings (knobs, keys inside a knob block or an option's node) do not key the
    remembered composition: the same group choices with other settings cost a copy, and the
    config, or the error, is Hydra's own composition's."""
    from hydra import compose, initialize_config_dir

    groups = ["scheduler=priority", "executor=sim", "logger=[]"]
    compose_config(groups)
    hits = _compose_once.cache_info().hits
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            want = OmegaConf.to_container(compose(config_name="config",
                                                  overrides=[*settings, *groups]))
    except ConfigCompositionException as e:
        with pytest.raises(ConfigCompositionException, match=re.escape(str(e).splitlines()[0])):
            compose_config([*settings, *groups])
        return
    assert OmegaConf.to_container(compose_config([*settings, *groups])) == want
    assert _compose_once.cache_info().hits == hits + 1


def test_a_composition_is_remembered_but_each_caller_gets_its_own_copy_and_edits_are_read(
        tmp_path, monkeypatch):
    """compose_config remembers a composition for the process (Hydra's ~0.15 s once per set of
    group choices), yet a caller's change to its config never reaches the next caller, and an edited
    option file is composed again, even when its size and modification time are unchanged."""
    (tmp_path / "scheduler").mkdir()
    option = tmp_path / "scheduler" / "mine.yaml"
    option.write_text("_target_: lab.scheduler.queues.FCFSQueue\nweight: 1\n")
    stamp = option.stat().st_mtime_ns
    monkeypatch.setenv("LAB_CONFIG_PATH", str(tmp_path))
    first = compose_config(["scheduler=mine"])
    first.scheduler.weight = 5
    first.max_num_seqs = 3
    hits = _compose_once.cache_info().hits
    second = compose_config(["scheduler=mine"])
    assert _compose_once.cache_info().hits == hits + 1  # remembered, not composed again
    assert second.scheduler.weight == 1 and second.max_num_seqs != 3
    option.write_text("_target_: lab.scheduler.queues.FCFSQueue\nweight: 2\n")  # same size
    os.utime(option, ns=(stamp, stamp))
    assert compose_config(["scheduler=mine"]).scheduler.weight == 2
