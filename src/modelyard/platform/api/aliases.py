"""Where a model's version aliases end up after a change: Vertex AI's rules, in one place, as pure functions.

An alias names one version of a model at a time: giving it to a version takes it from whichever version
held it. A version's aliases keep the order they were given in (upload, an update mask), as Vertex AI
returns them (the SDK appends ``default`` to the caller's list; Google's test_model_version_management
checks that order). For mergeVersionAliases Vertex documents no order; here it is deterministic: the
version's own aliases first, then those added, in the order given. Exactly one version holds ``default`` at all times, so ``default`` moves (given to another
version) but is never simply removed. The store applies the result inside the transaction that read
the current placement, so two changes never interleave.
"""
from __future__ import annotations

from modelyard.platform.api.errors import ApiError
from modelyard.platform.api.names import DEFAULT_ALIAS, check_alias

Placement = dict[str, list[str]]  # version id -> its aliases


def parse_merge(changes: object) -> tuple[list[str], list[str]]:
    """``MergeVersionAliasesRequest.version_aliases`` -> (to add, to remove); ``-x`` removes ``x``.
    An alias both added and removed in one request cancels out, as Vertex AI documents."""
    if not isinstance(changes, list) or not changes:
        raise ApiError("INVALID_ARGUMENT", "MergeVersionAliasesRequest.version_aliases is required: aliases to "
                       "add, and '-alias' to remove one.")
    add, remove = [], []
    for item in changes:
        if isinstance(item, str) and item.startswith("-"):
            remove.append(check_alias(item[1:]))
        else:
            add.append(check_alias(item))
    both = set(add) & set(remove)
    return _unique(a for a in add if a not in both), _unique(a for a in remove if a not in both)


def check_list(aliases: object) -> list[str]:
    """A ``Model.version_aliases`` field as given (upload, update): each alias checked, repeats dropped."""
    if aliases is None:
        return []
    if not isinstance(aliases, list):
        raise ApiError("INVALID_ARGUMENT", "Model.version_aliases must be a list of aliases.")
    return _unique(check_alias(a) for a in aliases)


def first_version(aliases: list[str]) -> list[str]:
    """A model's first version's aliases: as given, with ``default`` (which it always holds) last unless
    the request placed it."""
    return aliases if DEFAULT_ALIAS in aliases else [*aliases, DEFAULT_ALIAS]


def place(current: Placement, version_id: str, add: list[str], remove: list[str]) -> Placement:
    """The placement after giving ``add`` to ``version_id`` and taking ``remove`` from it."""
    if DEFAULT_ALIAS in remove and DEFAULT_ALIAS in current.get(version_id, []):
        raise ApiError("INVALID_ARGUMENT", f"The '{DEFAULT_ALIAS}' alias cannot be removed from version {version_id}: "
                       "one version of a model always holds it. Add it to another version to move it there.")
    out = {v: [a for a in aliases if a not in add] for v, aliases in current.items()}
    mine = [a for a in current.get(version_id, []) if a not in remove]
    out[version_id] = _unique([*mine, *add])
    return out


def replace(current: Placement, version_id: str, aliases: list[str]) -> Placement:
    """The placement after setting ``version_id``'s aliases to exactly ``aliases`` (an update mask's rule)."""
    mine = current.get(version_id, [])
    out = place(current, version_id, aliases, [a for a in mine if a not in aliases])
    out[version_id] = _unique(aliases)  # exactly the list given, in its order
    return out


def _unique(items) -> list[str]:
    return list(dict.fromkeys(items))
