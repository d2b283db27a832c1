"""The parent <-> worker channel: pickled messages in length-prefixed frames over a socket pair.

Why not ``multiprocessing.Pipe``: its ``send``/``recv`` are blocking calls, and on the event
loop one stopped worker (a full pipe, a half-written reply) froze the whole server. Here the
parent reads and writes through asyncio streams, so the loop never waits on a worker: a write
is buffered by the transport, a read resumes when the bytes are there. The worker, which has
nothing else to do, uses the same frames over a plain blocking socket.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
import threading
from typing import Any

HEADER = struct.Struct("!Q")


def frame(message: Any) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(payload)) + payload


async def read_message(reader: asyncio.StreamReader) -> Any:
    """The next message; raises ``asyncio.IncompleteReadError`` when the worker is gone."""
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    return pickle.loads(await reader.readexactly(size))


class BlockingChannel:
    """The worker's end: blocking reads from one thread, locked writes from any thread."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self.sock = sock
        self._lock = threading.Lock()

    def send(self, message: Any) -> None:
        data = frame(message)
        with self._lock:
            self.sock.sendall(data)

    def recv(self) -> Any:
        """The next message; raises ``EOFError`` when the parent is gone."""
        (size,) = HEADER.unpack(self._exactly(HEADER.size))
        return pickle.loads(self._exactly(size))

    def _exactly(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise EOFError("the channel is closed")
            got += k
        return buf
