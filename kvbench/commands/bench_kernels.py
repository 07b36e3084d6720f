"""``kvbench bench-kernels``: the kernel benchmark's command line (Hydra overrides of
``conf/bench_kernels.yaml``); the benchmark itself is :func:`kvbench.kernelbench.bench.run`."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from kvbench.app.config import to_dataclass
from kvbench.errors import ConfigError
from kvbench.errors.extras import install_hint
from kvbench.kernelbench.bench import DRY_RUN_SHAPES, BenchKernelsConfig, run


@hydra.main(version_base="1.3", config_path="pkg://kvbench.conf", config_name="bench_kernels")
def _hydra_main(node: DictConfig) -> None:
    from kvbench.specs.hardware import HardwareSpec

    try:
        data = OmegaConf.to_container(node, resolve=True)
        hardware = to_dataclass(HardwareSpec, data.pop("hardware"), "hardware")
        if data.get("dry_run"):  # tiny shapes, except where the command line names a value
            given = {o.split("=")[0].lstrip("+~") for o in HydraConfig.get().overrides.task}
            data.update({k: v for k, v in DRY_RUN_SHAPES.items() if k not in given})
        cfg = to_dataclass(BenchKernelsConfig, data, "bench_kernels")
        if not cfg.dry_run:
            import torch

            if not torch.cuda.is_available():
                raise ConfigError(
                    "kvbench bench-kernels needs a CUDA GPU (torch sees none); "
                    "dry_run=true runs tiny shapes on CPU to test the output path"
                )
        command = " ".join(["kvbench bench-kernels", *sys.argv[1:]])
        run(cfg, hardware, Path(HydraConfig.get().runtime.output_dir), command)
    except ConfigError as exc:
        from kvbench.errors import error_line

        print(error_line("kvbench bench-kernels", exc), file=sys.stderr)
        sys.exit(2)


def _no_gpu(args: list[str]) -> str | None:
    """Why the benchmark cannot run here (no torch, or no CUDA GPU), unless the command only asks
    for help, a config dump or completion, or for ``dry_run=true`` (tiny shapes on the CPU)."""
    import importlib.util

    if any(a in ("-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "-sc") for a in args):
        return None
    dry = [
        a.split("=", 1)[1].strip().lower() for a in args if a.split("=", 1)[0].lstrip("+~") == "dry_run" and "=" in a
    ]
    if dry and dry[-1] in ("true", "yes", "on", "1"):
        return None
    if importlib.util.find_spec("torch") is None:
        return f"kvbench bench-kernels times kernels with torch, which is not installed: {install_hint('kernels')}"
    import torch

    if not torch.cuda.is_available():
        return (
            "kvbench bench-kernels needs a CUDA GPU (torch sees none); "
            "dry_run=true runs tiny shapes on CPU to test the output path"
        )
    return None


def main() -> None:
    """Entry point for ``kvbench bench-kernels`` (``sys.argv[1:]`` holds only Hydra overrides):
    bad overrides and options are one line and exit 2, as for ``kvbench`` itself."""
    import os

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from kvbench.app.overrides import hydra_error_line
    from kvbench.commands.help import wants_help
    from kvbench.commands.main import _unknown_flag
    from kvbench.commands.signals import exit_interrupted, handle_sigterm
    from kvbench.errors import error_line

    handle_sigterm()
    args = sys.argv[1:]
    if wants_help(args) and "--hydra-help" not in args:  # what the command does and what it needs, in 100 columns
        from kvbench.commands.help import print_page, render_help

        try:
            page = render_help(args, "bench_kernels", groups=("hardware",))
        except (HydraException, OmegaConfBaseException) as exc:
            print(error_line("kvbench bench-kernels", hydra_error_line(exc, args)), file=sys.stderr)
            sys.exit(2)
        print_page(page)
        return
    unknown = _unknown_flag(args)
    if unknown:
        print(
            error_line("kvbench bench-kernels", unknown.replace("kvbench --help", "kvbench bench-kernels --help")),
            file=sys.stderr,
        )
        sys.exit(2)
    refusal = _no_gpu(args)
    if refusal:  # said before Hydra makes a run folder that would hold nothing but its own files
        from hydra import compose, initialize_config_module

        try:  # a bad override is the first thing to fix: said before the missing GPU
            with initialize_config_module("kvbench.conf", version_base="1.3"):
                compose("bench_kernels", overrides=args)
        except (HydraException, OmegaConfBaseException) as exc:
            refusal = hydra_error_line(exc, args)
        print(error_line("kvbench bench-kernels", refusal), file=sys.stderr)
        sys.exit(2)
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises instead of printing several lines
    try:
        _hydra_main()
    except KeyboardInterrupt as exc:
        exit_interrupted(exc, "kvbench bench-kernels", "the run folder holds no COMPLETE marker")
    except (HydraException, OmegaConfBaseException) as exc:
        if full_error:
            raise
        print(error_line("kvbench bench-kernels", hydra_error_line(exc, args)), file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
