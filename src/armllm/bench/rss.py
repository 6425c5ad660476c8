"""rss: the process's resident memory as the benchmarks report it: now
(VmRSS) and its peak so far (VmHWM), from /proc/self/status on Linux, the
peak from getrusage elsewhere (where "now" is unknown: None)."""
from __future__ import annotations

import resource
import sys


def _status_bytes(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024   # the file counts kB
    except OSError:
        pass
    return None


def rss_bytes() -> int | None:
    """Resident memory now."""
    return _status_bytes("VmRSS")


def peak_rss_bytes() -> int:
    """The most resident memory the process has held so far."""
    peak = _status_bytes("VmHWM")
    if peak is not None:
        return peak
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024   # bytes there, kB on Linux
