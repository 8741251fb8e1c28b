"""verl-exporter: serve a verl training run's metrics, GPU and host stats to Prometheus."""

__version__ = "0.1.0"
