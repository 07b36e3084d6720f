"""Times Vidur's request making in a Vidur run: put this folder first on the runner's ``PYTHONPATH``
and name a file in ``KVBENCH_VIDUR_TIMES`` (side_by_side.py's ``run_vidur`` does both).

Python imports ``sitecustomize`` at start-up, from the first folder of its path that has one. With
``KVBENCH_VIDUR_TIMES`` set, this one waits for ``vidur.simulator`` to be imported and wraps its
``Simulator._init_event_queue`` (the request generator's ``generate()``, which makes every request
object, and one arrival event per request pushed on the event queue: Vidur's request making, done
before its event loop) with a timer; when it returns, ``{"request_making_s": ..., "requests": ...}``
is written to that file. Nothing inside Vidur's event loop is touched, so its loop runs as it
would. Any other Python process the runner starts (its set-up check, its report) imports this too
and does nothing more. A ``sitecustomize`` further down the path, which this one hides, is run too.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import time

TARGET = "vidur.simulator"
HERE = os.path.dirname(os.path.abspath(__file__))


def _wrap(simulator_class: type, times_file: str) -> None:
    make = simulator_class._init_event_queue

    def timed_init_event_queue(self) -> None:
        start_s = time.perf_counter()
        make(self)
        making_s = time.perf_counter() - start_s
        with open(times_file, "w") as out:
            json.dump({"request_making_s": making_s, "requests": len(self._event_queue)}, out)

    simulator_class._init_event_queue = timed_init_event_queue


class _TimeRequestMaking(importlib.abc.MetaPathFinder):
    """Finds ``vidur.simulator`` as Python would, and wraps its Simulator once the module has run."""

    def __init__(self, times_file: str) -> None:
        self.times_file = times_file

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module) -> None:
            exec_module(module)
            _wrap(module.Simulator, self.times_file)

        spec.loader.exec_module = exec_and_wrap
        return spec


def _run_hidden_sitecustomize() -> None:
    """The ``sitecustomize`` this one hides (a distribution's own), if the path has another."""
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if os.environ.get("KVBENCH_VIDUR_TIMES"):
    sys.meta_path.insert(0, _TimeRequestMaking(os.environ["KVBENCH_VIDUR_TIMES"]))
_run_hidden_sitecustomize()
