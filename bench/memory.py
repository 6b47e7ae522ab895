"""Peak memory of a bench's own process (shared by the benches that measure a child)."""

from __future__ import annotations

import resource
from pathlib import Path


def peak_rss_kib() -> int:
    """Peak resident memory of this process, in KiB.

    ``VmHWM`` of /proc/self/status belongs to the memory map made at ``exec``; ru_maxrss does
    not do here: Linux carries the parent's peak into a forked child (and keeps it across
    ``exec``), so a child started by a bench that built a large study or file reports the
    parent's peak instead of its own.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
