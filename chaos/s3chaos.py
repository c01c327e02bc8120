"""S3 sends killed at every store call, and sends through a proxy that fails a request.

A moto server runs on loopback (:func:`server`, ``tests/s3_server.py``) with one bucket;
every trial writes under a fresh key prefix of it, ``s3://rlwire-chaos/<hex>``, and
deletes what it wrote when it has judged it. Two kinds of trials share the budget:

- **kill -9 at every store call.** A sender runs in a process forked from the trial's
  child, with :func:`install_hooks` wrapping ``S3FileSystem._call_s3`` (every request
  s3fs makes) and rlwire's ``_s3_parts._upload_part`` (multipart parts, which call the
  client directly): the N-th call sends the process SIGKILL just before it is made, or
  just after it returns. A calibration run (:func:`calibrate`) counts a send's calls
  (opening the sender with ``on_existing="resume"``, the send, ``finish()`` if any,
  closing it); N runs over every one of them when the budget allows, else a sample.
- **a failed request.** The sender's endpoint is a :class:`~s3_server.FaultProxy` (run in
  the trial's child, with s3fs's retries cut to one attempt and rlwire's own retry
  delays shortened, as ``tests/transport/fsspec/test_fsspec_faults.py`` does) that fails the
  N-th request of the send (half the time a request that makes an object visible, a
  ``put_object`` or ``complete_multipart_upload``; else any): a reset before the server
  sees it, a reply lost after the server acted on it, a request held unanswered then
  reset, or an outage of up to 1.5 s starting at it. aiohttp sends an idempotent request
  (GET, HEAD, PUT, DELETE) again, once, when its connection is reset, so the fault
  fails that retry too. The send must succeed or raise an ``RlwireError``; a send that
  returned must have made its step visible for every rank; a failed send's error must
  say true ("nothing was made visible", "visible for ranks [r] only"). In half the
  trials the same sender then sends once more, the fault over: after "nothing was made
  visible" it must send the same step again, after a partly visible step the next one
  (the number is used up), and after a step whose state is unknown it must refuse.
  After the sender closes, no multipart upload may be left under the prefix unless
  closing warned (``ResourceWarning``) that it could not abort it.

Both are configured like the file-sink kill campaign (``kills.py``): 1 and 2 ranks
(``send_ranks``), compression none and zstd, small payloads (every object one PUT at
commit) and, without compression, payloads of a few MiB whose objects go up as multipart
uploads; and three scenarios: step 0 to an empty prefix, step 1 after a whole step 0,
step 1 then ``finish()``. The prefix is then judged (:func:`judge`) as ``kills.classify``
judges a directory: every visible main object receives exactly; a step visible for some
ranks only must be the last, and ``resume`` must refuse it naming it (then truncating at
it and sending it again must give every rank the step); an end mark stops every rank with
``EndOfStream``; a sender reopened with ``resume`` sends the next step, which every rank
receives exactly (a partly visible step the sender went on after may be incomplete
although not the last: ``resume`` must refuse it, and truncating at it and sending it
and the later steps again must work). Finally, once that sender has closed, no
unfinished multipart upload may be left under the prefix (docs/how-to/destinations.md: the next
sender opened with ``resume``, ``truncate`` or ``overwrite`` aborts a killed sender's
uploads, and a closing sender those of its failed sends).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import threading
import traceback
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import botocore.loaders  # type: ignore[import-untyped]
import fsspec
import fsspec.config
import s3fs
from s3_server import _CREDENTIALS, DROP_REPLY, HOLD, RESET, FaultProxy, moto_server, s3_client

import rlwire
from rlwire.transport._stored.names import MAIN_RE
from rlwire.transport.fsspec import _s3_parts, _s3_upload
from rlwire.transport.layout import END_NAME

from ._model import (
    EXACT,
    HALF,
    HANG,
    PARTLY,
    TYPED,
    UNTYPED,
    WRONG,
    check_end_and_resume,
    check_visible,
    describe,
    payload,
    receive_one,
)
from ._proc import Job, reap, run_jobs

CAMPAIGN = "S3 kills and faults"
BUCKET = "rlwire-chaos"
#: Tokens per sample: a small payload (every object one PUT, at commit), and one whose
#: uncompressed main and sidecar objects (about 2.9 and 1.1 MB) go up as multipart uploads.
SMALL, LARGE = 600, 70_000
#: (ranks, compression, tokens per sample).
CONFIGS = [(ranks, comp, SMALL) for ranks in (1, 2) for comp in (None, "zstd")] + [
    (ranks, None, LARGE) for ranks in (1, 2)
]
#: What the sender does: 0 sends step 0 to an empty prefix; 1 sends step 1 after a whole
#: step 0; 2 does that and then finishes the stream (the end mark).
MODES = {0: "step 0", 1: "step 1 after step 0", 2: "step 1, then finish()"}
OUTAGE = "outage"
#: The store calls that make an object visible (the commit of a step, or its end mark).
COMMIT_CALLS = ("put_object ", "complete_multipart_upload ")
FAULTS = (RESET, DROP_REPLY, HOLD, OUTAGE)
#: rlwire's retry delays in the fault trials (the tests' shortened schedule): 0.75 s in all.
SHORT_RETRY_DELAYS = (0.05, 0.1, 0.2, 0.4)
TIMEOUT = 60.0
#: Methods aiohttp sends again, once, on a fresh connection when the server closed or
#: reset the one it used (aiohttp's ``IDEMPOTENT_METHODS``): a fault meant to fail one
#: such request fails that retry too, or it would go unnoticed.
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


# ---------------------------------------------------------------------------- the server


@contextlib.contextmanager
def server() -> Iterator[dict[str, Any]]:
    """A moto server on loopback (a subprocess) with the campaign's bucket; yields the
    fsspec storage options that reach it. The bucket is made in a forked child: the
    driver starts no thread."""
    with moto_server() as url, _models_read_once():
        options: dict[str, Any] = {
            "endpoint_url": url,
            "key": _CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "secret": _CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "client_kwargs": {"region_name": _CREDENTIALS["AWS_DEFAULT_REGION"]},
        }
        _client(options)  # reads botocore's models, here, once for every trial
        made: dict[str, Any] = {}
        job = Job(_make_bucket, (options,), timeout=TIMEOUT, tag="bucket")
        run_jobs([job], lambda _job, result: made.update(result), 1)
        if made.get("outcome") != EXACT:
            raise RuntimeError(f"chaos: cannot make the S3 bucket: {made}")
        yield options


@contextlib.contextmanager
def _models_read_once() -> Iterator[None]:
    """botocore reads and parses its bundled JSON models for every session it makes
    (s3fs makes one per filesystem: two or three per trial, some 0.15 s each). While
    this holds, a file read once (in the driver) is not read again, so forked trials
    inherit the parsed models. Only botocore's own data files are cached."""
    cls = botocore.loaders.JSONFileLoader
    real = cls.load_file
    cache: dict[str, Any] = {}

    def load_file(self: Any, file_path: str) -> Any:
        if file_path not in cache:
            cache[file_path] = real(self, file_path)
        return cache[file_path]

    cls.load_file = load_file
    try:
        yield
    finally:
        cls.load_file = real


_CLIENTS: dict[str, Any] = {}


def _client(options: dict[str, Any]) -> Any:
    """A boto3 client for ``options``, one per endpoint. Made in the driver too (no
    request, no thread), so that forked trials find botocore's models loaded."""
    url = options["endpoint_url"]
    if url not in _CLIENTS:
        _CLIENTS[url] = s3_client(options)
    return _CLIENTS[url]


def _make_bucket(options: dict[str, Any]) -> dict[str, Any]:
    _client(options).create_bucket(Bucket=BUCKET)
    return {"outcome": EXACT}


# ------------------------------------------------------------------------ in a trial


def _prepare(endpoint: dict[str, Any]) -> str:
    """Set up a trial's child: receivers opened without storage options (``receive_one``)
    reach the server; returns a fresh URL ``s3://bucket/<hex>``."""
    fsspec.config.conf["s3"] = dict(endpoint)
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"


def _prefix(url: str) -> str:
    return url.removeprefix(f"s3://{BUCKET}/") + "/"


def _names(client: Any, url: str) -> list[str]:
    """The object names directly under the URL's prefix, from S3 itself."""
    prefix, out, token = _prefix(url), [], dict[str, str]()
    while True:
        page = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix, **token)
        out += [str(o["Key"])[len(prefix) :] for o in page.get("Contents", [])]
        if not page.get("IsTruncated"):
            return out
        token = {"ContinuationToken": page["NextContinuationToken"]}


def _uploads(client: Any, url: str) -> list[tuple[str, str]]:
    """``(key, upload id)`` of every unfinished multipart upload under the prefix."""
    prefix, out, marker = _prefix(url), [], dict[str, str]()
    while True:
        page = client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix, **marker)
        out += [(str(u["Key"]), str(u["UploadId"])) for u in page.get("Uploads", []) or []]
        if not page.get("IsTruncated"):
            return out
        marker = {
            "KeyMarker": page["NextKeyMarker"],
            "UploadIdMarker": page["NextUploadIdMarker"],
        }


def _clean(endpoint: dict[str, Any], url: str) -> None:
    """Delete the trial's objects and uploads (the server holds every trial's data)."""
    with contextlib.suppress(Exception):
        client = _client(endpoint)
        for key, upload_id in _uploads(client, url):
            client.abort_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload_id)
        keys = [{"Key": _prefix(url) + name} for name in _names(client, url)]
        for i in range(0, len(keys), 1000):
            client.delete_objects(Bucket=BUCKET, Delete={"Objects": keys[i : i + 1000]})


def _visible(names: list[str]) -> dict[int, set[int]]:
    """The ranks whose main object is visible, by step."""
    mains: dict[int, set[int]] = {}
    for name in names:
        m = MAIN_RE.fullmatch(name)
        if m:
            mains.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    return mains


def _sender_options(compression: str | None) -> dict[str, Any]:
    return {"sidecar": ("routed_experts",), "compression": compression, "on_existing": "resume"}


async def _send_steps(
    url: str,
    options: dict[str, Any],
    ranks: int,
    steps: range,
    compression: str | None,
    n: int,
    finish: bool = False,
    **extra: Any,
) -> None:
    """Open a sender (``on_existing="resume"`` unless ``extra`` says otherwise), send
    ``steps`` (checking the numbers), finish the stream if asked, close."""
    kwargs = {**_sender_options(compression), **extra}
    async with rlwire.open_sender(url, storage_options=options, **kwargs) as sender:
        for step in steps:
            if ranks == 1:
                got = await sender.send(payload(step, 0, n), step=step)
            else:
                got = await sender.send_ranks(
                    [payload(step, r, n) for r in range(ranks)], step=step
                )
            assert got == step, (got, step)
        if finish:
            await sender.finish()


def _short(kwargs: dict[str, Any]) -> str:
    key = str(kwargs.get("Key") or kwargs.get("Prefix") or "")
    return key.rpartition("/")[2] if "/" in key else key


def install_hooks(
    kill_at: int | None, after: bool = False, said: Callable[[str], None] | None = None
) -> list[str]:
    """Count every store call (``_call_s3`` and ``_upload_part``) from now on; the
    ``kill_at``-th (from 1) sends this process SIGKILL before it is made, or after it
    returns or fails when ``after``, after telling ``said`` which call it is. Returns
    the list of calls made so far."""
    calls: list[str] = []
    lock = threading.Lock()
    real_call = s3fs.S3FileSystem._call_s3
    real_part = _s3_parts._upload_part

    def start(what: str) -> int:
        with lock:
            calls.append(what)
            index = len(calls)
        if index == kill_at and not after:
            kill(f"before {what}")
        return index

    def end(index: int) -> None:
        if index == kill_at and after:
            kill(f"after {calls[index - 1]}")

    def kill(what: str) -> None:
        if said is not None:
            said(what)
        os.kill(os.getpid(), signal.SIGKILL)

    async def call_s3(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        index = start(f"{method} {_short(kwargs)}".strip())
        try:
            return await real_call(self, method, *args, **kwargs)
        finally:
            end(index)

    async def upload_part(fs: Any, obj: Any, number: int, body: Any) -> str:
        index = start(f"upload_part {obj.key.rpartition('/')[2]} #{number}")
        try:
            return await real_part(fs, obj, number, body)
        finally:
            end(index)

    s3fs.S3FileSystem._call_s3 = call_s3
    _s3_parts._upload_part = upload_part
    return calls


def _scenario(
    url: str, endpoint: dict[str, Any], ranks: int, comp: str | None, n: int, mode: int
) -> tuple[range, bool]:
    """Send what comes before the scenario's send; the steps it sends, and whether it
    finishes the stream."""
    first = min(mode, 1)
    if first:
        anyio.run(_send_steps, url, endpoint, ranks, range(first), comp, n)
    return range(first, first + 1), mode == 2


def calibrate(
    endpoint: dict[str, Any], keys: list[tuple[tuple[int, str | None, int], int]]
) -> dict[str, Any]:
    """The store calls of each scenario's send (see :data:`MODES`) in ``keys``, one
    after the other in this child: ``calls[i]`` lists those of ``keys[i]``."""
    calls = install_hooks(None)
    out = []
    for (ranks, comp, n), mode in keys:
        url = _prepare(endpoint)
        try:
            steps, finish = _scenario(url, endpoint, ranks, comp, n, mode)
            calls.clear()  # count from here, as the victim does
            anyio.run(_send_steps, url, endpoint, ranks, steps, comp, n, finish)
            out.append(list(calls))
        finally:
            _clean(endpoint, url)
    return {"outcome": EXACT, "calls": out}


def kill_at_call(
    endpoint: dict[str, Any],
    ranks: int,
    comp: str | None,
    n: int,
    mode: int,
    at: int,
    after: bool,
) -> dict[str, Any]:
    """A sender forked from this child is killed at its ``at``-th store call; then the
    prefix is judged."""
    url = _prepare(endpoint)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the victim
        code = 0
        try:
            os.close(r)
            steps, finish = _scenario(url, endpoint, ranks, comp, n, mode)
            install_hooks(at, after)
            anyio.run(_send_steps, url, endpoint, ranks, steps, comp, n, finish)
        except BaseException as exc:
            code = 3 if isinstance(exc, rlwire.RlwireError) else 4
            with contextlib.suppress(OSError):
                os.write(w, (describe(exc) + "\n" + traceback.format_exc()[-600:]).encode())
        finally:
            os._exit(code)
    os.close(w)
    try:
        status = reap(pid, TIMEOUT / 2)
        with os.fdopen(r, "rb") as f:
            said = f.read().decode(errors="replace")
        if status is None:
            return {"outcome": HANG, "detail": "the sender did not end"}
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) in (3, 4):
            outcome = TYPED if os.WEXITSTATUS(status) == 3 else UNTYPED
            return {"outcome": outcome, "detail": f"the sender failed before its kill: {said}"}
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        got = judge(url, endpoint, ranks, comp, n)
        if not killed:
            got["detail"] = f"(the send made fewer calls: no kill) {got['detail']}"
        return got
    finally:
        _clean(endpoint, url)


def fault_at_request(
    endpoint: dict[str, Any],
    ranks: int,
    comp: str | None,
    n: int,
    mode: int,
    at: int,
    action: str,
    seconds: float,
    go_on: bool,
) -> dict[str, Any]:
    """The scenario's send goes through a :class:`FaultProxy` that fails its ``at``-th
    request (``action``; a hold or an outage lasts ``seconds``). If the send failed and
    ``go_on``, the same sender then sends once more, the fault over. The send's claims
    and what closing left are checked, then the prefix is judged."""
    url = _prepare(endpoint)
    try:
        steps, finish = _scenario(url, endpoint, ranks, comp, n, mode)
        step = steps[0]
        _s3_upload.RETRY_DELAYS = SHORT_RETRY_DELAYS
        error: BaseException | None = None
        sent = False
        problem: dict[str, Any] | None = None
        went_on = ""
        partial: int | None = None
        fired: list[str] = []
        timers: list[threading.Timer] = []
        with FaultProxy(endpoint) as proxy:
            fsspec.filesystem("s3", **proxy.options).retries = 1  # one attempt per call
            lock = threading.Lock()
            count = [0]
            repeat: list[tuple[str, str]] = []

            def back_up() -> None:
                proxy.down = False

            def fault(method: str, target: str) -> str | None:
                with lock:
                    count[0] += 1
                    again = bool(fired) and repeat == [(method, target)]
                    if again:
                        repeat.clear()  # aiohttp retries once
                    elif count[0] != at:
                        return None
                    if not again:
                        fired.append(f"{method} {target.partition('?')[0].rpartition('/')[2]}")
                        if method in IDEMPOTENT:
                            repeat.append((method, target))
                if again and action in (HOLD, OUTAGE):
                    return RESET  # the hold is over by now, or the outage resets it
                if action == HOLD:
                    timers.append(threading.Timer(seconds, proxy.release))
                elif action == OUTAGE:
                    proxy.down = True
                    timers.append(threading.Timer(seconds, back_up))
                else:
                    return action
                timers[-1].start()
                return HOLD if action == HOLD else RESET

            proxy.fault = fault

            async def send() -> None:
                nonlocal sent, error, problem, went_on, partial
                async with rlwire.open_sender(
                    url, storage_options=proxy.options, **_sender_options(comp)
                ) as sender:
                    try:
                        await _send_one(sender, ranks, step, n, numbered=True)
                        sent = True
                        if finish:
                            await sender.finish()
                    except rlwire.RlwireError as exc:
                        error = exc
                    if error is None or sent:
                        return
                    problem = _check_failure(url, endpoint, step, error)
                    if problem is not None or not go_on:
                        return
                    for timer in timers:  # the hold or the outage is over
                        await anyio.to_thread.run_sync(timer.join)
                    proxy.fault = None
                    # Not "whether ranks [1] are too is unknown": a step visible for
                    # some ranks is partly visible, its number used up.
                    unknown = "became visible is unknown" in str(error)
                    expected = step + 1 if "visible for ranks" in str(error) else step
                    try:
                        got = await _send_one(sender, ranks, expected, n, numbered=False)
                    except rlwire.RlwireError as exc:
                        went_on = f"the same sender refused to go on: {_brief(exc, url)}"
                        if not unknown:
                            problem = {"outcome": TYPED, "detail": went_on}
                        return
                    went_on = f"the same sender went on with step {got}"
                    if unknown or got != expected:
                        problem = {"outcome": WRONG, "detail": f"{went_on}, not {expected}"}
                    elif expected != step:
                        partial = step

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    anyio.run(send)
                except rlwire.RlwireError as exc:  # opening, or closing
                    error = exc
                except Exception as exc:
                    return {
                        "outcome": UNTYPED,
                        "detail": f"{describe(exc)}\n{traceback.format_exc()[-600:]}",
                    }
            for timer in timers:
                timer.join()
        warned = [
            str(w.message)
            for w in caught
            if issubclass(w.category, ResourceWarning) and "multipart" in str(w.message)
        ]
        what = f"fault on {fired[0] if fired else 'no request'}"
        what += f"; send raised {_brief(error, url)}" if error else "; send returned"
        what += f"; {went_on}" if went_on else ""
        what += "; closing warned that uploads are left" if warned else ""
        if problem is None:
            problem = _check_claims(url, endpoint, step, ranks, finish, sent, error, warned)
        if problem is not None:
            problem["detail"] = f"{what}: {problem['detail']}"
            return problem
        got = judge(url, endpoint, ranks, comp, n, partial)
        got["detail"] = f"{what}; {got['detail']}"
        return got
    finally:
        _clean(endpoint, url)


def _brief(exc: BaseException, url: str) -> str:
    """An rlwire error, without its URL and the connection error's long tail."""
    text = describe(exc).replace(f"{url}: ", "").replace(f"{url}/", "")
    return text.partition(": EndpointConnectionError")[0]


async def _send_one(
    sender: rlwire.TrainingBatchSender, ranks: int, step: int, n: int, *, numbered: bool
) -> int:
    """Send the payload of ``step`` (as ``step=step`` if ``numbered``); the step used."""
    kwargs = {"step": step} if numbered else {}
    if ranks == 1:
        return await sender.send(payload(step, 0, n), **kwargs)
    return await sender.send_ranks([payload(step, r, n) for r in range(ranks)], **kwargs)


def _check_failure(
    url: str, endpoint: dict[str, Any], step: int, error: BaseException
) -> dict[str, Any] | None:
    """Right after a send failed: what its error says is visible must be; None if so."""
    have = _visible(_names(_client(endpoint), url)).get(step, set())
    text = str(error)
    if "nothing was made visible" in text and have:
        return {"outcome": HALF, "detail": f"step {step} is visible for ranks {sorted(have)}"}
    if "visible for ranks" in text and not have:
        return {"outcome": WRONG, "detail": f"step {step} is not visible for any rank"}
    return None


def _check_claims(
    url: str,
    endpoint: dict[str, Any],
    step: int,
    ranks: int,
    finish: bool,
    sent: bool,
    error: BaseException | None,
    warned: list[str],
) -> dict[str, Any] | None:
    """What the send (failed or not) and closing said must be true of the bucket; None
    if it is."""
    client = _client(endpoint)
    left = _uploads(client, url)
    if left and not warned:
        keys = sorted(k.rpartition("/")[2] for k, _ in left)
        return {"outcome": HALF, "detail": f"closing left multipart uploads {keys}, no warning"}
    names = _names(client, url)
    have = _visible(names).get(step, set())
    if sent and have != set(range(ranks)):
        return {"outcome": WRONG, "detail": f"send returned, step {step} visible for {have}"}
    if sent and finish and error is None and END_NAME not in names:
        return {"outcome": WRONG, "detail": "finish() returned, but there is no end mark"}
    return None


# ------------------------------------------------------------------------------ judging


def judge(
    url: str,
    endpoint: dict[str, Any],
    ranks: int,
    comp: str | None,
    n: int,
    partial: int | None = None,
) -> dict[str, Any]:
    """Judge a prefix a sender was killed or failed in (``kills.classify``'s rules),
    then check that the last sender opened on it left no multipart upload.

    ``partial``: a step the sender reported visible for some ranks only, after which it
    went on (its number is used up): it may be incomplete although not the last."""
    got = _classify(url, endpoint, ranks, comp, n, partial)
    if got["outcome"] in (EXACT, PARTLY):
        left = _uploads(_client(endpoint), url)
        if left:
            keys = sorted(k.rpartition("/")[2] for k, _ in left)
            return {
                "outcome": HALF,
                "detail": f"multipart uploads {keys} left after the reopened sender closed "
                f"({got['outcome']}: {got['detail']})",
            }
    return got


def _classify(
    url: str, endpoint: dict[str, Any], ranks: int, comp: str | None, n: int, partial: int | None
) -> dict[str, Any]:
    mains = _visible(_names(_client(endpoint), url))

    def receive(step: int, rank: int) -> dict[str, Any]:
        return receive_one(url, step, rank, payload(step, rank, n), timeout=1)

    bad = check_visible(mains, receive)
    if bad is not None:
        return bad
    holes = [s for s in range(min(mains), max(mains)) if s not in mains] if mains else []
    if holes:
        return {"outcome": HALF, "detail": f"steps {holes} missing (a hole)"}
    incomplete = sorted(s for s, have in mains.items() if len(have) != ranks)
    if incomplete:
        last = max(mains)
        if not set(incomplete) <= {last, partial}:
            return {"outcome": HALF, "detail": f"incomplete steps {incomplete} (last {last})"}
        first = incomplete[0]
        have = {s: sorted(mains[s]) for s in incomplete}
        try:
            anyio.run(_send_steps, url, endpoint, ranks, range(0), comp, n)
        except rlwire.StepExistsError as exc:
            if f"step {first} " in str(exc) or str(exc).endswith(f"step {first}"):
                return _repair(url, endpoint, ranks, comp, n, range(first, last + 1), have, exc)
            return {"outcome": HALF, "detail": f"resume refused, but not naming {first}: {exc}"}
        except Exception as exc:
            return {"outcome": UNTYPED, "detail": describe(exc)}
        return {"outcome": HALF, "detail": f"resume accepted steps {sorted(mains)}, ranks {have}"}
    # A consistent prefix: the end mark and a resumed sender.
    nxt = max(mains) + 1 if mains else 0
    bad = check_end_and_resume(
        url,
        ranks,
        nxt,
        has_end=END_NAME in _names(_client(endpoint), url),
        receive=receive,
        send_next=lambda: anyio.run(
            _send_steps, url, endpoint, ranks, range(nxt, nxt + 1), comp, n
        ),
        storage_options=endpoint,
    )
    if bad is not None:
        return bad
    seen = "nothing visible" if not mains else f"steps {sorted(mains)} whole"
    return {"outcome": EXACT, "detail": seen}


def _repair(
    url: str,
    endpoint: dict[str, Any],
    ranks: int,
    comp: str | None,
    n: int,
    steps: range,
    have: dict[int, list[int]],
    refusal: Exception,
) -> dict[str, Any]:
    """Follow the refusal's advice (truncate at the first incomplete step, send it and
    any later one again): every rank must then receive them exactly."""
    try:
        send = functools.partial(_send_steps, start_step=steps[0], on_existing="truncate")
        anyio.run(send, url, endpoint, ranks, steps, comp, n)
    except Exception as exc:
        return {"outcome": UNTYPED, "detail": f"repair after a partly visible step: {exc!r}"}
    for step in steps:
        for rank in range(ranks):
            got = receive_one(url, step, rank, payload(step, rank, n), timeout=1)
            if got["outcome"] != EXACT:
                got["detail"] = f"step {step} sent again after truncating: {got['detail']}"
                return got
    return {"outcome": PARTLY, "detail": f"visible ranks {have}: {refusal}"}


# ----------------------------------------------------------------------------- the jobs


def _describe(ranks: int, comp: str | None, n: int, mode: int) -> str:
    size = "multipart" if n == LARGE else "small"
    return f"{ranks} rank(s) {comp} {size} {MODES[mode]}"


def _calibrate(
    endpoint: dict[str, Any], keys: list[tuple[tuple[int, str | None, int], int]]
) -> dict[Any, list[str]]:
    """The calls of each (config, mode), counted in forked children (one per core,
    each taking a share of ``keys``)."""
    out: dict[Any, list[str]] = {}

    def done(job: Job, result: dict[str, Any]) -> None:
        if result.get("outcome") != EXACT:
            raise RuntimeError(f"chaos: S3 calibration failed: {result}")
        out.update(zip(job.tag, result["calls"], strict=True))

    parallel = os.cpu_count() or 2
    shares = [keys[i::parallel] for i in range(parallel) if keys[i::parallel]]
    run_jobs(
        [Job(calibrate, (endpoint, share), timeout=TIMEOUT, tag=share) for share in shares],
        done,
        parallel=parallel,
    )
    return out


def jobs(root: str, endpoint: dict[str, Any], total: int, seed: int) -> Iterator[Job]:
    """``total`` trials: two thirds kills, one third faults, deterministic from
    ``seed``. Kills go over every call (before and after it) of every configuration and
    scenario when the budget allows, the rest being faults; else a sample. Small budgets
    (under three per configuration and scenario) calibrate only the configurations they
    sample. The calibration runs in forked children, at the first ``next()``."""
    del root  # everything goes to the bucket
    rng = random.Random(seed)
    keys = [(cfg, mode) for cfg in CONFIGS for mode in MODES]
    faults = total // 3
    kills = total - faults
    small = total < 3 * len(keys)
    if small:
        kill_keys = [rng.choice(keys) for _ in range(kills)]
        fault_keys = [rng.choice(keys) for _ in range(faults)]
        need = [k for k in keys if k in kill_keys or k in fault_keys]
    else:
        need = keys
    calls = _calibrate(endpoint, need) if need else {}
    if small:
        plan = [(key, rng.randint(1, len(calls[key])), rng.random() < 0.5) for key in kill_keys]
    else:
        every = [
            (key, at, after)
            for key in keys
            for at in range(1, len(calls[key]) + 1)
            for after in (False, True)
        ]
        plan = every if kills >= len(every) else rng.sample(every, kills)
        faults = total - len(plan)
        fault_keys = [rng.choice(keys) for _ in range(faults)]
    for (cfg, mode), at, after in plan:
        call = calls[(cfg, mode)][at - 1]
        yield Job(
            kill_at_call,
            (endpoint, *cfg, mode, at, after),
            timeout=TIMEOUT,
            tag=(
                CAMPAIGN,
                f"kill {'after' if after else 'before'} call #{at} ({call}), "
                f"{_describe(*cfg, mode)}",
            ),
        )
    for cfg, mode in fault_keys:
        names = calls[(cfg, mode)]
        commits = [i for i, call in enumerate(names, 1) if call.startswith(COMMIT_CALLS)]
        # Half of the faults hit a request that makes an object visible, where the
        # visibility promises live; the others any request of the send.
        at = rng.choice(commits) if commits and rng.random() < 0.5 else rng.randint(1, len(names))
        action = rng.choice(FAULTS)
        seconds = rng.uniform(0.05, 0.5) if action == HOLD else rng.uniform(0.1, 1.5)
        go_on = rng.random() < 0.5
        lasting = f" {seconds:.2f} s" if action in (HOLD, OUTAGE) else ""
        then = ", then the same sender goes on" if go_on else ""
        yield Job(
            fault_at_request,
            (endpoint, *cfg, mode, at, action, seconds, go_on),
            timeout=TIMEOUT,
            tag=(
                CAMPAIGN,
                f"{action}{lasting} at request #{at} ({calls[(cfg, mode)][at - 1]}), "
                f"{_describe(*cfg, mode)}{then}",
            ),
        )
