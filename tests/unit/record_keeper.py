"""A store for Source tests: keeps every record it is handed; a parse error fails the test."""

from verl_exporter.sources import RecordsOnly


class RecordKeeper(RecordsOnly):
    def __init__(self):
        self.records = []

    def ingest(self, record):
        self.records.append(record)

    def parse_error(self, source, reason=""):
        raise AssertionError(f"{source}: {reason}")
