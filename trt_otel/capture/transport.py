"""The way a build's callback records travel from its worker process to the supervisor: an
append-only spool file, written in compact frames, read at the supervisor's own pace.

Why a file: the worker must never wait for the supervisor (its callbacks are TensorRT's), and
nothing may be lost, yet neither process may hold a backlog that grows with the build. A pipe
blocks its writer once 64 KiB are unread, so the worker's records piled up in its memory (600 MiB
in a million-step build at full speed) while the supervisor's followers piled up the rest in its
own. An append to a file never waits on the reader, the page cache and the disk hold whatever
backlog there is, and each process keeps in memory only the frame it is writing or reading. The
supervisor reads a frame only when its followers have room for it (see
:class:`~trt_otel.capture.supervisor` ), so its memory is bounded too. The file is unlinked as soon
as both
ends have it open (``/proc/PID/fd``), so nothing is left behind whatever happens to either
process. It holds the whole stream, about 60 bytes a callback (60 MiB for a million).

A frame is a little-endian ``u32`` payload length, a ``u8`` codec (0: msgpack, 1: pickle) and
the payload: ``[watermark_ns, callbacks_total, callback_ns_total, final, records]``. Records are
:data:`~trt_otel.capture.monitor.CallbackRecord` tuples as msgpack arrays; a batch msgpack cannot
carry
exactly (an integer beyond 64 bits, an argument of an odd type) goes as a pickle instead, so a
record arrives as it was made. ``watermark_ns`` is the worker's monotonic clock when it began
taking the records that end with this frame (0: more of them follow): every callback stamped
before it is in this frame or an earlier one, which is how the
supervisor places a cancel it decided among the callbacks by time.
"""

from __future__ import annotations

import os
import pickle
import struct
from dataclasses import dataclass
from typing import Any

import msgspec

_HEADER = struct.Struct("<IB")
_MSGPACK, _PICKLE = 0, 1
_ENCODER = msgspec.msgpack.Encoder()
DECODER = msgspec.msgpack.Decoder()
MAX_RECORDS_PER_FRAME = 512
"""A frame is decoded whole, into a Python object per value: 512 records (about 30 KiB) keep
what one decode allocates in the processor's cache, and it is freed before the next frame is
decoded (decoding 8,192 records at once cost the supervisor 2 to 4 times as much per record)."""
_READ_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Frame:
    """One batch of records as the worker wrote it."""

    watermark_ns: int
    callbacks_total: int
    callback_ns_total: int
    final: bool
    """The worker's last frame: nothing follows it."""
    records: list[Any]


class SpoolError(Exception):
    """A frame that cannot be read (the file was damaged, or is not a spool)."""


def encode_frame(
    records: list[Any],
    watermark_ns: int,
    callbacks_total: int,
    callback_ns_total: int,
    *,
    final: bool = False,
) -> bytes:
    """The bytes of one frame."""
    body = [watermark_ns, callbacks_total, callback_ns_total, final, records]
    try:
        payload, codec = _ENCODER.encode(body), _MSGPACK
    except (TypeError, OverflowError, ValueError):  # an odd value: keep it exactly
        payload, codec = pickle.dumps(body, protocol=pickle.HIGHEST_PROTOCOL), _PICKLE
    return _HEADER.pack(len(payload), codec) + payload


class SpoolWriter:
    """The worker's end: appends frames to the spool. Not thread-safe (one forwarder)."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def write(self, frame: bytes) -> None:
        view = memoryview(frame)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def close(self) -> None:
        os.close(self._fd)


class SpoolReader:
    """The supervisor's end: the frames appended since the last read, complete ones only."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = b""
        self._offset = 0

    def read(self, max_frames: int = 64) -> list[Frame]:
        """Up to ``max_frames`` complete frames; [] when none is complete yet."""
        frames: list[Frame] = []
        while len(frames) < max_frames:
            frame = self._next()
            if frame is None:
                chunk = os.read(self._fd, _READ_BYTES)
                if not chunk:
                    break
                self._buffer = self._buffer[self._offset :] + chunk
                self._offset = 0
                continue
            frames.append(frame)
        return frames

    @property
    def torn(self) -> bool:
        """Whether bytes of an incomplete frame are left (the writer died mid-write)."""
        return len(self._buffer) > self._offset

    def _next(self) -> Frame | None:
        buffer, start = self._buffer, self._offset
        if len(buffer) - start < _HEADER.size:
            return None
        length, codec = _HEADER.unpack_from(buffer, start)
        end = start + _HEADER.size + length
        if len(buffer) < end:
            return None
        payload = memoryview(buffer)[start + _HEADER.size : end]
        self._offset = end
        try:
            if codec == _MSGPACK:
                body = DECODER.decode(payload)
            elif codec == _PICKLE:
                body = pickle.loads(payload)  # written by our own worker
            else:
                raise SpoolError(f"unknown frame codec {codec}")
            watermark_ns, callbacks_total, callback_ns_total, final, records = body
        except SpoolError:
            raise
        except Exception as error:
            raise SpoolError(f"unreadable frame ({error})") from None
        return Frame(watermark_ns, callbacks_total, callback_ns_total, bool(final), records)
