"""The alert and recording rules, their runbook and their table, generated from one definition.

Every alert is defined once (``training.py``, ``system.py``, ``gpus.py``) with its expression, severity,
``for`` duration, summary, description, the guide's meaning and the recommended fix, as named fields.
Numbers in expressions are ``${verl/key:threshold}`` placeholders filled in from the exporter's
catalog, so the catalog is the one place to change a threshold; ``${...}`` is the one placeholder
syntax of the definitions (``model.py`` lists its forms). ``render.py`` renders the rule files,
RUNBOOK.md and docs/alerts.md, ``kubernetes.py`` the PrometheusRule; ``python -m
verl_mixin`` (``generate.py``, run by ``make generate``) writes them into
``alerts/`` and the checkout, ``--check`` fails when they are stale.
"""
