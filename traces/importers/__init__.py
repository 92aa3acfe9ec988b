"""Workload importers, one module per format; ``traces.formats`` registers them.

Each module has ``detect(path, first_line) -> bool`` and a reader returning a ``Workload``. The
trace files are read as published (data/traces/SOURCES.md). Every row becomes one request, or
an error naming file, line and field; with ``skip_bad_rows`` a bad row is skipped and counted in
``workload.meta["skipped_rows"]`` (the first few reasons are kept too), never dropped silently; a
file whose every row is bad is still an error ("no valid rows in FILE (N skipped; first: ...)").
"""
