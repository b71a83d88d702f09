"""Memory sizes as people write them on a command line (``--max-memory 6GiB``) and read them.

Powers of 1024, as ``free -h``, ``top`` and TensorRT's memory pools count memory: ``K``, ``KB``,
``KiB`` and ``Ki`` are 1024 bytes, ``M`` 1024², ``G`` 1024³, ``T`` 1024⁴; a plain number is
bytes. One parser for every size option (``--max-memory``, ``--workspace``, ``--memory-pool``).
"""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1,
    "b": 1,
    **{f"{p}{s}": 1024 ** (i + 1) for i, p in enumerate("kmgt") for s in ("", "b", "i", "ib")},
}
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)")
MAX_SIZE_BYTES = 1 << 60
"""An exbibyte: larger is a typo."""


class SizeError(ValueError):
    """A size that cannot be read; the message says why."""


def parse_size(text: str) -> int:
    """Bytes in ``text`` (``250MiB``, ``5.5G``, ``4096``): 0 or more, at most an EiB."""
    match = _SIZE.fullmatch(text.strip().lower())
    if match is None or match.group(2) not in _UNITS:
        raise SizeError(f"{text!r} is not a size (write 4G, 512M, 1024MiB or bytes)")
    size = float(match.group(1)) * _UNITS[match.group(2)]
    if not math.isfinite(size) or size > MAX_SIZE_BYTES:
        raise SizeError(f"{text!r} is larger than any memory")
    return int(size)


def format_bytes(count: float) -> str:
    """``455 MiB``, ``5.1 GiB``: binary units, as ``top`` and ``free -h`` show memory."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            value = count / size
            return f"{value:.1f} {unit}" if value < 10 and unit == "GiB" else f"{value:.0f} {unit}"
    return f"{count:.0f} B"
