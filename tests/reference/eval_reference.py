"""fp64 held-out loss of Hugging Face weights, against `tpusim eval`.

What it checks
--------------
`tpusim eval HF_DIR model_name=... dataset_path=TEXT ... --json` scores eval_steps batches of the
held-out windows of TEXT. This script rebuilds those batches from the file alone, as
sim/train/dataset.h describes them (byte-level tokens = the file's bytes; windows of length + 1
tokens every `length` tokens; in each era of 2^20 tokens the last tenth of its windows, at least
one, is held out, in file order; batch b is held-out windows [b S, (b + 1) S)), runs them through
Transformers' Llama forward pass in float64 (hf_reference.py's, from HF_DIR/model.safetensors and
config.json), and compares the mean negative log-likelihood per token with tpusim's loss:
relative error <= 1e-6 (fp32 tpusim against fp64 truth).

Run: /usr/bin/python3 tests/reference/eval_reference.py HF_DIR TEXT EVAL_JSON
     (EVAL_JSON: the file `tpusim eval ... --json` wrote)
"""

import json
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference  # noqa: E402
import torch_reference as ref  # noqa: E402

ERA_TOKENS = 1 << 20
EVAL_SHARE = 10


def held_out_starts(token_count, length):
    """Start of every held-out window, in order (sim/train/dataset.cpp's layout, from scratch)."""
    windows = (token_count - 1) // length
    era_windows = max(2, ERA_TOKENS // length)
    starts = []
    for era_first in range(0, windows, era_windows):
        in_era = min(era_windows, windows - era_first)
        held = 0 if in_era < 2 else max(1, in_era // EVAL_SHARE)
        starts += [(era_first + in_era - held + i) * length for i in range(held)]
    return starts


def main():
    hf_dir, text_path, eval_path = sys.argv[1:4]
    with open(os.path.join(hf_dir, "config.json")) as stream:
        config = json.load(stream)
    with open(eval_path) as stream:
        result = json.load(stream)
    weights = {n: torch.tensor(v) for n, v in
               ref.read_safetensors(os.path.join(hf_dir, "model.safetensors")).items()}
    with open(text_path, "rb") as stream:
        tokens = list(stream.read())
    sequences, steps = result["sequences_per_batch"], result["eval_steps"]
    length = result["tokens"] // (sequences * steps)
    starts = held_out_starts(len(tokens), length)
    losses = []
    for batch in range(steps):
        rows = [starts[(batch * sequences + s) % len(starts)] for s in range(sequences)]
        inputs = torch.tensor([tokens[r:r + length] for r in rows], dtype=torch.int64)
        targets = torch.tensor([tokens[r + 1:r + length + 1] for r in rows], dtype=torch.int64)
        logits = hf_reference.llama_logits(weights, config, inputs)
        nll = -torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])
        losses.append(nll.mean().item())
    loss = sum(losses) / len(losses)
    error = abs(result["loss"] - loss) / abs(loss)
    ok = error <= 1e-6
    print(f"# {hf_dir}: {steps} held-out batches of {sequences}x{length} from {text_path}")
    print(f"{'ok  ' if ok else 'FAIL'} tpusim eval loss {result['loss']:.12f} vs fp64 {loss:.12f}: "
          f"relative error {error:.3e} (tol 1e-06)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
