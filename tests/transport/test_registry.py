"""Sink plugins found through the `rlwire.sinks` entry point group.

The example plugin in examples/plugin_sink (the `sqlite://` scheme) is built and
installed with pip, as a user would install it, and then used by URL scheme alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import assert_batches_equal, make_batch

import rlwire
from rlwire import ConfigError
from rlwire.aio import run_sliced
from rlwire.codecs import available_codecs, make_codec
from rlwire.transport import available_schemes, get_sink_class, register_sink

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plugin_sink"
BUILTIN_SCHEMES = {"file", "memory", "s3", "gs", "gcs", "zmq+tcp", "zmq+ipc", "ray"}


# Session-wide, and its tests in one xdist group: pip builds the plugin once (about 4 s
# of CPU in an isolated build environment), not once per worker that runs one of them.
@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example plugin, built and installed by pip into a directory of its own.

    --no-deps: rlwire itself is already installed; pip still fetches the build backend
    into an isolated build environment, as for any user's install.
    """
    target = tmp_path_factory.mktemp("plugin") / "site"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-input",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(EXAMPLE),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode:
        pytest.fail(f"pip could not install {EXAMPLE.name}:\n{result.stdout}\n{result.stderr}")
    return target


@pytest.fixture
def plugin_on_path(site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The installed plugin visible to this process, as if installed in its environment:
    the registry reads the entry points again for a scheme it does not know yet."""
    monkeypatch.syspath_prepend(str(site))
    yield site
    # The plugin stays imported (and its scheme loaded) for the rest of the session, as
    # in a process that uses an installed plugin: `site` is session-wide.


# Run in a fresh interpreter, so that the only way rlwire can know the `sqlite` scheme is
# the installed package's entry point. Every check exits nonzero with a reason.
SCRIPT = textwrap.dedent(
    """
    import contextlib
    import sqlite3
    import sys
    from pathlib import Path

    import anyio
    import numpy as np

    import rlwire
    from rlwire.transport import available_schemes

    url, db, site = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    schemes = available_schemes()
    if "sqlite" not in schemes:
        sys.exit(f"sqlite is not an available scheme: {schemes}")

    def batch(seed: int) -> rlwire.TrainingBatch:
        rng = np.random.default_rng(seed)
        return rlwire.TrainingBatch(
            samples=[
                rlwire.TrainingSample(
                    token_ids=rng.integers(0, 50_000, n),
                    mask=rng.random(n) < 0.5,
                    logprobs=-rng.exponential(size=n).astype(np.float32),
                    temperatures=np.ones(n, np.float32),
                    advantages=rng.standard_normal(n).astype(np.float32),
                    env_name=f"env{seed}",
                    routed_experts=rng.integers(0, 256, (n, 4, 2), dtype=np.uint8),
                )
                for n in (16, 300)
            ]
        )

    steps = [[batch(10 * step + rank) for rank in range(2)] for step in range(2)]

    async def send() -> None:
        async with rlwire.open_sender(url, sidecar=("routed_experts",)) as sender:
            for payloads in steps:
                await sender.send_ranks(payloads)

    anyio.run(send)
    for rank in range(2):
        with rlwire.open_receiver(url, rank=rank) as receiver:
            for step, payloads in enumerate(steps):
                got = receiver.receive(timeout=10)
                for sent, received in zip(payloads[rank].samples, got.samples, strict=True):
                    for field in ("token_ids", "mask", "logprobs", "advantages", "routed_experts"):
                        a, b = getattr(sent, field), getattr(received, field)
                        if a.dtype != b.dtype or not np.array_equal(a, b):
                            sys.exit(f"step {step} rank {rank}: {field} differs")
            if receiver.poll() is not None:
                sys.exit(f"rank {rank}: a third step appeared")

    import rlwire_sqlite_sink

    if site not in Path(rlwire_sqlite_sink.__file__).parents:
        sys.exit(f"the plugin was imported from {rlwire_sqlite_sink.__file__}, not {site}")
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute(
            "SELECT count(*), sum(name LIKE '%.sidecar.rlw') FROM rlwire_messages "
            "WHERE name LIKE 'step-%'"
        ).fetchone()
    if rows != (8, 4):
        sys.exit(f"expected 4 rows with sidecars in {db}, found {rows}")

    try:
        rlwire.open_sender("nope://x")
    except rlwire.ConfigError as exc:
        if "sqlite" not in str(exc):
            sys.exit(f"the unknown-scheme error does not list the plugin: {exc}")
    else:
        sys.exit("an unknown scheme was accepted")
    print("plugin ok")
    """
)


@pytest.mark.xdist_group("plugin")
def test_installed_plugin_moves_batches_by_url_scheme(site: Path, tmp_path: Path) -> None:
    db = tmp_path / "db dir" / "run.db"  # a space, so the URL needs quoting
    url = "sqlite" + db.as_uri().removeprefix("file")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, url, str(db), str(site)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert result.stdout.strip() == "plugin ok"


def test_unknown_scheme_lists_every_installed_sink() -> None:
    installed = set(available_schemes())
    assert installed >= BUILTIN_SCHEMES
    for open_url in (rlwire.open_sender, rlwire.open_receiver):
        with pytest.raises(ConfigError, match=r"unknown URL scheme 'nope'") as info:
            open_url("nope://bucket/run")
        listed = str(info.value).partition("installed sinks serve: ")[2]
        assert installed <= {name.strip() for name in listed.split(",")}, str(info.value)


def installed(site: Path, name: str, entry_points: str) -> None:
    """Install the distribution ``name`` (``_`` in a file name, ``-`` in its metadata)
    into ``site``, as pip would leave its metadata: ``entry_points`` is its
    entry_points.txt."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(entry_points)


@contextlib.contextmanager
def on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, packages: dict[str, str]
) -> Iterator[None]:
    """Install ``packages`` (a name and its entry_points.txt each, :func:`installed`)
    into a site on sys.path; then take it off and read the entry points again, so
    that the rest of the session sees none of them."""
    site = tmp_path / "site"
    for name, entry_points in packages.items():
        installed(site, name, entry_points)
    monkeypatch.syspath_prepend(str(site))
    yield
    monkeypatch.undo()
    available_schemes(), available_codecs()


@pytest.fixture
def broken_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A distribution whose entry points name a missing module and a class that is not
    a Sink: its metadata on sys.path, as an installed package's would be."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "not_a_sink.py").write_text("class Thing:\n    pass\n")
    installed(
        site,
        "broken_sinks",
        "[rlwire.sinks]\nmissing = no_such_module:Sink\nthing = not_a_sink:Thing\n",
    )
    monkeypatch.syspath_prepend(str(site))
    yield
    sys.modules.pop("not_a_sink", None)


def test_plugins_that_cannot_serve_their_scheme(broken_plugins: None) -> None:
    assert {"missing", "thing"} <= set(available_schemes())
    with pytest.raises(
        ConfigError, match=r"sink for 'missing' \(no_such_module:Sink\) cannot be loaded"
    ):
        rlwire.open_sender("missing://x")
    with pytest.raises(ConfigError, match=r"not_a_sink:Thing is not a subclass of rlwire.abc.Sink"):
        rlwire.open_receiver("thing://x")


@pytest.mark.anyio
@pytest.mark.xdist_group("plugin")
async def test_plugin_sink_objects_with_the_sender_and_receiver(
    plugin_on_path: Path, tmp_path: Path
) -> None:
    """The example's classes used directly, and a step that is staged but not committed
    staying invisible to every rank."""
    sink_class: Any = get_sink_class("sqlite")  # loaded through the entry point
    assert sink_class.__module__ == "rlwire_sqlite_sink.sink"
    assert plugin_on_path in Path(sys.modules[sink_class.__module__].__file__ or "").parents
    from rlwire_sqlite_sink import SqliteSink, SqliteSource

    assert sink_class is SqliteSink
    db = tmp_path / "run.db"
    codec = make_codec("msgpack", sidecar=("routed_experts",))
    sink = SqliteSink(db, table="direct", timeout=1.0)
    receivers: list[rlwire.TrainingBatchReceiver[rlwire.TrainingBatch]] = [
        rlwire.TrainingBatchReceiver(
            SqliteSource(db, table="direct", rank=rank), rlwire.TrainingBatch
        )
        for rank in range(2)
    ]
    try:
        assert [r.poll() for r in receivers] == [None, None]  # no database yet
        async with rlwire.TrainingBatchSender(sink, codec) as sender:
            payloads = [make_batch(2, seed=rank) for rank in range(2)]
            assert await sender.send_ranks(payloads) == 0
            for rank, receiver in enumerate(receivers):
                assert_batches_equal(receiver.receive(timeout=5), payloads[rank])

            # Staged by hand, as the sender would: written, yet no rank sees it.
            later = [make_batch(1, seed=10 + rank) for rank in range(2)]
            staged = run_sliced(sink.stage(1, [run_sliced(codec.encode_sliced(b)) for b in later]))
            assert [r.poll() for r in receivers] == [None, None]
            staged.commit()
            for rank, receiver in enumerate(receivers):
                assert_batches_equal(receiver.receive(timeout=5), later[rank])
            with pytest.raises(rlwire.StepExistsError, match="step 1: already exists"):
                await sender.send(make_batch(1))
    finally:
        for receiver in receivers:
            receiver.close()


class MemorySink(rlwire.transport.FileSink):
    """A sink class registered in process (a FileSink under another scheme)."""


def test_register_sink_in_process() -> None:
    register_sink("test-registered", MemorySink)
    assert "test-registered" in available_schemes()
    assert get_sink_class("test-registered") is MemorySink
    register_sink("test-registered", MemorySink)  # the same target again: no conflict
    with pytest.raises(ConfigError, match=r"sink for 'file' is already registered .*clobber=True"):
        register_sink("file", MemorySink)
    with pytest.raises(ConfigError, match=r"sink for .x.: .*Thing.> is not a subclass of rlwire"):
        register_sink("x", type("Thing", (), {}))
    register_sink("test-registered", "rlwire.transport:FileSink", clobber=True)
    assert get_sink_class("test-registered") is rlwire.transport.FileSink
    register_sink("test-lazy", "no_such_module:Sink")  # imported on first use only
    with pytest.raises(ConfigError, match=r"sink for 'test-lazy' \(no_such_module:Sink\)"):
        get_sink_class("test-lazy")


@pytest.fixture
def twin_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Two distributions that both register the scheme ``twin``."""
    twins = {f"twin_{x}": f"[rlwire.sinks]\ntwin = twin_{x}:Sink\n" for x in "ab"}
    with on_path(tmp_path, monkeypatch, twins):
        yield


def test_a_scheme_two_installed_packages_register_is_refused(twin_plugins: None) -> None:
    """Which of them served it depended on the order of sys.path: the error names both,
    and a choice made in process settles it."""
    with pytest.raises(
        ConfigError,
        match=r"sink for 'twin' is registered by more than one installed package: "
        r"twin-a \(twin_a:Sink\), twin-b \(twin_b:Sink\)",
    ):
        rlwire.open_sender("twin://x")
    with pytest.raises(ConfigError, match=r"sink for 'twin' is registered by more than one"):
        rlwire.open_receiver("twin://x")
    register_sink("twin", MemorySink, clobber=True)
    assert get_sink_class("twin") is MemorySink


@pytest.fixture
def odd_schemes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A distribution registering sinks under schemes no URL can carry: urllib reads
    ``my_scheme://x`` as a path, and ``MyS://x`` as the scheme ``mys``."""
    sinks = "my_scheme = rlwire.transport:FileSink\nMyS = rlwire.transport:FileSink\n"
    with on_path(tmp_path, monkeypatch, {"odd_schemes": f"[rlwire.sinks]\n{sinks}"}):
        yield


def test_a_scheme_no_url_can_carry_is_refused_not_taken_for_a_path(
    odd_schemes: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was listed, yet ``my_scheme://bucket/run`` wrote to the local directory
    ``./my_scheme:/bucket/run``, and ``MyS://`` was an unknown scheme 'mys'."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert not {"my_scheme", "MyS"} & set(available_schemes())
    for open_url in (rlwire.open_sender, rlwire.open_receiver):
        with pytest.raises(
            ConfigError,
            match=r"not a URL scheme: 'my_scheme' .*odd-schemes registers 'my_scheme' "
            r"\(rlwire.transport:FileSink\) in rlwire.sinks, ignored",
        ):
            open_url("my_scheme://bucket/run")
        with pytest.raises(ConfigError, match=r"not a URL scheme: 's3_'"):
            open_url("s3_://bucket/run")
        with pytest.raises(
            ConfigError,
            match=r"unknown URL scheme 'mys'.*odd-schemes registers 'MyS' .*read in lower case",
        ):
            open_url("MyS://bucket/run")
    assert list(cwd.iterdir()) == []  # nothing written as a local path
    assert rlwire.transport.parse_url("./my_scheme://x").scheme == "file"  # a path, said so
    for bad in ("my_scheme", "MyS", "9p", ""):
        with pytest.raises(ConfigError, match=f"sink for {bad!r}: "):
            register_sink(bad, MemorySink)


@pytest.fixture
def plugin_with_extras(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A distribution whose entry point lists extras, as the standard syntax allows."""
    sinks = "[rlwire.sinks]\nwith-extras = rlwire.transport : FileSink [fast, s3]\n"
    with on_path(tmp_path, monkeypatch, {"extras_sink": sinks}):
        yield


def test_an_entry_point_with_extras_is_loaded(plugin_with_extras: None) -> None:
    """It was refused: 'invalid format: rlwire.transport : FileSink [fast, s3]'."""
    assert get_sink_class("with-extras") is rlwire.transport.FileSink


@pytest.fixture
def malformed_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An installed package, nothing to do with rlwire, whose entry_points.txt has a line
    without '=' (under console_scripts), next to a good sink plugin."""
    packages = {
        "unrelated_tool": "[console_scripts]\nfoo\n",
        "good_sink": "[rlwire.sinks]\ngood = rlwire.transport:FileSink\n",
    }
    with on_path(tmp_path, monkeypatch, packages):
        yield


def test_a_package_with_malformed_entry_points_breaks_nothing_else(
    malformed_package: None, tmp_path: Path
) -> None:
    """Every open_sender, even of a plain path, raised a bare TypeError from
    importlib.metadata. The package is skipped, with one warning naming it."""
    with pytest.warns(RuntimeWarning, match=r"skips the entry points of .*'unrelated-tool'"):
        assert BUILTIN_SCHEMES | {"good"} <= set(available_schemes())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        assert get_sink_class("good") is rlwire.transport.FileSink
        assert "msgpack" in available_codecs()
        rlwire.open_sender(tmp_path / "run")
        rlwire.open_receiver(tmp_path / "run")


@pytest.fixture
def shadowing_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An installed package registering a sink under ``file`` and a codec under
    ``msgpack``, rlwire's own names."""
    sinks = "[rlwire.sinks]\nfile = shadow_mod:Sink\n"
    codecs = "[rlwire.codecs]\nmsgpack = shadow_mod:Codec\n"
    with on_path(tmp_path, monkeypatch, {"shadow_pkg": sinks + codecs}):
        yield


def test_a_package_cannot_take_a_builtin_name(shadowing_package: None, tmp_path: Path) -> None:
    """From a source tree (no rlwire entry points) it replaced the built-in, silently;
    installed, both were refused as a conflict, and with them every plain path. The
    built-in wins, and a warning names both."""
    with pytest.warns(RuntimeWarning) as warned:
        available_schemes(), available_codecs()  # the entry points read (not only loaded)
        assert get_sink_class("file") is rlwire.transport.FileSink
        assert type(make_codec("msgpack")).__module__.startswith("rlwire.")
    said = "\n".join(str(w.message) for w in warned)
    assert re.search(
        r"shadow-pkg registers 'file' \(shadow_mod:Sink\) in rlwire.sinks, ignored: sink for "
        r"'file' is rlwire's own \(rlwire.transport._file.sink:FileSink\)",
        said,
    ), said
    assert "shadow-pkg registers 'msgpack' (shadow_mod:Codec) in rlwire.codecs, ignored" in said
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        rlwire.open_sender(tmp_path / "run")
        rlwire.open_receiver(tmp_path / "run").close()
