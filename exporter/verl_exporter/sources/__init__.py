"""Sources: follow verl's log files and hand each step's values to the store as a Record.

``Source`` reads one path or glob (FileLogger JSONL, console log, or a run's config file such as
hydra's ``.hydra/config.yaml``), ``Ingestor`` polls every source on a daemon thread. The run's
config and length travel as Records too (``settings``, ``total_steps``). What a source hands its
records to is a ``Store`` (``store_interface``); ``naming`` says a file's format and run by its
path. The names below are the package's interface.
"""

from verl_exporter.sources.ingestor import Ingestor
from verl_exporter.sources.naming import FORMATS, format_for, run_for
from verl_exporter.sources.source import FileState, Source
from verl_exporter.sources.store_interface import RecordsOnly, Store

__all__ = ["FORMATS", "FileState", "Ingestor", "RecordsOnly", "Source", "Store", "format_for", "run_for"]
