"""What is known of each run: ``records`` (what the sources hand over), ``catalog`` (how a verl key
becomes a series), the step windows the rules judge, ``run_state`` (one run, one scrape's snapshot),
``series_names`` and ``run_settings``, and ``run_store`` (``RunStore``: the latest value of every
key per run, caps and retention)."""
