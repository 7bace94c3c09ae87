"""Record the cost model's validation against published training runs.

    python benchmarks/cost_model_validation.py [--out DIR]

One row per run of ``cluster.validation.PUBLISHED_RUNS`` (Narayanan et al. 2021 Tables 1 and 2,
Korthikanti et al. 2022 Table 5 and sec. 6.3; A100 80GB) and of
``cluster.validation_hopper.MEGATRON_CORE_H100`` (Megatron-Core's H100 table): the published and
the predicted seconds per iteration, the error (published / predicted - 1), and whether the run
calibrated its GPU's GEMM ceiling. ``meta`` holds the summaries: mean and largest absolute error
over the calibration rows and over the held-out rows, per GPU. The numbers are a model's, computed on the CPU; the
record is stamped with that CPU only to say where and when it was computed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from tutorial_lib.bench import environment_stamp, write_and_print
from tutorial_lib.cluster.gemm_model import (
    A100_GEMM_CEILING,
    A100_GEMM_TILE,
    HOPPER_GEMM_CEILING,
)
from tutorial_lib.cluster.validation import (
    CALIBRATION_RUNS,
    gemm_validation_table,
    validation_summary,
)
from tutorial_lib.cluster.validation_hopper import (
    H100_ASSUMED,
    HOPPER_CALIBRATION_RUNS,
    hopper_validation_table,
)

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def main(argv: Sequence[str] | None = None) -> Path:
    """Compute the table and write it; returns the JSON's path."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results folder")
    args = p.parse_args(argv)
    table = gemm_validation_table()
    rows = [
        {
            "gpu": "A100",
            "run": r["name"],
            "source": r["source"],
            "gpus": r["gpus"],
            "tp x pp x dp": f"{r['tp']} x {r['pp']} x {r['dp']}",
            "recompute": r["recompute"] + (" + SP" if r["sequence_parallel"] else ""),
            "v": r["virtual_stages"],
            "published_s": round(r["seconds"], 3),
            "predicted_s": round(r["predicted_seconds"], 3),
            "error": round(r["error"], 4),
            "calibration": r["calibration"],
        }
        for r in table
    ]
    hopper_table = hopper_validation_table()
    rows += [
        {
            "gpu": "H100",
            "run": f"MC {r['name']}",
            "source": "Megatron-Core r0.8.0 README (H100)",
            "gpus": r["gpus"],
            "tp x pp x dp": f"{r['tp']} x {r['pp']} x {r['dp']}",
            "recompute": "none" + (" + SP" if r["tp"] > 1 else ""),
            "v": 1,
            "published_s": round(r["seconds"], 3),
            "predicted_s": round(r["predicted_seconds"], 3),
            "error": round(r["error"], 4),
            "calibration": r["calibration"],
        }
        for r in hopper_table
    ]
    hopper = {f"hopper_{k}": v for k, v in validation_summary(hopper_table).items()}
    meta = {
        **validation_summary(table),
        "a100_gemm_ceiling": A100_GEMM_CEILING,
        "a100_gemm_tile": list(A100_GEMM_TILE),
        "calibration_runs": list(CALIBRATION_RUNS),
        **hopper,
        "hopper_gemm_ceiling": HOPPER_GEMM_CEILING,
        "hopper_calibration_runs": list(HOPPER_CALIBRATION_RUNS),
        "hopper_assumed": H100_ASSUMED,
        "what": "cost model (cluster.cost_terms with cluster.gemm_model) against published "
        "A100 and H100 runs; computed on the CPU, no GPU involved",
    }
    env = {**environment_stamp(torch.device("cpu")), "preset": "model"}
    return write_and_print(
        "cost_model_validation", "cost model validation", rows, args.out, meta, env
    )


if __name__ == "__main__":
    main(sys.argv[1:])
