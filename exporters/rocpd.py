"""The rocpd side-car as a registered exporter (``probe export --to rocpd --out X.db``).

The side-car itself (schema layouts, regions, the detection of a rocprofv3 database's
layout) lives in :mod:`exporters.rocprof_sidecar`; this module is its offline ``write``
under the exporter contract, with the side-car's default layout.
"""

from __future__ import annotations

import os
from typing import Any

from exporters.rocprof_sidecar import write_sidecar
from probe.progress import SILENT, Progress

__all__ = ["write"]


def write(recording: Any, target: str | os.PathLike[str], *, progress: Progress = SILENT) -> int:
    """Write ``recording``'s spans as a new rocpd database at ``target``; returns the
    number of regions. An existing ``target`` raises ``FileExistsError``."""
    return write_sidecar(recording, target, progress=progress)
