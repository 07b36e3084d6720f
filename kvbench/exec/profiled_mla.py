"""Multi-head latent attention (MLA) and DeepSeek sparse attention (DSA) priced from measured tables.

Two ways the tables measure an MLA layer, and which framework has which:

- **Module tables** (``mla/<fw>/<ver>/mla_generation_module_perf`` and ``mla_context_module_perf``,
  vLLM and TRT-LLM): the whole attention block of one layer (the q/kv down- and up-projections,
  the absorbed BMMs, the attention kernel and the output projection) timed together, by batch
  size and context length (``step``) for decode and by prompt length (``isl``) for prefill, at
  ``num_heads`` per GPU, the projections' GEMM dtype (``gemm_type``) and the KV dtype. They were
  measured on DeepSeek-V3's projection shapes (hidden 7168, q_lora 1536, kv_lora 512, rope 64,
  nope 128, v 128), so they price a model with those dimensions (DeepSeek-V3/R1, Kimi-K2.5) and
  nothing else. Sparse attention is measured the same way
  (``sparse_attention/<fw>/<ver>/dsa_generation_module_perf`` and ``dsa_context_module_perf``,
  the indexer and its top-k included) per model (DeepSeek-V3.2, GLM-5).
- **Kernel tables** (SGLang: ``generation_mla_perf`` and ``context_mla_perf``, the attention
  kernel alone, by the same axes): kvbench adds the projection GEMMs from the GEMM table and, for
  decode, the two absorbed BMMs from ``mla_bmm/<fw>/<ver>/mla_bmm_perf`` (``mla_gen_pre``: q_nope
  times W_UK, ``mla_gen_post``: the latent output times W_UV, by tokens and heads per GPU).

The grids are :class:`kvbench.exec.profiled.DecodeAttentionGrid` and
:class:`~kvbench.exec.profiled.PrefillAttentionCurve` over these rows, so decode and prefill
interpolate and extrapolate (counted) as dense attention does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd

from kvbench.errors import ConfigError
from kvbench.specs import profiles

#: DeepSeek-V3's MLA projection shapes, on which the module tables were measured
MODULE_SHAPE = dict(
    hidden_size=7168, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128
)

#: the attention kernel each framework runs by default, in order of preference, where a table
#: measured several (another measured kernel is taken only when none of these is)
PREFERRED_MLA_KERNELS = (
    "FLASHMLA",
    "FLASHINFER_MLA",
    "default",
    "flash_attention",
    "trtllm_mla",
    "FLASH_ATTN_MLA",
    "FLASH_ATTN",
    "FLASHMLA_SPARSE",
    "sglang_dsa_indexer_flashmla_kv",
    "sglang_dsa_indexer_fa3",
    "sglang_dsa_indexer_trtllm",
)


@dataclass(frozen=True)
class MLARows:
    """The decode and prefill rows of one MLA (or DSA) layer on one GPU, and what they include."""

    label: str
    decode: object  #: pandas DataFrame with batch_size, step, latency (ms)
    prefill: object  #: pandas DataFrame with batch_size, isl, latency (ms)
    #: True when the rows time the whole attention block (projections and BMMs included)
    includes_projections: bool


def _pick_kernel(frame) -> str:
    present = frame["kernel_source"].value_counts()
    for source in PREFERRED_MLA_KERNELS:
        if source in present.index:
            return source
    return sorted(present.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


def _pick_prefill_kernel(frame) -> str:
    """The prefill kernel: of the kernels that measured the longest prompts at this shape, the one
    :func:`_pick_kernel` prefers. A module table also names the decode kernel on its shortest
    prompts (vLLM runs a query of up to a few hundred tokens through the decode backend: FLASHMLA to
    isl 128, FLASH_ATTN_MLA to 512 on Hopper, FLASHINFER_MLA at isl 1 on Blackwell) and SGLang's
    dense-MHA path below the indexer's top-k (to isl 2048); priced from those rows a real prompt
    would be extrapolated at every length, so the kernel measured over full prompts is taken
    (vLLM's prefill backend: FLASH_ATTN, or TRTLLM_RAGGED for an FP8 prefill)."""
    longest = frame.groupby("kernel_source")["isl"].max()
    return _pick_kernel(frame[frame["kernel_source"].isin(longest[longest == longest.max()].index)])


def _prefill_rows(frame):
    """The prefill kernel's rows (:func:`_pick_prefill_kernel`) and, below its shortest measured
    prompt, the rows of the kernel the framework runs there (SGLang's dense MHA up to the indexer's
    top-k, vLLM's decode backend for short queries), with the name of what was read."""
    main = _pick_prefill_kernel(frame)
    rows = frame[frame["kernel_source"] == main]
    shortest = int(rows["isl"].min())
    below = frame[(frame["kernel_source"] != main) & (frame["isl"] < shortest)]
    if below.empty:
        return rows, main
    other = _pick_kernel(below)
    return pd.concat([below[below["kernel_source"] == other], rows]), f"{main} ({other} below isl {shortest})"


def _filter(frame, **columns):
    for column, value in columns.items():
        if column in frame.columns:
            frame = frame[frame[column] == value]
    return frame


def _refuse(where: str, what: str, frame, asked: dict) -> ConfigError:
    """One line naming what the table measured for the first column that ruled every row out."""
    rows = frame
    for column, value in asked.items():
        if column not in rows.columns:
            continue
        kept = rows[rows[column] == value]
        if kept.empty:
            measured = sorted({str(v) for v in rows[column].unique()})
            hint = f" ({profiles.INSTALL_HINT} for the full tables)" if profiles.table_root().excerpt else ""
            return ConfigError(f"{where} has no {what} for {column}={value}: measured {', '.join(measured)}{hint}")
        rows = kept
    return ConfigError(f"{where} has no {what} for {asked}")


#: the sparse-attention (DSA) architectures the module tables measured (their ``architecture``
#: column), by the attention shapes of their config.json (values from the published configs of
#: zai-org/GLM-5 and deepseek-ai/DeepSeek-V3.2; every GLM-5.x checkpoint, FP8 and NVFP4 included,
#: has GLM-5's values), with the checkpoint read first where several were measured
DSA_ARCHITECTURES = {
    "GlmMoeDsaForCausalLM": (
        dict(
            hidden_size=6144,
            q_lora_rank=2048,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=192,
            v_head_dim=256,
            index_head_dim=128,
            index_n_heads=32,
            index_topk=2048,
        ),
        "zai-org/GLM-5",
    ),
    "DeepseekV32ForCausalLM": (
        dict(
            hidden_size=7168,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            index_head_dim=128,
            index_n_heads=64,
            index_topk=2048,
        ),
        "deepseek-ai/DeepSeek-V3.2",
    ),
}


def dsa_architecture(mla, indexer, hidden_size: int) -> str:
    """The measured DSA architecture whose attention has this model's shapes (one-line ConfigError
    naming the measured ones otherwise): the module tables are chosen by shape, not by repo id."""
    asked = {**dataclasses.asdict(mla), **dataclasses.asdict(indexer), "hidden_size": hidden_size}
    for architecture, (shape, _) in DSA_ARCHITECTURES.items():
        if all(asked.get(k) == v for k, v in shape.items()):
            return architecture
    measured = "; ".join(f"{a}: {shape}" for a, (shape, _) in DSA_ARCHITECTURES.items())
    raise ConfigError(f"no sparse-attention module table measured this attention ({asked}): measured {measured}")


def _model_order(frame, canonical: str | None) -> list:
    """The checkpoints a table measured, the canonical one first, then the same family's (its repo
    id's stem: zai-org/GLM-5-FP8 after zai-org/GLM-5), then the rest by name."""
    ids = sorted(str(m) for m in frame["model"].unique())
    stem = (canonical or "").split("/")[-1]
    return sorted(ids, key=lambda m: (m != canonical, not m.split("/")[-1].startswith(stem), m))


def module_matches(mla) -> bool:
    """Whether an MLA shape is the one the module tables measured (DeepSeek-V3's projections)."""
    return all(getattr(mla, k, None) == v for k, v in MODULE_SHAPE.items() if k != "hidden_size")


def select_module(
    system: str,
    framework: str,
    op: str,
    tables: tuple[str, str],
    *,
    heads_per_gpu: int,
    gemm_type: str,
    kv_dtype: str,
    architecture: str | None = None,
) -> MLARows | None:
    """Module rows (``op`` = ``mla`` or ``sparse_attention``) at this shape, None when the framework
    has no module table on this GPU; a one-line ConfigError for a shape or precision not measured.

    A sparse-attention table (``architecture`` given) is read by the architecture's rows: of the
    newest version that measured it, the canonical checkpoint's rows at this precision, else those
    of another checkpoint of the same architecture (the same attention shapes: GLM-5-FP8's stand in
    for GLM-5's where only the FP8 checkpoint was measured with block-scaled GEMMs). NVFP4
    checkpoints keep attention in bf16 (their quantization config ignores every ``self_attn``), so
    an nvfp4 model's module is the NVFP4 checkpoint's rows at ``gemm_type=bfloat16`` where the
    table has no nvfp4 rows. The label names a checkpoint that stands in."""
    gen_table, ctx_table = tables
    versions = [
        v
        for v in profiles.versions(system, op, framework, gen_table)
        if v in profiles.versions(system, op, framework, ctx_table)
    ]
    if not versions:
        return None
    error = None
    for version in reversed(versions):
        try:
            return _select_module_version(
                system, framework, op, tables, version, heads_per_gpu, gemm_type, kv_dtype, architecture
            )
        except ConfigError as exc:  # the newest version's reason is the one reported
            error = error or exc
    raise error


def _select_module_version(
    system, framework, op, tables, version, heads_per_gpu, gemm_type, kv_dtype, architecture
) -> MLARows:
    where = f"{profiles.table_root().label} {system}/{op}/{framework}/{version}"
    frames = [profiles.read_table(system, op, framework, version, table) for table in tables]
    asked = dict(num_heads=heads_per_gpu, gemm_type=gemm_type, kv_cache_dtype=kv_dtype, mla_dtype="bfloat16")
    choices = [(None, asked)]
    canonical = None
    if architecture is not None and "model" in frames[0].columns:
        canonical = DSA_ARCHITECTURES[architecture][1]
        same = frames[0][frames[0]["architecture"] == architecture] if "architecture" in frames[0] else frames[0]
        ids = _model_order(same, canonical) or [canonical]
        choices = [(m, {"model": m, **asked}) for m in ids]
        if gemm_type == "nvfp4":
            choices += [(m, {"model": m, **asked, "gemm_type": "bfloat16"}) for m in ids if "NVFP4" in m]
    for model, columns in choices:
        found = [_filter(frame, **columns) for frame in frames]
        if all(not rows.empty for rows in found):
            break
    else:  # named by the first choice: the canonical checkpoint at the asked precision
        model, columns = choices[0]
        table, frame = next((t, f) for t, f in zip(tables, frames) if _filter(f, **columns).empty)
        raise _refuse(where, f"{table} rows", frame, columns)
    decode, prefill = found
    decode = decode[decode["kernel_source"] == _pick_kernel(decode)]
    if "step" in prefill.columns:  # DSA context rows also time prompts after a cached prefix (step)
        prefill = prefill[prefill["step"] == prefill["step"].min()]  # a whole prompt: no prefix
    prefill, prefill_name = _prefill_rows(prefill)
    label = f"{op} module {decode['kernel_source'].iloc[0]}/{prefill_name} {columns['gemm_type']} {version}"
    if model is not None and model != canonical:
        label += f" ({model} stands in for {canonical}: the same {architecture} attention shapes)"
    return MLARows(label, decode, prefill, includes_projections=True)


def select_kernel_rows(system: str, framework: str, *, heads_per_gpu: int, kv_dtype: str) -> MLARows:
    """The MLA attention kernel's own rows (SGLang's tables): projections and BMMs priced apart."""
    version = profiles.newest_version(system, "mla", framework, "generation_mla_perf", "MLA attention")
    where = f"{profiles.table_root().label} {system}/mla/{framework}/{version}"
    frames = []
    for table in ("generation_mla_perf", "context_mla_perf"):
        frame = profiles.read_table(system, "mla", framework, version, table)
        asked = dict(num_heads=heads_per_gpu, kv_cache_dtype=kv_dtype, mla_dtype="bfloat16")
        rows = _filter(frame, **asked)
        if rows.empty:
            raise _refuse(where, f"{table} rows", frame, asked)
        # the same heads per GPU may be measured at several TP sizes: the smallest TP's
        rows = rows[rows["tp_size"] == rows["tp_size"].min()]
        frames.append(rows[rows["kernel_source"] == _pick_kernel(rows)])
    decode, prefill = frames
    return MLARows(f"mla {decode['kernel_source'].iloc[0]} {version}", decode, prefill, includes_projections=False)


def select_bmm(system: str, framework: str, *, heads_per_gpu: int, bmm_dtype: str):
    """The absorbed BMMs of MLA decode (pre: q_nope x W_UK, post: latent x W_UV), by tokens."""
    version = profiles.newest_version(system, "mla_bmm", framework, "mla_bmm_perf", "MLA BMMs")
    frame = profiles.read_table(system, "mla_bmm", framework, version, "mla_bmm_perf")
    where = f"{profiles.table_root().label} {system}/mla_bmm/{framework}/{version}"
    out = []
    for op_name in ("mla_gen_pre", "mla_gen_post"):
        asked = dict(op_name=op_name, bmm_dtype=bmm_dtype, num_heads=heads_per_gpu)
        rows = _filter(frame, **asked)
        if rows.empty:
            raise _refuse(where, "MLA BMM rows", frame, asked)
        out.append(rows)
    return out[0], out[1], f"mla_bmm {bmm_dtype} {version}"


def granular_gemm_shapes(mla, num_heads: int, hidden_size: int, tp: int) -> tuple[list, list]:
    """The projection GEMMs (n, k) per GPU that a kernel-table MLA layer adds, for decode (the
    kv up-projection absorbed into the BMMs) and for prefill (kv up-projection run as a GEMM)."""
    heads = num_heads // tp
    q_width = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    if mla.q_lora_rank:
        down = [
            (mla.q_lora_rank + mla.kv_lora_rank + mla.qk_rope_head_dim, hidden_size),
            (heads * q_width, mla.q_lora_rank),
        ]
    else:
        down = [(mla.kv_lora_rank + mla.qk_rope_head_dim, hidden_size), (heads * q_width, hidden_size)]
    out_proj = (hidden_size, heads * mla.v_head_dim)
    kv_up = (heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank)
    return [*down, out_proj], [*down, kv_up, out_proj]
