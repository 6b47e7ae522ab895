"""kombu's filesystem transport, made safe for several processes (``./cirval up``'s broker).

kombu's own ``filesystem://`` writes a message in place under its final name, and a worker
that lists the folder while the file is still being written reads half a message: its JSON
does not parse and the worker dies (``Unrecoverable error: JSONDecodeError``). It also takes a
message by moving it to the system's temporary folder, which is a copy (not atomic) when
that folder is on another disk. Here:

* a message is written under a hidden temporary name in the queue folder, flushed, then
  renamed to its final name (``os.replace``: atomic on one filesystem), so a reader sees a
  whole message or none;
* a worker takes a message by renaming it into a ``processing`` folder beside the queue (one
  filesystem again: of two workers, exactly one wins);
* a message that is not JSON all the same (a file put there by hand, a disk error) is moved
  to ``broker/bad`` and logged, never delivered and never fatal.

Selected by ``CELERY_BROKER_URL=filesystem://`` (the default): :func:`register`, called by
``config/celery.py`` in every process, maps kombu's ``filesystem`` name to this class.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

from kombu.transport import filesystem
from kombu.transport.virtual import Empty
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

logger = logging.getLogger("config.fsbroker")

#: Prefix of a message being written (never matches a queue's ``<name>.msg`` suffix rule).
PARTIAL = ".partial-"


def write_atomically(folder: str, name: str, data: bytes) -> str:
    """Write ``data`` to ``folder/name`` so that no reader ever sees a part of it."""
    tmp = os.path.join(folder, f"{PARTIAL}{uuid.uuid4().hex}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    final = os.path.join(folder, name)
    os.replace(tmp, final)
    return final


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        """Put a message on ``queue``: written aside, then renamed into place."""
        name = f"{int(round(filesystem.monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        try:
            write_atomically(self.data_folder_out, name, str_to_bytes(dumps(payload)))
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add file {name!r} to directory") from exc

    def _side_folder(self, which: str) -> Path:
        folder = Path(self.data_folder_in).parent / which
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _get(self, queue):
        """Take the oldest whole message of ``queue`` (a rename: one taker only)."""
        suffix = f"{queue}.msg"
        for filename in sorted(os.listdir(self.data_folder_in)):
            if filename.startswith(PARTIAL) or filename.partition(".")[2] != suffix:
                continue
            taken = self._side_folder("processing") / filename
            try:
                os.replace(os.path.join(self.data_folder_in, filename), taken)
            except OSError:
                continue  # another worker took it
            try:
                payload = taken.read_bytes()
                message = loads(bytes_to_str(payload))
            except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
                bad = self._side_folder("bad") / filename
                os.replace(taken, bad)
                logger.error("broker message %s is unreadable (%s): moved to %s, not delivered", filename, exc, bad)
                continue
            if self.store_processed:
                os.replace(taken, Path(self.processed_folder) / filename)
            else:
                taken.unlink(missing_ok=True)
            return message
        raise Empty()


class Transport(filesystem.Transport):
    """kombu's filesystem transport with :class:`Channel`'s atomic put and take.

    No host: the broker is a folder. kombu's virtual transports default to ``localhost``,
    so every connection (the web process's sends, the worker's start) warned "No hostname
    was supplied. Reverting to default 'localhost'" of a server that does not exist."""

    Channel = Channel

    @property
    def default_connection_params(self):
        return {"port": None, "hostname": None}


def register() -> None:
    """Make ``filesystem://`` broker URLs use :class:`Transport` in this process."""
    from kombu.transport import TRANSPORT_ALIASES

    TRANSPORT_ALIASES["filesystem"] = "config.fsbroker:Transport"
