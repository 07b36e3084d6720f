"""Hook specifications: everything a kvbench plugin can provide.

A plugin is a module (or object) with functions decorated ``@kvbench.hookimpl`` whose names match
the specs below, made discoverable through the ``kvbench`` entry-point group::

    [project.entry-points.kvbench]
    my_allocator = "my_package.my_allocator"

The built-in plugins under ``plugins/`` register through exactly this path. Registration hooks
return lists of classes; each class carries a ``name`` that matches a ``conf/<group>/<name>.yaml``
file, and kvbench merges the lists from every plugin (two plugins claiming one name is an error
naming both). Hooks only ever gain arguments, so a plugin written today keeps working.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbench import hookspec

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd

    from kvbench.output.results import RunResult


# -------------------------------------------------------------------------------------------------
# Registration: what a plugin adds to kvbench's choices.
# -------------------------------------------------------------------------------------------------


@hookspec
def kvbench_register_allocators() -> list[type]:
    """Return KV-cache allocator classes to add to the ``allocator`` config group.

    Each class subclasses :class:`kvbench.memory.allocator.Allocator`, sets ``name`` (selected with
    ``allocator=<name>``) and a ``Config`` dataclass of its options. It must pass the allocator
    conformance suite in :mod:`kvbench.testing.allocators`.

    :return: a list of allocator classes (may be empty).
    """


@hookspec
def kvbench_register_kernels() -> list[type]:
    """Return attention-kernel classes to add to the ``kernel`` config group.

    Each class subclasses :class:`kvbench.kernels.kernel.Kernel`: in ``sim`` mode it supplies the decode
    efficiency measured in its calibration file, in ``real`` mode it computes paged decode
    attention.

    :return: a list of kernel classes (may be empty).
    """


@hookspec
def kvbench_register_preemption_policies() -> list[type]:
    """Return preemption-policy classes to add to the ``preemption`` config group.

    Each class subclasses :class:`kvbench.sched.preemption.PreemptionPolicy`: when a running sequence
    cannot grow, it picks the victim (a whole request) and the mechanism (recompute or swap).

    :return: a list of preemption-policy classes (may be empty).
    """


@hookspec
def kvbench_register_schedulers() -> list[type]:
    """Return scheduling-policy classes to add to the ``scheduler`` config group.

    Each class subclasses :class:`kvbench.sched.scheduler.Scheduler` and implements
    ``schedule_step(plan)``: the order in which a step runs the running requests, resumes swapped
    ones and admits waiting ones, composed from the scheduler's public mechanisms
    (``run_running``, ``admit``, ``resume_swapped``). It must pass the scheduling conformance suite
    in :mod:`kvbench.testing.schedulers`.

    :return: a list of scheduler classes (may be empty).
    """


@hookspec
def kvbench_register_queues() -> list[type]:
    """Return admission-queue classes, selected with ``scheduler.queue=<name>``.

    Each class subclasses :class:`kvbench.sched.queue.RequestQueue` (``add``, ``add_preempted``,
    ``peek``, ``pop``, ``__len__``, ``__iter__``; ``fifo = True`` only if later arrivals never
    come out first): which waiting request the scheduler offers for admission next.

    :return: a list of queue classes (may be empty).
    """


@hookspec
def kvbench_register_workloads() -> list[type]:
    """Return workload-source classes to add to the ``workload`` config group.

    Each class subclasses :class:`kvbench.workload.source.WorkloadSource` and turns its config and a
    seeded random generator into the run's requests (arrival time, prompt and output tokens,
    declared S_max).

    :return: a list of workload-source classes (may be empty).
    """


@hookspec
def kvbench_register_routers() -> list[type]:
    """Return router classes to add to the ``router`` config group (``deployment=disagg``).

    Each class sets ``name`` (selected with ``router=<name>``) and ``Config`` (its options'
    dataclass, or None), and implements :class:`kvbench.deploy.interfaces.Router`:
    ``route(request, role, workers)`` returns the ``index`` of one of ``workers``, the snapshots
    (:class:`kvbench.deploy.interfaces.WorkerView`) of the prefill or decode workers it may pick.
    :class:`kvbench.deploy.routers.RouterPlugin` is a base to subclass.

    :return: a list of router classes (may be empty).
    """


@hookspec
def kvbench_config_searchpath() -> str | None:
    """Return a Hydra search-path entry holding this plugin's config files, or ``None``.

    An outside plugin that adds ``allocator=my_alloc`` ships ``my_pkg/conf/allocator/my_alloc.yaml``
    and returns ``"pkg://my_pkg.conf"`` here; kvbench appends it to Hydra's search path so the
    name can be selected on the command line like a built-in one.

    :return: a search-path string such as ``"pkg://my_pkg.conf"`` or ``"file:///abs/path"``.
    """


# -------------------------------------------------------------------------------------------------
# Results: what a plugin does with a finished run.
# -------------------------------------------------------------------------------------------------


@hookspec
def kvbench_run_finished(result: RunResult) -> None:
    """Receive every finished run: a sink such as W&B logs it.

    Called once per job after its tables are written to ``results/``, also for a multirun's jobs.
    An exception raised here is reported as a warning and does not fail the run.

    :param result: the run's resolved config, summary row, per-request and per-step tables, and
        its output folder.
    """


@hookspec
def kvbench_sweep_finished(sweep_dir: Path, comparison: pd.DataFrame) -> None:
    """Receive a finished multirun: a sink such as W&B logs its comparison table and figure.

    Called once, in the process that launched the sweep, after ``comparison.{parquet,csv,png}`` are
    written into ``sweep_dir`` (also when jobs failed: their rows say so). An exception raised
    here is reported as a warning.

    :param sweep_dir: the multirun's folder (one numbered sub-folder per job).
    :param comparison: one row per job, as in ``comparison.parquet``.
    """
