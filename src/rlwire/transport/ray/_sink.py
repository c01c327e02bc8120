"""RaySink: stores each step's frames in Ray's object store, recorded by the board."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import replace

import ray

from rlwire._core.errors import ClosedError, ConfigError, StepExistsError, TransportError
from rlwire._core.slicing import Sliced
from rlwire._frame.checksums import checksum_segments
from rlwire._frame.frame import Frame, JoinSpace
from rlwire._frame.pieces import Pieces
from rlwire.transport._base import OnExisting, PendingFrame, Sink, Staged, take_frame
from rlwire.transport._options import SinkOptions, SourceOptions, reject_unknown
from rlwire.transport._parts import PartInfo, Seal
from rlwire.transport._stored.parts import check_end, check_seal_size
from rlwire.transport._url import URL
from rlwire.transport.ray._actors import (
    BOARD_START_SECONDS,
    BoardHandle,
    board_id,
    call,
    create_board,
    ensure_ray,
    find_board,
)
from rlwire.transport.ray._appended import RayFieldsSink
from rlwire.transport.ray._handing import Handed, HandingSink
from rlwire.transport.ray._handle import Commits, StepHandle
from rlwire.transport.ray._handover import producer_actor
from rlwire.transport.ray._payload import make_payload, runs_fit
from rlwire.transport.ray._source import RaySource
from rlwire.transport.ray._staged import (
    RayStaged,
    RayStagedPart,
    check_fence,
    open_step_error,
    taken_over,
)
from rlwire.transport.ray._url import (
    OPTIONS,
    PULL_TIMEOUT,
    board_options,
    parse_name,
    pull_timeout,
)

__all__ = ["RaySink", "producer_actor"]

#: What stands for a buffer left out of a join.
_NOTHING = memoryview(b"")


class RaySink(HandingSink, RayFieldsSink, Sink):
    """Stores each step in Ray's object store: per rank a main object (the codec's
    header and buffers) and, when the message has one, a sidecar object, each a list of
    out-of-band buffers that receivers on the same node map without a copy. A named
    async actor, the *board* (``rlwire-board:NAME``), records the steps, their commit,
    what each rank consumed and the end of the stream; receivers wait on it.

    It :attr:`stores_parts`: a part of a step filled part by part is a message like a
    rank's, staged and then committed on the board on its own (in commit order per
    rank, its key unique in the step); the seal is recorded last, only if it lists
    exactly the committed parts. A producer that resumes the step learns the committed
    parts from the board (:meth:`committed_parts`), which then drops what a killed
    producer staged and never committed.

    Ownership: when the sender runs in an async (or threaded) Ray actor, the board
    pulls each rank's objects from that actor as the return values of a call it makes,
    so the board owns them and a producer that dies after a commit loses nothing.
    Anywhere else (a driver, a task, an actor running one call at a time, a sync
    sender opened on an async actor's loop, which it blocks while it sends) the sender
    puts them itself and owns them: those steps die with the sender's process
    (:attr:`board_owned` says which). Everything dies with the board: for resume after
    the board or the cluster is lost, send to a second, durable destination too.

    Every put and get runs in a worker thread; the event loop never waits on Ray. A
    buffer the codec hands over as the runs of :class:`~rlwire.abc.Pieces` (a column of
    per-sample arrays) goes into the object store run by run, with no join, when its
    runs are multiples of 64 bytes (all but the last): Ray lays them back to back, and
    receivers map them as one block. Other runs are joined first, since a receiver's
    buffer is one block, into memory the sink keeps from one message to the next: warm
    pages, as large as the largest message's joined columns, for as long as the sender
    lives. The object store holds its own copy before the next message is joined.
    Checksums are those of every sink (xxh3-64 per segment, verified on receive); a
    whole step's rank is hashed while Ray copies it into the object store, and its
    checksums go to the board with the commit (they cannot be in objects made before
    they are known); a part's and appended fields' are in their objects.
    Compression is the sender's choice (``compression=``); on one node it does not pay.

    Storage options (``open_sender(..., storage_options={...})``, and the same
    ``namespace`` for receivers):

    ``namespace``
        the Ray namespace of the board (default: the job's own).
    ``detached``
        create the board detached, so it outlives the driver (default False: it dies
        with the process that created it). Drop it with
        :func:`~rlwire.transport.ray.drop_board`.
    ``pull_timeout``
        seconds the board waits for the producer's actor to hand a rank over (default
        120).

    Raises:
        ConfigError: a malformed URL or option; Ray is not initialized.
        TransportError: the board is gone or does not answer.

    Example:
        >>> from rlwire.abc import SinkOptions
        >>> from rlwire.transport import parse_url
        >>> RaySink.from_url(parse_url("ray://rollouts"), SinkOptions()).where
        'ray://rollouts'
    """

    gathers = True  # Pieces are joined into the sink's JoinSpace, not fresh memory
    stores_parts = True
    _pulling_actor = staticmethod(producer_actor)  # what attach_fields asks

    def __init__(
        self,
        name: str,
        *,
        namespace: str | None = None,
        detached: bool = False,
        checksum: bool = True,
        pull_timeout: float = PULL_TIMEOUT,
    ) -> None:
        self.name = name
        self.namespace = namespace
        self.detached = detached
        self.checksum = checksum
        self.pull_timeout = pull_timeout
        self._join_space = JoinSpace()
        self._board: BoardHandle | None = None
        self._board_id = ""  # the id of the board open() found or made
        self._own_board = False  # whether open() made it, not detached: it dies with us
        self._producer: BoardHandle | None = None
        self._opened = False
        self._commits = Commits()  # the tokens of the steps it committed, for handles

    def __repr__(self) -> str:
        return f"RaySink({self.where!r})"

    @property
    def where(self) -> str:
        """The destination's URL, ``ray://NAME``."""
        return f"ray://{self.name}"

    @property
    def board_owned(self) -> bool | None:
        """True when the steps this sink sends outlive this process: the board owns them
        (pulled from the actor it runs in), and the board is not this process's own (one
        it made, not detached, dies with it). False when they die with this process;
        ``None`` before the sink is open."""
        if not self._opened:
            return None
        return self._producer is not None and not self._own_board

    @classmethod
    def from_url(cls, url: URL, options: SinkOptions) -> RaySink:
        opts = options.storage_options
        reject_unknown(url, opts, OPTIONS)
        namespace, detached = board_options(url, opts)
        return cls(
            parse_name(url),
            namespace=namespace,
            detached=detached,
            checksum=options.checksum,
            pull_timeout=pull_timeout(url, opts),
        )

    @classmethod
    def open_source(cls, url: URL, options: SourceOptions) -> RaySource:
        return RaySource.from_url(url, options)

    def _require_board(self) -> BoardHandle:
        if self._board is None:
            raise TransportError("the sink is not open", where=self.where)
        return self._board

    def open(self, on_existing: OnExisting, start_step: int | None = None) -> int:
        ensure_ray(self.where)
        # A board this process makes, not detached, dies with it (Ray's fate sharing).
        made = not self.detached and find_board(self.name, self.namespace) is None
        board = create_board(self.name, namespace=self.namespace, detached=self.detached)
        answer = call(
            board.open,
            on_existing,
            start_step,
            where=self.where,
            action="open the destination",
            timeout=BOARD_START_SECONDS,  # the board may be starting
        )
        if answer[0] != "ok":
            error = StepExistsError if answer[0] == "StepExistsError" else ConfigError
            raise error(answer[1], where=self.where)
        self._board, self._own_board = board, made
        # Its epoch, named in every later call: refused once another sender opens the
        # destination (_board_fence). A board of an rlwire before epochs answers none.
        self._fence = (int(answer[2]),) if len(answer) > 2 else ()
        self.resumed_widths = list(answer[3]) if len(answer) > 3 else []  # after "resume"
        self._board_id = board_id(board)
        # A sync sender on the actor's loop blocks it: the board could not call in.
        self._producer = None if self.caller_blocks_loop else producer_actor()
        self._opened = True
        return int(answer[1])

    def stage(self, step: int, frames: Sequence[PendingFrame]) -> Sliced[Staged]:
        """Stage every rank of ``step``, one after another: each is handed to the board
        as soon as it is encoded (and joined), and hashed while Ray copies it into the
        object store. A rank whose buffers must be joined waits until the board has
        answered for the ranks before (their bytes are in the store, and the join space
        is free again); one stored as it is (its columns held packed, or rows large
        enough) is handed over without that wait, so the board's calls overlap. The
        checksums go to the board with the commit (the envelope says so), since the
        objects are made before they are known. Nothing that holds the GIL for long runs
        beside Ray's copy: the copy takes the GIL back between values, and beside a busy
        Python thread it waits a switch interval each time (a 200 MB rank took a second
        instead of 30 ms)."""
        board = self._require_board()
        key = uuid.uuid4().hex
        staged = RayStaged(board, self.where, key, step, len(frames), self._fence)
        self._commits.remember(step, key, len(frames))  # the board's token, once committed
        handoffs: list[tuple[int, Handed]] = []  # (rank, its hand-off), not answered yet
        sums: list[bytes | None] = []
        try:
            for rank, pending in enumerate(frames):
                frame = yield from take_frame(pending)
                if self._joins(frame):
                    self._settle(step, handoffs)
                frame = yield from self._storable(frame)
                main, side = make_payload(frame, None, on_board=self.checksum)
                handoff = self._hand_off(
                    board.stage,
                    (step, key, rank),
                    f"{key}.{rank}",
                    main,
                    side,
                    f"store step {step} rank {rank}",
                )
                handoffs.append((rank, handoff))
                del main, side
                # xxhash lets go of the GIL while it hashes: Ray's copy goes on meanwhile.
                sums.append((yield from self._checksums(frame)))
                del frame  # the board may still be pulling it: its memory stays as it is
            self._settle(step, handoffs)
            self._settle_prune()
        except BaseException as exc:
            staged.failed(exc)
            for _, handoff in handoffs:
                self._quiesce(handoff, staged.silent)
            staged.discard()
            raise
        staged.checksums = sums if self.checksum else None
        return staged

    def _checksums(self, frame: Frame) -> Sliced[bytes | None]:
        """The checksums of ``frame``'s segments, or ``None`` without checksums."""
        return (yield from checksum_segments(frame)) if self.checksum else None

    def _settle(self, step: int, handoffs: list[tuple[int, Handed]]) -> None:
        """Wait for the board's answers to the stages of ``step``'s ranks in
        ``handoffs``, in order, each taken off the list; raise what one says is wrong."""
        while handoffs:
            rank, handoff = handoffs.pop(0)
            result = self._answer(handoff)
            if result[0] == "exists":
                raise StepExistsError(
                    f"step {step} rank {rank} already exists at the destination", where=self.where
                )
            if result[0] == "open":
                raise open_step_error(step, self.where)
            if result[0] == "dropped":
                raise taken_over(result, self.where)
            check_fence(result, self.where)

    @staticmethod
    def _joins(frame: Frame) -> bool:
        """True when storing ``frame`` joins some of its buffers into the join space."""
        return any(isinstance(b, Pieces) and not runs_fit(b) for b in frame.buffers)

    def _storable(self, frame: Frame) -> Sliced[Frame]:
        """``frame`` with every :class:`~rlwire._frame.pieces.Pieces` buffer that cannot
        be stored as its runs (:func:`~rlwire.transport.ray._payload.runs_fit`) joined
        into the join space."""
        space = self._join_space
        fit = {i: b for i, b in enumerate(frame.buffers) if isinstance(b, Pieces) and runs_fit(b)}
        if not fit:
            return (yield from space.joined(frame))
        rest = replace(
            frame, buffers=tuple(_NOTHING if i in fit else b for i, b in enumerate(frame.buffers))
        )
        joined = yield from space.joined(rest)
        return replace(joined, buffers=tuple(fit.get(i, b) for i, b in enumerate(joined.buffers)))

    def stage_part(self, step: int, part: PartInfo, frame: PendingFrame) -> Sliced[Staged]:
        board = self._require_board()
        key = uuid.uuid4().hex
        staged = RayStagedPart(board, self.where, key, step, part, self._fence)
        try:
            taken = yield from self._storable((yield from take_frame(frame)))
            sums = yield from self._checksums(taken)
            main, side = make_payload(taken, sums)
            del taken
            answer = self._hand(
                board.stage_part,
                (step, key, part.rank, part.index),
                f"{key}.{part.rank}",
                main,
                side,
                f"store part {part.index} of rank {part.rank} of step {step}",
            )
            del main, side
            if answer[0] == "exists":
                raise StepExistsError(str(answer[1]), where=self.where)
            if answer[0] == "dropped":
                raise taken_over(answer, self.where)
            check_fence(answer, self.where)
            self._settle_prune()
        except BaseException as exc:
            staged.failed(exc)
            staged.discard()
            raise
        return staged

    def committed_parts(self, step: int, ranks: int | None = None) -> list[PartInfo]:
        answer = call(
            self._require_board().committed_parts,
            step,
            *self._fence,
            where=self.where,
            action=f"list the parts of step {step}",
        )
        check_fence(answer, self.where)
        if answer[0] != "ok":
            raise StepExistsError(str(answer[1]), where=self.where)
        return [
            PartInfo(rank=int(rank), index=int(index), key=key, cost=float(cost))
            for rank, index, key, cost in answer[1]
        ]

    def seal(self, seal: Seal) -> None:
        check_seal_size(seal, self.where)  # as its readers check it (checked_seal)
        self._settle_prune()
        token = uuid.uuid4().hex
        self._commits.remember(seal.step, token, seal.ranks)
        answer = call(
            self._require_board().seal,
            seal.step,
            [list(keys) for keys in seal.keys],
            [list(costs) for costs in seal.costs],
            token,
            *self._fence,
            where=self.where,
            action=f"seal step {seal.step}",
        )
        check_fence(answer, self.where)
        if answer[0] != "ok":
            raise StepExistsError(str(answer[1]), where=self.where)

    def finish(self, end: int) -> None:
        self._settle_prune()
        board = self._require_board()
        answer = call(board.finish, end, *self._fence, where=self.where, action="mark the end")
        check_fence(answer, self.where)
        check_end(end, end if answer == ("open",) else None, self.where)

    def read_consumption(self, ranks: int, sent: int) -> list[int | None]:
        # A mark beyond sent is another run's receiver's, as on files (read_consumed).
        board, action = self._require_board(), "read the consumption marks"
        marks = call(board.consumption, ranks, *self._fence, where=self.where, action=action)
        check_fence(marks, self.where)  # a fenced sender waits for no room (max_ahead)
        return list(marks)

    def handle(self, step: int, rank: int = 0) -> StepHandle:
        """A small, serialisable :class:`StepHandle` of rank ``rank``'s message of this commit
        of ``step``, for a trainer actor to open (:meth:`StepHandle.receiver_options`)."""
        # The board's namespace, the job's own included: a receiver of another job finds it.
        space = ray.get_runtime_context().namespace if self.namespace is None else self.namespace
        token = self._commits.token(step, rank, self.where)  # ConfigError: no such rank
        return StepHandle(self.name, space, step, rank, self._board_id, token)

    def close(self) -> None:
        """Let go of the board, once a prune not waited for yet is answered. Nothing a
        close does can lose a step (each send returned once its step was committed): after
        ``ray.shutdown()`` it lets go of the prune too, and returns."""
        # A send that failed raised it already; a fenced sender's prune deleted nothing;
        # the ConfigError is Ray's shutdown (before the close, or during its wait).
        with contextlib.suppress(TransportError, ClosedError, ConfigError):
            self._settle_prune()
        self._board = None
