"""Test helpers and the contract every sink must meet, for rlwire and for plugin authors.

:class:`SinkContract` is a pytest test class. Subclass it in a test module of your
plugin, give it a ``sink_url`` fixture that returns a fresh URL for each test, and pytest
runs the whole contract against your sink: round trips through the public
:func:`~rlwire.open_sender` / :func:`~rlwire.open_receiver`, per-rank payloads, the
sidecar, receivers that start late, timeouts, cancelled sends and closing. rlwire runs
the same class against each of its own sinks (``tests/transport/test_contract.py``)::

    import pytest
    from rlwire.testing import SinkContract

    class TestMySink(SinkContract):
        @pytest.fixture
        def sink_url(self, tmp_path):
            return f"myscheme://{tmp_path}/run"

:class:`SinkContract` needs pytest (imported when it is first used) and anyio's pytest
plugin (installed with anyio); the async tests run under asyncio and, when it is
installed, trio. The property over column-stored values
(``columns_examples`` per sink) needs hypothesis and is skipped without it. Override
``sender_options`` / ``receiver_options`` to pass ``storage_options``, set
``persistent = False`` for a sink that keeps nothing once the sender is gone (a socket
rather than a store), and raise ``timeout`` (30 s, how long a test waits for a step,
a part or the end of the stream before it fails) for a slow store.

The batch helpers (:func:`make_sample`, :func:`make_batch`,
:func:`assert_batches_equal`) are useful in any test of code that sends batches.
"""

from rlwire._api.synthetic import assert_batches_equal, make_batch, make_sample
from rlwire._core.faces import claim, names_on_demand

__all__ = ["SinkContract", "assert_batches_equal", "make_batch", "make_sample"]

claim(__name__, globals(), [name for name in __all__ if name != "SinkContract"])

# The contract needs pytest, imported on first use: a process that only makes and
# compares batches (a test's child process, a benchmark) starts without it.
__getattr__ = names_on_demand(
    __name__, optional={"SinkContract": "rlwire.testing._contract:SinkContract"}
)
