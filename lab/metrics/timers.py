"""Timers: wall time spent inside chosen calls of live objects, by name (the step profile's and
the simulator's operator profile's instrument). Patches instance attributes and restores them."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable


class Timers:
    """Wall time spent in patched calls, by name (instance attributes: restored by `close`)."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        """sync: called before each clock reading (torch.cuda.synchronize on a GPU, whose calls
        return before the device finishes)."""
        self.sync = sync
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._patched: list[tuple[object, str, object]] = []  # (obj, attr, its own before)

    def wrap(self, obj: object, attr: str, name: str) -> None:
        fn: Callable = getattr(obj, attr)

        def timed(*args, **kwargs):
            if self.sync:
                self.sync()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.sync:
                    self.sync()
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1

        self._patched.append((obj, attr, vars(obj).get(attr, _CLASS_ATTR)))
        setattr(obj, attr, timed)

    def close(self) -> None:
        """Undo the patches, last first: an attribute the instance had of its own (compile=true's
        model.forward) is put back, else the class's method shows through again."""
        for obj, attr, own in reversed(self._patched):
            if own is _CLASS_ATTR:
                delattr(obj, attr)
            else:
                setattr(obj, attr, own)
        self._patched.clear()


_CLASS_ATTR = object()  # Timers: the patched attribute was the class's, not the instance's
