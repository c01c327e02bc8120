"""A step's messages, one per rank, sent so that a cancellation leaves the step with
every rank or with none (docs/reliability.md, "Cancellations and interrupts").

Until the first message is sealed, a cancellation stops the step with nothing visible
(the message under way is aborted). Once it is, the others go on to the end in a task
of their own, shielded, and the cancellation is raised after them. They wait for room
in a full queue as any send does; once cancelled, for ``patience`` seconds at most (the
sink's ``linger``): a receiver that reads nothing for that long, like one gone midway,
fails the send with a TransportError, the step visible for the ranks before it only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import anyio

from rlwire._core.errors import TransportError
from rlwire.transport.zmq._sending import Message

__all__ = ["send_step"]


async def send_step(
    messages: Sequence[Message], send: Callable[[Message], Awaitable[None]], *, patience: float
) -> None:
    """Send ``messages`` in turn with ``send``
    (:func:`~rlwire.transport.zmq._sending.send_message`, which aborts a message it does
    not finish), the first cancellable, the others to the end.

    Raises:
        TransportError: a message after the first failed, or (the send cancelled) could
            not be sent within ``patience`` seconds.
    """
    if not messages:
        return
    await send(messages[0])
    if len(messages) == 1:
        return
    sent = [messages[0].head.rank]
    failed: list[Exception] = []
    done = anyio.Event()
    rest = anyio.CancelScope(shield=True)

    async def send_rest() -> None:
        with rest:
            try:
                for message in messages[1:]:
                    await send(message)
                    sent.append(message.head.rank)
            except Exception as exc:  # its own cancellation ends it too (rest's deadline)
                failed.append(exc)
        done.set()

    cancelled: BaseException | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(send_rest)
        try:
            await done.wait()
        except anyio.get_cancelled_exc_class() as exc:
            # The caller's cancellation, a scope's or asyncio's own: the rest is sent first.
            cancelled = exc
            rest.deadline = anyio.current_time() + patience
            with anyio.CancelScope(shield=True):
                await done.wait()
    if failed:
        raise failed[0]
    if rest.cancelled_caught:
        missing = messages[len(sent)].head
        raise TransportError(
            f"the send of step {missing.step} was cancelled once it had reached rank(s) "
            f"{', '.join(map(str, sent))}, and the receiver of rank {missing.rank} made no "
            f"room for its message within {patience:g} s (linger) after that: the step "
            f"counts as sent, and rank {missing.rank} will get a StepGapError for it"
        )
    if cancelled is not None:
        raise cancelled
