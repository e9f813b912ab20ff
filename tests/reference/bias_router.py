"""Gives a deepseek4 checkpoint's routers a non-zero selection bias, for the routed_bias check.

Usage: /usr/bin/python3 tests/reference/bias_router.py SOURCE_CHECKPOINT DESTINATION

Copies the checkpoint directory written by `tpusim train` (routed_bias=true) and sets every
`moe/gate_bias` (MaxText's GateLogit bias, [experts], zeros at initialization) to
0.05 x (e mod 5 - 2) for expert e: a spread comparable to the gaps between a token's router scores
at initialization, so the bias changes some of the top-k choices and not all of them (the
reference prints how many). The checksums in state.json are recomputed (tpusim verifies them).
"""

import sys

import numpy as np

from imbalance_router import copy_checkpoint, edit_tensors, rewrite_checksums

STEP = 0.05


def bias_values(bias):
    experts = np.arange(bias.shape[0])
    return (STEP * (experts % 5 - 2)).astype(np.float32)


def main():
    source, destination = sys.argv[1], sys.argv[2]
    model, names = copy_checkpoint(source, destination)
    biases = [n for n in names if "/moe/gate_bias#" in n]
    if not biases:
        sys.exit(f"bias_router: {source} has no moe/gate_bias (train with routed_bias=true)")
    edit_tensors(model, {name: bias_values for name in biases})
    rewrite_checksums(destination)
    print(f"bias_router: {destination}: {len(biases)} router bias(es) set to {STEP} x (e % 5 - 2)")


if __name__ == "__main__":
    main()
