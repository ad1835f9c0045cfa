"""Foreign timelines: GPU profiles from other tools, and their merge with a recording.

One module per job, so each can be read (and imported) alone:

- :mod:`~exporters.timelines.model`: the neutral :class:`Profile` every reader returns,
  and :class:`ProfileError`, the one error of every reader;
- :mod:`~exporters.timelines.inputs`: safe opening (regular files, bounded gzip and JSON,
  read-only SQLite URIs);
- readers, a file per format: :mod:`~exporters.timelines.rocprofv3_csv`,
  :mod:`~exporters.timelines.rocprofv3_json`, :mod:`~exporters.timelines.rocpd`,
  :mod:`~exporters.timelines.kineto`; :mod:`~exporters.timelines.load` picks one by file;
- rocpd writing: :mod:`~exporters.timelines.rocpd_schema` (AMD's SQL, installed or the
  probe's own copy of its tables) and :mod:`~exporters.timelines.rocpd_writer`;
- :mod:`~exporters.timelines.analyses`: HTA-style analyses over any profile;
- :mod:`~exporters.timelines.align` (clock alignment),
  :mod:`~exporters.timelines.crosscheck` (per-step cross-check) and
  :mod:`~exporters.timelines.merge` (one Perfetto timeline).

Nothing here runs inside vLLM; the live roctx and NVTX markers are the engine side's
:mod:`probe.engine.markers`.
"""
