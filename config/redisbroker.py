"""kombu's Redis transport, patched so that a Redis restart cannot kill a worker.

After a Redis restart the worker's consumer releases its old connection; closing the old
channel tries to put the unacknowledged messages back (``restore_unacked``), which asks the
channel for a new connection pool, and the pool's parameters come from the connection's
client, already gone: ``AttributeError: 'NoneType' object has no attribute 'hostname'``.
kombu's ``ignore_errors`` around the release only catches connection errors, so the
AttributeError reached Celery as an unrecoverable error and the worker exited (4 of 4 Redis
restarts during an import or export; reproduced by ``tests/integration/test_worker_survival.py``
on kombu 5.7.0). Here the closed channel raises Redis's ``ConnectionError`` instead: the
release goes on, the consumer reconnects. The unacknowledged messages are what a restarted
Redis lost anyway; the job sweep resends their work (``retrieval/jobs/leases.py``).

:func:`register` maps kombu's ``redis`` and ``rediss`` names to :class:`Transport`.
"""

from __future__ import annotations

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous=False):
        if self.connection.client is None:  # the connection this channel belonged to is closed
            raise kombu_redis.redis.exceptions.ConnectionError("the broker connection was closed")
        return super()._connparams(asynchronous=asynchronous)


class Transport(kombu_redis.Transport):
    Channel = Channel


def register() -> None:
    """Make ``redis://`` and ``rediss://`` broker URLs use :class:`Transport` in this process."""
    from kombu.transport import TRANSPORT_ALIASES

    for name in ("redis", "rediss"):
        TRANSPORT_ALIASES[name] = "config.redisbroker:Transport"
