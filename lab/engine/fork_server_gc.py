"""The fork server's last preload (lab.distributed.launch.PRELOAD): importing this module
collects the fork server's heap and freezes it, once, right after it imported torch,
transformers and lab's engine code (~325k objects the cyclic GC tracks).

Why: every engine-core process, rank and test command is a fork of that server. Unfrozen, the
heap they inherit is walked again by each child's first full collection (the core's own freeze
at start-up, lab.engine.core.freeze_gc_heap: 0.19 s of CPU per child on the 2-core machine of
the measurements) and by every automatic full collection after, and walking it writes to the
objects' GC headers, copying the shared pages into each child. Frozen in the parent, they stay
out of the children's collections, as Python's documentation of `gc.freeze` advises for a
parent that forks without exec. The fork server hands them back at its exit (extensions that
count their live objects at exit, as Triton's nanobind does, would report frozen ones as leaks).

It is the engine's own start-up freeze (lab.engine.core.freeze_gc_heap), earlier. This module
exists for that one effect of importing it: only the fork server imports it.
"""

from lab.engine.core import freeze_gc_heap

freeze_gc_heap()
