"""A run's whole history from its logs: ``backfill`` (timestamped samples, TSDB blocks) and
``replay`` (the alert rules evaluated over that history by a real Prometheus).

``timeline`` reads the logs through the live sources and gives every step a wall-clock time;
``backfill`` turns the steps into the series the live exporter would have served, scrape by
scrape; ``replay`` loads them into Prometheus and reports what each alert would have done.
"""
