#!/usr/bin/python3
"""torch.optim.SGD reference for megatron-cpp's optimizer test (written for this test).

usage: /usr/bin/python3 sgd_reference.py IN.safetensors OUT.safetensors

IN (float64) holds the parameters as "param.<i>" and each step's gradients
as "grad.<step>.<i>". Its __metadata__ "plan" is a JSON object:
  {"momentum": m, "wd_mult": [0 or 1 per parameter],
   "steps": [{"lr": .., "wd": .., "clip": ..}, ...]}
Each step does what Megatron does around torch.optim.SGD: the scheduler
sets every group's lr and weight_decay (wd x wd_mult), the gradients are
clipped as clip_grad_norm_fp32 does (coef = clip / (norm + 1e-6), applied
when below 1; clip 0: off), then optimizer.step(). OUT receives
"param.<i>", "momentum_buffer.<i>" (when momentum != 0) and "norm" (the
pre-clip norm of each step). Exit code 77 when torch is not installed.
"""
import json
import os
import sys

try:
    import torch
except ImportError as e:  # pragma: no cover
    print(f"sgd_reference.py: {e}; install python3-torch python3-numpy", file=sys.stderr)
    sys.exit(77)

# The safetensors reader and writer of the model test's reference (float64 here).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model"))
from reference_gpt import read_safetensors, write_safetensors  # noqa: E402


def main():
    tensors, meta = read_safetensors(sys.argv[1])
    plan = json.loads(meta["plan"])
    n = len(plan["wd_mult"])
    params = [torch.nn.Parameter(tensors[f"param.{i}"].clone()) for i in range(n)]
    groups = [{"params": [p], "wd_mult": plan["wd_mult"][i]} for i, p in enumerate(params)]
    opt = torch.optim.SGD(groups, lr=0.0, momentum=plan["momentum"], weight_decay=0.0, foreach=False)
    norms = []
    for s, step in enumerate(plan["steps"]):
        for i, p in enumerate(params):
            p.grad = tensors[f"grad.{s}.{i}"].clone()
        norm = torch.sqrt(sum((p.grad * p.grad).sum() for p in params)).item()
        norms.append(norm)
        if step["clip"] > 0:
            coef = step["clip"] / (norm + 1e-6)
            if coef < 1.0:
                for p in params:
                    p.grad.mul_(coef)
        for g in opt.param_groups:
            g["lr"] = step["lr"]
            g["weight_decay"] = step["wd"] * g["wd_mult"]
        opt.step()
    out = {f"param.{i}": p.data for i, p in enumerate(params)}
    if plan["momentum"] != 0:
        for i, p in enumerate(params):
            out[f"momentum_buffer.{i}"] = opt.state[p]["momentum_buffer"]
    out["norm"] = torch.tensor(norms, dtype=torch.float64)
    write_safetensors(sys.argv[2], out)


if __name__ == "__main__":
    main()
