"""The sha256 of every input shard `fix --tp` reads, from the bytes its rank files copy out of it: each input byte
is read once, as `fix` hashes a shard it rewrites (io/hashing.SourceDigest). Bytes no copy passes (the header, a
computed tensor's, a column slice's) are read through the same pinned handle as the digest reaches them."""

from __future__ import annotations

from repair.io.hashing import SourceDigest, sha256_pinned
from repair.io.ranges import source_of
from repair.io.staging import InterruptGate


class SourceDigests:
    """One input shard's digest at a time, the one named like the output shard being written (the standard output's
    order: a shard's tensors are together); `with` finishes the last, or stops its thread on an error or interrupt."""

    def __init__(self, plan, gate: InterruptGate):
        self._inputs = {s.path.name: s for s in plan.source.shards}  # opened (if not pinned at plan time) when reached
        self._gate = gate
        self._name: str | None = None
        self._digest: SourceDigest | None = None
        self.done: dict[str, str] = {}

    def __enter__(self) -> "SourceDigests":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self._finish()
        elif self._digest is not None:
            self._digest.abort()

    def of(self, shard: str) -> SourceDigest | None:
        """The digest the copies into output shard `shard` feed (None: no input shard has its name)."""
        if shard != self._name:
            self._finish()
            with self._gate.held():  # its hashing thread starts: a signal waits until this object holds it to stop
                self._name = shard
                self._digest = SourceDigest(source_of(self._inputs[shard])) if shard in self._inputs else None
        return self._digest

    def sha256(self, name: str) -> str:
        """An input shard's sha256: from the copies' reads, else (no tensor of its output shard was written) read now."""
        return self.done[name] if name in self.done else sha256_pinned(source_of(self._inputs[name]))

    def _finish(self) -> None:
        if self._digest is not None:
            self.done[self._name] = self._digest.hexdigest()
            self._digest = None
