"""`executor=ray`: one Ray actor per rank, in one placement group, each running the same Worker as
executor=multiproc's processes.

    RayExecutor (the engine's process, Ray's driver)
      placement group: world_size bundles of {"CPU": 1} (CPU) or {"GPU": 1} (CUDA),
                       STRICT_PACK (one node) by default, PACK to let a group span nodes
      actor r = RayWorker(r) in bundle r
      rendezvous: tcp://<rank 0 actor's node IP>:<a port free there>
      execute_model: the SchedulerOutput put in Ray's object store once, every actor's call
                     takes the reference; rank 0's output back (the others return None)
      execute_model_async: the same calls made now, rank 0's output read when asked for (an
                     actor runs its calls in order, so step N+1 queues behind step N)

The cluster: an existing one when the `address` option (or RAY_ADDRESS) names it, else the one
this process already joined, else a local one started on demand (`num_cpus` of it; no
dashboard, no worker logs forwarded). A locally started cluster lives as long as this process
(Ray ends it at exit); the executor's shutdown() ends its actors and placement group. Ray is
imported only when this executor is built: without it, a clear ImportError says how to get it.

Failures (lab/executor/distributed.py): a call's references are polled every POLL_S; an actor
that died (RayActorError) or a call that raised (RayTaskError) stops every actor and raises
RankFailedError naming the rank.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.config.worker import WorkerConfig
from lab.core.step import ModelRunnerOutput, SchedulerOutput
from lab.distributed.launch import free_port
from lab.executor.base import call_worker
from lab.executor.distributed import (
    POLL_S,
    STARTUP_TIMEOUT_S,
    DistributedExecutor,
    RankFailedError,
    rank_failure,
)
from lab.executor.pipeline import InOrderSteps, StepFuture

ACTOR_DIED = "(its Ray actor) died"
PLACEMENT_STRATEGIES = ("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD")
REPO_ROOT = str(Path(__file__).resolve().parents[2])


def import_ray():
    """The ray module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError("executor=ray needs Ray: pip install 'lab[ray]' (ray>=2.9), or use "
                          "executor=multiproc (one process per rank on this machine)") from e
    return ray


class RayWorker:
    """The actor of one rank (decorated with ray.remote when the executor starts): a Worker
    built on `init_worker`, then its methods run by name."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.worker = None

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def free_port(self) -> int:
        return free_port("")

    def pid(self) -> int:
        return os.getpid()

    def init_worker(self, config: WorkerConfig, init_method: str) -> None:
        import ray

        from lab.worker.worker import Worker

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)  # on a CPU
        self.worker = Worker(config, self.rank, init_method, cpu_threads=max(1, int(cpus)))

    def execute_method(self, method: str | Callable, args: tuple, kwargs: dict) -> Any:
        return call_worker(self.worker, method, args, kwargs)

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput | None:
        out = self.worker.execute_model(sched)
        return out if self.rank == 0 else None


class RayExecutor(DistributedExecutor):
    """One Ray actor per rank (see the module docstring)."""

    def __init__(self, config: WorkerConfig, address: str | None = None,
                 placement_strategy: str = "STRICT_PACK", num_cpus: int | None = None,
                 placement_timeout_s: float = 120.0,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        if placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"executor.placement_strategy={placement_strategy!r}: use one of "
                             f"{', '.join(PLACEMENT_STRATEGIES)}")
        self.ray = import_ray()
        self.world_size = config.parallel.world_size
        self.failure: str | None = None
        self._in_flight = InOrderSteps(chain=False)  # steps called, outputs not read yet
        self.group = RayGroup(self.ray)
        # an engine dropped without shutdown(): its actors end when it is collected (or at exit)
        self._finalizer = weakref.finalize(self, self.group.release)
        connect_ray(self.ray, address, num_cpus or max(self.world_size, os.cpu_count() or 1))
        self._place(config, placement_strategy, placement_timeout_s)
        self._start_actors(config, startup_timeout_s)

    def _place(self, config: WorkerConfig, strategy: str, timeout_s: float) -> None:
        """Reserve one bundle per rank (RuntimeError naming what the cluster has when they
        cannot be placed in `timeout_s`: other engines' groups hold their bundles until they
        shut down)."""
        from ray.util.placement_group import placement_group

        from lab.platform import resolve_device

        self.on_gpu = resolve_device(config.knobs.device).type == "cuda"
        resource = {"GPU": 1} if self.on_gpu else {"CPU": 1}
        self.group.pg = placement_group([resource] * self.world_size, strategy=strategy)
        ready, _ = self.ray.wait([self.group.pg.ready()], timeout=timeout_s)
        if not ready:
            self.shutdown()
            raise RuntimeError(f"Ray could not place {self.world_size} bundles of {resource} "
                               f"({strategy}) in {timeout_s:.0f} s: the cluster has "
                               f"{self.ray.cluster_resources()}, of which "
                               f"{self.ray.available_resources()} are free")

    def _start_actors(self, config: WorkerConfig, timeout_s: float) -> None:
        """One actor per bundle; rank 0's node and a free port there make the rendezvous."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        on_gpu = self.on_gpu
        actor_cls = self.ray.remote(RayWorker)
        for rank in range(self.world_size):
            self.group.actors.append(actor_cls.options(
                num_cpus=0 if on_gpu else 1, num_gpus=1 if on_gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.group.pg, placement_group_bundle_index=rank)).remote(rank))
        ip = self._wait([self.group.actors[0].node_ip.remote()], timeout_s)[0]  # rank 0's node
        port = self._wait([self.group.actors[0].free_port.remote()], timeout_s)[0]
        init_method = f"tcp://{ip}:{port}"
        self._wait([a.init_worker.remote(config, init_method) for a in self.group.actors],
                   timeout_s)

    @property
    def pids(self) -> list[int]:
        """The actors' process ids, in rank order."""
        return self._wait([a.pid.remote() for a in self.group.actors])

    def collective_rpc(
        self, method: str | Callable, args: tuple = (), kwargs: dict | None = None,
    ) -> list[Any]:
        self._check()
        return self._wait([a.execute_method.remote(method, args, kwargs or {})
                           for a in self.group.actors])

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        return self.execute_model_async(sched).result()

    def execute_model_async(self, sched: SchedulerOutput, chained: bool = False) -> StepFuture:
        """Call every actor now; rank 0's output is read when asked for, oldest step first.
        (`chained` needs nothing here: after a failure the group is stopped and every later
        step raises.)"""
        self._check()
        ref = self.ray.put(sched)  # serialized once; every actor reads the same object
        refs = [a.execute_model.remote(ref) for a in self.group.actors]
        return self._in_flight.submit(lambda: self._wait(refs)[0])

    def _check(self) -> None:
        if self.failure is not None:
            raise RankFailedError(self.failure)

    def _wait(self, refs: list, timeout_s: float | None = None) -> list[Any]:
        """Every reference's value (refs[i] is rank i's), polled every POLL_S; an error or a dead actor stops the group (RankFailedError)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        while pending:
            ready, pending = self.ray.wait(pending, num_returns=1, timeout=POLL_S)
            for ref in ready:
                status, value = self._get(ref)
                if status != "ok":
                    dead = self._dead_among(pending, index)
                    if status == "died":
                        dead[index[ref]] = ACTOR_DIED
                    self._fail(index[ref], value, dead)
                results[index[ref]] = value
            if not ready and deadline is not None and time.monotonic() > deadline:
                self._fail(index[pending[0]], f"gave no answer in {timeout_s:.0f} s", {})
        return results

    def _get(self, ref) -> tuple[str, Any]:
        """("ok", value), ("died", why) for a dead actor, ("error", what) for a raised call."""
        try:
            return "ok", self.ray.get(ref)
        except self.ray.exceptions.RayActorError as e:
            return "died", str(e)
        except self.ray.exceptions.RayError as e:
            return "error", f"{type(e).__name__}: {e}"

    def _dead_among(self, pending: list, index: dict) -> dict[int, str]:
        """The ranks among `pending` whose actor is found dead within half a second (a rank's
        error is often the echo of a peer's death)."""
        ready, _ = self.ray.wait(pending, num_returns=len(pending), timeout=0.5) if pending \
            else ([], [])
        dead = {}
        for ref in ready:
            if self._get(ref)[0] == "died":
                dead[index[ref]] = ACTOR_DIED
        return dead

    def _fail(self, rank: int, what: str, dead: dict[int, str]) -> None:
        self.failure = rank_failure(rank, what, dead)
        self.shutdown()
        raise RankFailedError(self.failure)

    def shutdown(self) -> None:
        """Kill the actors and remove the placement group (Ray itself stays up: other engines
        of this process may use it; a local cluster ends with the process)."""
        self.group.release()


class RayGroup:
    """The actors and placement group of one executor; `release()` ends them (idempotent)."""

    def __init__(self, ray) -> None:
        self.ray = ray
        self.actors: list = []
        self.pg = None

    def release(self) -> None:
        actors, self.actors = self.actors, []
        if not self.ray.is_initialized():  # Ray already shut down (at exit): nothing is left
            self.pg = None
            return
        for actor in actors:
            self.ray.kill(actor)
        if self.pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.pg)
            self.pg = None


def connect_ray(ray, address: str | None, num_cpus: int) -> None:
    """Join the cluster at `address` / RAY_ADDRESS, keep the one already joined, or start a
    local one of `num_cpus` CPUs (no dashboard, worker logs not forwarded)."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
        return
    path = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
