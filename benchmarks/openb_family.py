"""A family of traces in the shape of Alibaba's `openb` trace, for checking that a placement policy does not only fit
the default one.

The FGD paper (USENIX ATC'23, section 6) varies its trace by resampling: it keeps the number of pods and draws them
again so that one kind of pod makes a chosen share of the GPU pods. This generator does the same from the default
pod list, each variant from its own seeded random stream:

* `share-N`: GPU-sharing pods (one GPU, less than all of it) are N % of the GPU pods (the default trace: 44 %);
* `multi-N`: pods asking for more than one GPU are N % of the GPU pods (the default trace: 1 %);
* `model-N`: N % of the GPU pods must run on GPUs of one or two models (a `gpu_spec` of `A` or `A|B`, the models
  drawn by how many GPUs of each the nodes have); the default trace constrains none.

CPU-only pods are kept as they are. The variants are written in the trace's own csv format, so `kubegpu simulate`
and `sharing_bench.py` read them like the default one:

    .venv/bin/python benchmarks/openb_family.py OUT_DIR [--trace DIR] [--seed 7]
"""

from __future__ import annotations

import argparse
import csv
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb"
POD_FILE = "openb_pod_list_default.csv"
NODE_FILE = "openb_node_list_gpu_node.csv"

Row = dict[str, str]

# name -> (what the share is of, the share of the GPU pods it should make); model constraints are added, not drawn.
VARIANTS: dict[str, tuple[str, float]] = {
    "share-30": ("share", 0.30),
    "share-70": ("share", 0.70),
    "multi-10": ("multi", 0.10),
    "multi-20": ("multi", 0.20),
    "model-20": ("model", 0.20),
    "model-50": ("model", 0.50),
}


def gpus(row: Row) -> int:
    return int(row["num_gpu"])


def is_share(row: Row) -> bool:
    return gpus(row) == 1 and int(row["gpu_milli"]) < 1000


def is_multi(row: Row) -> bool:
    return gpus(row) > 1


def resample(rows: list[Row], chosen: Callable[[Row], bool], share: float, rng: random.Random) -> list[Row]:
    """As many GPU pods as `rows` has, `share` of them drawn (with replacement) from those `chosen` picks and the
    rest from the other GPU pods; cpu-only pods as they are, the order shuffled."""
    gpu_rows = [r for r in rows if gpus(r)]
    inside = [r for r in gpu_rows if chosen(r)]
    outside = [r for r in gpu_rows if not chosen(r)]
    wanted = round(share * len(gpu_rows))
    drawn = [rng.choice(inside) for _ in range(wanted)] + [rng.choice(outside) for _ in range(len(gpu_rows) - wanted)]
    result = [r for r in rows if not gpus(r)] + drawn
    rng.shuffle(result)
    return [dict(r, name=f"{r['name']}-{i}") for i, r in enumerate(result)]


def constrain(rows: list[Row], nodes: list[Row], share: float, rng: random.Random) -> list[Row]:
    """`share` of the GPU pods restricted to one or two GPU models (half each), drawn by GPUs per model, among the
    models whose nodes have at least as many GPUs as the pod asks (a constraint no node could meet tests nothing)."""
    capacity: Counter[str] = Counter()
    largest: Counter[str] = Counter()
    for node in nodes:
        capacity[node["model"]] += int(node["gpu"])
        largest[node["model"]] = max(largest[node["model"]], int(node["gpu"]))
    out = []
    for row in rows:
        if gpus(row) and rng.random() < share:
            models = [m for m in capacity if largest[m] >= gpus(row)]
            weights = [capacity[m] for m in models]
            first = rng.choices(models, weights)[0]
            spec = [first]
            if rng.random() < 0.5 and len(models) > 1:
                rest = [m for m in models if m != first]
                spec.append(rng.choices(rest, [capacity[m] for m in rest])[0])
            row = dict(row, gpu_spec="|".join(spec))
        out.append(row)
    return out


def family(trace: Path, seed: int) -> dict[str, list[Row]]:
    """Each variant's pod rows, by name."""
    with (trace / POD_FILE).open() as f:
        rows = list(csv.DictReader(f))
    with (trace / NODE_FILE).open() as f:
        nodes = list(csv.DictReader(f))
    out = {}
    for i, (name, (what, share)) in enumerate(VARIANTS.items()):
        rng = random.Random(seed * 1000 + i)
        if what == "model":
            out[name] = constrain(rows, nodes, share, rng)
        else:
            out[name] = resample(rows, is_share if what == "share" else is_multi, share, rng)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in family(args.trace, args.seed).items():
        path = args.out / f"openb_pod_list_{name}.csv"
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        gpu_rows = [r for r in rows if gpus(r)]
        print(
            f"{path}: {len(rows)} pods, shares {sum(map(is_share, gpu_rows)) / len(gpu_rows):.0%}, "
            f"multi-GPU {sum(map(is_multi, gpu_rows)) / len(gpu_rows):.0%}, "
            f"model-constrained {sum(1 for r in gpu_rows if r['gpu_spec']) / len(gpu_rows):.0%} of the GPU pods"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
