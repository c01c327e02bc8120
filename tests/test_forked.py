"""The fork server of the tests (tests/forked.py): its children behave as a new
interpreter's would in what the tests rely on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import forked
import pytest


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code), *args]


def test_a_child_is_forked_with_its_arguments_streams_and_exit_code() -> None:
    done = forked.run(
        python(
            """
            import os, sys
            print(sys.argv[1:], os.getppid() != int(sys.argv[1]), flush=True)
            print(sys.stdin.read().upper(), file=sys.stderr)
            raise SystemExit(3)
            """,
            str(os.getpid()),
            "b",
        ),
        input="in",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3
    assert done.stdout == f"[{str(os.getpid())!r}, 'b'] True\n"  # the server's child
    assert done.stderr == "IN\n"


def test_the_server_imported_what_a_child_uses_before_the_fork() -> None:
    done = forked.run(
        python("import sys; print('rlwire' in sys.modules, __name__)"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout == "True __main__\n"


def test_an_uncaught_exception_prints_its_traceback_and_exits_1() -> None:
    done = forked.run(
        python("raise ValueError('from the child')"), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "ValueError: from the child" in done.stderr


def test_environment_directory_and_pythonpath_are_the_childs(tmp_path: Path) -> None:
    (tmp_path / "only_here.py").write_text("WHERE = 'found'\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "FORKED_TEST": "set"}
    done = forked.run(
        python(
            "import os, only_here; print(os.getcwd(), os.environ['FORKED_TEST'], only_here.WHERE)"
        ),
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert done.stdout == f"{tmp_path} set found\n", done.stderr


def test_exit_waits_for_threads_and_runs_atexit() -> None:
    done = forked.run(
        python(
            """
            import atexit, threading, time
            atexit.register(print, "atexit", flush=True)
            threading.Thread(target=lambda: (time.sleep(0.2), print("thread", flush=True))).start()
            """
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout == "thread\natexit\n"


def test_a_killed_child_reports_the_signal_and_a_timeout_raises() -> None:
    with forked.Popen(python("import time; time.sleep(60)")) as proc:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.2)
        assert proc.poll() is None
        proc.kill()
        assert proc.wait(60) == -signal.SIGKILL


def test_other_forms_start_a_new_interpreter() -> None:
    proc = forked.Popen([sys.executable, "-m", "this"], stdout=subprocess.DEVNULL)
    assert isinstance(proc, subprocess.Popen)
    assert proc.wait(60) == 0


def test_poll_kill_and_wait_after_the_child_ended_on_its_own() -> None:
    proc = forked.Popen(python("pass"))
    assert proc.wait(60) == 0
    assert proc.poll() == 0
    proc.kill()  # reaped already: nothing to signal, no error (as subprocess)
    with forked.Popen(python("import time; time.sleep(60)")) as sleeper:
        with pytest.raises(subprocess.TimeoutExpired):
            sleeper.wait(0)
        sleeper.kill()


def test_wait_and_poll_from_two_threads_see_one_exit_status() -> None:
    for _ in range(20):
        proc = forked.Popen(python("pass"))
        codes: list[int | None] = []
        waiter = threading.Thread(target=lambda p=proc, c=codes: c.append(p.wait(60)))
        waiter.start()
        while proc.poll() is None:
            time.sleep(0.001)
        waiter.join(60)
        assert codes == [0] and proc.returncode == 0


def test_communicate_again_after_a_timeout_gets_all_the_output() -> None:
    proc = forked.Popen(
        python("import time; print('partial', flush=True); time.sleep(0.5); print('rest')"),
        stdout=subprocess.PIPE,
        text=True,
    )
    with pytest.raises(subprocess.TimeoutExpired):
        proc.communicate(timeout=0.05)
    assert proc.communicate(timeout=60) == ("partial\nrest\n", None)


def test_a_child_starts_in_the_tests_directory_with_its_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    old = os.umask(0o077)
    try:
        done = forked.run(
            python("import os; print(os.getcwd(), oct(os.umask(0)))"),
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        os.umask(old)
    assert done.stdout == f"{tmp_path} 0o77\n"


def test_a_client_gone_mid_request_leaves_the_server_and_its_children_running() -> None:
    with forked.Popen(python("import time; time.sleep(0.5)")) as running:
        with pytest.raises(OSError):
            forked.Popen(python("pass"), stdin=999)  # not a descriptor: the send fails
        assert running.wait(60) == 0
    assert forked.run(python("pass"), timeout=60).returncode == 0
