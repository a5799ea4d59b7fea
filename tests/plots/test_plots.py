"""`python -m lab.plots`: non-empty PNGs from run directories (the scripted workload's files)."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from matplotlib.image import imread

from lab.metrics import JsonlLogger
from lab.plots import load_runs
from lab.plots.figures import bin_steps
from tests.metrics.scripted import run_script
from tests.procs import run_python
from tests.waits import WAIT_S

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A sweep directory with two jobs (0: the scripted run, 1: a copy with another setting)."""
    root = tmp_path_factory.mktemp("sweep")
    run_script([JsonlLogger()], root / "0")
    config = {"scheduler": {"_target_": "lab.scheduler.queues.FCFSQueue"}, "num_gpu_blocks": 6,
              "seed": 0}
    (root / "0" / "config.yaml").write_text(yaml.safe_dump(config))
    shutil.copytree(root / "0", root / "1")
    config["num_gpu_blocks"] = 12
    (root / "1" / "config.yaml").write_text(yaml.safe_dump(config))
    (root / "1" / ".hydra").mkdir()
    (root / "1" / ".hydra" / "hydra.yaml").write_text(
        yaml.safe_dump({"hydra": {"runtime": {"choices": {"scheduler": "fcfs",
                                                          "hydra/launcher": "basic"}}}}))
    return root


def test_plot_command_writes_pngs(sweep, tmp_path):
    out = tmp_path / "plots"
    proc = run_python(["-m", "lab.plots", str(sweep), "--out", str(out)], cwd=REPO,
                      timeout=WAIT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = sorted(p.name for p in out.glob("*.png"))
    assert names == ["latency_cdf.png", "throughput_goodput.png",
                     "timeline_0_num_gpu_blocks=6.png", "timeline_1_num_gpu_blocks=12.png"]
    assert sorted(proc.stdout.split()) == sorted(str(out / n) for n in names)
    for name in names:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
        img = imread(out / name)
        assert img.shape[0] > 300 and img.shape[1] > 600
        assert img[..., :3].std() > 0.05, f"{name} is blank"


def test_single_run_default_out(sweep, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(sweep / "0", run)
    from lab.plots.__main__ import main

    files = main([str(run)])
    assert {f.parent for f in files} == {run / "plots"} and len(files) == 3
    assert all(f.stat().st_size > 10_000 for f in files)


def test_labels_name_what_differs(sweep):
    runs = load_runs([sweep / "0", sweep / "1"])
    assert [r.label for r in runs] == ["num_gpu_blocks=6", "num_gpu_blocks=12"]
    assert runs[1].choices == {"scheduler": "fcfs"}
    assert [s["num_preempted"] for s in runs[0].steps] == [0, 0, 0, 1, 0, 0]
    assert runs[0].summary["num_good_requests"] == 1


def test_not_a_run_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        load_runs([tmp_path])


def test_bin_steps_means():
    steps = np.arange(7)
    x, (a,), width = bin_steps(steps, np.array([1, 3, 5, 7, 9, 11, 13.0]), max_bins=3)
    assert width == 3 and list(x) == [0, 3, 6] and list(a) == [3.0, 9.0, 13.0]
    x, (a,), width = bin_steps(steps, steps * 1.0, max_bins=10)
    assert width == 1 and list(a) == list(steps)
