"""fsspec sink and source: any fsspec URL (``s3://bucket/prefix``, ``gs://...``,
``memory://...``).

Objects have the names and bytes of the filesystem sink's files
(``step-00000042.rank-0000.rlw`` and ``.sidecar.rlw``), so ``rlwire inspect`` and the
layout parser read them unchanged. Object stores have no rename, so the main object is
the "ready" marker: every sidecar object is made visible first, the main objects last.

On S3 (s3fs) each large object is a multipart upload whose upload parts are cut from the
frame's buffers one at a time (never joining the whole object in memory) and
uploaded several at once while the next one is being cut; the step becomes visible only
when :meth:`Staged.commit <rlwire.abc.Staged.commit>` completes the uploads, and a
cancelled or failed send aborts them, so nothing is ever half-visible. Small objects are
put whole at commit. On other filesystems each object is written under a hidden
temporary key beside its final one and moved into place at commit.

The filesystem (and, for S3, a first request checking that the bucket exists) is made
lazily, once, in a worker thread, shared by concurrent first callers.

Inside: ``_connection`` (URL checks, the lazy filesystem, error translation) chooses a
``_store.Store``, the strategy the sink and source call: ``_s3`` (multipart uploads,
ranged reads) or ``_generic`` (temporary keys); ``_sink`` and ``_source`` hold the two
public classes.

Example:
    >>> sink = FsspecSink("memory://doc-package")
    >>> sink.open("error"), FsspecSource("memory://doc-package").read(0) is None
    (0, True)
"""

from rlwire._core.faces import claim
from rlwire.transport.fsspec._sink import FsspecSink
from rlwire.transport.fsspec._source import FsspecSource

__all__ = ["FsspecSink", "FsspecSource"]

claim(__name__, globals(), __all__)
