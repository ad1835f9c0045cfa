"""What a test wrote to a ring, read back and decoded (the reader's own path)."""

from __future__ import annotations

from probe.engine.ring_writer import RingWriter
from probe.reader.ring_reader import RingReader
from probe.records import Decoded, Decoder


def drain(writer: RingWriter) -> tuple[list[Decoded], Decoder]:
    """Every data record written to ``writer`` so far, decoded."""
    dec = Decoder()
    with RingReader.open(writer.path) as reader:
        out = [r for r in (dec.feed(rec) for rec in reader.read()) if r is not None]
    return out, dec
