"""Method specs as text, shared by the command line and the bench: 'sd:gamma=4,drafter=lookup'; and the JSON
files a user names as parameters (trees, plans).

No torch here: the command line parses its arguments before loading anything heavy.
"""

from __future__ import annotations

import json
from pathlib import Path

# What `generate()` and `multispec generate` run when no method is named: speculative sampling that copies
# from the text where it repeats, drafts with the draft model elsewhere (where one is given), and picks each
# draft length, zero included, from the target's measured cost and the acceptance so far.
DEFAULT_METHOD = "sd:gamma=auto,drafter=hybrid"


def parse_params(items: list[str], what: str = "--param") -> dict[str, str]:
    """['gamma=4', 'k-config=2x2'] -> {'gamma': '4', 'k_config': '2x2'} (dashes in keys become underscores)."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what} takes KEY=VALUE, got {item!r}")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


def parse_method(text: str) -> tuple[str, dict[str, str]]:
    """'sd:gamma=4,bonus=false' -> ('sd', {'gamma': '4', 'bonus': 'false'})."""
    name, _, rest = text.strip().partition(":")
    items = [p.strip() for p in rest.split(",") if p.strip()]
    return name.strip(), parse_params(items, f"method parameters in {text!r}")


def short_repr(value) -> str:
    """A value in an error message: its repr, cut (a request's value may be long)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def read_json(path: str | Path, what: str):
    """The contents of a JSON file the user named, or a ValueError that names `what` and the problem."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"cannot read the {what} {str(path)!r}: {e.strerror or e}") from None
    except ValueError as e:
        raise ValueError(f"the {what} {str(path)!r} is not JSON: {e}") from None
