"""kvbench: compare KV-cache allocators, attention kernels and preemption policies in a decode loop."""

import pluggy

__version__ = "0.1.0"

#: Marker for hook specifications (used only by :mod:`kvbench.hookspecs`).
hookspec = pluggy.HookspecMarker("kvbench")
#: Marker a plugin puts on its hook implementations: ``@kvbench.hookimpl``.
hookimpl = pluggy.HookimplMarker("kvbench")

__all__ = ["hookimpl", "hookspec", "__version__"]
