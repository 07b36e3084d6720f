"""How to install an optional extra, said the same way by every hint: a clone of the repository
(how the README installs kvbench) takes ``pip install -e '.[x]'``, an installed package
``pip install 'kvbench[x]'``; a hint names both, on one line."""

from __future__ import annotations


def install_hint(extra: str) -> str:
    """``pip install -e '.[wandb]' in a clone (pip install 'kvbench[wandb]' otherwise)``."""
    return f"pip install -e '.[{extra}]' in a clone (pip install 'kvbench[{extra}]' otherwise)"
