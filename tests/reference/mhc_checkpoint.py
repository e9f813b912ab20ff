"""Moves a deepseek4 checkpoint's mHC scalars and biases away from their initial values, for the
mHC check.

Usage: /usr/bin/python3 tests/reference/mhc_checkpoint.py SOURCE_CHECKPOINT DESTINATION

At initialization MaxText's mHC (layers/mhc.py) has every alpha scale at 0.01 and every bias at 0,
so the residual matrices are within about 1% of uniform (1/k everywhere) and Sinkhorn's iterations
change little: a check from there would barely see them. This copies the checkpoint directory
written by `tpusim train` (mhc_expansion_rate > 1) and sets, in every hyper-connection,
  {pre,post,res}_alpha_scale  1 (the projections' entries then spread about +-1),
  res_beta[i, j]              2 where j = (i + 1) mod k, else 0 (a shifted permutation),
  pre_beta[i], post_beta[i]   0.5 x (i mod 3 - 1),
so the matrices are far from uniform and from doubly stochastic before the iterations (the
reference prints how far). tests/sim/train/decoder_blocks_training_test.cpp sets the same values.
The checksums in state.json are recomputed (tpusim verifies them).
"""

import sys

import numpy as np

from imbalance_router import copy_checkpoint, edit_tensors, rewrite_checksums

SCALE = 1.0
PERMUTATION_BIAS = 2.0
STREAM_BIAS = 0.5


def scale_values(scale):
    return np.full(scale.shape, SCALE, dtype=np.float32)


def res_beta_values(beta):
    k = beta.shape[0]
    rows, columns = np.meshgrid(np.arange(k), np.arange(k), indexing="ij")
    return (PERMUTATION_BIAS * (columns == (rows + 1) % k)).astype(np.float32)


def stream_beta_values(beta):
    return (STREAM_BIAS * (np.arange(beta.shape[0]) % 3 - 1)).astype(np.float32)


def main():
    source, destination = sys.argv[1], sys.argv[2]
    model, names = copy_checkpoint(source, destination)
    edits = {}
    for name in names:
        base = name.split("#")[0]
        if base.endswith("_alpha_scale"):
            edits[name] = scale_values
        elif base.endswith("/res_beta"):
            edits[name] = res_beta_values
        elif base.endswith(("/pre_beta", "/post_beta")):
            edits[name] = stream_beta_values
    if not edits:
        sys.exit(f"mhc_checkpoint: {source} has no mHC parameters (train with mhc_expansion_rate > 1)")
    edit_tensors(model, edits)
    rewrite_checksums(destination)
    print(f"mhc_checkpoint: {destination}: {len(edits)} mHC scalars and biases set")


if __name__ == "__main__":
    main()
