#!/usr/bin/env python3
"""The results table and the SVG plot, from the JSON run_bench.py writes.
Standard library only. Standalone, it redraws both from a saved run:

  bench/plot.py bench/results/latest.json   # prints the table, rewrites latest.svg
"""
import html
import json
import math
import os
import sys

COLUMNS = ["scenario", "store", "impl", "rate/s", "min-max", "vs floor", "p50 us", "p90 us", "p99 us", "Jain",
           "reacq %", "overtakes", "order", "cmds/op", "scripts/op", "time s", "RSS MiB", "threads"]


def _f(v, digits=0):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:,.{digits}f}"


PRIMARY = {"cycles": "cycles_per_sec", "handoff": "handoffs_per_sec", "contended": "handoffs_per_sec"}


def merged_runs(doc):
    """The runs, with the repeated rounds of one (label, store, impl) merged:
    the round whose primary rate is the median stands for all of them, and
    every round's rate is kept in "samples"."""
    out, groups = [], {}
    for x in doc["runs"]:
        metric = PRIMARY.get(x.get("label"))
        if not metric or "result" not in x or metric not in x["result"]:
            out.append(x)
            continue
        key = (x["label"], x["store"], x["impl"])
        if key not in groups:
            groups[key] = []
            out.append(key)
        groups[key].append(x)
    merged = []
    for x in out:
        if not isinstance(x, tuple):
            merged.append(x)
            continue
        rounds = groups[x]
        metric = PRIMARY[x[0]]
        ranked = sorted(rounds, key=lambda y: y["result"][metric])
        pick = dict(ranked[(len(ranked) - 1) // 2])
        pick["samples"] = [y["result"][metric] for y in rounds]
        merged.append(pick)
    return merged


def table_rows(doc):
    runs = [x for x in merged_runs(doc) if "result" in x]
    floor = {x["store"]: x["result"]["cycles_per_sec"] for x in runs if x["impl"] == "floor"}
    rows = []
    for x in merged_runs(doc):
        row = {c: "" for c in COLUMNS}
        row.update(scenario=x.get("label", ""), store=x.get("store", ""), impl=x.get("impl", ""))
        if "result" not in x:
            row["impl"] = (row["impl"] or "?") + " ERROR"
            rows.append(row)
            continue
        res = x["result"]
        req = res.get("requests") or {}
        hand = res.get("handoff_us") or {}
        if "cycles_per_sec" in res:
            row["rate/s"] = _f(res["cycles_per_sec"])
            if x["store"] in floor:
                row["vs floor"] = _f(res["cycles_per_sec"] / floor[x["store"]], 2)
        elif "handoffs_per_sec" in res:
            row["rate/s"] = _f(res["handoffs_per_sec"])
        if len(x.get("samples", [])) > 1:
            row["min-max"] = f'{_f(min(x["samples"]))}-{_f(max(x["samples"]))}'

        row["p50 us"] = _f(hand.get("p50"))
        row["p90 us"] = _f(hand.get("p90"))
        row["p99 us"] = _f(hand.get("p99"))
        if "fairness_jain" in res:
            row["Jain"] = _f(res["fairness_jain"], 3)
            row["reacq %"] = _f(100 * res["reacquire_fraction"], 1)
            row["overtakes"] = _f(res.get("overtakes_per_hold"), 2)
            row["order"] = _f(res.get("out_of_store_order"))
        row["cmds/op"] = _f(req.get("commands_per_op"), 1)
        row["scripts/op"] = _f(req.get("scripts_per_op"), 2)
        row["time s"] = _f(res.get("total_seconds"), 3)
        if "rss_kb" in res:
            row["RSS MiB"] = _f(res["rss_kb"] / 1024, 1)
            row["threads"] = f"{res['threads']} ({res['dlock_threads']} dlock)"
        many = res.get("many_locks") or {}
        if "rss_kb_pending" in many:  # async-footprint: the many-locks part
            row["scenario"] = f"{row['scenario']}/{many.get('locks')}"
            row["RSS MiB"] = _f(many["rss_kb_pending"] / 1024, 1)
            row["threads"] = f"{many['threads_pending']} ({many['dlock_threads']} dlock)"
            row["time s"] = _f((many.get("grant_round") or {}).get("grant_all_s"), 3)
        rows.append(row)
    return rows


def format_table(rows):
    """A Markdown table (also readable on a terminal)."""
    widths = {c: max([len(c)] + [len(r[c]) for r in rows]) for c in COLUMNS}
    line = lambda cells: "| " + " | ".join(cells) + " |"  # noqa: E731
    out = [line(c.ljust(widths[c]) for c in COLUMNS),
           line("-" * widths[c] for c in COLUMNS)]
    for r in rows:
        out.append(line((r[c].rjust(widths[c]) if c not in ("scenario", "store", "impl") else r[c].ljust(widths[c]))
                        for c in COLUMNS))
    return "\n".join(out)


COLORS = {"dlock": "#3b6fb6", "floor": "#888888", "floor-setnx": "#bbbbbb", "floor-flock": "#bbbbbb"}
PEER_COLOR = "#d9822b"


def _panel(title, unit, items, y0, width=960):
    """Horizontal bars: items are (label, value, color). Returns (svg, height)."""
    items = [i for i in items if i[1] is not None and not (isinstance(i[1], float) and math.isnan(i[1]))]
    bar, gap, left, right = 16, 6, 300, 110
    h = 34 + len(items) * (bar + gap) + 10
    out = [f'<text x="10" y="{y0 + 20}" font-size="15" font-weight="bold">{html.escape(title)}</text>']
    if not items:
        out.append(f'<text x="{left}" y="{y0 + 40}" font-size="12">no data</text>')
        return "\n".join(out), 60
    top = max(v for _, v, _ in items) or 1
    for k, (label, v, color) in enumerate(items):
        y = y0 + 32 + k * (bar + gap)
        w = max(1.0, (width - left - right) * v / top)
        out.append(f'<text x="{left - 8}" y="{y + 12}" font-size="12" text-anchor="end">{html.escape(label)}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar}" fill="{color}"/>')
        out.append(f'<text x="{left + w + 6:.1f}" y="{y + 12}" font-size="12">{v:,.{0 if v >= 100 else 2}f} {unit}</text>')
    return "\n".join(out), h


def svg(doc):
    runs = [x for x in merged_runs(doc) if "result" in x]

    def color(impl):
        return COLORS.get(impl, PEER_COLOR)

    panels = [
        ("1. Uncontended lock+unlock cycles per second, median of the rounds (higher is better)", "/s",
         [(f'{x["store"]} {x["impl"]}', x["result"]["cycles_per_sec"], color(x["impl"]))
          for x in runs if x["label"] == "cycles"]),
        ("2. Handoff latency, release to next lock() return, p50 and p99 (2 processes; lower is better)", "us",
         [item for x in runs if x["label"] == "handoff"
          for item in ((f'{x["store"]} {x["impl"]} p50', x["result"].get("handoff_us", {}).get("p50"),
                        color(x["impl"])),
                       (f'{x["store"]} {x["impl"]} p99', x["result"].get("handoff_us", {}).get("p99"),
                        "#9bb7de" if x["impl"] == "dlock" else "#f0c08f"))]),
        ("3. Contended: handoffs between holders per second (4 processes x 4 threads)", "/s",
         [(f'{x["store"]} {x["impl"]}', x["result"].get("handoffs_per_sec"), color(x["impl"]))
          for x in runs if x["label"] == "contended"]),
        ("4. Many waiters: server commands per handoff (must not grow with waiters)", "",
         [(f'{x["store"]} {x["label"]}', (x["result"].get("requests") or {}).get("commands_per_op"),
           color(x["impl"])) for x in runs if x["label"].startswith("waiters/")]),
        ("4'. Many waiters: total time for every waiter to hold the lock once", "s",
         [(f'{x["store"]} {x["label"]}', x["result"].get("total_seconds"), color(x["impl"]))
          for x in runs if x["label"].startswith("waiters/")]),
        ("5. Footprint: resident memory of a client waiting on many locks at once", "MiB",
         [(f'{x["store"]} {x["result"]["locks"]} locks', x["result"]["rss_kb"] / 1024, color(x["impl"]))
          for x in runs if x["label"] == "footprint"]),
        ("6. Election handover: resign to the next leader told, p50 (lower is better)", "ms",
         [(f'{x["store"]} {x["impl"]}', x["result"]["handoff_us"]["p50"] / 1000, color(x["impl"]))
          for x in runs if x["label"] == "handover"]),
        ("7. Election failover: leader SIGKILLed to the next leader told, p50 (session timeout 2 s)", "ms",
         [(f'{x["store"]} {x["impl"]}', x["result"]["handoff_us"]["p50"] / 1000, color(x["impl"]))
          for x in runs if x["label"] == "failover"]),
    ]
    panels = [p for p in panels if p[2]]  # a run of some scenarios only (--election-only) draws those
    body, y = [], 40
    for title, unit, items in panels:
        s, h = _panel(title, unit, items, y)
        body.append(s)
        y += h + 10
    m = doc.get("machine", {})
    head = (f'dlock benchmarks: {m.get("cpu", "")}, {m.get("nproc", "")} CPUs, {doc.get("command", "")}, '
            f'{doc.get("started", "")}; blue = dlock, grey = protocol floor, orange = peer')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="960" height="{y + 10}" '
            f'font-family="sans-serif">\n<rect width="100%" height="100%" fill="white"/>\n'
            f'<text x="10" y="22" font-size="13">{html.escape(head)}</text>\n' + "\n".join(body) + "\n</svg>\n")


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "results", "latest.json")
    with open(path) as f:
        doc = json.load(f)
    print(format_table(table_rows(doc)))
    with open(os.path.splitext(path)[0] + ".svg", "w") as f:
        f.write(svg(doc))


if __name__ == "__main__":
    main()
