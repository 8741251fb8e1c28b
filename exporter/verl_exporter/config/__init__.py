"""The exporter's own options: their table and types (``options``, ``option_kinds``), the duration
grammar, the bounded reading of the files an operator names, the one YAML loader, and SIGHUP's
all-or-nothing reload plan (``reload``)."""
