"""``kvbench slo-batch``: the largest decode-only batch whose TPOT meets an SLO, by the cost
model's arithmetic (:mod:`kvbench.slo.batch`), beside the memory ceiling of the run's allocator.

    kvbench slo-batch                                      # the lecture's 20 ms, 640-token question
    kvbench slo-batch slo.tpot_s=0.05 --context-tokens 4096 model=opt-13b hardware=a100-40gb

The SLO is the config key ``slo.tpot_s``, in seconds, as every kvbench command takes it.
"""

from __future__ import annotations

import math
from dataclasses import asdict

from omegaconf import OmegaConf

from kvbench.commands.arguments import renamed_slo_flag
from kvbench.commands.common import Parser, compose_checked, resolve_out_dir, run_cli
from kvbench.errors import ConfigError, require
from kvbench.output.figures import pyplot
from kvbench.output.report import wide_console
from kvbench.output.run_report import compact_table
from kvbench.slo.batch import (
    GB,
    MAX_BATCH,
    MAX_CONTEXT_TOKENS,
    MAX_TPOT_S,
    TPOT_SLO_DEFAULT_S,
    BatchAnswer,
    arithmetic,
    batch_table,
    batches_to_show,
    figure,
    memory_ceiling,
    slo_batch,
)
from kvbench.slo.common import fmt_seconds, folder_files, write_folder


def _main(argv: list[str]) -> int:
    renamed = renamed_slo_flag(argv)  # `--tpot-ms 20`, this command's spelling before slo.tpot_s
    if renamed:
        raise ConfigError(renamed)
    parser = Parser(
        "kvbench slo-batch",
        "The largest decode-only batch whose TPOT meets the SLO slo.tpot_s=<seconds> (default "
        f"{TPOT_SLO_DEFAULT_S:g}, the lecture's {fmt_seconds(TPOT_SLO_DEFAULT_S)}), by the cost model's arithmetic, "
        "beside the memory ceiling of the run's allocator.",
    )
    parser.add_argument(
        "--context-tokens",
        type=int,
        default=640,
        help="KV tokens each sequence holds (default 640: the lecture's 512-token prompt + 128 output)",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help="largest B in the table and figure (default: a power of two above both limits)",
    )
    parser.add_argument("--out", default=None, help="output folder (default results/slo/<date>/batch-<time>/)")
    args, overrides = parser.parse(argv)
    out_dir = resolve_out_dir(
        args.out, "batch", folder_files(["tpot_vs_batch"], ["tpot_vs_batch.png", "slo_batch.json"])
    )
    require(
        1 <= args.context_tokens <= MAX_CONTEXT_TOKENS,
        "--context-tokens",
        args.context_tokens,
        f"use an integer from 1 to {MAX_CONTEXT_TOKENS:,} (2**24, above any model's positions)",
    )
    require(
        args.max_batch is None or 1 <= args.max_batch <= MAX_BATCH,
        "--max-batch",
        args.max_batch,
        f"use an integer from 1 to {MAX_BATCH:,} (the table and the figure hold every batch up to it)",
    )

    from kvbench.app.run import setup

    cfg, choices = compose_checked(overrides)
    s = setup(cfg)  # checks slo.tpot_s like any run's: a positive number of seconds or null
    tpot_given = s.slo.tpot_s is not None
    tpot_slo_s = float(s.slo.tpot_s) if tpot_given else TPOT_SLO_DEFAULT_S
    require(
        math.isfinite(tpot_slo_s) and tpot_slo_s <= MAX_TPOT_S,
        "slo.tpot_s",
        tpot_slo_s,
        f"use a positive number of seconds, at most {MAX_TPOT_S:g} (a {MAX_TPOT_S:g} s token is no serving SLO)",
    )
    slo_text = fmt_seconds(tpot_slo_s)
    context_tokens = args.context_tokens
    if s.model.max_positions and context_tokens > s.model.max_positions:
        raise ConfigError(
            f"--context-tokens={context_tokens} is beyond the {s.model.max_positions} positions of "
            f"model {s.model.name}: use a shorter context or a longer-context model"
        )
    exact, b_slo = slo_batch(s.cost, context_tokens, tpot_slo_s)
    s_max_tokens = OmegaConf.select(cfg, "workload.s_max_tokens", default=None) or context_tokens
    b_mem, held_bytes = memory_ceiling(s.allocator, context_tokens, int(s_max_tokens))
    answer = BatchAnswer(
        context_tokens=context_tokens,
        tpot_slo_s=tpot_slo_s,
        weight_bytes=s.model.weight_bytes,
        hbm_bandwidth_bytes_per_s=s.hardware.hbm_bandwidth_bytes_per_s,
        decode_efficiency=s.cost.decode_efficiency,
        seq_kv_bytes=context_tokens * s.model.kv_bytes_per_token,
        exact_batch=exact,
        slo_batch=b_slo,
        memory_batch=b_mem,
        held_bytes_per_seq=held_bytes,
        budget_bytes=s.budget_bytes,
        max_num_seqs=int(s.scheduler.config.max_num_seqs),
    )
    max_batch = args.max_batch or min(MAX_BATCH, 1 << math.ceil(math.log2(max(8, 1.25 * max(b_slo + 1, b_mem)))))
    table = batch_table(s.cost, context_tokens, batches_to_show(answer, max_batch), answer)

    allocator = choices.get("allocator", s.allocator.name)
    what = f"{s.model.name} on {s.hardware.name}, allocator {allocator} (block {s.allocator.block_size_tokens}), kernel {s.kernel.name}"
    out = wide_console()
    out.print(f"kvbench slo-batch: {what}", highlight=False)
    out.print(
        f"decode-only batch, every sequence at {context_tokens} context tokens "
        f"(--context-tokens; default 640 = 512 + 128)",
        highlight=False,
    )
    source = f"slo.tpot_s={tpot_slo_s:g}" if tpot_given else f"slo.tpot_s not set: the lecture's {slo_text}"
    out.print(f"TPOT SLO {slo_text} ({source})", highlight=False)
    # a decode-only step has no prefill and no queue: the other SLOs bound nothing here
    ignored = [f"slo.{key}" for key in ("ttft_s", "e2e_s") if getattr(s.slo, key) is not None]
    if ignored:
        out.print(f"{' and '.join(ignored)}: not used (a decode-only batch has only a TPOT)", highlight=False)
    out.print(f"kernel decode efficiency {answer.decode_efficiency:.3f} ({s.efficiency.source})", highlight=False)
    # no vertical rules: the eight columns fit 100 (a pipe's width) without wrapping a cell
    rich_table = compact_table(
        f"TPOT versus batch: SLO {slo_text}",
        ("B", "KV read GB", "weights ms", "KV ms", "step (TPOT) ms", "tokens/s", "meets SLO?", "fits memory?"),
    )
    for row in table.itertuples():
        note = {b_slo: " ← SLO", b_mem: " ← memory"}.get(row.batch, "")
        rich_table.add_row(
            f"{row.batch:,}{note}",
            f"{row.kv_read_bytes / GB:.2f}",
            f"{row.weights_s * 1e3:.2f}",
            f"{row.kv_s * 1e3:.2f}",
            f"{row.tpot_s * 1e3:.2f}",
            f"{row.tokens_per_s:,.0f}",
            "yes" if row.meets_slo else "no",
            "yes" if row.fits_memory else "no",
        )
    out.print(rich_table)
    out.print(
        f"KV read per sequence per step: {context_tokens} tokens × {s.model.kv_bytes_per_token:,} B = "
        f"{answer.seq_kv_bytes / GB:.4f} GB; weights {answer.weight_bytes / GB:.3f} GB",
        highlight=False,
    )
    out.print(f"SLO: {arithmetic(answer)}", highlight=False)
    if b_slo == 0:
        out.print(
            f"     reading the weights alone takes {s.cost.decode_time_s(0) * 1e3:.2f} ms: no batch meets {slo_text}",
            highlight=False,
        )
    else:
        out.print(
            f"     check: TPOT({b_slo}) = {s.cost.decode_time_s(b_slo * context_tokens) * 1e3:.3f} ms <= "
            f"{slo_text} < TPOT({b_slo + 1}) = "
            f"{s.cost.decode_time_s((b_slo + 1) * context_tokens) * 1e3:.3f} ms",
            highlight=False,
        )
    if b_mem:
        out.print(
            f"memory: allocator {allocator} holds {b_mem:,} such sequences in the {s.budget_bytes / GB:.2f} GB KV "
            f"budget,\n        {held_bytes / GB:.4f} GB set aside for each (S_max {max(context_tokens, int(s_max_tokens))})",
            highlight=False,
        )
    else:
        out.print(f"memory: allocator {allocator} cannot hold one sequence of {context_tokens} tokens", highlight=False)
    others = ", ".join(f"{name} {value:,}" for name, value in answer.limits.items() if name not in answer.binding)
    out.print(
        f"[bold]binds: {' and '.join(answer.binding)}: the largest batch is B = {answer.batch:,}[/bold] ({others})",
        highlight=False,
    )

    title = f"{what}\nTPOT SLO {slo_text}: B = {b_slo} by the SLO, {b_mem} by memory"
    # JSON has no NaN: the bytes per sequence of an allocator that holds none is null
    fields = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(answer).items()}
    document = {
        **fields,
        "batch": answer.batch,
        "binding": answer.binding,
        "arithmetic": arithmetic(answer),
        "calibration": s.efficiency.source,
        "overrides": overrides,
    }
    fig = figure(s.cost, answer, max_batch, title)
    try:
        write_folder(out_dir, {"tpot_vs_batch": table}, {"tpot_vs_batch.png": fig}, {"slo_batch.json": document})
    finally:
        pyplot().close(fig)
    out.print(f"results: {out_dir}", highlight=False)
    return 0


def main() -> None:
    """Entry point for ``kvbench slo-batch`` (reads ``sys.argv[1:]``)."""
    run_cli(_main)


if __name__ == "__main__":
    main()
