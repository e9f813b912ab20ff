"""Makes a tiny-moe checkpoint's router deliberately unbalanced, for the dropless MoE check.

Usage: /usr/bin/python3 tests/reference/imbalance_router.py SOURCE_CHECKPOINT DESTINATION

Copies the checkpoint directory written by `tpusim train` (model.safetensors,
optimizer.safetensors, state.json) and edits two parameters in place: every element of the token
embedding gets +3 (a component shared by every token's residual stream), and the router gate's
columns for experts 0 and 1 become 2.0 and 1.0 times the unit vector along it. Every token of
every MoE layer then picks experts 0 and 1 (twice the share balanced top-2 routing of 4 experts
gives them), so a capacity-bound dispatch would drop half of those choices. The checksums in
state.json (and its fields_sha256) are recomputed (tpusim verifies them). Same edit as tests/support/imbalanced_moe.cpp.
"""

import hashlib
import json
import math
import os
import shutil
import struct
import sys

import numpy as np

SHARED = 3.0
PREFERRED = (2.0, 1.0)


def edit_tensors(path, edits):
    """Applies {name: function(array) -> array} to an F32 safetensors file in place."""
    with open(path, "rb") as stream:
        blob = bytearray(stream.read())
    (header_size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + header_size])
    start = 8 + header_size
    for name, edit in edits.items():
        info = header[name]
        begin, end = (start + offset for offset in info["data_offsets"])
        values = np.frombuffer(bytes(blob[begin:end]), dtype="<f4").reshape(info["shape"])
        blob[begin:end] = np.ascontiguousarray(edit(values.copy()), dtype="<f4").tobytes()
    with open(path, "wb") as stream:
        stream.write(blob)
    return header


def copy_checkpoint(source, destination):
    """Copies checkpoint folder `source` to `destination`; returns (weights file, tensor names)."""
    shutil.copytree(source, destination)
    model = os.path.join(destination, "model.safetensors")
    with open(model, "rb") as stream:
        (header_size,) = struct.unpack("<Q", stream.read(8))
        names = [n for n in json.loads(stream.read(header_size)) if n != "__metadata__"]
    return model, names


def main():
    source, destination = sys.argv[1], sys.argv[2]
    model, names = copy_checkpoint(source, destination)
    gates = [n for n in names if "/moe/gate#" in n]
    if "embed/token_embedding#0" not in names or not gates:
        sys.exit(f"imbalance_router: {source} is not a MoE checkpoint with a token embedding")

    def skew_gate(gate):
        unit = 1.0 / math.sqrt(gate.shape[0])
        for expert, scale in enumerate(PREFERRED):
            gate[:, expert] = scale * unit
        return gate

    edits = {"embed/token_embedding#0": lambda table: table + np.float32(SHARED)}
    edits.update({name: skew_gate for name in gates})
    edit_tensors(model, edits)
    rewrite_checksums(destination)
    print(f"imbalance_router: {destination}: embedding +{SHARED}, experts 0 and 1 preferred in "
          f"{len(gates)} gate(s)")


def rewrite_checksums(destination):
    """Recomputes state.json's file checksums and fields_sha256 after an edit."""
    state_path = os.path.join(destination, "state.json")
    with open(state_path) as stream:
        state = json.load(stream)
    for file_name in state["files"]:
        with open(os.path.join(destination, file_name), "rb") as stream:
            content = stream.read()
        state["files"][file_name] = {"bytes": len(content),
                                     "sha256": hashlib.sha256(content).hexdigest()}
    # state.json's checksum of its own fields, as sim/train/checkpoint.cpp computes it: the SHA-256
    # of the compact JSON of step, metadata and files, keys sorted.
    fields = {key: state[key] for key in ("step", "metadata", "files") if key in state}
    state["fields_sha256"] = hashlib.sha256(
        json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        .encode()).hexdigest()
    with open(state_path, "w") as stream:
        json.dump(state, stream, indent=2)


if __name__ == "__main__":
    main()
