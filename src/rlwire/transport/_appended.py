"""Fields appended to a committed step, as the user API reaches them
(:mod:`rlwire.transport._stored.appended`)."""

from __future__ import annotations

from rlwire.transport._stored.appended import (
    keeps_steps,
    read_appended,
    sink_appended,
    stage_fields,
    stored_frames,
)

__all__ = ["keeps_steps", "read_appended", "sink_appended", "stage_fields", "stored_frames"]
