from lab.scheduler.output import ModelRunnerOutput, SchedulerOutput
from lab.scheduler.preemption import PreemptionStrategy, RecomputePreemption
from lab.scheduler.queues import FCFSQueue, RequestQueue
from lab.scheduler.scheduler import Scheduler, SchedulerConfig

__all__ = [
    "FCFSQueue", "ModelRunnerOutput", "PreemptionStrategy", "RecomputePreemption",
    "RequestQueue", "Scheduler", "SchedulerConfig", "SchedulerOutput",
]
