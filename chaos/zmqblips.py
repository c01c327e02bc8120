"""ZeroMQ senders and receivers that stay open through trouble: network blips, two
receivers of one rank, cancelled receives.

Each trial runs (in its own forked child, under asyncio or trio) a real
``zmq+tcp://127.0.0.1`` sender and one or two receivers, and one of:

- *blip*: the receiver connects through a :class:`~chaos.tcpproxy.TcpProxy`, which is
  cut and restored at random moments (seeded) while steps flow; sends the sender finds
  unreachable are retried, as a user would;
- *duplicate rank*: two receivers claim rank 0 (in the ``ranks`` pattern the one that
  announced itself last takes it over for good, and the other is told: ``ConfigError``);
- *cancelled receive*: receives cancelled at random deadlines while messages are being
  decoded.

Judged per receiver: every step returned is exactly the payload sent for it; steps go up,
by one in the ``ranks`` pattern, and a step that does not follow on comes right after one
``StepGapError`` (what was lost); never an old step as new (a ``StepOrderError`` is
wrong: it means fresh steps were taken for old ones). Two receivers of one rank get each
step once between them: the one replaced gets the steps before the takeover, then one
``ConfigError`` saying another receiver took the rank over, and nothing after (a step
after it, or a second trainer silently given only some steps, is wrong data). Outcomes:
*exact* when all of that holds and the last step sent arrives; *typed error* for any
other ``RlwireError``; *wrong data* for a step that is not its payload, one that goes
back or repeats, a skip without a ``StepGapError``, or a step after the last blip that
never arrives; *untyped error* otherwise; *hang* when the trial outlives its deadline.
"""

from __future__ import annotations

import random
import traceback
from typing import Any

import anyio

import rlwire

from ._model import EXACT, TYPED, UNTYPED, WRONG, describe, payload, same
from ._proc import Job
from .tcpproxy import TcpProxy

CAMPAIGN = "ZeroMQ blips"
STEPS = 30
N = 64
LONG = 10.0
KINDS = ("blip", "duplicate rank", "cancelled receive")


def jobs(root: str, count: int, seed: int) -> list[Job]:
    """``count`` trials; the first ones take each kind and pattern in turn (three
    trials: each kind, both patterns)."""
    out = []
    for i in range(count):
        rng = random.Random(seed * 1_000_003 + i)
        kind = KINDS[i % len(KINDS)]
        pattern = ("ranks", "shared")[i % 2]  # with 3 kinds, six trials take every pair
        backend = ("asyncio", "trio")[(i // (2 * len(KINDS))) % 2]
        args = (kind, pattern, backend, rng.randrange(1 << 30))
        what = f"{kind}, {pattern}, {backend}"
        out.append(Job(trial, args, timeout=60, tag=(CAMPAIGN, what)))
    return out


def trial(kind: str, pattern: str, backend: str, seed: int) -> dict[str, Any]:
    try:
        return anyio.run(_trial, kind, pattern, seed, backend=backend)
    except rlwire.RlwireError as exc:
        return {"outcome": TYPED, "detail": describe(exc)}
    except Exception as exc:
        return {"outcome": UNTYPED, "detail": describe(exc) + traceback.format_exc()[-600:]}


async def _trial(kind: str, pattern: str, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    options = {"pattern": pattern, "linger": 5, "hwm": rng.choice([1, 2, 4])}
    async with rlwire.open_sender("zmq+tcp://127.0.0.1:0", storage_options=options) as sender:
        port = int(sender.sink.url.rsplit(":", 1)[1])
        with TcpProxy(("127.0.0.1", port)) as proxy:
            url = f"zmq+tcp://{proxy.address}" if kind == "blip" else sender.sink.url
            count = 2 if kind == "duplicate rank" else 1
            receivers = [rlwire.open_receiver(url, rank=0) for _ in range(count)]
            logs: list[list[Any]] = [[] for _ in receivers]
            try:
                async with anyio.create_task_group() as tg:
                    for receiver, log in zip(receivers, logs, strict=True):
                        tg.start_soon(_receive, receiver, log, kind == "cancelled receive", rng)
                    # A receiver of a rank left out announces itself again after a
                    # second without news (which once took the rank back): send for 3 s.
                    pace = 0.15 if kind == "duplicate rank" else 0.03
                    await _send(sender, proxy if kind == "blip" else None, rng, pace)
                    await sender.finish()
                    with anyio.move_on_after(LONG):
                        while not all(_ended(log) for log in logs):
                            await anyio.sleep(0.05)
                    tg.cancel_scope.cancel()
            finally:
                for receiver in receivers:
                    receiver.close()
    return _judge(logs, pattern, kind)


async def _send(sender: Any, proxy: TcpProxy | None, rng: random.Random, pace: float) -> None:
    cuts = sorted(rng.sample(range(1, STEPS - 2), 2)) if proxy is not None else []
    for step in range(STEPS):
        if step in cuts and proxy is not None:
            proxy.cut()
            await anyio.sleep(rng.uniform(0.0, 0.4))
            proxy.restore()
        with anyio.fail_after(LONG):
            while True:
                try:
                    await sender.send(payload(step, 0, n=N), step=step)
                    break
                except rlwire.TransportError:
                    await anyio.sleep(0.05)  # the receiver is away: nothing was sent
        await anyio.sleep(rng.uniform(pace / 2, pace))


async def _receive(receiver: Any, log: list[Any], cancel: bool, rng: random.Random) -> None:
    while True:
        try:
            if cancel and rng.random() < 0.5:
                with anyio.move_on_after(rng.uniform(0.0, 0.005)):
                    batch = await receiver.areceive(timeout=LONG)
                    log.append(
                        (receiver.last_step, same(batch, payload(receiver.last_step, 0, n=N)))
                    )
                continue
            batch = await receiver.areceive(timeout=LONG)
        except rlwire.EndOfStream:
            log.append("end")
            return
        except rlwire.RlwireError as exc:
            log.append(f"{type(exc).__name__}: {str(exc)[:300]}")
            if isinstance(exc, rlwire.ReceiveTimeout | rlwire.ConfigError):
                return  # (a refusal is final: every later receive raises it again)
            continue
        log.append((receiver.last_step, same(batch, payload(receiver.last_step, 0, n=N))))


def _ended(log: list[Any]) -> bool:
    return bool(log) and (log[-1] == "end" or str(log[-1]).startswith(_FINAL))


_FINAL = ("ReceiveTimeout", "ConfigError")


def _taken_over(logs: list[list[Any]], pattern: str, kind: str) -> dict[str, Any] | None:
    """For two receivers of rank 0 (the ``ranks`` pattern): the outcome if they did not
    share the steps as they must (one, until it was told that the other took the rank
    over, the other every later step); ``None`` if they did. Their logs lose the
    ``ConfigError`` that told one of them, for :func:`_judge`."""
    if kind != "duplicate rank" or pattern != "ranks":
        return None
    told = [log for log in logs if log and str(log[-1]).startswith("ConfigError")]
    words = "another receiver of rank 0 announced itself after this one"
    if len(told) != 1 or words not in str(told[0][-1]):
        return {"outcome": WRONG, "detail": f"not one receiver told of a takeover; {logs}"}
    told[0].pop()
    steps = sorted(e[0] for log in logs for e in log if isinstance(e, tuple))
    if steps != list(range(STEPS)):
        return {"outcome": WRONG, "detail": f"the rank's steps were not each sent once; {logs}"}
    return None


def _judge(logs: list[list[Any]], pattern: str, kind: str) -> dict[str, Any]:
    shared = _taken_over(logs, pattern, kind)
    if shared is not None:
        return shared
    typed = []
    for r, log in enumerate(logs):
        previous: int | None = None
        gap = False
        for event in log:
            if event == "end":
                continue
            if isinstance(event, str):
                if event.startswith("StepGapError") and not gap:
                    gap = True
                    continue
                if event.startswith("StepOrderError"):
                    return {"outcome": WRONG, "detail": f"receiver {r}: {event}; log {log}"}
                typed.append(f"receiver {r}: {event}")
                continue
            step, ok = event
            if not ok:
                return {"outcome": WRONG, "detail": f"receiver {r}: step {step} is not its payload"}
            follows = previous is None or step == previous + 1 or (pattern == "shared")
            if previous is not None and step <= previous:
                return {"outcome": WRONG, "detail": f"receiver {r}: step {step} again; {log}"}
            if not follows and not gap:
                return {"outcome": WRONG, "detail": f"receiver {r}: skipped to {step}; {log}"}
            previous, gap = step, False
    lasts = [e[0] for log in logs for e in log if isinstance(e, tuple)]
    if kind != "duplicate rank" and STEPS - 1 not in lasts:
        return {"outcome": WRONG, "detail": f"the last step never arrived; {logs}"}
    if typed:
        return {"outcome": TYPED, "detail": "; ".join(typed)[:600]}
    gaps = sum(1 for log in logs for e in log if str(e).startswith("StepGapError"))
    return {"outcome": EXACT, "detail": f"{gaps} StepGapError(s)"}
