"""Building lab's C++ CPU kernels (torch's cpp_extension), one place for all of them.

The CPU has no compiled Triton here (only the interpreter), so the few CPU kernels lab has are
C++ (`lab/kernels/cpu_*.cpp`), each beside its PyTorch reference like every Triton kernel.
`CPUExtension(stem)` builds `<stem>.cpp`; nothing builds at import or inside a request:

- when: `load()` builds (or loads from disk) and is called before an engine reports ready (the
  `kernels=cpu` option's and `attention=cpu`'s `setup`, from the Worker) or at install
  (`python -m lab.kernels.build`, run by scripts/install.sh). A kernel's request-path calls go
  through `loaded()`, which never builds: it raises when `load()` did not run in this process.
- where: `extensions_root()`, one directory per install: `$TORCH_EXTENSIONS_DIR` when the user
  sets it, else `<lab cache>/torch_extensions/<install key>` (lab cache: `$LAB_CACHE_DIR`, else
  ~/.cache/lab; the key hashes lab's package path, torch's and Python's versions and the flags),
  never torch's default directory, which every install of the same torch shares.
- lock: one builder per extension at a time, through an exclusive `flock` on
  `<root>/<name>.lock` (`build_lock`). The kernel drops a flock when its process dies, so a
  builder killed mid-build leaves nothing held; the next builder then also removes the lock
  file torch's own `FileBaton` left in the build directory (torch waits on that file forever).
  A live builder is waited for up to `LOCK_TIMEOUT_S`, then `CPUKernelUnavailable` names it.
- flags: `-O3 -march=native` (this CPU's instructions: AVX-512, AMX where it has them);
  `-fopenmp` makes `at::parallel_for` run on torch's OpenMP pool (without it the header-only
  loop runs serially; the extension's libgomp is torch's, one runtime per process);
  `-ffast-math` lets fp32 reductions and exp vectorize (glibc's libmvec: `-lmvec`); an
  extension may add flags after these (`extra_cflags`: cpu_sgemm undoes -ffast-math, as its
  ordered kernel's order of adds is its contract).
- name: `lab_<stem>_<hash>`, the hash over the source, the flags, torch's version and this
  CPU's flags, so a changed source or another machine builds its own copy instead of loading a
  binary made for other instructions. The library registers its functions as dispatcher ops
  under that name (`load()` returns `torch.ops.<name>`; two builds never collide): a plain
  shared library, with no pybind11 module, whose headers took half of each build (4 kernels:
  84 -> 35 CPU-seconds on the 2-core machine of the measurements, with ATen's core headers
  and each op's own instead of ATen/ATen.h).
- failure: no compiler, no ninja, no libmvec, a lock held too long... raise
  `CPUKernelUnavailable`; the option that asked decides (fail, or its PyTorch reference).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CFLAGS = ("-O3", "-march=native", "-fopenmp", "-ffast-math")
LDFLAGS = ("-fopenmp", "-lmvec")  # OpenMP (torch's libgomp at run time), glibc's vector math
# how long a builder waits for another live one: well past the longest build (~1 min on 2 busy
# cores), short of a hang
LOCK_TIMEOUT_S = 600.0
TORCH_BATON = "lock"  # the file torch's cpp_extension creates in a build directory while building


#: a loaded extension's functions: the dispatcher ops its source registers under its name
#: (`torch.ops.<name>.<function>`, module docstring)
Kernels = Any


class CPUKernelUnavailable(RuntimeError):
    """A C++ CPU kernel could not be built or loaded here (no compiler, no glibc libmvec, ...)."""


def cpu_flags() -> str:
    """This CPU's feature flags (/proc/cpuinfo), or the processor name where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def lab_cache_dir() -> Path:
    """lab's cache: $LAB_CACHE_DIR, else ~/.cache/lab."""
    env = os.environ.get("LAB_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "lab"


def install_key(package_dir: Path | None = None) -> str:
    """A hash naming this install: lab's package directory (`package_dir`, default this one),
    torch's and Python's versions, the flags."""
    import torch

    package_dir = package_dir or Path(__file__).resolve().parents[1]
    parts = [str(package_dir), torch.__version__, sys.version, *CFLAGS, *LDFLAGS]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def extensions_root() -> Path:
    """Where extensions are built: $TORCH_EXTENSIONS_DIR when set, else this install's own
    directory under lab's cache (module docstring)."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(env) if env else lab_cache_dir() / "torch_extensions" / install_key()


@contextlib.contextmanager
def build_lock(path: Path, timeout_s: float = LOCK_TIMEOUT_S,
               poll_s: float = 0.2) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing) for the body. A lock whose holder
    died is free (the kernel released it); a live holder is waited for up to `timeout_s`, then
    CPUKernelUnavailable names it (the pid and start time it wrote into the file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise CPUKernelUnavailable(
                        f"another process ({_holder(path)}) still holds the build lock {path} "
                        f"after {timeout_s:.0f} s; let it finish or stop it") from None
                time.sleep(poll_s)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode())
        yield
    finally:
        os.close(fd)  # releases the flock


def _holder(path: Path) -> str:
    """What the lock's holder wrote into it ("pid N since T"), or "unknown"."""
    try:
        return path.read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def remove_stale_baton(build_dir: Path) -> bool:
    """Remove torch's build lock (`<build_dir>/lock`), which a builder killed mid-build leaves
    behind and which makes torch wait forever; only call it holding `build_lock` (then nobody
    is building there). Returns whether there was one."""
    baton = build_dir / TORCH_BATON
    if not baton.exists():
        return False
    log.warning("removing %s, left by a build that did not finish", baton)
    baton.unlink(missing_ok=True)
    return True


def compile_extension(name: str, source: Path, cflags: tuple[str, ...],
                      build_dir: Path) -> Kernels:
    """torch's cpp_extension: build `source` as library `name` in `build_dir` (ninja skips an
    up-to-date build), load it, and return its ops (`torch.ops.<name>`)."""
    import torch
    from torch.utils.cpp_extension import load as cpp_load

    # lists made here: cpp_extension appends torch's libraries to the lists it is given
    cpp_load(name, [str(source)], extra_cflags=list(cflags), extra_ldflags=list(LDFLAGS),
             build_directory=str(build_dir), verbose=False, is_python_module=False)
    return getattr(torch.ops, name)


class CPUExtension:
    """The extension built from lab/kernels/<stem>.cpp (module docstring). It remembers the
    module it loaded in this process; `load()` is the only way in that may build."""

    def __init__(self, stem: str, extra_cflags: tuple[str, ...] = ()) -> None:
        self.stem = stem
        self.cflags = CFLAGS + extra_cflags  # later flags win: ("-fno-fast-math",) undoes one
        self.source = Path(__file__).with_name(f"{stem}.cpp")
        self.module: Kernels | None = None  # loaded in this process

    def name(self) -> str:
        """lab_<stem>_<hash of source, flags, torch version and the CPU's flags>."""
        import torch

        key = "\n".join([self.source.read_text(), *self.cflags, *LDFLAGS, torch.__version__,
                         cpu_flags()])
        return f"lab_{self.stem}_{hashlib.sha256(key.encode()).hexdigest()[:12]}"

    def load(self) -> Kernels:
        """The compiled extension: loaded already in this process, else built (or loaded from
        the disk cache) now; CPUKernelUnavailable when it cannot be built here."""
        if self.module is None:
            self.module = self.build()
        return self.module

    def loaded(self) -> Kernels:
        """The extension `load()` loaded in this process; never builds (a request's path)."""
        if self.module is None:
            raise RuntimeError(f"the CPU kernel {self.source.name} is not loaded in this process: "
                               "its option's setup (before the engine is ready) loads it")
        return self.module

    def build(self) -> Kernels:
        """Build (or load from the disk cache) the extension under the build lock;
        CPUKernelUnavailable when it cannot be built here."""
        name = self.name()
        root = extensions_root()
        build_dir = root / name
        try:
            build_dir.mkdir(parents=True, exist_ok=True)
            with build_lock(root / f"{name}.lock", LOCK_TIMEOUT_S):
                remove_stale_baton(build_dir)
                if not (build_dir / f"{name}.so").exists():
                    log.info("building the C++ CPU kernel %s in %s (once per install)",
                             self.source.name, build_dir)
                return compile_extension(name, self.source, self.cflags, build_dir)
        except CPUKernelUnavailable:
            raise
        except Exception as e:  # no compiler / ninja: OSError, RuntimeError, CalledProcessError
            raise CPUKernelUnavailable(
                f"the CPU kernel {self.source.name} could not be built: {e}") from e

    def __repr__(self) -> str:
        return f"CPUExtension({self.stem!r})"


class PackedGemm:
    """A GEMM on a weight packed once after loading: one slot of `kernels=cpu`'s `gemms`
    (lab/layers/cpu_ops.py), which packs each dense linear's weight for the first slot that
    takes it.

    `setup()` (before the model loads) checks the machine (`applies`), builds or loads the
    slot's extension and says whether the slot runs here; `takes(weight)` then says whether it
    packs a weight: one of its `dtypes`, at least `min_elements` elements, a shape it supports.
    A C++ slot names its `extension` and its dispatcher op `lab_cpu::<op>`
    `(x [M, K], packed, weight [N, K], bias) -> [M, N]`, whose fake implementation is
    registered at setup, so torch.compile keeps the op opaque."""

    extension: CPUExtension | None = None  # None: nothing to build
    op: str | None = None
    dtypes: tuple = ()

    def __init__(self, min_elements: int = 0) -> None:
        if min_elements < 0:
            raise ValueError(f"min_elements={min_elements} is invalid: use an int >= 0")
        self.min_elements = min_elements
        self.ready = False

    def applies(self) -> bool:
        """Whether this machine can run the kernel at all (checked before anything is built)."""
        return True

    def usable(self, module: Kernels) -> bool:
        """Whether the loaded extension runs here (e.g. the OS grants the AMX tiles)."""
        return True

    @classmethod
    def available(cls) -> bool:
        """Whether the kernel runs here, built now if needed (tests, benchmarks)."""
        try:
            return cls().setup()
        except CPUKernelUnavailable:
            return False

    def setup(self) -> bool:
        """Build or load the extension where the kernel applies (CPUKernelUnavailable when it
        cannot be built); whether the kernel runs here."""
        self.ready = False
        if not self.applies():
            return False
        if self.extension is not None:
            if not self.usable(self.extension.load()):
                return False
            if self.op is not None:
                import torch

                torch.library.register_fake(f"lab_cpu::{self.op}")(_packed_gemm_fake)
        self.ready = True
        return True

    def supports(self, weight) -> bool:
        """Whether the kernel takes this weight's dtype, layout and shape."""
        raise NotImplementedError

    def takes(self, weight) -> bool:
        """Whether `weight` [N, K] is packed for this kernel (after setup)."""
        return self.ready and weight.numel() >= self.min_elements and self.supports(weight)

    def pack(self, weight):
        """`weight` [N, K] in the kernel's packed form."""
        raise NotImplementedError

    def gemm(self, x, packed, weight, bias=None):
        """y [..., N] = x [..., K] W^T (+ bias) through `packed` (= pack(weight)): the op."""
        return packed_gemm(self.op, x, packed, weight, bias)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(min_elements={self.min_elements})"


def packed_gemm(op: str, x, packed, weight, bias=None):
    """`lab_cpu::<op>` on x [..., K] with any leading dims -> [..., N] (the op is registered by
    its extension's load)."""
    import torch

    fn = getattr(torch.ops.lab_cpu, op)
    return fn(x.reshape(-1, x.shape[-1]), packed, weight, bias).view(*x.shape[:-1],
                                                                    weight.shape[0])


def _packed_gemm_fake(x, packed, weight, bias):
    return x.new_empty(x.shape[0], weight.shape[0])
