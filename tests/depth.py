"""How many examples the property tests (hypothesis) draw.

A module asks for the count it wants at full depth, ``max_examples=examples(300)``: the
long task (``python3 tasks.py long``) runs every property test at that depth, beside the
long scenarios; the test command runs a third of it (at least ten), some 70 CPU-s less
on two cores (2026-11-30). ``RLWIRE_TEST_DEPTH`` sets the fraction (1: full depth; 3:
three times it, for a search of its own).
"""

from __future__ import annotations

import math
import os

__all__ = ["DEPTH", "examples"]

#: The fraction of each asked-for count that is drawn.
DEPTH = float(os.environ.get("RLWIRE_TEST_DEPTH", "0.34"))


def examples(full: int) -> int:
    """The examples to draw for a test that asks for ``full`` at full depth."""
    return max(min(full, 10), math.ceil(full * DEPTH))
