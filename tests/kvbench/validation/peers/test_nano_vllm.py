"""kvbench.validation.peers.nano_vllm: nano-vllm's own scheduler, step by step, on cases worked by hand.

Every expected trace below follows nano-vllm's Scheduler.schedule/postprocess and BlockManager
(nanovllm/engine/scheduler.py and block_manager.py at upstream commit bb823b3) line by line; the
comments give the reasoning. Each case runs twice: through nano-vllm's own scheduler where it is
installed (skipped elsewhere with the one line that says how to get it), and through kvbench's
``engine=nano_vllm`` preset, which pins the same semantics on every machine, nano-vllm or not.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import types

import pytest

from kvbench.api import compose
from kvbench.validation.differential import prepare, run_kvbench
from kvbench.validation.peers import nano_vllm
from kvbench.validation.peers.types import PeerCaps, PeerRequest, PeerStep

REASON = nano_vllm.unavailable_reason()
needs_nano_vllm = pytest.mark.skipif(REASON is not None, reason=str(REASON))

BLOCK = 256  # the block size upstream nano-vllm takes (a multiple of 256)
STEP_S = 0.01
#: tiny-llama's KV bytes per token: K and V x 2 layers x 2 KV heads x 16 dims x 4 bytes (float32)
TINY_LLAMA_KV_BYTES_PER_TOKEN = 512

_fresh_token_ids = itertools.count(1000)


def request(rid: int, prompt_tokens: int, output_tokens: int, arrival_s: float = 0.0, token_ids=None) -> PeerRequest:
    """A request whose prompt shares no token with any other (unless token_ids says otherwise)."""
    if token_ids is None:
        token_ids = tuple(next(_fresh_token_ids) for _ in range(prompt_tokens))
    return PeerRequest(rid, prompt_tokens, output_tokens, arrival_s, tuple(token_ids))


def caps(num_blocks=16, max_num_seqs=8, max_num_batched_tokens=4096, block_size_tokens=BLOCK, **kwargs) -> PeerCaps:
    return PeerCaps(num_blocks, block_size_tokens, max_num_seqs, max_num_batched_tokens, step_s=STEP_S, **kwargs)


def step(scheduled, preempted=(), finished=()) -> PeerStep:
    return PeerStep(dict(scheduled), list(preempted), list(finished))


def case(name, requests, peer_caps, steps, blocks_used=None, *, kvbench=True, **options):
    """One hand-worked case: nano-vllm's trace (``steps``, and ``blocks_used`` after each step where
    given); ``kvbench``: whether kvbench's preset can express it (False: the reason); ``options``
    go to nano_vllm.run."""
    return pytest.param(requests, peer_caps, steps, blocks_used, kvbench, options, id=name)


PROMPT_600 = tuple(range(600))
PROMPT_512 = tuple(range(512))
CASES = [
    case("one_request", [request(0, 10, 1)], caps(), [step({0: 10}, finished=[0])], [0]),
    # Three running, max_num_seqs 2: the decode steps take the first two of the running queue
    # until they finish; the third, prefilled a step later, waits.
    case(
        "max_num_seqs_caps_each_step_not_the_running_set",
        [request(0, 10, 3), request(1, 10, 3), request(2, 10, 3)],
        caps(max_num_seqs=2),
        [
            step({0: 10, 1: 10}),  # the prefill loop stops at max_num_seqs
            step({2: 10}),  # a waiting request that fits is prefilled before any decode: now 3 running
            step({0: 1, 1: 1}),  # decodes: 0 and 1 only, 2 is running and left out
            step({0: 1, 1: 1}, finished=[0, 1]),  # the decoded ones go back to the front of running
            step({2: 1}),
            step({2: 1}, finished=[2]),
        ],
        [2, 3, 3, 1, 1, 0],
    ),
    # Budget 300: a 700-token prompt at the head is chunked 300, 300, 100 over three steps and
    # holds all its 3 blocks from the first; the short prompt behind it fits in the last step's rest.
    case(
        "only_the_first_prefill_of_a_step_is_chunked",
        [request(0, 700, 2), request(1, 50, 2)],
        caps(max_num_batched_tokens=300),
        [
            step({0: 300}),  # a partial chunk gets no token (postprocess skips it)
            step({0: 300}),
            step({0: 100, 1: 50}),
            step({0: 1, 1: 1}, finished=[0, 1]),
        ],
        [3, 3, 4, 0],
    ),
    case(
        "a_long_prompt_behind_another_waits_rather_than_filling_the_rest_of_the_budget",
        [request(0, 50, 2), request(1, 700, 2)],
        caps(max_num_batched_tokens=300),
        [
            step({0: 50}),  # 250 tokens left, but 1 is not first in the step: not chunked, not admitted
            step({1: 300}),
            step({1: 300}),
            step({1: 100}),  # 0 has been running since step 0: a step with a prefill has no decodes
            step({0: 1, 1: 1}, finished=[0, 1]),
        ],
    ),
    # Three requests with one 600-token prompt (2 full blocks and a partial one). 0 and 1 are
    # admitted in the same step: no block is hashed yet, so they share nothing. 2 arrives during
    # step 0 and is admitted at step 1: it finds both full blocks (the last block is never looked
    # up) and prefills the 88 tokens of its partial block.
    *(
        case(
            f"blocks_are_hashed_after_the_step_prefix_caching_{prefix_caching}",
            [
                request(0, 600, 2, 0.0, PROMPT_600),
                request(1, 600, 2, 0.0, PROMPT_600),
                request(2, 600, 2, 0.005, PROMPT_600),
            ],
            caps(prefix_caching=prefix_caching),
            [step({0: 600, 1: 600}), step({2: new_tokens}), step({0: 1, 1: 1, 2: 1}, finished=[0, 1, 2])],
            [6, blocks, 0],
            kvbench="shared prompts: a request_csv workload has none (and kvbench keys a block as it is scheduled)",
        )
        for prefix_caching, new_tokens, blocks in ((True, 88, 7), (False, 600, 9))
    ),
    # 512 tokens, 2 full blocks: only the first is looked up, so the second (256 tokens) is
    # prefilled again.
    case(
        "a_fully_cached_prompt_recomputes_its_last_block",
        [request(0, 512, 3, 0.0, PROMPT_512), request(1, 512, 1, 0.005, PROMPT_512)],
        caps(prefix_caching=True),
        [step({0: 512}), step({1: 256}, finished=[1]), step({0: 1}), step({0: 1}, finished=[0])],
        kvbench="shared prompts: a request_csv workload has none",
    ),
    # 4 blocks, three 256-token prompts (1 block each, every next token needs a new block). At the
    # first decode 0 takes the free block; 1 needs one more: the last of running (2) is preempted
    # and its block goes to 1. 2 waits at the head of the queue (it now needs 2 blocks for 257
    # tokens) until 0 and 1 finish, then prefills its prompt and its generated token again.
    case(
        "preemption_takes_the_last_of_running_and_puts_it_first_in_waiting",
        [request(0, 256, 3), request(1, 256, 3), request(2, 256, 3)],
        caps(num_blocks=4),
        [
            step({0: 256, 1: 256, 2: 256}),
            step({0: 1, 1: 1}, preempted=[2]),
            step({0: 1, 1: 1}, finished=[0, 1]),  # 2 does not fit, so the step decodes
            step({2: 257}),
            step({2: 1}, finished=[2]),
        ],
        [3, 4, 0, 2, 0],
    ),
    # 3 blocks, two 256-token prompts: at the first decode 0 takes the last free block; 1 has no
    # one behind it in running, so it preempts itself; its second token comes from the new prefill.
    case(
        "a_request_preempting_itself_when_it_is_the_last_running",
        [request(0, 256, 3), request(1, 256, 2)],
        caps(num_blocks=3),
        [step({0: 256, 1: 256}), step({0: 1}, preempted=[1]), step({0: 1}, finished=[0]), step({1: 257}, finished=[1])],
    ),
    # 5 blocks; 0 and 1 have 256-token prompts, 2 a 400-token one (2 blocks, the first full and
    # hashed after step 0). At the first decode 0 and 1 each need a block: 2 is preempted and frees
    # its partial block, then its full one (deallocate goes in reverse); 1 takes the partial one.
    # The full block keeps its hash while free, so 2's new prefill recomputes only 401 - 256 tokens.
    *(
        case(
            f"a_preempted_request_finds_its_own_freed_blocks_prefix_caching_{prefix_caching}",
            [request(0, 256, 3), request(1, 256, 3), request(2, 400, 3)],
            caps(num_blocks=5, prefix_caching=prefix_caching),
            [
                step({0: 256, 1: 256, 2: 400}),
                step({0: 1, 1: 1}, preempted=[2]),
                step({0: 1, 1: 1}, finished=[0, 1]),
                step({2: 145 if prefix_caching else 401}),
                step({2: 1}, finished=[2]),
            ],
        )
        for prefix_caching in (True, False)
    ),
    case(
        "arrivals_join_at_the_next_step_boundary_and_an_idle_engine_jumps_to_the_next",
        [request(0, 10, 3, 0.0), request(1, 10, 2, 0.015), request(2, 10, 1, 0.5)],
        caps(),
        [
            step({0: 10}),  # clock 0.00
            step({0: 1}),  # 0.01: 1 has not arrived
            step({1: 10}),  # 0.02: 1 joins and is prefilled; 0 waits
            step({0: 1, 1: 1}, finished=[0, 1]),  # 0.03
            step({2: 10}, finished=[2]),  # idle at 0.04: the clock jumps to 0.5 (no empty steps)
        ],
    ),
    # 16-token blocks (a size upstream's Config refuses: allow_any_block_size). A 16-token prompt
    # fills one block; the first decode (17 tokens) takes a second block and the next 15 decodes
    # fit in it; the prefill's token and 17 decodes make 18.
    case(
        "decode_takes_a_new_block_when_the_length_is_one_past_a_block",
        [request(0, 16, 18)],
        caps(num_blocks=4, block_size_tokens=16),
        [step({0: 16}), *[step({0: 1})] * 16, step({0: 1}, finished=[0])],
        [1, *[2] * 16, 0],
        allow_any_block_size=True,
    ),
    # chunked_prefill=False holds while nothing is chunked: a prompt of exactly the budget
    case(
        "chunked_prefill_off_holds_while_nothing_is_chunked",
        [request(0, 300, 2)],
        caps(max_num_batched_tokens=300, chunked_prefill=False),
        [step({0: 300}), step({0: 1}, finished=[0])],
        kvbench="kvbench refuses up front a request that a preemption would leave too long to prefill "
        "whole (300 + 2 tokens over a 300-token budget); nano-vllm fails only if it happens",
    ),
    # a long_prefill_token_threshold at or above the budget never binds
    case(
        "a_threshold_at_the_budget_never_binds",
        [request(0, 300, 2)],
        caps(max_num_batched_tokens=300, long_prefill_token_threshold=300),
        [step({0: 300}), step({0: 1}, finished=[0])],
    ),
]


@needs_nano_vllm
@pytest.mark.parametrize(("requests", "peer_caps", "steps", "blocks_used", "kvbench", "options"), CASES)
def test_nano_vllm_s_own_scheduler_gives_the_hand_worked_trace(
    requests, peer_caps, steps, blocks_used, kvbench, options
):
    trace = nano_vllm.run(requests, peer_caps, **options)
    assert trace.steps == steps
    if blocks_used is not None:
        assert trace.blocks_used == blocks_used


def kvbench_preset_trace(requests: list[PeerRequest], peer_caps: PeerCaps, tmp_path):
    """kvbench's ``engine=nano_vllm`` preset on the same requests and caps (tiny-llama, a KV budget
    of exactly ``num_blocks`` blocks), as ``kvbench diff-engine`` runs its side: no nano-vllm needed."""
    path = tmp_path / "requests.csv"
    rows = "".join(f"{r.arrival_s!r},{r.prompt_tokens},{r.output_tokens}\n" for r in requests)
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    budget_bytes = peer_caps.num_blocks * peer_caps.block_size_tokens * TINY_LLAMA_KV_BYTES_PER_TOKEN
    overrides = [
        "engine=nano_vllm",
        "model=tiny-llama",
        f"hardware.kv_budget_bytes={budget_bytes}",
        "workload=request_csv",
        f"workload.path={path}",
        f"allocator.block_size_tokens={peer_caps.block_size_tokens}",
        f"scheduler.max_num_seqs={peer_caps.max_num_seqs}",
        f"scheduler.max_num_batched_tokens={peer_caps.max_num_batched_tokens}",
        f"scheduler.long_prefill_token_threshold={peer_caps.long_prefill_token_threshold}",
        f"scheduler.head_only_chunking={str(peer_caps.chunked_prefill).lower()}",
    ]
    if peer_caps.prefix_caching:
        overrides += ["allocator=paged_cached", "allocator.cache_generated_blocks=true"]
    cfg, _ = compose(overrides)
    setup = prepare(cfg, STEP_S)
    assert setup.caps == peer_caps  # the composed config is the case's caps, nothing else
    return run_kvbench(setup)


@pytest.mark.parametrize(("requests", "peer_caps", "steps", "blocks_used", "kvbench", "options"), CASES)
def test_kvbench_s_nano_vllm_preset_gives_the_hand_worked_trace(
    requests, peer_caps, steps, blocks_used, kvbench, options, tmp_path
):
    if kvbench is not True:
        pytest.skip(f"kvbench's preset cannot express this case: {kvbench}")
    assert kvbench_preset_trace(requests, peer_caps, tmp_path).steps == steps


@needs_nano_vllm
def test_the_installed_nano_vllm_is_found_and_named():
    assert REASON is None
    upstream = nano_vllm.load()
    assert upstream.label.startswith("nano-vllm ")
    assert nano_vllm.run([request(0, 10, 1)], caps()).engine == upstream.label
    # loading ran none of nanovllm/__init__.py (which imports torch and flash-attn) and left no
    # nanovllm module behind
    assert not [name for name in sys.modules if name.partition(".")[0] == "nanovllm"]


@needs_nano_vllm
def test_the_block_size_class_attribute_is_put_back():
    sequence_cls = nano_vllm.load().Sequence
    small = caps(num_blocks=4, block_size_tokens=16)
    nano_vllm.run([request(0, 16, 2)], small, allow_any_block_size=True)
    assert sequence_cls.block_size == 256


@needs_nano_vllm
def test_a_prefill_that_would_chunk_refuses_chunked_prefill_off():
    with pytest.raises(ValueError, match="chunked request 0"):
        nano_vllm.run([request(0, 700, 2)], caps(max_num_batched_tokens=300, chunked_prefill=False))


@needs_nano_vllm
def test_max_steps():
    with pytest.raises(RuntimeError, match="after 3 steps"):
        nano_vllm.run([request(0, 10, 10)], caps(), max_steps=3)


@pytest.mark.parametrize(
    ("requests", "peer_caps", "message"),
    [
        ([request(0, 10, 1)], caps(policy="priority"), "first come, first served"),
        ([request(0, 10, 1)], caps(num_blocks=8, block_size_tokens=16), "allocator.block_size_tokens=256"),
        ([request(0, 10, 1)], caps(num_blocks=8, block_size_tokens=16), "--any-block-size"),
        ([request(0, 10, 1)], caps(long_prefill_token_threshold=512), "long_prefill_token_threshold"),
        ([request(0, 600, 1)], caps(num_blocks=2), "needs 3 blocks"),
        ([request(0, 10, 1), request(0, 10, 1)], caps(), "unique"),
        ([request(0, 10, 0)], caps(), "output_tokens >= 1"),
    ],
)
def test_caps_nano_vllm_cannot_honour_are_refused_before_it_loads(requests, peer_caps, message):
    """Checked against nano-vllm's rules before its scheduler is loaded: these hold without it."""
    with pytest.raises(ValueError, match=message):
        nano_vllm.run(requests, peer_caps)


def test_one_token_blocks_are_refused_even_when_any_size_is_allowed():
    with pytest.raises(ValueError, match="1-token blocks"):
        nano_vllm.run([request(0, 10, 2)], caps(num_blocks=64, block_size_tokens=1), allow_any_block_size=True)


def test_without_nano_vllm_one_line_says_how_to_get_it(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "nanovllm" else find_spec(name, *a)
    )
    reason = nano_vllm.unavailable_reason()
    assert reason is not None and "\n" not in reason
    assert "pip install --no-deps git+https://github.com/GeeeekExplorer/nano-vllm.git" in reason
    assert "pip install xxhash" in reason and "--nano-vllm-path" in reason
    with pytest.raises(RuntimeError, match="nano-vllm is not installed"):
        nano_vllm.run([request(0, 10, 1)], caps())


def test_a_path_that_is_not_a_checkout_is_refused(tmp_path):
    reason = nano_vllm.unavailable_reason(str(tmp_path))
    assert "no nanovllm/engine/scheduler.py there" in reason and "git clone" in reason


# A stand-in for a checkout, written by this test (not nano-vllm's code): the four modules the
# driver loads, importing one another as upstream's do, and a package __init__ that must never run.
_FAKE_CHECKOUT = {
    "pyproject.toml": '[project]\nname = "nano-vllm"\nversion = "9.9.9"\n',
    "nanovllm/__init__.py": "raise ImportError('the package __init__ ran')\n",
    "nanovllm/config.py": "raise ImportError('upstream config.py ran')\n",
    "nanovllm/sampling_params.py": "class SamplingParams:\n    pass\n",
    "nanovllm/engine/__init__.py": "raise ImportError('the engine __init__ ran')\n",
    "nanovllm/engine/sequence.py": "from nanovllm.sampling_params import SamplingParams\n\n\nclass Sequence:\n    block_size = 256\n",
    "nanovllm/engine/block_manager.py": "import xxhash\nfrom nanovllm.engine.sequence import Sequence\n\n\nclass BlockManager:\n    pass\n",
    "nanovllm/engine/scheduler.py": (
        "from nanovllm.config import Config\nfrom nanovllm.engine.block_manager import BlockManager\n\n\n"
        "class Scheduler:\n    config_class = Config\n\n"
        "    def postprocess(self, seqs, token_ids{}):\n        pass\n"
    ),
}


def fake_checkout(root, postprocess_extra=", is_prefill"):
    for name, text in _FAKE_CHECKOUT.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace("{}", postprocess_extra))
    return root


def test_a_checkout_loads_its_four_modules_and_nothing_else(tmp_path, monkeypatch):
    before = types.ModuleType("nanovllm")  # a nanovllm imported before: still there afterwards
    monkeypatch.setitem(sys.modules, "nanovllm", before)
    upstream = nano_vllm.load(str(fake_checkout(tmp_path)))
    assert upstream.label == "nano-vllm 9.9.9"  # the checkout's pyproject.toml version
    assert upstream.package_dir == (tmp_path / "nanovllm").resolve()
    # upstream's Config is never imported: the scheduler sees kvbench's SchedulerConfig
    assert upstream.Scheduler.config_class is nano_vllm.SchedulerConfig
    assert upstream.Sequence.__module__ == "nanovllm.engine.sequence"
    assert sys.modules["nanovllm"] is before
    assert not [name for name in sys.modules if name.startswith("nanovllm.")]
    # the package folder itself is a checkout too
    assert nano_vllm.load(str(tmp_path / "nanovllm")).package_dir == upstream.package_dir


def test_a_nano_vllm_from_before_chunked_prefill_is_refused(tmp_path):
    reason = nano_vllm.unavailable_reason(str(fake_checkout(tmp_path, postprocess_extra="")))
    assert "predates chunked prefill" in reason and "pip install --no-deps git+" in reason


def test_a_checkout_that_does_not_import_is_one_line(tmp_path):
    fake_checkout(tmp_path)
    (tmp_path / "nanovllm" / "engine" / "block_manager.py").write_text("import not_a_module_kvbench_has\n")
    reason = nano_vllm.unavailable_reason(str(tmp_path))
    assert "does not load (ModuleNotFoundError" in reason and "\n" not in reason
