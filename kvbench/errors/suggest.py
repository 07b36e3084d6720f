"""``did you mean `paged`?``: the names a near miss most likely meant, for the one-line errors.

Standard library only (difflib), and nothing imported at module level beyond it: the errors that use
it are printed before anything heavy is loaded.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

#: difflib's ratio (2 x matching characters / both lengths) from which a whole name is a near miss:
#: difflib's own default; `pagd` is 0.89 of `paged`, `slo_batch` 0.89 of `slo-batch`
WHOLE_CUTOFF = 0.6
#: the same ratio against one word of a name (split at `_`, `-`, `.`): stricter, since a word is
#: short and a long name has several. `blok` is 0.89 of `block` (of `block_size_tokens`), while as a
#: whole it is 0.38 of `block_size_tokens`
WORD_CUTOFF = 0.75
#: names scoring within this of the best are equally likely: both are offered (`slo` for
#: `slo-batch` and `slo-search`), a clearly worse one is not (`sharegpt` beside `sharegpt_like`)
TIE = 0.02
#: words shorter than this are left out of the word match (`s` in `s_max_tokens` matches anything)
MIN_WORD_CHARS = 3


def _best(scored: list[tuple[float, int, str]], cutoff: float) -> list[tuple[float, int, str]]:
    scored = [item for item in scored if item[0] >= cutoff]
    if not scored:
        return []
    best = max(score for score, _, _ in scored)
    return sorted((item for item in scored if item[0] >= best - TIE), key=lambda item: (-item[0], item[1]))


def _starts_words(typed: str, name: str) -> bool:
    """Whether ``typed`` is the whole of ``name``'s first words (`h100` of `h100-sxm`, `llama2` of
    `llama2-7b`): a name cut short, which edit distance misses (`h100` is nearer `h200`)."""
    return (
        len(typed) >= MIN_WORD_CHARS and len(name) > len(typed) and name.startswith(typed) and name[len(typed)] in "_-."
    )


def near_misses(word: str, names: Iterable[object], most: int = 3) -> list[str]:
    """The names ``word`` most likely misspells or cuts short, best first (none when nothing is
    close); case is ignored. Names that ``word`` begins word for word come first, shortest first
    (`h100` means `h100-sxm` before `h200`); then a name close as a whole wins over one with a close
    word (`pagd` means `paged`, not `paged_cached`); only when no whole name is close are the words
    tried."""
    unique = [name for name in dict.fromkeys(str(name) for name in names) if name != word]
    typed = word.lower()
    cut_short = sorted((name for name in unique if _starts_words(typed, name.lower())), key=len)
    misspelt = [name for name in _misspellings(typed, unique) if name not in cut_short]
    return [*cut_short, *misspelt][:most]


def _misspellings(typed: str, unique: list[str]) -> list[str]:
    """The names ``typed`` (lower case) is a near miss of, best first."""
    whole = [(difflib.SequenceMatcher(None, typed, name.lower()).ratio(), i, name) for i, name in enumerate(unique)]
    close = _best(whole, WHOLE_CUTOFF)
    if not close:
        by_word = []
        for i, name in enumerate(unique):
            words = [w for w in re.split(r"[_\-.]", name.lower()) if len(w) >= MIN_WORD_CHARS]
            ratio = max((difflib.SequenceMatcher(None, typed, w).ratio() for w in words), default=0.0)
            by_word.append((ratio, i, name))
        close = _best(by_word, WORD_CUTOFF)
    return [name for _, _, name in close]


def did_you_mean(word: str, names: Iterable[object], prefix: str = "") -> str:
    """``did you mean `paged`?`` (``prefix`` before each name: ``allocator.``), or "" when nothing
    is close."""
    found = [f"`{prefix}{name}`" for name in near_misses(word, names)]
    if not found:
        return ""
    return f"did you mean {' or '.join(found) if len(found) < 3 else ', '.join(found[:-1]) + ' or ' + found[-1]}?"
