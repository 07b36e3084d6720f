"""``kvbench slo-batch``: the largest decode-only batch whose TPOT meets an SLO, by the cost
model's arithmetic (:mod:`kvbench.slo.batch`), beside the memory ceiling of the run's allocator."""

from __future__ import annotations

import math
from dataclasses import asdict

from omegaconf import OmegaConf
from rich.table import Table

from kvbench.commands.common import Parser, compose_checked, resolve_out_dir, run_cli
from kvbench.errors import ConfigError, require
from kvbench.output.figures import pyplot
from kvbench.output.report import wide_console
from kvbench.slo.batch import (
    GB,
    MAX_BATCH,
    MAX_CONTEXT_TOKENS,
    MAX_TPOT_MS,
    BatchAnswer,
    arithmetic,
    batch_table,
    batches_to_show,
    figure,
    memory_ceiling,
    slo_batch,
)
from kvbench.slo.common import write_folder


def _main(argv: list[str]) -> int:
    parser = Parser(
        "kvbench slo-batch",
        "The largest decode-only batch whose TPOT meets an SLO, by the "
        "cost model's arithmetic, beside the memory ceiling of the run's allocator.",
    )
    parser.add_argument("--tpot-ms", type=float, default=20.0, help="the TPOT SLO in ms (default 20)")
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
    out_dir = resolve_out_dir(args.out, "batch")
    require(
        math.isfinite(args.tpot_ms) and 0 < args.tpot_ms <= MAX_TPOT_MS,
        "--tpot-ms",
        args.tpot_ms,
        f"use a positive number of milliseconds, at most {MAX_TPOT_MS:,} (a {MAX_TPOT_MS // 1000:g} s token)",
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
    s = setup(cfg)
    context_tokens, tpot_slo_s = args.context_tokens, args.tpot_ms / 1e3
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
        f"decode-only batch, every sequence holding {context_tokens} context tokens "
        f"(--context-tokens; default 640, the lecture's 512 + 128)",
        highlight=False,
    )
    out.print(f"kernel decode efficiency {answer.decode_efficiency:.3f} ({s.efficiency.source})", highlight=False)
    rich_table = Table(title=f"TPOT versus batch: SLO {args.tpot_ms:g} ms")
    for header in (
        "B",
        "KV read GB",
        "weights ms",
        "KV ms",
        "step (TPOT) ms",
        "tokens/s",
        "meets SLO?",
        "fits memory?",
    ):
        rich_table.add_column(header, justify="right")
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
            f"     reading the weights alone takes {s.cost.decode_time_s(0) * 1e3:.2f} ms: no batch meets "
            f"{args.tpot_ms:g} ms",
            highlight=False,
        )
    else:
        out.print(
            f"     check: TPOT({b_slo}) = {s.cost.decode_time_s(b_slo * context_tokens) * 1e3:.3f} ms <= "
            f"{args.tpot_ms:g} ms < TPOT({b_slo + 1}) = "
            f"{s.cost.decode_time_s((b_slo + 1) * context_tokens) * 1e3:.3f} ms",
            highlight=False,
        )
    if b_mem:
        out.print(
            f"memory: allocator {allocator} holds {b_mem:,} such sequences in the {s.budget_bytes / GB:.2f} GB KV "
            f"budget, {held_bytes / GB:.4f} GB set aside for each (S_max {max(context_tokens, int(s_max_tokens))})",
            highlight=False,
        )
    else:
        out.print(f"memory: allocator {allocator} cannot hold one sequence of {context_tokens} tokens", highlight=False)
    others = ", ".join(f"{name} {value:,}" for name, value in answer.limits.items() if name not in answer.binding)
    out.print(
        f"[bold]binds: {' and '.join(answer.binding)}: the largest batch is B = {answer.batch:,}[/bold] ({others})",
        highlight=False,
    )

    title = f"{what}\nTPOT SLO {args.tpot_ms:g} ms: B = {b_slo} by the SLO, {b_mem} by memory"
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
