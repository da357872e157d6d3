"""A Linear layer's cost with its (out, in) weight stored output-major (torch's default) or input-major.

On one torch thread, as every role runs: the forward for a worker's few rows and a learner's batch, and a
forward + backward of a learner's batch, for the Linear layers of the image torsos and a few others.

    python -m bench.linear_layout [--reps 5] [--out bench/results/linear_layout.json]
"""
from __future__ import annotations

import argparse
import os

import torch

from bench.common import ROOT, hardware, write_json
from bench.micro import median_us

SHAPES = [(3136, 512), (1600, 128), (3872, 256), (256, 256), (64, 64), (512, 18)]  # (in, out)
ROWS = (8, 64, 256)


def layer_costs(in_features: int, out_features: int, reps: int) -> dict:
    torch.manual_seed(0)
    output_major = torch.nn.Linear(in_features, out_features)
    input_major = torch.nn.Linear(in_features, out_features)
    input_major.load_state_dict(output_major.state_dict())
    input_major.weight.data = input_major.weight.data.t().contiguous().t()
    row = {"in": in_features, "out": out_features}
    for layout, layer in (("output_major", output_major), ("input_major", input_major)):
        for n in ROWS:
            x = torch.randn(n, in_features)
            with torch.inference_mode():
                row[f"{layout}_forward_{n}_us"] = round(median_us(lambda: layer(x), 200, reps), 1)
        x = torch.randn(64, in_features, requires_grad=True)  # a learner's features carry the convs' gradient

        def step():
            layer.zero_grad(set_to_none=True)
            x.grad = None
            layer(x).sum().backward()

        row[f"{layout}_train_64_us"] = round(median_us(step, 50, reps), 1)
    print(row, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "linear_layout.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [layer_costs(i, o, args.reps) for i, o in SHAPES]
    print("| in -> out | " + " | ".join(f"forward {n} rows (µs)" for n in ROWS) + " | forward + backward 64 rows (µs) |")
    print("|---|" + "---|" * (len(ROWS) + 1))
    for r in rows:
        cells = [f"{r[f'input_major_forward_{n}_us']:.0f} · {r[f'output_major_forward_{n}_us']:.0f}" for n in ROWS]
        train = f"{r['input_major_train_64_us']:.0f} · {r['output_major_train_64_us']:.0f}"
        print(f"| {r['in']} -> {r['out']} | " + " | ".join(cells) + f" | {train} |")
    write_json(args.out, {"hardware": hardware(), "layers": rows})


if __name__ == "__main__":
    main()
