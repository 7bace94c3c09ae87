"""``ntp_reproduce()``'s result as readable tables, each next to what the paper reports: the text
``python -m tutorial_lib ntp-reproduce`` prints without ``--json``."""

from __future__ import annotations

from typing import Any

from .goodput import BREAKDOWN
from .plan_options import PLAN_POLICIES

__all__ = ["format_report"]


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def _goodput_table(report: dict[str, Any]) -> str:
    """Goodput with restarts per policy at Daly's interval, the simulated best, the breakdown."""
    g, r = report["goodput"], report["setup"]["restart"]
    first = g[PLAN_POLICIES[0]]
    rows = [
        [
            p,
            f"{100 * g[p]['goodput']:.1f}%",
            f"{60 * g[p]['optimal_interval_h']:.1f} -> {100 * g[p]['optimal_goodput']:.1f}%",
        ]
        + [f"{100 * g[p]['breakdown'][k]:.1f}%" for k in BREAKDOWN]
        for p in PLAN_POLICIES
    ]
    return (
        f"Goodput with restarts (every failure restarts from the last checkpoint): MTBF "
        f"{r['mtbf_h']:.2f} h, downtime {r['downtime_s'] / 60:.1f} min (detect "
        f"{r['detect_s']:.0f} s + restart {r['restart_s']:.0f} s + load {r['load_s']:.1f} s), "
        f"checkpoint write {r['write_s']:.1f} s; interval: Young "
        f"{60 * first['young_interval_h']:.2f} min, Daly {60 * first['daly_interval_h']:.2f} min "
        f"(used)\n"
        + _table(
            ["policy", "goodput", "best interval (min)", *[k.replace("_", " ") for k in BREAKDOWN]],
            rows,
        )
    )


def format_report(report: dict[str, Any]) -> str:
    """``ntp_reproduce()``'s result as readable tables, each next to what the paper reports."""
    a, loss, job = report["availability"], report["throughput_loss"], report["setup"]["job"]
    paper = report["paper"]
    tps = list(a["simulated"])
    avail_rows = [
        [f"{100 * f:.2f}%"]
        + [f"{a['simulated'][tp][i]:.3f} ({a['expected'][tp][i]:.3f})" for tp in tps]
        for i, f in enumerate(a["failed_fraction"])
    ]
    loss_rows = [
        [f"{100 * f:.3f}%"]
        + [
            f"{100 * loss['mean'][p][i]:.2f}% ({100 * loss['max'][p][i]:.2f}%)"
            for p in PLAN_POLICIES
        ]
        for i, f in enumerate(loss["failed_fraction"])
    ]
    spare_rows = [
        [
            p,
            str(report["spare_domains"][p]),
            str(report["spare_domains_per_trace"][p]),
            f"{100 * report['paused_fraction'][p]:.1f}%",
            str(paper["spare_domains"][p]),
        ]
        for p in PLAN_POLICIES
    ]
    return "\n\n".join(
        [
            f"Replica availability on {a['gpus']:,} GPUs, uniform random failures: simulated "
            f"(expected); paper: TP64 at 0.1% -> {paper['availability_tp64_at_0.1pct']}\n"
            + _table(["failed"] + [f"TP{tp}" for tp in tps], avail_rows),
            f"Throughput loss, mean (worst), {job['gpus']:,} GPUs in domains of {job['domain_size']}, "
            f"TP {job['tp']} -> {job['reduced_tps']}, PP {job['pp']}, DP {job['dp']}; paper's worst: "
            + ", ".join(f"{p} {100 * v:.0f}%" for p, v in paper["throughput_loss_max"].items())
            + "\n"
            + _table(["failed"] + list(PLAN_POLICIES), loss_rows),
            f"Spare domains to hold the global batch over {report['setup']['days']:g}-day traces\n"
            + _table(["policy", "needed", "per trace", "paused w/o spares", "paper"], spare_rows),
            f"Time with > 0.1% of GPUs down: {100 * report['time_above_0.1pct']:.1f}% "
            f"(paper: {100 * paper['time_above_0.1pct']:.0f}%)",
            _goodput_table(report),
        ]
    )
