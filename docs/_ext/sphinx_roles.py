"""A griffe extension for the API pages: the docstrings' Sphinx roles as code.

rlwire's docstrings name other objects the Sphinx way (``:class:`~rlwire.Frame```), which
doctests and ``help()`` show as written; on the site they become code: ``Frame`` for a
``~`` role (the last part of the name), the whole name otherwise.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj|const):`(~?)([^`]+)`")


def _as_code(match: re.Match[str]) -> str:
    tilde, name = match.groups()
    return f"`{name.rsplit('.', 1)[-1] if tilde else name}`"


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring as it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_as_code, obj.docstring.value)
