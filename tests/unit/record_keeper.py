"""Stores for Source tests: each keeps every record it is handed; ``RecordKeeper`` fails the test on a
parse error, ``RecordCollector`` keeps the errors' reasons."""

from verl_exporter.sources import RecordsOnly


class RecordKeeper(RecordsOnly):
    def __init__(self):
        self.records = []

    def ingest(self, record):
        self.records.append(record)

    def parse_error(self, source, reason=""):
        raise AssertionError(f"{source}: {reason}")


class RecordCollector(RecordsOnly):
    def __init__(self):
        self.records = []
        self.errors = []

    def ingest(self, record):
        self.records.append(record)

    def parse_error(self, source, reason=""):
        self.errors.append(reason)
