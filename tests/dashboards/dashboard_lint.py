"""Lint rules for the dashboards, in the spirit of grafana/dashboard-linter.

Each rule takes a dashboard's JSON model and returns a list of problems (empty when it passes), so a
test can show both that the committed dashboards pass and that a broken dashboard is caught.
"""

from __future__ import annotations

import re

from dashboard_models import panels, targets, variable_query, variables

DATASOURCE_UID = "${datasource}"
# Range functions whose window must follow the scrape interval ($__rate_interval); $__range is for
# "over the whole time range" stats.
RANGE_FUNCTIONS = ("rate", "irate", "increase", "delta", "idelta", "deriv")
ALLOWED_WINDOWS = ("$__rate_interval", "$__range")
KNOWN_UNITS = {"none", "short", "percentunit", "percent", "s", "ms", "bytes", "celsius", "watt", "hertz", "ops",
               "joule"}
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range", "__range_s", "__url_time_range", "__data"}


def _expressions(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target, variable query and annotation of the dashboard."""
    found = [(f"panel {title!r}", target.get("expr", "")) for title, target in targets(dashboard)]
    found += [(f"variable {v['name']!r}", variable_query(v)) for v in variables(dashboard) if v.get("type") == "query"]
    found += [(f"annotation {a.get('name')!r}", a["expr"])
              for a in dashboard.get("annotations", {}).get("list", []) if a.get("expr")]
    return found


def datasource_rule(dashboard: dict) -> list[str]:
    """A ``datasource`` variable of type prometheus, used by every panel, target, variable and annotation."""
    problems = []
    datasource_vars = [v for v in variables(dashboard) if v.get("type") == "datasource"]
    if [(v.get("name"), v.get("query")) for v in datasource_vars] != [("datasource", "prometheus")]:
        problems.append("needs exactly one datasource variable named 'datasource' of type prometheus")
    users = [(f"panel {p.get('title')!r}", p.get("datasource")) for p in panels(dashboard)]
    users += [(f"target of {title!r}", t.get("datasource")) for title, t in targets(dashboard)]
    users += [(f"variable {v['name']!r}", v.get("datasource"))
              for v in variables(dashboard) if v.get("type") == "query"]
    users += [(f"annotation {a.get('name')!r}", a.get("datasource"))
              for a in dashboard.get("annotations", {}).get("list", [])]
    for where, ref in users:
        if not isinstance(ref, dict) or ref.get("uid") != DATASOURCE_UID:
            problems.append(f"{where} does not use the $datasource variable: {ref}")
    return problems


def run_variables_rule(dashboard: dict) -> list[str]:
    """``project`` and ``experiment`` variables exist."""
    names = {v.get("name") for v in variables(dashboard)}
    return [f"missing variable {name!r}" for name in ("project", "experiment") if name not in names]


def panel_rule(dashboard: dict) -> list[str]:
    """Every panel has a title, a description, a unit and thresholds whose first step is the base colour."""
    problems = []
    for panel in panels(dashboard):
        title = panel.get("title") or "<untitled>"
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        if not panel.get("title"):
            problems.append("a panel has no title")
        if len((panel.get("description") or "").strip()) < 20:
            problems.append(f"panel {title!r} has no real description")
        unit = defaults.get("unit")
        if not unit or not (unit in KNOWN_UNITS or unit.startswith("suffix:")):
            problems.append(f"panel {title!r} has no known unit: {unit!r}")
        steps = defaults.get("thresholds", {}).get("steps") or []
        if not steps or steps[0].get("value") is not None:
            problems.append(f"panel {title!r} has no thresholds starting with a base colour")
        values = [step["value"] for step in steps[1:]]
        if values != sorted(values):
            problems.append(f"panel {title!r} has thresholds out of order: {values}")
        if not panel.get("targets"):
            problems.append(f"panel {title!r} has no query")
        ref_ids = [target.get("refId") for target in panel.get("targets", [])]
        if None in ref_ids or "" in ref_ids or len(set(ref_ids)) != len(ref_ids):
            problems.append(f"panel {title!r} has missing or repeated query refIds: {ref_ids}")
    return problems


def rate_interval_rule(dashboard: dict) -> list[str]:
    """rate(), increase() and friends use ``$__rate_interval`` (or ``$__range``), never a fixed window."""
    problems = []
    pattern = re.compile(r"\b(" + "|".join(RANGE_FUNCTIONS) + r")\s*\(")
    for where, expr in _expressions(dashboard):
        for match in pattern.finditer(expr):
            window = _window_of_call(expr, match.end())
            if window not in ALLOWED_WINDOWS:
                problems.append(f"{where}: {match.group(1)}() window is {window!r}, not $__rate_interval: {expr}")
    return problems


def _window_of_call(expr: str, start: int) -> str | None:
    """The ``[...]`` range at the top level of the call whose arguments begin at ``start``."""
    depth = 0
    for index in range(start, len(expr)):
        char = expr[index]
        if char in "({":
            depth += 1
        elif char in ")}":
            if depth == 0:
                return None
            depth -= 1
        elif char == "[" and depth == 0:
            return expr[index + 1:expr.index("]", index)]
    return None


def selector_rule(dashboard: dict) -> list[str]:
    """No hard-coded ``job``/``instance`` matchers: a node is picked only through ``$instance``."""
    problems = []
    matcher = re.compile(r"\b(job|instance)\s*(=~|!~|!=|=)\s*\"([^\"]*)\"")
    for where, expr in _expressions(dashboard):
        for label, _, value in matcher.findall(expr):
            if label == "job" or value != "$instance":
                problems.append(f"{where}: hard-coded {label} matcher {value!r}: {expr}")
    return problems


# A GPU's raw series (not a recording rule, whose name has colons), and the selector after it.
_RAW_GPU_SERIES = re.compile(r"(?<![\w:])(verl_gpu_\w+)(?![\w:])(\{[^}]*\})?")


def scale_rule(dashboard: dict) -> list[str]:
    """A panel reads GPUs' raw series (``verl_gpu_*``) only on the nodes the ``instance`` variable picks: an
    overview reads the recording rules (per node, run or fleet), so that no panel touches every GPU of a
    fleet of a thousand nodes to draw a few lines."""
    problems = []
    for title, target in targets(dashboard):
        expr = target.get("expr", "")
        for name, selector in _RAW_GPU_SERIES.findall(expr):
            if not re.search(r'\binstance\s*=~?\s*"\$instance"', selector or ""):
                problems.append(f"panel {title!r} reads {name} of every node (no instance=\"$instance\"): {expr}")
    reads_raw = any(_RAW_GPU_SERIES.search(target.get("expr", "")) for _, target in targets(dashboard))
    for variable in variables(dashboard):
        if reads_raw and variable.get("name") == "instance" and variable.get("includeAll") and variable.get("allValue"):
            problems.append(f"variable 'instance' offers All as {variable['allValue']!r}: a panel would read every "
                            "node's GPUs; pick one node, or all of a run's (All without a custom value)")
    return problems


def variables_defined_rule(dashboard: dict) -> list[str]:
    """Every ``$variable`` a query uses is defined on the dashboard (or is one of Grafana's)."""
    defined = {v.get("name") for v in variables(dashboard)} | BUILTIN_VARIABLES
    problems = []
    for where, expr in _expressions(dashboard):
        for name in re.findall(r"\$\{?([a-zA-Z_]\w*)", expr):
            if name not in defined:
                problems.append(f"{where} uses undefined variable ${name}")
    return problems


def identity_rule(dashboard: dict) -> list[str]:
    """Read-only, a short uid, unique panel ids and unique panel titles."""
    problems = []
    if dashboard.get("editable") is not False:
        problems.append("dashboard is editable; the Python code is its source")
    uid = dashboard.get("uid") or ""
    if not re.fullmatch(r"[a-z0-9-]{1,40}", uid):
        problems.append(f"uid {uid!r} is not a short stable slug")
    all_panels = [p for p in dashboard.get("panels", [])] + [p for row in dashboard.get("panels", [])
                                                             for p in row.get("panels", [])]
    ids = [p.get("id") for p in all_panels]
    if len(ids) != len(set(ids)) or None in ids:
        problems.append(f"panel ids are missing or repeated: {ids}")
    titles = [p.get("title") for p in panels(dashboard)]
    repeated = sorted({t for t in titles if titles.count(t) > 1})
    if repeated:
        problems.append(f"panel titles repeated: {repeated}")
    return problems


RULES = (datasource_rule, run_variables_rule, panel_rule, rate_interval_rule, selector_rule, scale_rule,
         variables_defined_rule, identity_rule)


def lint(dashboard: dict) -> list[str]:
    """Problems found by every rule."""
    return [problem for rule in RULES for problem in rule(dashboard)]


def lint_set(dashboards: dict[str, dict]) -> list[str]:
    """Problems across dashboards: repeated uids or titles."""
    problems = []
    for key in ("uid", "title"):
        values = [d.get(key) for d in dashboards.values()]
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            problems.append(f"dashboard {key}s repeated: {repeated}")
    return problems
