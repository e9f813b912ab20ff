#!/usr/bin/env python3
"""tpusim train against PyTorch, side by side on this machine (issue 15).

For each model and thread count, runs `tpusim train` (synthetic data, 1 simulated device) and an
independent fp32 PyTorch training loop of the same model (written here from the model's
definition: token embedding, RMSNorm, RoPE on split halves, causal GQA attention with no run-time
1/sqrt(head_dim) as in MaxText, SwiGLU MLP, untied unembedding, cross-entropy, AdamW with
clipping; tpusim with remat_policy=none, as PyTorch keeps the activations too), the two
alternating run after run, and reports the median tokens/s of each and their ratio. tpusim runs
once per --dtypes value: float32 (fp32 GEMMs) and bfloat16_matmul (bf16 operands, fp32
accumulation, as MaxText's default dtype on a TPU); PyTorch runs fp32, its fastest on this CPU. Each run's
rate is the median over its steps after the first (warm-up). Also: the cost of simulating 8
devices (fsdp=4 x tensor=2) over 1 at the same global batch and thread count.

The machine is shared: compare the ratios, measured side by side, rather than absolute rates.

Run (Debian's python3 has torch):
  /usr/bin/python3 benchmarks/train_vs_torch.py [--tpusim build/sim/tpusim] [--runs 3]
      [--models small,large] [--threads 1,all] [--dtypes float32,bfloat16_matmul]
      [--json out.json] [--skip-devices]
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = {
    # The model: emb 256, 8 query / 4 kv heads of 32, mlp 1024, 4 layers, vocab 256.
    "small": dict(emb=256, heads=8, kv_heads=4, head_dim=32, mlp=1024, layers=4, vocab=256,
                  batch=8, length=256, steps=6),
    # A larger one: emb 1024, 8 layers, vocab 32k, 512 tokens per sequence.
    "large": dict(emb=1024, heads=16, kv_heads=8, head_dim=64, mlp=4096, layers=8, vocab=32768,
                  batch=2, length=512, steps=3),
}


def tpusim_args(model, threads, devices=1, dtype="float32"):
    args = [
        f"functional_dtype={dtype}",
        "model_name=tiny-llama",
        "override_model_config=true",
        f"base_emb_dim={model['emb']}",
        f"base_num_query_heads={model['heads']}",
        f"base_num_kv_heads={model['kv_heads']}",
        f"head_dim={model['head_dim']}",
        f"base_mlp_dim={model['mlp']}",
        f"base_num_decoder_layers={model['layers']}",
        f"vocab_size={model['vocab']}",
        f"max_target_length={model['length']}",
        f"steps={model['steps']}",
        "dataset_type=synthetic",
        # The same math as the PyTorch loop, which keeps every activation (MaxText's default,
        # full, recomputes the forward pass in the backward one: a third more FLOPs).
        "remat_policy=none",
        "learning_rate=1e-4",
        f"num_threads={threads}",
    ]
    if devices == 1:
        args += ["compile_topology=v5e-1", f"per_device_batch_size={model['batch']}"]
    else:
        args += ["compile_topology=v5e-8", "ici_fsdp_parallelism=4", "ici_tensor_parallelism=2",
                 f"per_device_batch_size={model['batch'] / 8:g}"]
    return args


def run_tpusim(binary, model, threads, devices=1, dtype="float32"):
    with tempfile.TemporaryDirectory() as work:
        metrics = os.path.join(work, "metrics.jsonl")
        cmd = [binary, "train", *tpusim_args(model, threads, devices, dtype),
               f"metrics_file={metrics}",
               "--quiet"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(metrics) as f:
            rates = [json.loads(line)["tokens_per_s"] for line in f if line.strip()]
    return statistics.median(rates[1:] if len(rates) > 1 else rates)


TORCH_PROGRAM = r'''
import json, math, sys, time
import torch
import torch.nn.functional as F

cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
torch.manual_seed(0)
E, H, K, D, M, L, V = (cfg[k] for k in ("emb", "heads", "kv_heads", "head_dim", "mlp", "layers",
                                          "vocab"))
B, T = cfg["batch"], cfg["length"]


def param(*shape, fan_in):
    return torch.nn.Parameter(torch.randn(*shape) / math.sqrt(fan_in))


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm = torch.nn.Parameter(torch.ones(E))
        self.wq = param(E, H * D, fan_in=E)
        self.wk = param(E, K * D, fan_in=E)
        self.wv = param(E, K * D, fan_in=E)
        self.wo = param(H * D, E, fan_in=H * D)
        self.mlp_norm = torch.nn.Parameter(torch.ones(E))
        self.w_gate = param(E, M, fan_in=E)
        self.w_up = param(E, M, fan_in=E)
        self.w_down = param(M, E, fan_in=M)


def rms_norm(x, scale, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * scale


def rope(x, cos, sin):  # x [B, T, heads, D], split halves
    first, second = x[..., : D // 2], x[..., D // 2 :]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Parameter(torch.randn(V, E))
        self.layers = torch.nn.ModuleList(Layer() for _ in range(L))
        self.final_norm = torch.nn.Parameter(torch.ones(E))
        self.unembed = param(E, V, fan_in=E)
        timescale = 10000.0 ** (torch.arange(D // 2, dtype=torch.float32) * 2 / D)
        angles = torch.arange(T, dtype=torch.float32)[:, None] / timescale[None, :]
        self.register_buffer("cos", angles.cos()[None, :, None, :])
        self.register_buffer("sin", angles.sin()[None, :, None, :])

    def forward(self, tokens):
        x = self.embed[tokens]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for layer in self.layers:
            h = rms_norm(x, layer.attn_norm)
            q = rope((h @ layer.wq).view(B, T, H, D), self.cos, self.sin)
            k = rope((h @ layer.wk).view(B, T, K, D), self.cos, self.sin)
            v = (h @ layer.wv).view(B, T, K, D)
            k = k.repeat_interleave(H // K, dim=2)
            v = v.repeat_interleave(H // K, dim=2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, T, D]
            scores = (q @ k.transpose(-1, -2)).masked_fill(~mask, float("-inf"))
            attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * D)
            x = x + attn @ layer.wo
            h = rms_norm(x, layer.mlp_norm)
            x = x + (F.silu(h @ layer.w_gate) * (h @ layer.w_up)) @ layer.w_down
        return rms_norm(x, self.final_norm) @ self.unembed


model = Model()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                              weight_decay=0.1)
generator = torch.Generator().manual_seed(1)
rates = []
for step in range(cfg["steps"]):
    tokens = torch.randint(0, V, (B, T + 1), generator=generator)
    start = time.perf_counter()
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, V), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    rates.append(B * T / (time.perf_counter() - start))
print(json.dumps(rates))
'''


def run_torch(python, model, threads):
    cfg = dict(model, threads=threads)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    out = subprocess.run([python, "-c", TORCH_PROGRAM, json.dumps(cfg)], check=True,
                         capture_output=True, text=True, env=env).stdout
    rates = json.loads(out.strip().splitlines()[-1])
    return statistics.median(rates[1:] if len(rates) > 1 else rates)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tpusim", default="build/sim/tpusim")
    parser.add_argument("--python", default="/usr/bin/python3", help="an interpreter with torch")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--models", default="small,large")
    parser.add_argument("--threads", default="1,all")
    parser.add_argument("--skip-devices", action="store_true",
                        help="skip the 8-devices-over-1 measurement")
    parser.add_argument("--dtypes", default="float32,bfloat16_matmul",
                        help="tpusim's functional_dtype values to run (PyTorch runs fp32, its "
                             "fastest on a CPU)")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    thread_counts = [cores if t == "all" else int(t) for t in args.threads.split(",")]
    torch_version = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"],
                                   check=True, capture_output=True, text=True).stdout.strip()
    results = {"cores": cores, "runs": args.runs, "models": {}, "devices": None,
               "torch_version": torch_version}
    for name in args.models.split(","):
        model = MODELS[name]
        for threads in thread_counts:
            dtypes = args.dtypes.split(",")
            rates = {label: [] for label in ["torch", *dtypes]}
            for run in range(args.runs):
                # Alternate the order, so a drift in the machine's load hits every contender.
                order = ["torch", *dtypes]
                if run % 2:
                    order.reverse()
                for label in order:
                    if label == "torch":
                        rate = run_torch(args.python, model, threads)
                    else:
                        rate = run_tpusim(args.tpusim, model, threads, dtype=label)
                    rates[label].append(rate)
                    print(f"  {name} threads={threads} run {run + 1}: {label} {rate:.0f} tokens/s",
                          file=sys.stderr, flush=True)
            torch_rate = statistics.median(rates["torch"])
            entry = {"torch_tokens_per_s": torch_rate, "torch_runs": rates["torch"], "tpusim": {}}
            for dtype in dtypes:
                rate = statistics.median(rates[dtype])
                entry["tpusim"][dtype] = {"tokens_per_s": rate, "runs": rates[dtype],
                                          "ratio": rate / torch_rate}
                print(f"{name} threads={threads} {dtype}: tpusim {rate:.0f} torch "
                      f"{torch_rate:.0f} tokens/s, ratio {rate / torch_rate:.2f}", flush=True)
            results["models"].setdefault(name, {"config": model})[str(threads)] = entry
    if not args.skip_devices:
        model = MODELS["small"]
        one, eight = [], []
        for run in range(args.runs):
            one.append(run_tpusim(args.tpusim, model, cores, devices=1))
            eight.append(run_tpusim(args.tpusim, model, cores, devices=8))
        results["devices"] = {
            "one_device_tokens_per_s": statistics.median(one),
            "eight_devices_tokens_per_s": statistics.median(eight),
            "threads": cores,
        }
        # Wall time per step of 8 devices over 1 device, same global batch.
        results["devices"]["wall_time_ratio"] = statistics.median(one) / statistics.median(eight)
        print(f"8 devices (fsdp=4 x tensor=2) over 1, {cores} threads: "
              f"{results['devices']['wall_time_ratio']:.2f}x the wall time", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
