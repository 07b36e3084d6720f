"""The one catalogue of what a summary key means to a reader: one :class:`Metric` record per key.

Every view reads its words from here: the full list of a run's numbers
(:func:`kvbench.metrics.display.format_summary`), the comparison table's columns
(:mod:`kvbench.output.report`), the memory figure's ledger parts (:mod:`kvbench.output.figures`),
the vLLM names of ``summary.json`` (:mod:`kvbench.output.run_json`) and the studies' figures. A key
the catalogue lacks is still shown, under its own name, formatted by its unit suffix.

One formatting vocabulary (``show``): ``int`` (thousands separators), ``ms`` (seconds shown in
milliseconds), ``pct`` (a fraction in percent), ``bytes`` (decimal kB/MB/GB), ``text``, or a
format string (``"{:.3f}"``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.core.ledger import LEDGER_FIELDS
from kvbench.metrics.summary import PERCENTILES


@dataclass(frozen=True)
class Metric:
    key: str
    #: the words a list of a run's numbers shows, unit included: "TTFT p50 (ms)"
    label: str
    #: how a value is shown (the vocabulary above)
    show: str = "{}"
    #: a table's column header (lines, no unit) and the unit on its own line; None: not a column
    header: str | None = None
    header_unit: str | None = None
    #: how the line of values every job of a sweep shares says it ("{}" stands for value and unit)
    phrase: str | None = None
    #: which way is better: "lower", "higher" or None (neither: a setting, a count of events)
    better: str | None = None
    #: ``vllm bench serve``'s name of the same number, where it has one
    vllm: str | None = None
    #: the colour a figure draws it in (the memory ledger's parts)
    colour: str | None = None
    #: a shorter name for a figure's legend, where the label is too long
    legend: str | None = None


#: the memory ledger's parts: (field, legend, colour), in LEDGER_FIELDS order
_LEDGER_PARTS = {
    "token_bytes": ("token states", "#2b8cbe"),
    "reserved_future_bytes": ("reserved (future tokens)", "#a6bddb"),
    "internal_bytes": ("internal fragmentation", "#e34a33"),
    "external_bytes": ("external fragmentation", "#fdbb84"),
    "free_bytes": ("free", "#f0f0f0"),
    "cached_bytes": ("cached prefix blocks (evictable)", "#74c476"),
    "state_bytes": ("per-request state (linear attention)", "#756bb1"),
}
assert tuple(_LEDGER_PARTS) == LEDGER_FIELDS, "every ledger part needs its words and colour here"


def _ledger_metrics() -> list[Metric]:
    short = {
        "internal_bytes": "int.\nfrag.",
        "external_bytes": "ext.\nfrag.",
        "cached_bytes": "cached",
        "state_bytes": "state",
    }
    phrase = {"cached_bytes": "cached prefix blocks {}"}
    out = []
    for field, (legend, colour) in _LEDGER_PARTS.items():
        name = field.removesuffix("_bytes")
        out.append(
            Metric(
                f"frac_{name}",
                f"  {name.replace('_', ' ')} (% of budget)",
                "pct",
                short.get(field),
                "% KV" if field in short else None,
                phrase.get(field),
                colour=colour,
                legend=legend,
            )
        )
    return out


def _percentiles(prefix: str, words: str, header: str, vllm: str) -> list[Metric]:
    return [
        Metric(
            f"{prefix}_p{p}_s",
            f"{words} p{p} (ms)",
            "ms",
            f"{header}\np{p}" if p in (50, 99) else None,
            "ms" if p in (50, 99) else None,
            better="lower",
            vllm=f"{'median' if p == 50 else f'p{p}'}_{vllm}_ms",
        )
        for p in PERCENTILES
    ]


#: what a sweep's jobs ran with: shown once when every job shares it, as a column where it differs
SETTINGS = (
    Metric("model", "model", "text", "model", phrase="{}"),
    Metric("hardware", "hardware", "text", "hardware", phrase="on {}"),
    Metric("kv_budget_bytes", "KV budget", "bytes", "KV budget"),
    Metric("workload", "workload", "text", "workload"),
    Metric("allocator", "allocator", "text", "allocator"),
    Metric("block_size_tokens", "block size (tokens)", "{:d}", "block", "tokens"),
    Metric("kernel", "kernel", "text", "kernel"),
    Metric("calibration", "calibration", "text", "calibration", phrase="({})"),
    Metric("engine", "engine preset", "text", "engine"),
    Metric("scheduler", "scheduler", "text", "scheduler"),
    Metric("preemption", "preemption", "text", "preemption"),
    Metric("victim", "victim", "text", "victim"),
    Metric("slo", "SLO", "text", "SLO"),
    Metric("seed", "seed", "{:d}", "seed"),
    Metric("mode", "mode", "text", "mode"),
)

#: a run's numbers in reading order (the full list shows them in this order)
METRICS = (
    Metric("num_requests", "requests", "int", vllm="num_prompts"),
    Metric("num_finished", "finished requests", "int", vllm="completed"),
    Metric("duration_s", "duration (s)", "{:.3f}", vllm="duration"),
    Metric(
        "throughput_tokens_per_s",
        "throughput (output tokens/s)",
        "{:,.0f}",
        "output",
        "tok/s",
        better="higher",
        vllm="output_throughput",
    ),
    Metric(
        "throughput_requests_per_s",
        "throughput (requests/s)",
        "{:,.2f}",
        "rate",
        "req/s",
        "request rate {}",
        better="higher",
        vllm="request_throughput",
    ),
    Metric(
        "goodput_requests_per_s",
        "goodput, vLLM's (requests/s meeting all SLOs)",
        "{:,.2f}",
        "goodput",
        "req/s",
        better="higher",
        vllm="request_goodput",
    ),
    Metric("slo_attainment", "SLO attainment (% of finished requests)", "pct", better="higher"),
    *_percentiles("ttft", "TTFT", "TTFT", "ttft"),
    Metric("ttft_mean_s", "TTFT mean (ms)", "ms", better="lower", vllm="mean_ttft_ms"),
    Metric("sched_delay_mean_s", "  scheduling delay mean (ms)", "ms", better="lower"),
    Metric("queue_mean_s", "  queueing mean (ms)", "ms", better="lower"),
    Metric("prefill_mean_s", "  prefill step mean (ms)", "ms", better="lower"),
    *_percentiles("tpot", "TPOT", "TPOT", "tpot"),
    *_percentiles("e2e", "end-to-end", "E2E", "e2el"),
    Metric("peak_concurrency", "peak concurrency (sequences)", "int", "peak", "seqs"),
    Metric("mean_concurrency", "mean concurrency (sequences)", "{:.1f}", better="higher"),
    Metric(
        "min_concurrency_saturated",
        "fewest sequences when saturated (sustained floor)",
        "int",
        "floor\n(sat.)",
        "seqs",
        better="higher",
    ),
    Metric(
        "mean_concurrency_saturated",
        "mean concurrency when saturated (sequences)",
        "{:,.1f}",
        "mean\n(sat.)",
        "seqs",
        better="higher",
    ),
    Metric(
        "utilization_saturated",
        "KV utilization when saturated (% of budget)",
        "pct",
        "util.\n(sat.)",
        "% KV",
        better="higher",
    ),
    Metric("utilization_mean", "KV utilization mean (% of budget)", "pct", "util.", "% KV", better="higher"),
    Metric("block_utilization_saturated", "KV blocks allocated when saturated, a server's gauge (% of budget)", "pct"),
    # the block-granular figure a server's usage gauge shows, beside the token slots of "util."
    Metric(
        "block_utilization_mean",
        "KV blocks allocated mean, a server's gauge (% of budget)",
        "pct",
        "blocks\nalloc.",
        "% KV",
    ),
    Metric("saturated_s", "time saturated (s)", "{:.3f}"),
    Metric("breakdown_period", "memory breakdown over steps", "text"),
    *_ledger_metrics(),
    Metric(
        "mean_tail_waste_tokens_per_seq",
        "mean tail waste (tokens/sequence)",
        "{:,.1f}",
        "unfilled\n/seq",
        "tokens",
        better="lower",
    ),
    Metric("num_preemptions", "preemptions", "int", "pre-\nempt.", "count", "preemptions {}", better="lower"),
    Metric("num_recompute_preemptions", "  by recompute", "int"),
    Metric("num_swap_preemptions", "  by swap", "int", "by\nswap", "count", "preemptions by swap {}"),
    Metric(
        "num_swap_fallbacks",
        "  swaps recomputed for lack of host memory",
        "int",
        "swap\nfallb.",
        "count",
        "swaps recomputed for lack of host memory {}",
    ),
    Metric(
        "recompute_tax",
        "recompute tax (% of tokens computed)",
        "pct",
        "re-\ncomp.\ntax",
        "% tok.",
        "recompute tax {}",
        better="lower",
    ),
    Metric(
        "preemption_cost_s",
        "preemption cost: swap transfers + recompute (s)",
        "{:,.2f}",
        "pre-\nempt.\ncost",
        "s",
        "preemption cost {}",
        better="lower",
    ),
    Metric("swap_out_bytes", "swapped out", "bytes"),
    Metric("swap_pool_peak_bytes", "host swap pool peak", "bytes"),
    Metric("swap_break_even_kv_tokens", "swap beats recompute above (KV tokens)", "{:,.0f}"),
    Metric("num_copies", "copy-on-write / fork copies", "int"),
    # a model with sliding-window layers under allocator=paged (hybrid KV groups); absent for the others
    Metric("num_kv_groups", "KV-cache groups (equal layers each)", "int"),
    Metric("num_window_groups", "of which sliding-window groups", "int"),
    Metric("sliding_window_tokens", "sliding window (tokens)", "int"),
    Metric("kv_page_bytes", "one block of one KV-cache group", "bytes"),
    Metric("window_slid_bytes", "KV that slid out of a window (not kept)", "bytes"),
    Metric("frac_full_group", "held by full-attention groups (of the KV budget)", "pct"),
    Metric("frac_window_group", "held by sliding-window groups (of the KV budget)", "pct"),
    # a model with linear-attention layers under allocator=paged: their states' groups
    Metric("num_state_groups", "of which linear-attention state groups", "int"),
    Metric("state_blocks_per_request", "blocks one request's state takes (all state groups)", "int"),
    Metric("frac_state_group", "held by linear-attention state groups (of the KV budget)", "pct"),
    # what the budget held by layer kind, each at its peak (kvbench.metrics.kv_kinds); absent for a
    # model of plain full-attention layers alone
    Metric("peak_latent_bytes", "MLA latents held, peak", "bytes", "latent\npeak"),
    Metric("peak_indexer_bytes", "sparse-attention indexer keys held, peak", "bytes", "indexer\npeak"),
    Metric("peak_full_bytes", "full-attention KV held, peak", "bytes", "full KV\npeak"),
    Metric("peak_window_bytes", "sliding-window KV held, peak", "bytes", "window\nKV peak"),
    Metric("peak_state_bytes", "linear-attention state held, peak", "bytes", "state\npeak"),
    # an allocator that maps physical pages on demand (vAttention); absent for the others
    Metric("pages_mapped", "pages mapped (one layer's K or V each)", "int", "pages\nmapped", "count"),
    Metric("page_map_s", "time mapping pages, overlapped or not (s)", "{:,.3f}"),
    Metric("page_map_added_s", "time page mapping added to the steps (s)", "{:,.3f}", better="lower"),
    Metric(
        "page_map_added_share",
        "page mapping's share of the run's step time",
        "pct",
        "page\nmap\nshare",
        "% time",
        "page mapping {} of step time",
        better="lower",
    ),
    Metric("peak_allocated_bytes", "KV allocated to sequences, peak", "bytes", "KV\nheld\npeak"),
    Metric(
        "peak_shared_blocks",
        "blocks shared by 2+ sequences, peak (fan-out, prefix hits)",
        "int",
        "shared\nblocks\npeak",
        "count",
    ),
    Metric(
        "peak_unshared_bytes",
        "KV the same sequences would hold with nothing shared, peak",
        "bytes",
        "KV w/o\nsharing\npeak",
    ),
    Metric(
        "sharing_saving",
        "sharing saving: KV without / with sharing, at the peaks (x)",
        "{:,.2f}",
        "shar-\ning\nsaves",
        "x",
        "sharing saves {}",
        better="higher",
    ),
    Metric(
        "prefix_hit_rate",
        "prefix cache hit rate (% of admitted prompt tokens)",
        "pct",
        "prefix\nhits",
        "% tok.",
        "prefix-cache hits {}",
        better="higher",
    ),
    Metric("prefix_cached_prompt_tokens", "prompt tokens served from the prefix cache", "int"),
    Metric(
        "prefix_recompute_cached_tokens", "tokens served from cache on re-admission after preemption (not hits)", "int"
    ),
    Metric(
        "prefix_hit_rate_infinite",
        "prefix hit rate ceiling, infinite cache (% of prompt tokens)",
        "pct",
        "ceil-\ning",
        "% tok.",
        "prefix-cache ceiling {}",
        legend="ceiling (infinite cache)",
    ),
    Metric(
        "prefix_hit_rate_belady",
        "prefix hit rate, Belady's optimal eviction, offline (% of prompt tokens)",
        "pct",
        "Belady",
        "% tok.",
        "Belady bound {}",
        legend="Belady (optimal eviction)",
    ),
    Metric(
        "prefix_hit_rate_lru_offline",
        "prefix hit rate, LRU, offline (% of prompt tokens)",
        "pct",
        legend="LRU (offline model)",
    ),
    Metric("prefix_note", "prefix cache note", "text"),
    # the host tier for evicted prefix blocks (allocator.host_cache_bytes > 0 only)
    Metric("host_cache_bytes", "host tier for evicted prefix blocks", "bytes", "host\ntier", phrase="host tier {}"),
    Metric("host_reload", "host tier reloads", "text", phrase="{} reloads"),
    Metric(
        "prefix_hit_rate_gpu",
        "  prefix hits found in GPU memory (% of admitted prompt tokens)",
        "pct",
        "GPU\nhits",
        "% tok.",
        better="higher",
    ),
    Metric(
        "prefix_hit_rate_host",
        "  prefix hits reloaded from host memory (% of admitted prompt tokens)",
        "pct",
        "host\nhits",
        "% tok.",
        better="higher",
    ),
    Metric("num_host_reloads", "host tier reloads (requests)", "int"),
    Metric("host_reload_bytes", "reloaded host -> device", "bytes"),
    Metric("host_offload_bytes", "offloaded device -> host (evicted blocks, overlapped)", "bytes"),
    Metric("host_reload_s", "host reloads' time on the link (s)", "{:,.3f}", "reload\nlink", "s", better="lower"),
    Metric(
        "host_reload_wait_s",
        "  requests' wait for overlapped reloads (s)",
        "{:,.3f}",
        "reload\nwait",
        "s",
        better="lower",
    ),
    Metric("host_reload_step_s", "  time blocking reloads added to steps (s)", "{:,.3f}", better="lower"),
    Metric("host_link_queue_s", "  reloads queued behind others on the link (s)", "{:,.3f}", better="lower"),
    Metric("num_host_evicted_blocks", "blocks evicted from the host tier", "int"),
    Metric("host_peak_bytes", "host tier peak", "bytes"),
    Metric(
        "prefix_hit_rate_lru_offline_with_host",
        "prefix hit rate, LRU, offline, GPU + host capacity (% of prompt tokens)",
        "pct",
        legend="LRU, GPU + host (offline model)",
    ),
    Metric(
        "prefix_hit_rate_belady_with_host",
        "prefix hit rate, Belady, offline, GPU + host capacity (% of prompt tokens)",
        "pct",
        "Belady\n+host",
        "% tok.",
        "Belady bound with the host tier {}",
        legend="Belady, GPU + host (optimal eviction)",
    ),
)

#: the summary's other numbers: what a run's full list shows under their keys (after the list
#: above) and ``kvbench compare``, which lists every numeric key, names in these words
DETAILS = (
    Metric("num_output_tokens", "output tokens", "int"),
    Metric("num_never_admitted", "requests never admitted", "int"),
    Metric("num_steps", "engine steps", "int"),
    Metric("tpot_mean_s", "TPOT mean (ms)", "ms", better="lower"),
    Metric("e2e_mean_s", "end-to-end mean (ms)", "ms", better="lower"),
    Metric("prefill_compute_mean_s", "prefill compute mean (ms)", "ms", better="lower"),
    Metric("num_computed_tokens", "tokens computed, recomputations included", "int"),
    Metric("num_recomputed_tokens", "tokens recomputed after a preemption", "int", better="lower"),
    Metric("max_concurrency", "closed-loop client's requests in flight (setting)", "int"),
    Metric("mean_requests_in_flight", "requests in flight, mean (closed loop)", "{:,.1f}"),
    Metric("saturated_fraction", "time saturated (% of duration)", "pct"),
    Metric("mean_tail_waste_bytes_per_seq", "mean tail waste (bytes/sequence)", "{:,.0f}", better="lower"),
    Metric("peak_token_bytes", "KV holding tokens, peak", "bytes"),
    Metric("kv_read_bytes_per_s", "KV read bandwidth achieved (bytes/s)", "{:,.0f}"),
    Metric("prefill_s", "step time prefilling (s)", "{:,.3f}"),
    Metric("decode_s", "step time decoding (s)", "{:,.3f}"),
    Metric("swap_s", "step time swapping (s)", "{:,.3f}", better="lower"),
    Metric("recompute_s", "step time recomputing (s)", "{:,.3f}", better="lower"),
    Metric("copy_s", "step time copying blocks (s)", "{:,.3f}", better="lower"),
    Metric("swap_in_bytes", "swapped in", "bytes"),
    Metric("copy_bytes", "copied by copy-on-write / fork", "bytes"),
    Metric("num_refusal_steps", "admission refusals (steps a queue head waited)", "int"),
    Metric("num_fragmentation_refusals", "admission refusals for fragmentation (steps)", "int", better="lower"),
    Metric("num_requests_refused_by_fragmentation", "requests refused for fragmentation", "int", better="lower"),
    Metric("kv_bytes_per_token", "KV per token, all layers (bytes)", "int"),
    Metric("weight_bytes", "model weights", "bytes"),
    Metric("attention_dp_ranks", "attention data-parallel ranks (each row is one rank's)", "int"),
    Metric("decode_efficiency", "decode efficiency (fraction of HBM bandwidth)", "{:.3f}"),
    Metric("prefill_flops_efficiency", "prefill efficiency (fraction of dense FLOP/s)", "{:.3f}"),
    Metric("step_overhead_s", "per-step overhead (ms)", "ms"),
    Metric("profile_extrapolated_lookups", "profiled-clock lookups outside the measured grid", "int"),
    Metric("num_trace_rows_read", "trace rows read", "int"),
    Metric("num_trace_requests_dropped", "trace requests dropped (too long)", "int"),
    Metric("num_trace_requests_clipped", "trace requests clipped (too long)", "int"),
    Metric("loop_wall_s", "the whole loop's wall-clock time, requests made and rows written (ms)", "ms"),
    Metric("sim_wall_s", "simulation's wall-clock time (ms)", "ms"),
    Metric("simulated_requests_per_wall_s", "simulated requests per wall-clock second", "{:,.0f}", better="higher"),
)

#: every record by its key
BY_KEY: dict[str, Metric] = {m.key: m for m in (*SETTINGS, *METRICS, *DETAILS)}
assert len(BY_KEY) == len(SETTINGS) + len(METRICS) + len(DETAILS), "a key is catalogued twice"


def metric(key: str) -> Metric:
    """The record of ``key`` (a KeyError names a key a view asks for that the catalogue lacks)."""
    return BY_KEY[key]


def ledger_parts() -> list[Metric]:
    """The memory ledger's parts, in :data:`LEDGER_FIELDS` order (``frac_<part>`` records)."""
    return [BY_KEY[f"frac_{field.removesuffix('_bytes')}"] for field in LEDGER_FIELDS]
