"""A job's chunks as stored, and joined: each finished chunk's reply as the arrays of one
``.npz`` (``Reply.to_arrays``: its arrays, and the rest as JSON in ``meta``), several chunks
merged into one before they are written, and the chunks read back joined into one reply,
which the job's capability answers as its route does (``Capability.result``). The reply's
type says how each of its members is stored and joined: nothing here lists them."""

from __future__ import annotations

import numpy as np

from service.core.work import Reply


def chunk_arrays(reply: Reply) -> dict[str, np.ndarray]:
    """A finished chunk's reply as the arrays of its file."""
    return reply.to_arrays()


def merged(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Several chunks' arrays as one chunk's (examples joined, in order)."""
    if len(parts) == 1:
        return parts[0]
    return Reply.join(0, [Reply.from_arrays(p) for p in parts]).to_arrays()


def joined_reply(chunks: list[dict[str, np.ndarray]]) -> Reply:
    """The chunks read back (in example order) as one reply; none: an empty reply."""
    if not chunks:
        return Reply(work_id=0)
    return Reply.join(0, [Reply.from_arrays(c) for c in chunks])
