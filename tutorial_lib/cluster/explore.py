"""An explorer for chapter 11: pick a cluster, a TP degree, a failed fraction and a policy, and
see the plan ``plans.plan_cluster`` makes and the throughput it keeps.

``explore_plan`` is the plain function (a summary dict and a figure, fine for a static page);
``plan_explorer`` wraps it in ipywidgets (the ``book`` extra), imported only when called.

The job is ``TrainingJob.paper()``'s, scaled to the chosen cluster: the 480B GPT on B200-class
GPUs with the paper's links, ``pp`` pipeline stages (8), ``local_batch`` sequences per replica
(8, as in the paper's 1024 over 128 replicas), and degraded replicas allowed to run at TP - 2
or TP - 4 (the paper's 30 and 28 for TP 32). Failures are uniform at random. Memory is not
modelled (a small cluster would not hold 480B parameters); everything is a model, not a
measurement.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import html
import io
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ..checks import check_positive_int
from .failures import random_failures
from .monte_carlo import throughput_samples
from .plan_options import PLAN_POLICIES
from .plans import ClusterPlan, plan_cluster
from .replica_cost import PAPER_CLUSTER, PAPER_MODEL, TrainingJob, paper_parallel

__all__ = ["explore_job", "explore_plan", "plan_explorer", "summary_html"]


def _reduced_degrees(tp: int) -> tuple[int, ...]:
    """TP - 2 and TP - 4 where positive (the paper's 30 and 28 for 32); TP - 1 for tiny TP."""
    return tuple(d for d in (tp - 2, tp - 4) if d >= 1) or (tp - 1,)


@functools.lru_cache(maxsize=32)
def explore_job(
    n_gpus: int, domain_size: int, tp: int, pp: int = 8, local_batch: int = 8
) -> TrainingJob:
    """``TrainingJob.paper()`` scaled to ``n_gpus`` GPUs in domains of ``domain_size`` at base TP ``tp``.

    Raises ``ValueError`` with the reason for a layout that cannot exist."""
    for name, value in (
        ("n_gpus", n_gpus),
        ("domain_size", domain_size),
        ("tp", tp),
        ("pp", pp),
        ("local_batch", local_batch),
    ):
        check_positive_int(value, name)
    if tp < 2:
        raise ValueError("tp must be at least 2: at TP 1 there is no degree to reduce to.")
    if domain_size % tp:
        raise ValueError(
            f"TP {tp} does not divide the scale-up domain of {domain_size} GPUs: "
            "a TP group must live inside one domain."
        )
    if n_gpus % domain_size:
        raise ValueError(f"{n_gpus} GPUs do not make whole domains of {domain_size}.")
    if n_gpus % (tp * pp):
        raise ValueError(
            f"{n_gpus} GPUs do not split into replicas of TP {tp} x PP {pp} = {tp * pp} GPUs."
        )
    dp = n_gpus // (tp * pp)
    cluster = dataclasses.replace(
        PAPER_CLUSTER,
        name=f"{n_gpus} GPUs, domains of {domain_size}",
        n_gpus=n_gpus,
        domain_size=domain_size,
    )
    par = paper_parallel(tp, pp, dp, local_batch)
    return TrainingJob(
        model=PAPER_MODEL, cluster=cluster, par=par, reduced_tps=_reduced_degrees(tp)
    )


def explore_plan(
    n_gpus: int = 32768,
    domain_size: int = 32,
    tp: int = 32,
    failed_fraction: float = 0.001,
    policy: str = "ntp-pw",
    seed: int = 0,
    pp: int = 8,
    samples: int = 4,
) -> tuple[dict[str, Any], Figure]:
    """Plan ``explore_job(n_gpus, domain_size, tp, pp)`` after ``failed_fraction`` of its GPUs
    fail (uniformly at random, ``seed``) under ``policy``.

    Returns (summary, figure). Summary keys: the layout (``gpus``, ``domain_size``, ``tp``,
    ``pp``, ``dp``, ``reduced_tps``), ``failed_gpus``, ``policy``, ``chosen`` (the plan that
    won), ``replicas``, ``degraded_replicas``, ``degrees`` (TP degrees in use), ``global_batch``,
    ``healthy_global_batch``, ``relative_throughput``, ``max_power`` (of TDP), ``step_time_s``,
    ``healthy_step_time_s``, ``idle_slots``, ``dead_slots`` (TP groups), ``describe``.
    The figure: left, every policy's mean relative throughput over ``samples`` patterns per
    failed fraction, with this plan marked; right, where the plan puts the cluster's TP groups.
    """
    if policy not in PLAN_POLICIES:
        raise ValueError(f"policy must be one of {PLAN_POLICIES}, got {policy!r}.")
    if not 0 <= failed_fraction <= 0.05:
        raise ValueError(f"failed_fraction must lie in [0, 0.05], got {failed_fraction!r}.")
    job = explore_job(n_gpus, domain_size, tp, pp)
    failed = random_failures(n_gpus, failed_fraction, seed)
    p = plan_cluster(job, failed, policy)
    degraded = [r for r in p.replicas if r.failed or r.tp != tp]
    summary = {
        "gpus": n_gpus,
        "domain_size": domain_size,
        "tp": tp,
        "pp": pp,
        "dp": job.par.dp,
        "reduced_tps": job.degrees,
        "failed_gpus": len(failed),
        "policy": policy,
        "chosen": tuple(p.chosen),
        "replicas": len(p.replicas),
        "degraded_replicas": len(degraded),
        "degrees": sorted({r.tp for r in p.replicas}),
        "global_batch": p.global_batch,
        "healthy_global_batch": p.healthy_global_batch,
        "relative_throughput": p.throughput,
        "max_power": max((r.power for r in p.replicas), default=1.0),
        "step_time_s": p.step_time,
        "healthy_step_time_s": p.healthy_step_time,
        "idle_slots": len(p.idle_slots),
        "dead_slots": len(p.dead_slots),
        "describe": p.describe(),
    }
    return summary, _plot(job, p, summary, failed_fraction, seed, samples)


def _plot(
    job: TrainingJob, p: ClusterPlan, s: dict[str, Any], frac: float, seed: int, samples: int
) -> Figure:
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    fractions = np.linspace(0, max(0.005, 1.5 * frac), 7)
    curves = throughput_samples(job, fractions, samples, seed)
    for i, (name, thr) in enumerate(curves.items()):
        ax.plot(100 * fractions, thr.mean(axis=1), "o-", ms=3, color=f"C{i}", label=name)
    ax.plot(
        100 * frac,
        s["relative_throughput"],
        "*",
        ms=14,
        color="k",
        label=f"this plan ({s['policy']})",
    )
    ax.set(
        xlabel="failed GPUs (% of the cluster)",
        ylabel="throughput / healthy job",
        title=f"{s['gpus']:,} GPUs, domains of {s['domain_size']}, TP {s['tp']} (model)",
    )
    ax.legend(fontsize=8)
    base = sum(r.tp == s["tp"] and not r.failed for r in p.replicas)
    counts = {
        "healthy replicas": base * job.par.pp,
        "degraded replicas": (len(p.replicas) - base) * job.par.pp,
        "idle (unused)": s["idle_slots"],
        "dead": s["dead_slots"],
    }
    bars = bx.barh(
        list(counts), list(counts.values()), color=["tab:green", "tab:orange", "0.6", "tab:red"]
    )
    bx.bar_label(bars, fontsize=8)
    bx.invert_yaxis()
    bx.set_xlim(0, 1.15 * max(max(counts.values()), 1))
    bx.set(
        xlabel=f"TP groups of {s['tp']} GPUs",
        title=f"Where the TP groups go (power up to {s['max_power']:.2f}x TDP)",
    )
    fig.tight_layout()
    return fig


def summary_html(summary: dict[str, Any]) -> str:
    """The summary of ``explore_plan`` as a small HTML table (the explorer's text output)."""
    keys = (
        "dp",
        "reduced_tps",
        "failed_gpus",
        "chosen",
        "replicas",
        "degraded_replicas",
        "degrees",
        "global_batch",
        "relative_throughput",
        "max_power",
        "step_time_s",
    )
    rows = []
    for k in keys:
        v = summary[k]
        text = f"{v:.4f}" if isinstance(v, float) else str(v)
        rows.append(
            f"<tr><td style='padding:1px 8px'>{k}</td><td style='padding:1px 8px;"
            f"font-family:monospace'>{html.escape(text)}</td></tr>"
        )
    return f"<table>{''.join(rows)}</table>"


def _figure_html(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return f"<img src='data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}'/>"


def plan_explorer(
    n_gpus: int = 32768,
    domain_size: int = 32,
    tp: int = 32,
    failed_fraction: float = 0.001,
    policy: str = "ntp-pw",
) -> Any:
    """A ``VBox`` of controls (cluster size, domain size, TP, failed fraction, policy) over an
    ``HTML`` output with the summary table and the figure of ``explore_plan``. The output is
    drawn before this returns, so a page built from saved widget state shows it; an impossible
    layout shows its ``ValueError`` message instead."""
    try:
        import ipywidgets as w
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "plan_explorer needs ipywidgets: pip install 'tutorial_lib[book]'. "
            "explore_plan gives the same numbers without it."
        ) from err
    gpus = w.Dropdown(options=[1024, 4096, 16384, 32768, 65536], value=n_gpus, description="GPUs")
    domain = w.Dropdown(options=[8, 16, 32, 64, 72], value=domain_size, description="domain")
    tp_w = w.Dropdown(options=[4, 8, 16, 32, 64, 72], value=tp, description="TP")
    frac = w.FloatSlider(
        value=failed_fraction,
        min=0.0,
        max=0.01,
        step=0.0005,
        readout_format=".4f",
        description="failed",
        continuous_update=False,
    )
    pol = w.ToggleButtons(options=list(PLAN_POLICIES), value=policy, description="policy")
    out = w.HTML()

    def redraw(_change: object = None) -> None:
        try:
            s, fig = explore_plan(gpus.value, domain.value, tp_w.value, frac.value, pol.value)
        except ValueError as err:
            out.value = f"<p style='color:#b00'>{html.escape(str(err))}</p>"
            return
        out.value = summary_html(s) + _figure_html(fig)

    for widget in (gpus, domain, tp_w, frac, pol):
        widget.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([gpus, domain, tp_w]), frac, pol, out])
