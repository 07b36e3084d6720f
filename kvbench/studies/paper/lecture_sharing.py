"""§10.4 of the lecture: n completions off one prompt share the prompt's blocks (copy-on-write
fan-out). Its fan-out numbers come back in "Numbers worth memorizing" (:func:`fan_out_specs`)."""

from __future__ import annotations

from kvbench.studies.paper.document import Section
from kvbench.studies.paper.lecture_numbers import GB, KIB, Numbers, fan_out_overrides, in_gb
from kvbench.studies.paper.lecture_rows import Measured, Spec, as_is, from_run, ratio, section
from kvbench.studies.paper.lecture_setup import LONG, blocks_for, fits_fan_out


def s10_4(n: Numbers) -> Section:
    prompt_blocks = 2000 / n.block
    system_prompt = Spec(
        "system_prompt_blocks",
        "blocks of a shared 2,000-token system prompt",
        "blocks",
        "125",
        f"2,000 / {n.block} = {prompt_blocks:g}",
        prompt_blocks,
    )
    return section(
        "§10.4 Sharing: copy-on-write fan-out",
        "§10.4",
        "n completions off one prompt share the prompt's blocks (run with one request, all at t = 0).",
        [*fan_out_specs(n, "s10_4"), system_prompt],
    )


def _fan_out(n: Numbers, branches: int, prompt: int, output: int) -> dict:
    """KV tokens and GB of ``branches`` completions off one prompt, without and with sharing."""
    unshared = branches * (prompt + output)
    shared = prompt + branches * output
    return {
        "unshared": unshared,
        "shared": shared,
        "ratio": unshared / shared,
        "unshared_gb": unshared * n.kv / GB,
        "shared_gb": shared * n.kv / GB,
    }


def fan_out_specs(n: Numbers, prefix: str) -> list[Spec]:
    """The fan-out numbers, keyed ``<prefix>_fanout...``; §10.4 (``s10_4``) also has the notes' GB."""
    return [*_fan_out_8(n, prefix), *_fan_out_16(n, prefix)]


def _fan_out_8(n: Numbers, prefix: str) -> list[Spec]:
    """8 completions of 256 tokens off a 4,096-token prompt, run paged and naive."""
    f8 = _fan_out(n, 8, 4096, 256)
    range8 = 4096 + 256  # the naive reservation per branch: prompt + output
    paged8 = fan_out_overrides(8, 4096, 256)
    naive8 = fan_out_overrides(8, 4096, 256, ["allocator=naive", f"allocator.s_max_tokens={range8}"])
    # paged before naive: the paper's runs table lists runs in the order they were first made
    rp = n.runs(paged8).summary
    n.runs(naive8)

    def allocated(overrides, convert):
        return from_run(n.runs, overrides, "peak_allocated_bytes", convert)

    specs = [
        Spec(
            f"{prefix}_fanout8_ratio",
            "sharing factor, n = 8 completions of 256 tokens off a 4,096-token prompt",
            "x",
            "5.7x",
            f"8 x (4,096 + 256) / (4,096 + 8 x 256) = {f8['unshared']:,} / {f8['shared']:,} = {f8['ratio']:.3f}",
            f8["ratio"],
            ratio(allocated(naive8, as_is), allocated(paged8, as_is)),
            sim_tol=1e-9,
            why=f"The run's ratio is the naive allocator's peak allocated bytes (a {range8:,}-token range per branch) "
            f"over the paged allocator's (the prompt's {blocks_for(4096, n.block)} blocks shared, "
            f"{blocks_for(256, n.block)} blocks per branch).",
        ),
        Spec(
            f"{prefix}_fanout8_unshared_tokens",
            "KV tokens without sharing, n = 8 off 4K",
            "tokens",
            "34,816",
            f"8 x (4,096 + 256) = {f8['unshared']:,}",
            f8["unshared"],
            allocated(naive8, lambda b: b / n.kv),
            sim_tol=0.0,
            why=f"The run reserves one {range8:,}-token range per branch (naive, S_max {range8:,}) and copies the "
            f"prompt into each: peak allocated bytes / {n.kv:,}.",
        ),
        Spec(
            f"{prefix}_fanout8_shared_tokens",
            "KV tokens with copy-on-write sharing, n = 8 off 4K",
            "tokens",
            "6,144",
            f"4,096 + 8 x 256 = {f8['shared']:,}",
            f8["shared"],
            allocated(paged8, lambda b: b / n.kv),
            sim_tol=0.0,
            why=f"Peak allocated bytes of the paged run / {n.kv:,} (whole blocks). Its peak token bytes are "
            f"{rp['peak_token_bytes'] / n.kv:,.0f} tokens: each branch's last emitted token is never fed back.",
        ),
    ]
    if prefix != "s10_4":
        return specs
    # the instructor notes give the same two in GB
    return [
        *specs,
        Spec(
            "fanout8_unshared_gb",
            "KV without sharing, n = 8 off 4K (instructor notes)",
            "GB",
            "17.9 GB",
            f"{f8['unshared']:,} x {n.kv:,} B = {f8['unshared_gb']:.2f} GB",
            f8["unshared_gb"],
            allocated(naive8, in_gb),
            sim_tol=0.0,
            why=f"{f8['unshared']:,} x {n.kv / KIB:g} KiB is {f8['unshared_gb']:.2f} GB "
            f"({f8['unshared'] * n.kv / 2**30:.1f} GiB; {f8['unshared'] * 512e3 / GB:.1f} GB with decimal KB): no "
            "reading of the units gives 17.9.",
        ),
        Spec(
            "fanout8_shared_gb",
            "KV with sharing, n = 8 off 4K (instructor notes)",
            "GB",
            "3.2 GB",
            f"{f8['shared']:,} x {n.kv:,} B = {f8['shared_gb']:.3f} GB",
            f8["shared_gb"],
            allocated(paged8, in_gb),
            sim_tol=0.0,
        ),
    ]


def _fan_out_16(n: Numbers, prefix: str) -> list[Spec]:
    """16 completions off an 8,192-token prompt: the unshared request does not fit the budget."""
    out16 = 512  # not printed by the lecture: the output length that gives its 73.0 GB
    f16 = _fan_out(n, 16, 8192, out16)
    paged16 = fan_out_overrides(16, 8192, out16)
    naive16 = ["allocator=naive", f"allocator.s_max_tokens={8192 + out16}", *LONG]
    fits = fits_fan_out(naive16, 8192, out16, 16)
    return [
        Spec(
            f"{prefix}_fanout16_unshared_gb",
            "KV without sharing, n = 16 off an 8K prompt (512-token outputs)",
            "GB",
            "73.0 GB",
            f"16 x (8,192 + 512) x {n.kv:,} B = {f16['unshared_gb']:.2f} GB",
            f16["unshared_gb"],
            why=f"The lecture does not print the output length; {out16} tokens is the one that gives its 73.0 GB.",
        ),
        Spec(
            f"{prefix}_fanout16_shared_gb",
            "KV with sharing, n = 16 off 8K",
            "GB",
            "8.6 GB",
            f"(8,192 + 16 x 512) x {n.kv:,} B = {f16['shared_gb']:.2f} GB",
            f16["shared_gb"],
            from_run(n.runs, paged16, "peak_allocated_bytes", in_gb),
            sim_tol=0.0,
        ),
        Spec(
            f"{prefix}_fanout16_ratio",
            "sharing factor, n = 16 off 8K",
            "x",
            "8.5x",
            f"{f16['unshared']:,} / {f16['shared']:,} = {f16['ratio']:.3f}",
            f16["ratio"],
        ),
        Spec(
            f"{prefix}_fanout16_unshared_fits",
            "unshared n = 16 off 8K does not fit the 62.5 GB budget",
            "",
            "unshared does not fit",
            f"{f16['unshared_gb']:.2f} GB > {n.budget / GB:g} GB",
            f16["unshared_gb"],
            Measured(
                None,
                f"Allocator.fits_in_empty on a fresh allocator of kvbench {' '.join(naive16)}, 16 branches off "
                "8,192 tokens",
            ),
            holds=(f16["unshared_gb"] * GB > n.budget) and not fits,
            why=f"kvbench's naive allocator refuses the request (fits_in_empty = {fits}).",
        ),
    ]
