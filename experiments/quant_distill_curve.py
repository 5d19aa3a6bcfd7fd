"""QAT-TT distillation at several TT ranks: compression of the encoder vs BBC News accuracy (arXiv 2306.01076).

One run per rank of ``tensorslim distill`` (the ``distill`` task + ``tt-qat`` method through the one Trainer):
MiniLM teacher, every encoder linear layer TT (4 cores) by TT-SVD of the teacher, 4-bit weight-only QAT of the
cores, the release's layer-by-layer curriculum. Each finished rank is appended to ``--out`` at once, so a run cut
short keeps its finished points.

Usage:
    OMP_NUM_THREADS=2 nice -n 15 .venv/bin/python experiments/quant_distill_curve.py --ranks 96 64 32 16 \
        --steps-per-layer 50 --task-steps 100 --out experiments/results/qat_distill_curve.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[96, 64, 32, 16])
    parser.add_argument("--steps-per-layer", type=int, default=50)
    parser.add_argument("--task-steps", type=int, default=100)
    parser.add_argument("--resume", action="store_true", help="continue each rank from its run folder's checkpoint")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torch

    from tensorslim.cli.distill import DistillRunConfig, run_distill

    result = {
        "meta": {
            "command": "python " + " ".join(sys.argv),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {platform.machine()}, torch {torch.__version__}, "
            f"threads {torch.get_num_threads()} (2-core VM shared with other jobs)",
        },
        "runs": [],
    }
    for rank in args.ranks:
        run_dir = Path(tempfile.gettempdir()) / f"qat_distill_curve_r{rank}"
        report = run_distill(
            DistillRunConfig(task_steps=args.task_steps, out_dir=str(run_dir), resume=args.resume),
            options={"rank": rank},
            task_options={"steps_per_layer": args.steps_per_layer},
        )
        report["loadavg_at_end"] = os.getloadavg()
        result["runs"].append(report)
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
