"""``TrainingJob.shard_split``: why our NTP needs 24 spare NVL32 domains where the NTP paper's
Figure 7 needs 16. With whole heads (``"whole"``, the default) the busiest of 30 ranks owns 5 of
128 heads, so a TP-30 replica keeps 6 of its 8 sequences; split evenly over the survivors
(``"even"``, the paper's assumption) it keeps 7, and two spare replicas (16 domains) suffice."""

from __future__ import annotations

from typing import Any

import pytest

from tutorial_lib.__main__ import main
from tutorial_lib.cluster import reproduce
from tutorial_lib.cluster.failures import FailureModel, simulate_trace
from tutorial_lib.cluster.monte_carlo import spare_domains
from tutorial_lib.cluster.plan_options import option_table
from tutorial_lib.cluster.replica_cost import SHARD_SPLITS, TrainingJob

WHOLE, EVEN = TrainingJob.paper(), TrainingJob.paper(shard_split="even")


def test_default_is_whole_and_even_splits_the_work_evenly() -> None:
    assert WHOLE.shard_split == "whole" and SHARD_SPLITS == ("whole", "even")
    # 32 divides 128 heads and the FFN: both splits agree on the healthy replica.
    assert WHOLE.per_microbatch(32) == EVEN.per_microbatch(32)
    # One efficiency for every GEMM (FLOPs decide): even, TP 30's GEMMs are exactly 32/30 of
    # TP 32's; whole, the busiest rank does 8.13% more (5 heads against a mean of 4.27).
    flat = {
        s: TrainingJob.paper(shard_split=s, compute_efficiency=0.6).per_microbatch
        for s in SHARD_SPLITS
    }
    ratio = {s: f(30)["compute"] / f(32)["compute"] for s, f in flat.items()}
    assert ratio["even"] == pytest.approx(32 / 30, rel=1e-12)
    assert ratio["whole"] == pytest.approx(32 / 30 * 1.0813, rel=1e-4)
    # GEMMs timed from their shapes (the default): close to that, tiles and waves aside
    shaped = {
        j.shard_split: j.per_microbatch(30)["compute"] / j.per_microbatch(32)["compute"]
        for j in (WHOLE, EVEN)
    }
    assert shaped["even"] == pytest.approx(32 / 30, rel=0.01)
    assert shaped["whole"] / shaped["even"] == pytest.approx(1.0813, rel=0.03)
    for tp in (30, 28):
        assert EVEN.per_microbatch(tp)["memory_bound"] < WHOLE.per_microbatch(tp)["memory_bound"]


@pytest.mark.parametrize(
    ("job", "tp30", "tp28"),
    [(WHOLE, [8, 6, 6, 0], [8, 6, 6, 6, 6, 0]), (EVEN, [8, 7, 7, 0], [8, 7, 7, 6, 6, 0])],
)
def test_sequences_a_degraded_replica_keeps(job: TrainingJob, tp30: list, tp28: list) -> None:
    # Per failures f = 0.. in the replica's worst TP group (paired at 30: at most 2 failures).
    assert option_table(job, 30, "ntp")["batch"][: len(tp30)].tolist() == tp30
    assert option_table(job, 28, "ntp")["batch"][: len(tp28)].tolist() == tp28
    assert option_table(job, 28, "ntp")["tp"][:5].tolist() == [32, 30, 30, 28, 28]
    assert option_table(job, 30, "ntp-pw")["batch"][1:3].tolist() == [8, 8]  # boosted: whole batch


def test_figure7_spare_domains_whole_24_even_16() -> None:
    # As ntp_reproduce builds it: the job's GPUs plus max_spares (256) domains, seed 0, 15 days.
    n, dom, max_spares = WHOLE.cluster.n_gpus, WHOLE.cluster.domain_size, 256
    trace = simulate_trace(FailureModel.llama3(), n + max_spares * dom, 15.0, seed=0)
    needed = {j.shard_split: spare_domains(j, trace, ["ntp", "ntp-pw"]) for j in (WHOLE, EVEN)}
    assert needed["whole"]["ntp"].needed == 24  # three 8-domain replicas
    assert needed["even"]["ntp"].needed == 16  # two: the paper's Figure 7
    assert needed["whole"]["ntp-pw"].needed == needed["even"]["ntp-pw"].needed == 0


@pytest.mark.parametrize("bad", ["ceil", "Even", ""])
def test_bad_shard_split_names_both_choices(bad: str) -> None:
    with pytest.raises(ValueError, match="'whole'.*'even'"):
        TrainingJob.paper(shard_split=bad)


def test_cli_shard_split_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs: list[TrainingJob] = []

    def fake(**kwargs: Any) -> dict[str, Any]:
        jobs.append(kwargs["job"])
        return {"quick": kwargs["quick"]}

    monkeypatch.setattr(reproduce, "ntp_reproduce", fake)
    for split in SHARD_SPLITS:
        assert main(["ntp-reproduce", "--json", "--quick", "--shard-split", split]) == 0
    assert main(["ntp-reproduce", "--json", "--quick"]) == 0  # default: whole
    assert [j.shard_split for j in jobs] == [*SHARD_SPLITS, "whole"]
    assert all(j.cluster.n_gpus == 32768 for j in jobs)  # the paper's job
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["ntp-reproduce", "--shard-split", "ceil"])
    assert "invalid choice" in capsys.readouterr().err
