"""SwapSpace: the scheduler's accounting of the CPU blocks that hold swapped-out KV blocks.

Plain Python, no tensors: the worker holds the CPU tensors (pinned on CUDA) and copies blocks when
a SchedulerOutput carries swap pairs. A request's swapped blocks are its first
cdiv(num_computed_tokens, block_size) device blocks, in token order.

Life of a swap within one step (the worker applies every swap-out before every swap-in, and both
before the forward pass):

    swap_out(req)   device blocks -> fresh CPU blocks; the device blocks are freed at once
                    (their data is copied out before anything allocated this step writes them)
    swap_in(req)    CPU blocks -> the request's new device blocks; the CPU blocks are released
                    only by take_step() (a swap-out later in the same step must not reuse them
                    before the swap-in has read them)

Fresh block ids are handed out lazily (a counter plus a free list), so a large swap space costs
nothing until it is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: a swapped block's target in `SwapSpace.swap_in` when its request no longer needs it (it left a
#: sliding window while the request was swapped out): neither copied nor reclaimed
NOT_NEEDED = -1


@dataclass
class SwapStep:
    """What one step swapped: (device, cpu) pairs out, (cpu, device) pairs in, the swap-outs
    refused because the swap space was full, and the swapped blocks that resumed requests took
    back from the device's prefix cache instead of copying them in."""

    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    num_refused: int = 0
    num_reclaimed: int = 0


class SwapSpace:
    """`num_blocks` CPU blocks; which requests hold which, and this step's pending copies."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"swap space num_blocks={num_blocks} must be >= 0")
        self.num_blocks = num_blocks
        self._next_fresh = 0
        self._free: list[int] = []
        self.req_to_blocks: dict[str, list[int]] = {}  # swapped-out requests
        self._pending_in: dict[str, list[int]] = {}  # swapped in this step; released at take_step
        self._reclaimed: dict[str, int] = {}  # of those, blocks found cached on the device
        self._step = SwapStep()

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self._next_fresh + len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by swapped requests or by this step's swap-ins."""
        return self.num_blocks - self.num_free_blocks

    @property
    def num_swapped_reqs(self) -> int:
        return len(self.req_to_blocks)

    def holds(self, request_id: str) -> bool:
        return request_id in self.req_to_blocks

    def swap_out(self, request_id: str, device_blocks: list[int]) -> bool:
        """Reserve CPU blocks for `device_blocks` and record the copies; False (nothing changed)
        when the swap space is too small or the request already holds swap blocks."""
        if request_id in self.req_to_blocks:
            raise ValueError(f"request {request_id} is already swapped out")
        if len(device_blocks) > self.num_free_blocks:
            self._step.num_refused += 1
            return False
        cpu = [self._take_one() for _ in device_blocks]
        self.req_to_blocks[request_id] = cpu
        self._step.swap_out.extend(zip(device_blocks, cpu))
        return True

    def swap_in(self, request_id: str, device_blocks: list[int | None]) -> None:
        """Record the copies of the request's CPU blocks into `device_blocks` (one per CPU
        block, in order; None: not copied, the block is still cached on the device (counted as
        reclaimed); NOT_NEEDED: not copied either). All its CPU blocks are released at the end
        of the step."""
        cpu = self.req_to_blocks[request_id]
        if len(device_blocks) != len(cpu):
            raise ValueError(f"request {request_id} swapped {len(cpu)} blocks; got "
                             f"{len(device_blocks)} device blocks to swap them into")
        del self.req_to_blocks[request_id]
        self._pending_in[request_id] = cpu
        self._step.swap_in.extend((c, d) for c, d in zip(cpu, device_blocks)
                                  if d is not None and d != NOT_NEEDED)
        self._reclaimed[request_id] = sum(d is None for d in device_blocks)
        self._step.num_reclaimed += self._reclaimed[request_id]

    def undo_swap_in(self, request_id: str) -> None:
        """Take back this step's swap-in of the request: it stays swapped out."""
        cpu = self._pending_in.pop(request_id)
        dropped = set(cpu)
        self._step.swap_in = [(c, d) for c, d in self._step.swap_in if c not in dropped]
        self._step.num_reclaimed -= self._reclaimed.pop(request_id)
        self.req_to_blocks[request_id] = cpu

    def discard(self, request_id: str) -> int:
        """Forget a swapped request (aborted): its CPU blocks are free again. Returns how many."""
        cpu = self.req_to_blocks.pop(request_id, [])
        self._free.extend(cpu)
        return len(cpu)

    def take_step(self) -> SwapStep:
        """This step's copies; releases the CPU blocks that this step swapped in."""
        for cpu in self._pending_in.values():
            self._free.extend(cpu)
        self._pending_in.clear()
        self._reclaimed.clear()
        step, self._step = self._step, SwapStep()
        return step

    def _take_one(self) -> int:
        if self._free:
            return self._free.pop()
        self._next_fresh += 1
        return self._next_fresh - 1
