"""Reading generated dashboards back: panels, queries, variables, and Grafana's variable substitution.

Used by the tests (every query must return data from a real Prometheus) and by ``preview`` (PNG
renderings of the dashboards for the docs), so both run the queries the way Grafana would.
"""

from __future__ import annotations

import re

# Grafana's built-in interval variables, with values that suit a Prometheus scraping every few seconds.
BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "5m",
    "__range_s": "300",
}


def panels(dashboard: dict) -> list[dict]:
    """Every panel except rows, including panels inside collapsed rows, in layout order."""
    found = []
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def targets(dashboard: dict) -> list[tuple[dict, dict]]:
    """(panel, target) for every query of every panel."""
    return [(panel, target) for panel in panels(dashboard) for target in panel.get("targets", [])]


def variables(dashboard: dict) -> list[dict]:
    return dashboard.get("templating", {}).get("list", [])


def variable_query(variable: dict) -> str:
    query = variable.get("query", "")
    return query["query"] if isinstance(query, dict) else query


def fixed_value(variable: dict) -> str | None:
    """The value of a variable no query fills (a text box, a constant, a custom list): its current value,
    else its default; None for a query or data source variable."""
    if variable.get("type") in ("query", "datasource"):
        return None
    return str((variable.get("current") or {}).get("value") or variable_query(variable))


def label_values_query(query: str) -> tuple[str, str]:
    """``label_values(selector, label)`` -> (selector, label); ValueError for any other variable query."""
    match = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query, re.S)
    if not match:
        raise ValueError(f"unsupported variable query {query!r}")
    return match.group(1), match.group(2)


def substitute(expr: str, values: dict[str, str]) -> str:
    """``expr`` with ``$name``, ``${name}`` and ``[[name]]`` replaced from ``values`` and BUILTINS.

    KeyError names a variable that has no value. ``$1`` (a label_replace group) is left alone.
    """
    table = {**BUILTINS, **values}

    def replace(match: re.Match) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if name not in table:
            raise KeyError(f"variable ${name} has no value (expr: {expr})")
        return table[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(__\w+|[a-zA-Z]\w*)|\[\[(\w+)\]\]", replace, expr)


# Characters Grafana's Prometheus data source escapes in each value of a multi-value variable (with two
# backslashes: one for the PromQL string, one for the regex).
_REGEX_SPECIAL = re.compile(r"([\\^$*+?.()|{}\[\]'])")


# Variables of labels a run may lack (no teams file, an owner not known): with no value, Grafana's "All"
# (any value, none included) or the empty value, which selects the runs without the label.
OPTIONAL_VARIABLES = ("team", "user")
# Hidden variables named ``has_<family>`` gate a row of metrics that only some runs log (run detail's V1
# trainer and async rows): the row is repeated over the variable, which has no value for the other runs.
GATE_PREFIX = "has_"


def may_be_empty(variable: dict) -> bool:
    """Whether the variable may find no value and the dashboard still work."""
    name = str(variable.get("name", ""))
    return name in OPTIONAL_VARIABLES or name.startswith(GATE_PREFIX)


def gated_rows(dashboard: dict) -> dict[str, dict]:
    """Rows repeated over a gate variable, by the variable's name."""
    return {row["repeat"]: row for row in dashboard.get("panels", [])
            if row.get("type") == "row" and str(row.get("repeat", "")).startswith(GATE_PREFIX)}


def gated(dashboard: dict, panel: dict) -> bool:
    """Whether ``panel`` is in a gated row: it has data only for the runs that log the row's metrics."""
    return any(panel is child for row in gated_rows(dashboard).values() for child in row.get("panels", []))


def variable_value(variable: dict, found: list[str], *, pick_all: bool) -> str:
    """The value Grafana gives a query variable whose query found ``found``: "All" where the variable
    offers it and it is picked (``pick_all``) or is the variable's default, else the first value.

    "All" is the variable's custom all value, or without one every value as a regex alternation, the way
    Grafana's Prometheus data source writes a multi-value selection.
    """
    is_default = (variable.get("current") or {}).get("value") == "$__all"
    if not found:
        return str(variable.get("allValue") or "") if variable.get("includeAll") else ""
    if variable.get("includeAll") and (pick_all or is_default):
        if variable.get("allValue"):
            return str(variable["allValue"])
        return "(" + "|".join(_REGEX_SPECIAL.sub(r"\\\\\1", value) for value in sorted(found)) + ")"
    return sorted(found)[0]
