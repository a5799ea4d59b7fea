"""Every knob checked once a config is composed — by run.py before it writes the run directory,
by LLMEngine for every other path (the offline `LLM`, `lab serve`, benchmarks, tests).

    validate_config(cfg)   # ValueError naming the setting and its allowed values, else None

The rules are the knobs' declarations (lab/config/knob.py); only declared names are knobs:
`+name=value` on the command line adds a key that nothing reads, so it is refused with the list
of knobs. Checks that need a component's class (the block sizes the attention backend supports,
whether the executor runs several ranks) or the machine (whether CUDA is there for
`device=cuda`) run here too, so the user meets the knob-named message before anything is built;
the components keep their own checks as a second line of defence.
"""

from __future__ import annotations

import difflib
import os
import sys
from typing import NoReturn

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from lab.config.compose import (
    GROUPS,
    LIST_GROUPS,
    is_known_setting,
    nested_groups,
    top_level_names,
    unknown_setting_message,
)
from lab.config.plugins import declared_knobs, group_options, option_files


def validate_config(cfg: DictConfig) -> None:
    """Refuse unknown keys, every knob outside its allowed values, and knobs the chosen
    components or this machine cannot run (ValueError)."""
    validate_knobs(cfg)
    check_components(cfg)


def validate_knobs(cfg: DictConfig) -> None:
    """Unknown keys and knobs outside their declared values (no component is imported: an
    engine-core process's frontend checks this much, the core the rest)."""
    knobs = declared_knobs()
    check_known_keys(cfg, {k.name for k in knobs})
    check_list_groups(cfg)
    for knob in knobs:
        value = OmegaConf.select(cfg, knob.name)
        if not knob.ok(value):
            raise ValueError(knob.refusal(value))


def check_components(cfg: DictConfig) -> None:
    """What the chosen components and this machine allow: the attention backend's block sizes
    (when the executor runs a model), the executor's ranks, the device, compile's limits, the
    speculative proposer's ranks."""
    executor = get_class(cfg.executor._target_)
    if executor.runs_kernels:
        from lab.attention.auto import backend_classes

        for backend in backend_classes(cfg.attention._target_):
            backend.check_block_size(cfg.block_size)
        check_device(cfg)
    check_parallel_executor(cfg)
    check_compile(cfg)
    check_speculative(cfg)


def check_device(cfg: DictConfig) -> None:
    """A CUDA device must exist here (torch is imported only for a device other than the CPU)."""
    if cfg.device != "cpu":
        from lab.platform import resolve_device

        resolve_device(cfg.device)


def check_compile(cfg: DictConfig) -> None:
    """compile=true runs one rank, and contradicts enforce_eager=true."""
    if not cfg.compile:
        return
    if cfg.enforce_eager:
        raise ValueError("compile=true is invalid with enforce_eager=true (every step eager): "
                         "drop one of them")
    if cfg.tensor_parallel_size > 1:
        raise ValueError(f"compile=true is invalid with tensor_parallel_size="
                         f"{cfg.tensor_parallel_size}: the compiled forward runs one rank; use "
                         "compile=false")


def check_speculative(cfg: DictConfig) -> None:
    """A proposer that runs its model on one rank (`single_rank_only`: a draft model, MTP)
    needs tensor_parallel_size 1."""
    target = (cfg.get("speculative") or {}).get("_target_")
    if not target or cfg.tensor_parallel_size == 1:
        return
    proposer = get_class(target)
    if getattr(proposer, "single_rank_only", False):
        raise ValueError(f"speculative={proposer.name} is invalid with tensor_parallel_size="
                         f"{cfg.tensor_parallel_size}: its model runs on one rank; use "
                         "tensor_parallel_size=1 or speculative=ngram")


def check_parallel_executor(cfg: DictConfig) -> None:
    """tensor_parallel_size > 1 only with an executor that runs one worker per rank; NCCL only
    on CUDA."""
    get_class(cfg.executor._target_).check_tensor_parallel(cfg.tensor_parallel_size)
    if cfg.distributed_backend != "nccl":
        return
    from lab.platform import resolve_device

    if resolve_device(cfg.device).type == "cpu":
        raise ValueError(f"distributed_backend=nccl is invalid with device={cfg.device} (the "
                         "CPU here): NCCL runs on CUDA only; use distributed_backend=gloo or auto")


def check_known_keys(cfg: DictConfig, names: set[str]) -> None:
    """Every top-level key is a group, a knob or a knob block; every key of a block (slo, sim)
    is a knob declared in it, or a config group nested in it (sim.step_time)."""
    blocks = {n.split(".", 1)[0] for n in names if "." in n}
    for key in cfg:
        if not is_known_setting(key):
            raise ValueError(unknown_setting_message(key)
                             + " (a +key=value override adds a key that nothing reads)")
        if key in blocks and key not in GROUPS:
            check_block_keys(cfg[key], key, names, nested_groups(key))


def check_block_keys(node, block: str, names: set[str], groups: set[str] = frozenset()) -> None:
    """Every key of a knob block is a knob declared in it, a block nested in it (sim.spec,
    checked the same way) or one of its nested config groups."""
    declared = {n.removeprefix(f"{block}.") for n in names if n.startswith(f"{block}.")}
    keys = {d.split(".", 1)[0] for d in declared}
    extra = sorted(set(node or {}) - keys - groups)
    if extra:
        raise ValueError(f"unknown setting '{block}.{extra[0]}': the keys of {block} are "
                         f"{', '.join(sorted(declared))}")
    for sub in sorted(keys - declared):
        if isinstance(node, DictConfig | dict) and isinstance(node.get(sub), DictConfig | dict):
            check_block_keys(node[sub], f"{block}.{sub}", names)


def check_list_groups(cfg: DictConfig) -> None:
    """Each chosen option of a list group (logger=[a,b], logits_processors=[...]) sits under its
    own name, which its file's `# @package <group>.<option>` header asks for: without it Hydra
    merges the options into one node and all but the last would silently vanish."""
    for group in LIST_GROUPS:
        node = cfg.get(group) or {}
        if "_target_" in node:
            missing = [str(f) for f in option_files(group) if not _has_package_header(f, group)]
            raise ValueError(
                f"{group}: an option's YAML lacks its package header, so Hydra merged the chosen "
                f"options into one: start {', '.join(missing) or 'the option file'} with "
                f"`# @package {group}.<option name>` (one key per option of a list group)")


def _has_package_header(path, group: str) -> bool:
    first = path.read_text().lstrip().splitlines()[:1]
    return bool(first) and first[0].replace(" ", "").startswith(f"#@package{group}.")


#: what a bad setting raises while a command starts (validation, the model's path, a knob, an
#: option's constructor, the engine's checks): `python run.py` and `lab serve` report it as one
#: line, exit code 2, not a traceback (refuse_setting_error)
SETTING_ERRORS = (ValueError, FileNotFoundError, MissingMandatoryValue)


def refuse(command: str, message: str) -> NoReturn:
    """A bad command line: one line on stderr naming the command, exit code 2 (a usage error,
    as argparse's)."""
    print(f"{command}: {message}", file=sys.stderr)
    sys.exit(2)


def refuse_setting_error(command: str, e: BaseException) -> NoReturn:
    """A SETTING_ERRORS exception as `refuse` reports it: its first line (omegaconf appends the
    key and the object type on more lines) and how to see the traceback; with
    HYDRA_FULL_ERROR=1 the exception itself, traceback and all."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise e
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    refuse(command, f"{first} (HYDRA_FULL_ERROR=1 shows the traceback)")


def check_command_line(args: list[str]) -> str | None:
    """The refusal of the first plain `name=value` override whose top-level name is neither a
    config group nor a knob, or that names an option its config group does not have, or None
    (with a "did you mean" for a near miss). Run before Hydra parses the command line: Hydra's
    own errors suggest `+name=value`, which adds a key nothing reads, or list its search path.
    Options are checked against lab's and installed plug-ins' config directories, so not when
    the command line adds a directory of its own (hydra.searchpath, --config-dir)."""
    extra_dirs = any("searchpath" in a or a.startswith(("--config-dir", "-cd")) for a in args)
    for arg in args:
        if arg.startswith(("-", "+", "~")) or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        top = key.split("@", 1)[0].split(".", 1)[0]
        if not is_known_setting(top):
            return unknown_setting_message(top) + near_miss(top, [*GROUPS, *top_level_names()])
        if (top == key and top in GROUPS and top not in LIST_GROUPS and is_option_name(value)
                and not extra_dirs):
            options = group_options(top)
            if value not in options:
                return (f"{top}={value} is not an option of {top}: {', '.join(options)}"
                        + near_miss(value, options))
    return None


def is_option_name(value: str) -> bool:
    """Whether an override's value names one option (not a list, a mapping, null or an
    interpolation)."""
    return bool(value) and value != "null" and value[0] not in "[{$'\""


def near_miss(word: str, choices: list[str]) -> str:
    """' (did you mean X?)' for the closest choice, or ''."""
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]}?)" if close else ""
