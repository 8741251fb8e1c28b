"""Render each dashboard's panels, with data from a Prometheus, into a PNG that looks like the dashboard.

For readers who want to see the dashboards without running Grafana (the images in docs/img/).
Every panel's queries run as Grafana would run them (variables filled from their own queries, first
value), and each panel is drawn at its grid position: time series as lines with threshold lines,
stats as a coloured number, bar gauges as bars, tables as tables. Needs matplotlib (not a project dependency):

    pip install matplotlib
    python -m verl_mixin.dashboards.preview --prometheus http://127.0.0.1:9090 --out docs/img
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from . import build_all
from .model import (
    fixed_value,
    label_values_query,
    may_be_empty,
    substitute,
    variable_query,
    variable_value,
    variables,
)

COLOURS = {"green": "#73BF69", "orange": "#FF9830", "red": "#F2495C", "text": "#D8D9DA"}
BACKGROUND, PANEL, GRID, TEXT, MUTED = "#111217", "#181B1F", "#2C3235", "#D8D9DA", "#8E8E8E"
SERIES = ["#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A9", "#705DA0",
          "#508642", "#CCA300", "#447EBC", "#C15C17"]
UNIT_HEIGHT, COLUMN_WIDTH = 0.42, 0.78  # inches per grid unit
MAX_LEGEND = 6
HEADER, PAD = 1.4, 0.08  # grid units above the first row (dashboard title); gap around each panel


class Prometheus:
    """Just enough of Prometheus' HTTP API."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def get(self, path: str, **params: object) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]

    def instant(self, expr: str) -> list:
        return self.get("/api/v1/query", query=expr)["result"]

    def range(self, expr: str, start: float, end: float, step: float) -> list:
        return self.get("/api/v1/query_range", query=expr, start=start, end=end, step=step)["result"]


def fill_variables(prom: Prometheus, dashboard: dict, chosen: dict[str, str] | None = None) -> dict[str, str]:
    """Each variable's value: ``chosen``, else "All" where offered, else the first value its query returns."""
    chosen = chosen or {}
    values: dict[str, str] = {}
    for variable in variables(dashboard):
        name = variable["name"]
        if variable["type"] == "datasource":
            values[name] = "prometheus"
            continue
        fixed = fixed_value(variable)
        if fixed is not None:  # a text box (the GPU-hour price): its default unless chosen
            values[name] = chosen.get(name, fixed)
            continue
        selector, label = label_values_query(substitute(variable_query(variable), values))
        found = sorted(prom.get(f"/api/v1/label/{label}/values", **{"match[]": selector}))
        if not found and not may_be_empty(variable):
            raise RuntimeError(f"variable {name} has no values: is Prometheus scraping an exporter?")
        if name in chosen:
            if chosen[name] not in found:
                raise RuntimeError(f"{name}={chosen[name]} is not one of {found}")
            values[name] = chosen[name]
        else:  # "All" where offered (a custom all value, or every value found), else the first value
            values[name] = variable_value(variable, found, pick_all=True)
    return values


def legend(template: str, labels: dict) -> str:
    text = template or "{{__name__}}"
    for key, value in labels.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def format_value(value: float, unit: str) -> str:
    """A value as Grafana would show it in ``unit`` (the units these dashboards use)."""
    if value != value:
        return "NaN"
    if unit == "percentunit":
        return f"{value:.1%}"
    if unit == "bytes":
        for size, name in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if abs(value) >= size:
                return f"{value / size:.1f} {name}"
        return f"{value:.0f} B"
    if unit == "s":
        return f"{value / 60:.1f} min" if abs(value) >= 120 else f"{value:.3g} s"
    if unit == "hertz":
        return f"{value / 1e9:.2f} GHz" if value >= 1e9 else f"{value / 1e6:.0f} MHz"
    if unit == "watt" and abs(value) >= 1000:
        return f"{value / 1000:.3g} kW"
    suffix = {"celsius": " °C", "watt": " W", "ops": " ops/s"}.get(unit, "")
    if unit.startswith("suffix:"):
        suffix = " " + unit.split(":", 1)[1].strip()
    return f"{value:.4g}{suffix}"


def colour_for(value: float, steps: list[dict]) -> str:
    """The colour of the last threshold step ``value`` reaches."""
    colour = steps[0]["color"] if steps else "text"
    for step in steps[1:]:
        if value >= step["value"]:
            colour = step["color"]
    return COLOURS.get(colour, colour)


def merge_table(results: list[tuple[str | None, list]],
                keys: Sequence[str] = ("project", "experiment")) -> tuple[list[str], list[list]]:
    """Grafana's "merge" of instant table queries: one row per set of the ``keys`` labels that every valued
    query has, a column per valued query (its header); a query without a header (None) brings label cells
    only (the ``keys`` the others lack: the scheduler's job, the largest part of a run's waste)."""
    valued = [result for header, result in results if header is not None]
    shared = [key for key in keys if all(key in series["metric"] for result in valued for series in result)]
    rows: dict[tuple, dict] = {}
    for header, result in results:
        for series in result:
            cells = rows.setdefault(tuple(series["metric"].get(key, "") for key in shared), {})
            if header is None:
                cells.update({key: value for key, value in series["metric"].items() if key in keys})
            else:
                cells[header] = float(series["value"][1])
    headers = list(keys) + [header for header, _ in results if header is not None]
    return headers, [[*(row.get(key, dict(zip(shared, index)).get(key, "")) for key in keys),
                      *(row.get(header) for header in headers[len(keys):])] for index, row in sorted(rows.items())]


def _field(panel: dict) -> tuple[str, list]:
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    return defaults.get("unit", "none"), defaults.get("thresholds", {}).get("steps", [])


def draw_timeseries(ax: Any, panel: dict, prom: Prometheus, values: dict, start: float, end: float,
                    alert_starts: Sequence[datetime] = ()) -> None:
    unit, steps = _field(panel)
    step = max(2.0, (end - start) / 240)
    colour_index = 0
    for target in panel["targets"]:
        for series in prom.range(substitute(target["expr"], values), start, end, step):
            times = [datetime.fromtimestamp(float(t)) for t, _ in series["values"]]
            ys = [float(v) for _, v in series["values"]]
            ax.plot(times, ys, linewidth=1.1, color=SERIES[colour_index % len(SERIES)],
                    label=legend(target.get("legendFormat", ""), series["metric"]))
            colour_index += 1
    if len(steps) > 1 and colour_index:  # Grafana's "dashed+area": lines at thresholds, bands coloured faintly
        low, high = ax.get_ylim()
        bounds = [low] + [min(max(t["value"], low), high) for t in steps[1:]] + [high]
        for index, threshold in enumerate(steps):
            colour = COLOURS.get(threshold["color"], threshold["color"])
            if bounds[index + 1] > bounds[index]:
                ax.axhspan(bounds[index], bounds[index + 1], color=colour, alpha=0.12, linewidth=0)
            if index and low < threshold["value"] < high:
                ax.axhline(threshold["value"], color=colour, linestyle="--", linewidth=0.8)
        ax.set_ylim(low, high)
    ax.yaxis.set_major_formatter(lambda value, _: format_value(value, unit))
    ax.tick_params(colors=MUTED, labelsize=6)
    ax.grid(color=GRID, linewidth=0.5)
    ax.xaxis.set_major_formatter(_time_formatter())
    if colour_index:
        handles, labels = ax.get_legend_handles_labels()
        if len(handles) > MAX_LEGEND:  # like a crowded Grafana legend: the first entries, then a count
            handles = handles[:MAX_LEGEND]
            labels = labels[:MAX_LEGEND - 1] + [f"... {len(labels) - MAX_LEGEND + 1} more"]
        ax.legend(handles, labels, fontsize=5.5, loc="upper left", ncol=min(3, len(handles)),
                  frameon=False, labelcolor=TEXT, handlelength=1.2)
    else:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", color=MUTED, transform=ax.transAxes)
    for moment in alert_starts:
        ax.axvline(moment, color=COLOURS["red"], linewidth=0.8, alpha=0.7)


def _time_formatter() -> Any:
    from matplotlib.dates import DateFormatter

    return DateFormatter("%H:%M")


def alert_starts(dashboard: dict, prom: Prometheus, values: dict, start: float, end: float) -> list:
    """When each firing alert of the dashboard's annotation query began (Grafana draws these as red lines)."""
    moments = []
    step = max(5.0, (end - start) / 240)
    for annotation in dashboard.get("annotations", {}).get("list", []):
        for series in prom.range(substitute(annotation["expr"], values), start, end, step):
            previous = None
            for timestamp, _ in series["values"]:
                if previous is None or float(timestamp) - previous > step * 1.5:
                    if float(timestamp) > start + step:  # firing before the range: not a start
                        moments.append(datetime.fromtimestamp(float(timestamp)))
                previous = float(timestamp)
    return moments


def draw_stat(ax: Any, panel: dict, prom: Prometheus, values: dict) -> None:
    unit, steps = _field(panel)
    result = [s for t in panel["targets"] for s in prom.instant(substitute(t["expr"], values))]
    ax.axis("off")
    if not result:
        ax.text(0.5, 0.45, "No data", ha="center", va="center", color=MUTED, fontsize=12, transform=ax.transAxes)
        return
    value = float(result[0]["value"][1])
    ax.text(0.5, 0.42, format_value(value, unit), ha="center", va="center", fontsize=20, fontweight="bold",
            color=colour_for(value, steps), transform=ax.transAxes)


def draw_bars(ax: Any, panel: dict, prom: Prometheus, values: dict) -> None:
    """A horizontal bar gauge: a bar per series of the instant queries, named by the legend."""
    unit, steps = _field(panel)
    bars = [(legend(target.get("legendFormat", ""), series["metric"]), float(series["value"][1]))
            for target in panel["targets"] for series in prom.instant(substitute(target["expr"], values))]
    if not bars:
        ax.axis("off")
        ax.text(0.5, 0.45, "No data", ha="center", va="center", color=MUTED, fontsize=12, transform=ax.transAxes)
        return
    names, sizes = zip(*bars)
    positions = range(len(bars))
    ax.barh(positions, sizes, color=[colour_for(size, steps) for size in sizes], height=0.6)
    ax.set_yticks(list(positions), names, fontsize=6, color=TEXT)
    ax.invert_yaxis()
    ax.set_xticks([])
    for position, size in zip(positions, sizes):
        ax.text(size, position, " " + format_value(size, unit), va="center", fontsize=6, color=TEXT)


def draw_table(ax: Any, panel: dict, prom: Prometheus, values: dict) -> None:
    overrides = {o["matcher"]["options"]: {p["id"]: p["value"] for p in o["properties"]}
                 for o in panel["fieldConfig"].get("overrides", [])}
    organize = next(t["options"] for t in panel["transformations"] if t["id"] == "organize")
    rename, index = organize["renameByName"], organize["indexByName"]
    keys = [name for name in sorted(index, key=index.get) if not name.startswith("Value #")]
    results = [(None if organize["excludeByName"].get(f"Value #{t['refId']}") else rename[f"Value #{t['refId']}"],
                prom.instant(substitute(t["expr"], values))) for t in panel["targets"]]
    headers, rows = merge_table(results, keys)
    ax.axis("off")
    cells, colours = [], []
    width = len(keys)
    for row in rows:
        cells.append(row[:width] + [format_value(v, overrides[h]["unit"]) if v is not None else "-"
                                    for h, v in zip(headers[width:], row[width:])])
        colours.append([TEXT] * width + [colour_for(v, overrides[h]["thresholds"]["steps"]) if v is not None
                                         else MUTED for h, v in zip(headers[width:], row[width:])])
    headers = [rename.get(header, header) for header in headers]
    table = ax.table(cellText=cells or [["-"] * len(headers)], colLabels=headers, loc="upper center",
                     cellLoc="left", colLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    table.scale(1, 1.5)
    for (row_index, col_index), cell in table.get_celld().items():
        cell.set_edgecolor(GRID)
        cell.set_facecolor(PANEL)
        if row_index == 0:
            cell.get_text().set_color(MUTED)
        elif cells:
            cell.get_text().set_color(colours[row_index - 1][col_index])


def render_dashboard(dashboard: dict, prom: Prometheus, path: Path, minutes: float,
                     chosen: dict[str, str] | None = None) -> None:
    """Draw every row and panel of ``dashboard`` at its grid position into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = fill_variables(prom, dashboard, chosen)
    end = time.time()
    start = end - minutes * 60
    starts = alert_starts(dashboard, prom, values, start, end)
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    height = (bottom + HEADER) * UNIT_HEIGHT
    fig = plt.figure(figsize=(24 * COLUMN_WIDTH, height), facecolor=BACKGROUND)
    shown = ", ".join(f"{k}={v}" for k, v in values.items() if k != "datasource")
    fig.text(0.01, 1 - 0.3 / height, f"{dashboard['title']}    ({shown}; last {minutes:g} min)", color=TEXT,
             fontsize=12, fontweight="bold", va="center")

    total = bottom + HEADER

    def rect(x: float, y: float, w: float, h: float) -> list[float]:
        """Grid units (24 columns, y down from the top) -> figure fractions."""
        return [x / 24, 1 - (y + HEADER + h) / total, w / 24, h / total]

    for item in dashboard["panels"]:
        if item["type"] == "row":  # titled as Grafana does: a variable's text, "None" for no value
            title = substitute(item["title"], {name: value or "None" for name, value in values.items()})
            fig.text(item["gridPos"]["x"] / 24 + 0.004, 1 - (item["gridPos"]["y"] + HEADER + 0.7) / total,
                     title, color=TEXT, fontsize=10, fontweight="bold")
    for panel in [item for item in dashboard["panels"] if item["type"] != "row"]:  # a collapsed row's are hidden
        x, y, w, h = (panel["gridPos"][k] for k in ("x", "y", "w", "h"))
        frame = fig.add_axes(rect(x + PAD, y + PAD, w - 2 * PAD, h - 2 * PAD))
        frame.set_facecolor(PANEL)
        frame.set_xticks([])
        frame.set_yticks([])
        for spine in frame.spines.values():
            spine.set_color(GRID)
        frame.text(0.01, 1 - 0.32 / (h - 2 * PAD), panel["title"], color=TEXT, fontsize=8, va="center",
                   transform=frame.transAxes)
        graph = panel["type"] == "timeseries"
        left, bottom_margin = (1.0, 0.5) if graph else (0.15, 0.1)
        inner = fig.add_axes(rect(x + PAD + left, y + PAD + 0.6, w - 2 * PAD - left - 0.15,
                                  h - 2 * PAD - 0.6 - bottom_margin))
        inner.set_facecolor(PANEL)
        for spine in inner.spines.values():
            spine.set_visible(False)
        if panel["type"] == "timeseries":
            draw_timeseries(inner, panel, prom, values, start, end, starts)
        elif panel["type"] == "stat":
            draw_stat(inner, panel, prom, values)
        elif panel["type"] == "table":
            draw_table(inner, panel, prom, values)
        elif panel["type"] == "bargauge":
            draw_bars(inner, panel, prom, values)
    fig.savefig(path, dpi=110, facecolor=BACKGROUND)
    plt.close(fig)
    _shrink(path)


def _shrink(path: Path) -> None:
    """Re-save the PNG with a 256-colour palette: a quarter of the size, no visible change."""
    from PIL import Image  # Pillow comes with matplotlib

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=256)
    small.save(path, optimize=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verl_mixin.dashboards.preview", description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus base URL")
    parser.add_argument("--out", type=Path, default=Path("docs/img"), help="directory for the PNG files")
    parser.add_argument("--minutes", type=float, default=15, help="time range of the graphs")
    parser.add_argument("--var", action="append", default=[], metavar="[UID:]NAME=VALUE",
                        help="value of a variable, on every dashboard or on the one with that uid "
                             "(default: All where offered, else the first value)")
    args = parser.parse_args(argv)
    chosen: dict[str, dict[str, str]] = {}
    for item in args.var:
        key, value = item.split("=", 1)
        uid, _, name = key.rpartition(":")
        chosen.setdefault(uid, {})[name] = value
    prom = Prometheus(args.prometheus)
    args.out.mkdir(parents=True, exist_ok=True)
    for filename, dashboard in build_all().items():
        path = args.out / filename.replace(".json", ".png")
        render_dashboard(dashboard, prom, path, args.minutes,
                         {**chosen.get("", {}), **chosen.get(dashboard["uid"], {})})
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
