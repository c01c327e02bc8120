"""Prometheus metrics from rlwire's per-step figures (needs ``rlwire[metrics]``).

:class:`Metrics` turns each :class:`~rlwire.SendStats` and :class:`~rlwire.ReceiveStats`
into Prometheus counters and histograms. Pass its :meth:`~Metrics.observe_send` as a
sender's ``on_stats=``, and hand it each ``receiver.last_stats``; expose the registry as
usual (``prometheus_client.start_http_server``).

Example:
    >>> import prometheus_client, rlwire
    >>> from rlwire.metrics import Metrics
    >>> registry = prometheus_client.CollectorRegistry()
    >>> metrics = Metrics(registry=registry)
    >>> metrics.observe_send(rlwire.SendStats(step=0, ranks=1, bytes_per_rank=(100,)))
    >>> registry.get_sample_value("rlwire_sent_bytes_total")
    100.0
"""

from rlwire._api.metrics import Metrics
from rlwire._core.faces import claim

__all__ = ["Metrics"]

claim(__name__, globals(), __all__)
