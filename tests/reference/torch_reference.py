"""Independent fp64 PyTorch reference for one tpusim training step.

What it checks
--------------
`tpusim train ... steps=1 --dump DIR` writes the parameters before the step (DIR/initial), the
gradient of every parameter (DIR/gradients), the parameters and Adam moments after the AdamW step
(DIR/updated) and the batch with the loss, gradient norm, learning rate and clipping factor
(DIR/step.json). This script rebuilds the model from DIR/initial in torch float64, written from
the model definition (not from tpusim's kernels), runs the same batch and compares:

  * the loss                                  (vs step.json "loss")
  * every parameter's gradient, by autograd    (vs DIR/gradients/model.safetensors)
  * the global L2 gradient norm before clipping (vs step.json "grad_norm")
  * the clipping factor min(1, clip / norm)     (vs step.json "gradient_scale")
  * the AdamW (optax) step: new parameters and first/second moments
                                               (vs DIR/updated/{model,optimizer}.safetensors)

Each comparison prints one line with the relative L2 error ||tpusim - torch|| / ||torch||; the
script exits 1 if any exceeds its tolerance (1e-5: fp32 tpusim vs fp64 truth, see
docs/reference/numerics.md). The per-step parameter change
(updated - initial, against the reference's new parameters rounded to fp32) is also printed for
information: it is ~1e-4 of the parameter, so its error mixes 1-ulp rounding flips with the
gradient error amplified by Adam's g / (|g| + eps) on tiny gradients, and it is not held to 1e-5.

Model families (detected from the tensor names), as MaxText computes them:
  llama  RMSNorm, RoPE (split halves), causal GQA attention with NO run-time 1/sqrt(head_dim)
         (MaxText's default Attention folds it into the query kernel's initializer), SwiGLU MLP,
         untied unembedding, or logits tied to the token embedding (head/unembedding absent).
         With qk-norm (qwen3: the parameters attention/query_norm/scale and key_norm/scale are
         present): the query and the key of every head RMS-normalized over head_dim, each with
         its own scale, before RoPE, and q.k scaled by 1/sqrt(head_dim) at run time (MaxText's
         query_pre_attn_scalar); pass --eps 1e-6 --rope-max-timescale 1e6 for tiny-qwen3.
         --attn-logits-soft-cap C: the scaled attention logits become C tanh(logits / C) before
         the mask; with tied logits, --normalize-embedding-logits divides them by sqrt(emb_dim)
         and --final-logits-soft-cap C then caps them the same way (gemma2's switches, as
         MaxText's AttentionOp and tied output head apply them).
  gpt3   LayerNorm (scale, bias), learned position embeddings, causal MHA with the query divided
         by sqrt(head_dim) at run time (MaxText's Gpt3MultiHeadAttention), GELU (tanh) MLP,
         logits tied to the token embedding.
  deepseek4  MaxText's DeepSeek4DecoderLayer with mHC off (mhc_expansion_rate 1) or, with
         --mhc-expansion-rate k > 1, on (layers/mhc.py: the embedding repeated into k streams, a
         hyper-connection around the attention and around the MoE with its pre, post and Sinkhorn
         res maps of --sinkhorn-iterations, the head summing the streams; --ignore-mhc and
         --sinkhorn-iterations 0 are ablations that must fail on an mHC dump), and
         --compress-ratios entries 0 or above 4 (default: every one 0): CompressedAttention's
         sliding-window path (low-rank query, unweighted q_up_norm, one shared key/value head,
         sinks, the output's rotation undone, grouped output projection); an entry r > 4 adds
         DeepseekV4HCACompressor's blocks (kv_proj, gate_proj; per feature a softmax over each
         block's r tokens of gate + position_bias weighting kv; kv_norm; RoPE at the block's
         first token) to the keys and values of the same softmax (block c visible to query i iff
         c < (i + 1) // r), and such a layer rotates at --compressed-rope-max-timescale; an entry
         4 (compressed sparse attention: DeepseekV4CSACompressor and DeepseekV4Indexer) pools
         2h-wide projections in csa_overlap_pooling's overlapping windows (block c: the first
         half of block c - 1's tokens, a prior of weight 0 for block 0, and its own second half),
         and the indexer (its own such blocks, rotated at c * 4; its query from the query latent,
         rotated; relu scores weighted per head) picks each query's --indexer-topk complete
         blocks (jax.lax.top_k: ties to the lower index), the only blocks that join the softmax
         (--perturb-topk: an ablation that picks the next block instead of the last pick); and
         RoutedAndSharedMoE (routed_score_func
         '': the top-k of the raw gate logits weighted by a softmax over them, moe.py get_topk,
         i.e. --renormalize-top-k; --routed-score-func sqrtsoftplus: the same of the scores
         sqrt(softplus(logit)) as GateLogit computes them; plus the shared experts). --mlp-activations-limit L clips
         the routed experts' SwiGLU (gate <= L, up in [-L, L]; not the shared experts');
         --first-num-hash-layers N routes the first N layers by MaxText's tid2eid table (zeros
         from initialization: expert 0 for every choice, weights a softmax over the chosen
         logits); --routed-bias: the other layers' routers choose the top-k of the scores plus
         moe/gate_bias (GateLogit's bias, deepseek_routing) and weight them by the scores alone,
         and the bias gets no gradient (its AdamW step is that of a zero gradient) unless
         --load-balance-loss-weight w > 0 adds MaxText's load-balance loss of every routed (not
         hash-routed) layer, whose softmax reads score + bias; --routed-bias-update-rate r adds
         r x sign(T k / E - choices of e) to each bias after AdamW. The loss is also computed with
         DeepSeek-V4's interleaved RoPE on head_dim-reordered weights (the same function). Pass
         --eps 1e-6 --sliding-window W --top-k K --renormalize-top-k.
  qwen3_custom  MaxText's Qwen3CustomMoeDecoderLayer: qwen3 attention (qk-norm, d^-0.5 at run
         time) out to attention_output_dim, latent_norm, RoutedMoE at that width
         (--renormalize-top-k), layer_up_projection, one residual.
  moe    llama attention (no run-time query scale) with a Mixtral MoE block: softmax router over experts, top-k experts
         per token weighted by their (unrenormalized) softmax probabilities, SwiGLU experts;
         with --capacity-factor > 0 each expert takes at most ceil(tokens*k/E*factor) token
         choices, first come first served in (token, choice) order, the rest are dropped;
         otherwise (dropless) every choice counts. The output is computed densely (every
         expert on every token, then the chosen ones picked), independent of tpusim's grouping.

Hyperparameters that the tensors do not carry come from the command line (defaults: the tiny
presets and configs/base.yml).

Run (only Debian's /usr/bin/python3 sees python3-torch):
  build/sim/tpusim train model_name=tiny-llama compile_topology=v5e-1 per_device_batch_size=2 \
      max_target_length=16 steps=1 --dump /tmp/dump --quiet
  /usr/bin/python3 tests/reference/torch_reference.py /tmp/dump
or everything at once: bash tests/reference/run_torch_reference.sh [path/to/tpusim].
"""

import argparse
import json
import math
import os
import re
import struct
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
torch.set_default_dtype(torch.float64)

TOLERANCE = 1e-5
# A parameter whose reference gradient is below this fraction of the global gradient norm gets no
# gradient in exact arithmetic (deepseek4's first hyper-connection: its k input streams are copies
# of the embedding, so its pre mapping only scales what the block's pre-norm normalizes and its
# Sinkhorn matrix mixes equal streams with columns summing to 1): both sides hold rounding noise
# (measured 3e-13 in torch fp64, 2e-8 in tpusim's fp32, against a norm of 3), so its gradient and
# moments are compared relative to the global norm of their kind instead of their own.
ZERO_BY_CONSTRUCTION = 1e-9
# The moments' second half, nu = b2 nu + (1 - b2) g^2: twice the gradients' relative error.
NU_TOLERANCE = 2 * TOLERANCE
NAME = re.compile(r"^(?P<base>.+)#(?P<layer>\d+)$")


# ------------------------------------------------------------------------------------------------
# I/O
# ------------------------------------------------------------------------------------------------


def read_safetensors(path):
    """{name: float64 numpy array} of an F32 safetensors file."""
    with open(path, "rb") as stream:
        blob = stream.read()
    (header_size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + header_size])
    data = blob[8 + header_size :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError(f"{path}: {name} has dtype {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]
        values = np.frombuffer(data[begin:end], dtype="<f4").astype(np.float64)
        tensors[name] = values.reshape(info["shape"])
    return tensors


def split_name(name):
    """'layer/attention/query#1' -> ('layer/attention/query', 1)."""
    match = NAME.match(name)
    if not match:
        raise ValueError(f"unexpected tensor name {name!r} (expected '<region>/<tensor>#<layer>')")
    return match.group("base"), int(match.group("layer"))


# ------------------------------------------------------------------------------------------------
# The model, written from its definition (torch 1.13 has no F.rms_norm nor
# F.scaled_dot_product_attention).
# ------------------------------------------------------------------------------------------------


def rms_norm(x, scale, eps):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * scale


def layer_norm(x, scale, bias, eps):
    mean = x.mean(dim=-1, keepdim=True)
    centered = x - mean
    variance = (centered * centered).mean(dim=-1, keepdim=True)
    return centered * torch.rsqrt(variance + eps) * scale + bias


def rope(x, max_timescale, min_timescale=1.0, inverse=False, stride=1):
    """Rotary embedding of x[batch, length, heads, d], pairs (i, i + d/2), index p at position
    p * stride (DeepSeek-V4's compressed blocks: their first token's); inverse rotates by -angle
    (DeepSeek-V4 undoes the values' rotation on the attention output)."""
    length, d = x.shape[1], x.shape[-1]
    half = d // 2
    fraction = 2.0 * torch.arange(half, dtype=torch.float64) / d
    timescale = min_timescale * (max_timescale / min_timescale) ** fraction
    positions = torch.arange(length, dtype=torch.float64) * stride
    angle = positions[:, None] / timescale[None, :]
    if inverse:
        angle = -angle
    cos = torch.cos(angle)[None, :, None, :]
    sin = torch.sin(angle)[None, :, None, :]
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def soft_cap(x, cap):
    """Gemma 2's logit soft-capping as MaxText applies it: cap * tanh(x / cap); cap 0 = off."""
    return cap * torch.tanh(x / cap) if cap > 0 else x


def causal_attention(q, k, v, scale, cap=0.0):
    """q[b, l, H, d], k/v[b, l, K, d]; query head h reads kv head h // (H / K); logits scale * q.k.

    MaxText's default Attention multiplies q.k by nothing (scale 1): it folds 1/sqrt(d) into the
    query kernel's initializer instead. GPT-3's attention divides the query by sqrt(d) at run time.
    With cap > 0 (attn_logits_soft_cap) the scaled logits are soft-capped before the causal mask.
    """
    heads, kv_heads = q.shape[2], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} kv heads")
    group = heads // kv_heads
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    scores = soft_cap(torch.einsum("bqhd,bkhd->bhqk", q, k) * scale, cap)
    length = q.shape[1]
    allowed = torch.ones(length, length, dtype=torch.bool).tril()
    scores = scores.masked_fill(~allowed, float("-inf"))
    probabilities = torch.softmax(scores, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", probabilities, v)


def rope_interleaved(x, max_timescale, inverse=False, stride=1):
    """RoPE on pairs (2i, 2i + 1) (DeepSeek-V4's published layout), angles as rope(); inverse
    rotates by -angle."""
    length, d = x.shape[1], x.shape[-1]
    fraction = 2.0 * torch.arange(d // 2, dtype=torch.float64) / d
    positions = torch.arange(length, dtype=torch.float64) * stride
    angle = positions[:, None] / max_timescale**fraction[None, :]
    if inverse:
        angle = -angle
    cos = torch.cos(angle)[None, :, None, :]
    sin = torch.sin(angle)[None, :, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)


def window_attention_with_sinks(q, kv, sinks, window):
    """MaxText's local sliding attention with DeepSeek-V4's sinks (attention_compressed.py,
    CompressedAttention with compress_ratio 0): q[b, l, H, d] (already scaled by d^-0.5),
    kv[b, l, 1, d] as both key and value; query i sees keys j with j <= i and i - j < window; the
    per-head sink logit joins the softmax with a zero value."""
    heads = q.shape[2]
    kv = kv.expand(-1, -1, heads, -1)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, kv)
    length = q.shape[1]
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    allowed = (j <= i) & (i - j < window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    sink = sinks[None, :, None, None].expand(scores.shape[0], -1, length, 1)
    probabilities = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", probabilities, kv)


def sinkhorn(t, iterations, eps=1e-6):
    """MaxText mhc.py `sinkhorn` over the last two dims: a softmax over each row plus eps, the
    columns divided by their sums plus eps, then `iterations` times the rows and the columns each
    divided by their sums (floored at 1e-12)."""
    t = torch.softmax(t, dim=-1) + eps
    t = t / (t.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iterations):
        t = t / torch.clamp(t.sum(dim=-1, keepdim=True), min=1e-12)
        t = t / torch.clamp(t.sum(dim=-2, keepdim=True), min=1e-12)
    return t


def hca_blocks(x, kv_proj, gate_proj, position_bias, norm_scale, eps, ratio, turn, theta):
    """DeepseekV4HCACompressor (attention_compressed.py, MaxText 00a1eaaa): x[b, l, e] ->
    [b, l // ratio, 1, d] blocks: kv and gate projections, cut into windows of `ratio` tokens,
    softmax over each window's tokens of gate + position_bias[ratio, d] (per feature), the
    weighted sum of kv, kv_norm (RMSNorm with scale), RoPE at position c * ratio."""
    batch, length, _ = x.shape
    windows = length // ratio
    kv = (x @ kv_proj)[:, :windows * ratio].reshape(batch, windows, ratio, -1)
    gate = (x @ gate_proj)[:, :windows * ratio].reshape(batch, windows, ratio, -1)
    weights = torch.softmax(gate + position_bias, dim=2)
    pooled = rms_norm((kv * weights).sum(dim=2), norm_scale, eps)[:, :, None, :]
    return turn(pooled, theta, stride=ratio)


def csa_overlap_blocks(x, kv_proj, gate_proj, position_bias, norm_scale, eps, ratio, turn, theta):
    """DeepseekV4CSACompressor / the indexer's pooling (attention_compressed.py at 00a1eaaa,
    csa_overlap_pooling without a cache): x[b, l, e] -> [b, l // ratio, 1, d] blocks. kv and gate
    are 2d wide; position_bias[ratio, 2d] joins the gate before the split; each window's first
    half moves to the next window (window 0 gets zeros with gate -inf), is concatenated with the
    window's own second half along the tokens (2 ratio entries), softmax over them per feature,
    the weighted sum of kv, kv_norm, RoPE at position c * ratio."""
    batch, length, _ = x.shape
    windows = length // ratio
    kv = (x @ kv_proj)[:, :windows * ratio].reshape(batch, windows, ratio, -1)
    gate = (x @ gate_proj)[:, :windows * ratio].reshape(batch, windows, ratio, -1) + position_bias
    first_kv, second_kv = kv.chunk(2, dim=-1)
    first_gate, second_gate = gate.chunk(2, dim=-1)
    prior_kv = torch.zeros_like(first_kv[:, :1])
    prior_gate = torch.full_like(first_gate[:, :1], float("-inf"))
    shifted_kv = torch.cat([prior_kv, first_kv[:, :-1]], dim=1)
    shifted_gate = torch.cat([prior_gate, first_gate[:, :-1]], dim=1)
    entries_kv = torch.cat([shifted_kv, second_kv], dim=2)
    weights = torch.softmax(torch.cat([shifted_gate, second_gate], dim=2), dim=2)
    pooled = rms_norm((entries_kv * weights).sum(dim=2), norm_scale, eps)[:, :, None, :]
    return turn(pooled, theta, stride=ratio)


def indexer_selection(q, blocks, head_weights, ratio, topk, perturb=False):
    """DeepseekV4Indexer's choice (attention_compressed.py at 00a1eaaa): q[b, l, H, d] (rotated),
    blocks[b, n, 1, d], head_weights[b, l, H] (weights_proj of x). Scores relu(q . block) * d^-0.5
    summed over heads weighted by head_weights * H^-0.5; blocks not complete (c >= (i + 1) //
    ratio) at -inf; jax.lax.top_k of min(topk, n) (a stable sort: equal scores keep the lower
    index first); picks of incomplete blocks are -1. Returns the selection [b, l, n] (bool). With
    perturb, each query that keeps fewer than its complete blocks swaps its last pick for the
    next-ranked block (an ablation the check must see)."""
    with torch.no_grad():
        heads, dim = q.shape[2], q.shape[3]
        scores = torch.relu(torch.einsum("blhd,bnd->blhn", q, blocks[:, :, 0, :])) * dim**-0.5
        index = torch.einsum("blhn,blh->bln", scores, head_weights * heads**-0.5)
        length, count = index.shape[1], index.shape[2]
        i = torch.arange(length)[:, None]
        c = torch.arange(count)[None, :]
        future = c >= (i + 1) // ratio
        index = index.masked_fill(future[None], float("-inf"))
        order = torch.sort(index, dim=-1, descending=True, stable=True).indices
        k = min(topk, count)
        picks = order[..., :k].clone()
        if perturb and k < count:
            complete = ((torch.arange(length) + 1) // ratio).clamp(max=count)
            swap = (complete > k)[None, :].expand(picks.shape[0], -1)
            picks[..., -1] = torch.where(swap, order[..., k], picks[..., -1])
        selection = torch.zeros(index.shape, dtype=torch.bool)
        selection.scatter_(-1, picks, True)
        return selection & ~future[None]


def window_and_blocks_attention(q, kv, blocks, sinks, window, ratio, selection=None):
    """One softmax over the window's keys, the visible compressed blocks and the sink (MaxText's
    attention_op given compressed_kv and its causal block mask): q[b, l, H, d] (scaled),
    kv[b, l, 1, d] and blocks[b, n, 1, d] each as key and value; key j visible iff j <= i and
    i - j < window, block c iff c < (i + 1) // ratio (and, with CSA's selection [b, l, n], iff
    the query picked it)."""
    heads, length = q.shape[2], q.shape[1]
    keys = torch.cat([kv, blocks], dim=1).expand(-1, -1, heads, -1)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, keys)
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    c = torch.arange(blocks.shape[1])[None, :]
    allowed = torch.cat([(j <= i) & (i - j < window), c < (i + 1) // ratio], dim=1)[None]
    if selection is not None:
        window_part = torch.ones(q.shape[0], length, length, dtype=torch.bool)
        allowed = allowed & torch.cat([window_part, selection], dim=2)
    allowed = allowed[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    sink = sinks[None, :, None, None].expand(scores.shape[0], -1, length, 1)
    probabilities = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", probabilities, keys)


def silu(x):
    return x * torch.sigmoid(x)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def swiglu(x, wi_0, wi_1, wo):
    return (silu(x @ wi_0) * (x @ wi_1)) @ wo


class Reference:
    def __init__(self, params, family, args):
        self.p = params  # name -> leaf tensor (requires_grad)
        self.family = family
        self.args = args
        regions = sorted({split_name(n)[0].split("/")[0] for n in params} - {"embed", "head"})

        def count(region):
            return 1 + max(split_name(n)[1] for n in params if n.startswith(region + "/"))

        # Decoder layer i's tensors: (region, index) in self.slots[i]. One region holds every
        # layer; deepseek4 with hash layers stores its first --first-num-hash-layers layers in a
        # region of their own (the one named *hash*), the others after them.
        hashed = [r for r in regions if "hash" in r]
        ratios = getattr(args, "compress_ratios", "")  # hf_reference.py's args have none
        self.compress_ratios = [int(v) for v in ratios.split(",")] if ratios else []
        if family == "deepseek4" and self.compress_ratios:
            self.slots = self.compressed_slots(regions, args.first_num_hash_layers)
        elif len(regions) == 1:
            self.slots = [(regions[0], i) for i in range(count(regions[0]))]
        elif family == "deepseek4" and len(regions) == 2 and len(hashed) == 1:
            other = next(r for r in regions if r != hashed[0])
            if count(hashed[0]) != args.first_num_hash_layers:
                raise ValueError(f"{count(hashed[0])} hash-routed layers in the dump, "
                                 f"--first-num-hash-layers {args.first_num_hash_layers}")
            self.slots = ([(hashed[0], i) for i in range(count(hashed[0]))] +
                          [(other, i) for i in range(count(other))])
        else:
            raise ValueError(f"expected one decoder region, found {regions}")
        self.region = "decoder"  # names below say decoder/...; w() maps them through slots
        self.layers = len(self.slots)
        if not self.compress_ratios:
            self.compress_ratios = [0] * self.layers
        swap = getattr(args, "swap_layers", "")  # ablation: compute two layers in swapped order
        if swap:
            i, j = (int(v) for v in swap.split(","))
            self.slots[i], self.slots[j] = self.slots[j], self.slots[i]
            self.compress_ratios[i], self.compress_ratios[j] = \
                self.compress_ratios[j], self.compress_ratios[i]
        self.interleaved = False  # deepseek4: the equivalent model with interleaved RoPE
        self.dropped = []  # per MoE layer: number of dropped token choices
        self.loads = []  # per MoE layer: token choices per expert / the balanced T*k/E
        self.clipped = []  # per MoE layer with a SwiGLU clip: shares of gate and up entries cut
        self.bias_changed = []  # per biased MoE layer: tokens whose experts the bias changed
        self.balance_losses = []  # per MoE layer with a load-balance loss: its value (torch)
        self.bias_counts = {}  # stored bias name -> choices per expert over the whole batch
        self.mhc_matrices = []  # per hyper-connection: its Sinkhorn matrices [b, s, k, k]
        self.selected = []  # per CSA layer: the mean number of blocks a query's indexer picks

    def compressed_slots(self, regions, hash_layers):
        """deepseek4 by --compress-ratios: train keeps MaxText's layer order, each run of
        consecutive layers of one kind (window_, csa_, hca<r>_, with hash_ for the first
        `hash_layers`) in a region of its own (model/builder/layer_plan.h, LayerOrder::kMaxText),
        named <kind>moe_layer, or <kind>moe_layer_<run> when the kind has several runs; layer i is
        the next of its run's region."""
        kinds = []
        for layer, ratio in enumerate(self.compress_ratios):
            if 0 < ratio < 4:
                raise ValueError(f"--compress-ratios: {ratio} (no compressor) is not written here")
            kinds.append(("window_" if ratio == 0 else "csa_" if ratio == 4 else f"hca{ratio}_") +
                         ("hash_" if layer < hash_layers else ""))
        runs = []  # [kind, first layer] of each run of consecutive layers of one kind
        for layer, kind in enumerate(kinds):
            if not runs or runs[-1][0] != kind:
                runs.append([kind, layer])
        runs_of = {kind: sum(1 for k, _ in runs if k == kind) for kind, _ in runs}
        slots, seen = [], {}
        for kind, first in runs:
            suffix = f"_{seen.get(kind, 0)}" if runs_of[kind] > 1 else ""
            seen[kind] = seen.get(kind, 0) + 1
            names = (kind + "moe_layer" + suffix, kind + "layer" + suffix)
            matches = [r for r in regions if r in names]
            if len(matches) != 1:
                raise ValueError(f"layer {first}: no single dump region of {names}: {regions}")
            end = next((i for i in range(first, len(kinds)) if kinds[i] != kind), len(kinds))
            length = end - first
            slots += [(matches[0], index) for index in range(length)]
        used = {region for region, _ in slots}
        if used != set(regions):
            raise ValueError(f"dump regions {sorted(set(regions) - used)} are no layer's "
                             f"of --compress-ratios {self.compress_ratios}")
        return slots

    def stored(self, name, layer=0):
        """The dump's name of `name` in decoder layer `layer` (other names: as given)."""
        if name.startswith(self.region + "/"):
            region, index = self.slots[layer]
            return f"{region}/{name[len(self.region) + 1:]}#{index}"
        return f"{name}#{layer}"

    def w(self, name, layer=0):
        return self.p[self.stored(name, layer)]

    def has(self, name, layer=0):
        return self.stored(name, layer) in self.p

    def norm(self, x, name, layer=0):
        eps = self.args.eps
        if self.family == "gpt3":
            return layer_norm(x, self.w(name + "/scale", layer), self.w(name + "/bias", layer), eps)
        return rms_norm(x, self.w(name + "/scale", layer), eps)

    def attention(self, x, layer):
        r = self.region
        if self.family == "deepseek4":
            return self.compressed_attention(x, layer, self.interleaved)
        q = torch.einsum("ble,ehd->blhd", x, self.w(f"{r}/attention/query", layer))
        k = torch.einsum("ble,ekd->blkd", x, self.w(f"{r}/attention/key", layer))
        v = torch.einsum("ble,ekd->blkd", x, self.w(f"{r}/attention/value", layer))
        qk_norm = self.has(f"{r}/attention/query_norm/scale", layer)
        if qk_norm:
            # MaxText's use_qk_norm (qwen3): each head's query and key RMS-normalized over head_dim
            # with their own [head_dim] scales, before RoPE; values untouched.
            q = rms_norm(q, self.w(f"{r}/attention/query_norm/scale", layer), self.args.eps)
            k = rms_norm(k, self.w(f"{r}/attention/key_norm/scale", layer), self.args.eps)
        if self.family != "gpt3":
            q = rope(q, self.args.rope_max_timescale)
            k = rope(k, self.args.rope_max_timescale)
        # Where MaxText scales the logits: GPT-3 at run time (query / sqrt(d)), qk-norm at run time
        # (query_pre_attn_scalar = d^-0.5), the others not at all (folded into the query init).
        runtime = self.family in ("gpt3", "qwen3_custom") or qk_norm
        scale = 1.0 / math.sqrt(q.shape[-1]) if runtime else 1.0
        context = causal_attention(q, k, v, scale, self.args.attn_logits_soft_cap)
        return torch.einsum("blhd,hde->ble", context, self.w(f"{r}/attention/out", layer))

    def compressed_attention(self, x, layer, interleaved=False):
        """DeepSeek-V4's CompressedAttention at compress_ratio 0 (attention_compressed.py): the
        low-rank query wq_a -> RMSNorm (q_norm) -> wq_b -> unweighted RMSNorm over head_dim ->
        RoPE -> times head_dim^-0.5; one projection wkv as key and value -> RMSNorm (kv_norm) ->
        RoPE; sliding-window attention with sinks; the output's rotation undone; the grouped
        output projection o_a_proj (block-diagonal over o_groups) then o_b_proj. A layer with
        compress ratio r > 4 (DeepseekV4HCACompressor) adds its pooled blocks to the keys and
        values of the window's softmax; any r > 0 rotates at compressed_rope_max_timescale."""
        r, eps, theta = self.region, self.args.eps, self.args.rope_max_timescale
        ratio = self.compress_ratios[layer]
        if ratio > 0:
            theta = self.args.compressed_rope_max_timescale
        turn = rope_interleaved if interleaved else rope
        w = self.permuted if interleaved else self.w
        latent = rms_norm(x @ w(f"{r}/attention/wq_a", layer),
                          w(f"{r}/attention/q_norm/scale", layer), eps)
        q = torch.einsum("blr,rhd->blhd", latent, w(f"{r}/attention/wq_b", layer))
        q = q * torch.rsqrt((q * q).mean(dim=-1, keepdim=True) + eps)  # with_scale=False
        head_dim = q.shape[-1]
        q = turn(q, theta) * head_dim**-0.5
        kv = torch.einsum("ble,ekd->blkd", x, w(f"{r}/attention/wkv", layer))
        kv = turn(rms_norm(kv, w(f"{r}/attention/kv_norm/scale", layer), eps), theta)
        if ratio == 4:
            blocks = csa_overlap_blocks(x, w(f"{r}/compressor/kv_proj", layer),
                                        w(f"{r}/compressor/gate_proj", layer),
                                        w(f"{r}/compressor/position_bias", layer),
                                        w(f"{r}/compressor/norm/scale", layer), eps, ratio, turn,
                                        theta)
            selection = self.indexer(x, latent, layer, w, turn, theta)
            context = window_and_blocks_attention(q, kv, blocks, w(f"{r}/attention/sinks", layer),
                                                  self.args.sliding_window, ratio, selection)
        elif ratio > 4:
            blocks = hca_blocks(x, w(f"{r}/compressor/kv_proj", layer),
                                w(f"{r}/compressor/gate_proj", layer),
                                w(f"{r}/compressor/position_bias", layer),
                                w(f"{r}/compressor/norm/scale", layer), eps, ratio, turn, theta)
            context = window_and_blocks_attention(q, kv, blocks, w(f"{r}/attention/sinks", layer),
                                                  self.args.sliding_window, ratio)
        else:
            context = window_attention_with_sinks(q, kv, w(f"{r}/attention/sinks", layer),
                                                  self.args.sliding_window)
        context = (rope_interleaved(context, theta, inverse=True) if interleaved
                   else rope(context, theta, inverse=True))
        batch, length = context.shape[:2]
        o_a = w(f"{r}/attention/o_a_proj", layer)  # [groups, heads*head_dim/groups, o_lora]
        grouped = context.reshape(batch, length, o_a.shape[0], o_a.shape[1])
        latent_out = torch.einsum("blgi,gir->blgr", grouped, o_a)
        return torch.einsum("blgr,gre->ble", latent_out, w(f"{r}/attention/o_b_proj", layer))

    def indexer(self, x, latent, layer, w, turn, theta):
        """DeepseekV4Indexer (MaxText 00a1eaaa) of a CSA layer: its own overlapping blocks at
        indexer_head_dim, its query q_proj(q latent) rotated at the token positions, head weights
        weights_proj(x); the selection of each query's blocks (indexer_selection)."""
        r, eps = self.region, self.args.eps
        blocks = csa_overlap_blocks(x, w(f"{r}/indexer/kv_proj", layer),
                                    w(f"{r}/indexer/gate_proj", layer),
                                    w(f"{r}/indexer/position_bias", layer),
                                    w(f"{r}/indexer/norm/scale", layer), eps, 4, turn, theta)
        q = turn(torch.einsum("blr,rhd->blhd", latent, w(f"{r}/indexer/q_proj", layer)), theta)
        head_weights = x @ w(f"{r}/indexer/weights_proj", layer)
        selection = indexer_selection(q, blocks, head_weights, 4, self.args.indexer_topk,
                                      self.args.perturb_topk)
        self.selected.append(selection.sum(dim=-1).double().mean().item())
        return selection

    def permuted(self, name, layer=0):
        """The weights of the model with interleaved RoPE that computes the same function: head_dim
        reordered (halves -> pairs) in wq_b, wkv, kv_norm and o_a_proj's rows (and in each half of
        CSA's 2h-wide compressor projections; the indexer's own features likewise)."""
        tensor = self.w(name, layer)
        indexer = "/indexer/" in name
        d = self.w(f"{self.region}/{'indexer/q_proj' if indexer else 'attention/wq_b'}",
                   layer).shape[-1]
        order = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], -1).flatten()
        if name.endswith("/weights_proj"):
            return tensor
        if tensor.shape[-1] == 2 * d and name.endswith(("/kv_proj", "/gate_proj",
                                                        "/position_bias")):
            return tensor[..., torch.cat([order, order + d])]
        if name.endswith(("/q_proj", "/norm/scale")) and indexer:
            return tensor[..., order]
        if name.endswith(("/wq_b", "/wkv", "/kv_norm/scale", "/compressor/kv_proj",
                          "/compressor/gate_proj", "/compressor/position_bias",
                          "/compressor/norm/scale")):
            return tensor[..., order]
        if name.endswith("/o_a_proj"):
            groups, per_group, rank = tensor.shape
            heads = per_group // d
            return tensor.reshape(groups, heads, d, rank)[:, :, order].reshape(tensor.shape)
        return tensor

    def mlp(self, x, layer):
        r = self.region
        if self.family == "gpt3":
            return gelu_tanh(x @ self.w(f"{r}/mlp/wi", layer)) @ self.w(f"{r}/mlp/wo", layer)
        if self.has(f"{r}/moe/gate", layer):
            return self.moe(x, layer)
        return swiglu(x, self.w(f"{r}/mlp/wi_0", layer), self.w(f"{r}/mlp/wi_1", layer),
                      self.w(f"{r}/mlp/wo", layer))

    def moe(self, x, layer):
        r = self.region
        batch, length, embed = x.shape
        tokens = x.reshape(batch * length, embed)
        gate = self.w(f"{r}/moe/gate", layer)  # [embed, experts]
        wi_0 = self.w(f"{r}/moe/experts/wi_0", layer)  # [experts, embed, mlp]
        wi_1 = self.w(f"{r}/moe/experts/wi_1", layer)
        wo = self.w(f"{r}/moe/experts/wo", layer)  # [experts, mlp, embed]
        experts = gate.shape[1]
        top_k = self.args.top_k
        scores = tokens @ gate  # MaxText's GateLogit: the logits, then routed_score_func
        if self.args.routed_score_func == "sqrtsoftplus":
            # DeepSeek-V4's score (linears._convert_to_activation_function): sqrt(softplus(x)).
            scores = torch.sqrt(torch.nn.functional.softplus(scores))
        elif self.args.routed_score_func not in ("", "softmax"):
            raise ValueError(f"routed_score_func {self.args.routed_score_func} is not written here")
        probabilities = torch.softmax(scores, dim=-1)  # [T, E]
        # Top-k by probability, descending, ties to the lower expert index (a stable sort).
        order = np.argsort(-probabilities.detach().numpy(), axis=-1, kind="stable")[:, :top_k]
        hashed = layer < self.args.first_num_hash_layers
        biased = self.has(f"{r}/moe/gate_bias", layer)
        if biased != (self.args.routed_bias and not hashed):
            raise ValueError(f"layer {layer}: moe/gate_bias {'present' if biased else 'absent'}, "
                             f"expected with --routed-bias outside the hash-routed layers")
        if biased:
            # MaxText's routed_bias (moe.py GateLogit: the bias added after routed_score_func;
            # deepseek_routing: jax.lax.top_k of the biased scores, ties to the lower index; the
            # weights below read the pre-bias scores).
            biased_scores = (scores + self.w(f"{r}/moe/gate_bias", layer)).detach().numpy()
            unbiased = order
            order = np.argsort(-biased_scores, axis=-1, kind="stable")[:, :top_k]
            self.bias_changed.append(int((np.sort(order, axis=-1) !=
                                          np.sort(unbiased, axis=-1)).any(axis=-1).sum()))
        if hashed:
            # DeepSeek-V4's hash routing (moe.py RoutedMoE.get_topk with is_hash_routing): the
            # experts are the token's row of tid2eid, a [vocab, top_k] table MaxText creates as
            # zeros and never trains, so expert 0 k times; the weights are the chosen gate logits
            # (take_along_axis of the pre-bias logits), then a softmax over them.
            order = np.zeros_like(order)
        chosen = torch.from_numpy(order.copy())
        weights = probabilities.gather(1, chosen)  # [T, k]
        if hashed or biased or self.args.routed_score_func == "sqrtsoftplus":
            # moe.py get_topk for deepseek4: the chosen experts' pre-bias scores, softmaxed.
            weights = torch.softmax(scores.gather(1, chosen), dim=-1)
        if self.args.renormalize_top_k:
            # MaxText's RoutedMoE (moe.py get_topk) outside DeepSeek: a softmax over the top-k
            # logits, i.e. the top-k probabilities renormalized.
            weights = weights / weights.sum(dim=-1, keepdim=True)
        # DeepSeek's deepseek_scale_weights: times routed_scaling_factor.
        weights = weights * self.args.routed_scaling_factor
        # Capacity: token choices in (token, choice) order take an expert's free slots.
        keep = torch.ones_like(weights)
        if self.args.capacity_factor > 0:
            count = batch * length
            capacity = math.ceil(count * top_k / experts * self.args.capacity_factor)
            used = [0] * experts
            for token in range(count):
                for choice in range(top_k):
                    expert = int(order[token, choice])
                    if used[expert] < capacity:
                        used[expert] += 1
                    else:
                        keep[token, choice] = 0.0
        self.dropped.append(int((keep == 0).sum()))
        counts = np.bincount(order.reshape(-1), minlength=experts)
        self.loads.append(counts / (batch * length * top_k / experts))
        if biased:
            self.bias_counts[self.stored(f"{r}/moe/gate_bias", layer)] = counts
        if self.args.load_balance_loss_weight > 0 and not hashed:
            gate_logits = scores + self.w(f"{r}/moe/gate_bias", layer) if biased else scores
            self.balance_losses.append(self.load_balance_loss(gate_logits, order, batch, length))
        # Every expert on every token (tiny sizes), then pick the chosen ones.
        gate_in = torch.einsum("te,xem->xtm", tokens, wi_0)
        up = torch.einsum("te,xem->xtm", tokens, wi_1)
        limit = self.args.mlp_activations_limit
        if limit > 0:
            # DeepSeek(-V4)'s clipped SwiGLU of the routed experts (moe.py apply_ffn_activation):
            # the gate projection at most L, the up projection within [-L, L].
            self.clipped.append(((gate_in > limit).double().mean().item(),
                                 (up.abs() > limit).double().mean().item()))
            gate_in = torch.clamp(gate_in, max=limit)
            up = torch.clamp(up, min=-limit, max=limit)
        hidden = silu(gate_in) * up
        expert_out = torch.einsum("xtm,xme->xte", hidden, wo)  # [E, T, embed]
        token_index = torch.arange(batch * length)[:, None].expand(-1, top_k)
        picked = expert_out[chosen, token_index]  # [T, k, embed]
        combined = (picked * (weights * keep)[..., None]).sum(dim=1)
        if self.has(f"{r}/moe/shared/wi_0", layer):
            # RoutedAndSharedMoE: the shared experts (one SwiGLU of shared_experts x moe_mlp_dim)
            # on every token, added to the routed output.
            combined = combined + swiglu(tokens, self.w(f"{r}/moe/shared/wi_0", layer),
                                         self.w(f"{r}/moe/shared/wi_1", layer),
                                         self.w(f"{r}/moe/shared/wo", layer))
        return combined.reshape(batch, length, embed)

    def load_balance_loss(self, gate_logits, order, batch, length):
        """MaxText's load-balance loss of one MoE layer (moe.py RoutedMoE.permute and
        load_balance_loss, Switch Transformer's): p = softmax over experts of the gate's output
        (the scores plus the bias when there is one); per sequence b, density[b, e] = the mean over
        its tokens of how many of the token's choices are e, density_prob[b, e] = the mean over its
        tokens of p[., e]; the loss is mean over (b, e) of density x density_prob, times E^2 w.
        The means are over whole sequences and the whole batch (the unsharded step's reading)."""
        experts = gate_logits.shape[-1]
        probabilities = torch.softmax(gate_logits, dim=-1).reshape(batch, length, experts)
        chosen = np.zeros((batch * length, experts))
        np.add.at(chosen, (np.arange(batch * length)[:, None], order), 1.0)
        density = torch.from_numpy(chosen.reshape(batch, length, experts).mean(axis=1))
        density_prob = probabilities.mean(dim=1)
        weight = self.args.load_balance_loss_weight
        return (density * density_prob).mean() * experts**2 * weight

    def hyper_connection(self, x, name, layer, block):
        """MaxText mhc.py ManifoldConstrainedHyperConnections.__call__ around `block` (which
        applies its own pre-norm): x[b, s, k, d] k streams; RMSNorm (mhc_norm, with scale) of the
        flattened k.d; pre = sigmoid(pre_alpha_scale (x pre_alpha) + pre_beta) mixes the streams
        into the block's input; post = 2 sigmoid(...) spreads its output over the streams; res =
        sinkhorn(res_alpha_scale (x res_alpha) reshaped [k, k] + res_beta) mixes the streams:
        out[m] = sum_k res[k, m] x[k] + post[m] block_out."""
        if self.args.ignore_mhc:
            # The ablation: the mHC-off layer (x + block(x)) on the streams' mean, copied back into
            # every stream (the head's sum then only scales what its RMSNorm normalizes).
            mean = x.mean(dim=2)
            return (mean + block(mean))[:, :, None, :].repeat(1, 1, x.shape[2], 1)
        prefix = f"{self.region}/{name}"
        b, s, k, d = x.shape
        norm_x = rms_norm(x.reshape(b, s, k * d), self.w(f"{prefix}/norm/scale", layer),
                          self.args.eps)

        def mapping(kind, scale):
            h = norm_x @ self.w(f"{prefix}/{kind}_alpha", layer)
            intermediate = (self.w(f"{prefix}/{kind}_alpha_scale", layer) * h +
                            self.w(f"{prefix}/{kind}_beta", layer))
            return scale * torch.sigmoid(intermediate)

        layer_input = torch.einsum("bskd,bsk->bsd", x, mapping("pre", 1.0))
        post_out = torch.einsum("bsd,bsk->bskd", block(layer_input), mapping("post", 2.0))
        h_res = (norm_x @ self.w(f"{prefix}/res_alpha", layer)).reshape(b, s, k, k)
        res = sinkhorn(self.w(f"{prefix}/res_alpha_scale", layer) * h_res +
                       self.w(f"{prefix}/res_beta", layer), self.args.sinkhorn_iterations)
        self.mhc_matrices.append(res.detach())
        return torch.einsum("bskd,bskm->bsmd", x, res) + post_out

    def deepseek4_layer(self, x, layer):
        """DeepSeekGenericLayer with mHC (deepseek.py, deepseek4.py): the attention and the MoE,
        each behind its pre-norm inside a hyper-connection."""
        r = self.region
        x = self.hyper_connection(
            x, "mhc_attention", layer,
            lambda y: self.attention(self.norm(y, f"{r}/pre_attention_norm", layer), layer))
        return self.hyper_connection(
            x, "mhc_mlp", layer,
            lambda y: self.mlp(self.norm(y, f"{r}/pre_mlp_norm", layer), layer))

    def latent_moe_layer(self, x, layer):
        """MaxText's Qwen3CustomMoeDecoderLayer (models/qwen3_custom.py): the input RMSNorm, Qwen3
        attention (qk-norm, query_pre_attn_scalar head_dim^-0.5) whose out projection ends at
        attention_output_dim, latent_norm, RoutedMoE at that width, layer_up_projection to
        emb_dim; the caller adds the one residual."""
        r = self.region
        latent = self.attention(self.norm(x, f"{r}/pre_attention_norm", layer), layer)
        latent = self.norm(latent, f"{r}/latent_norm", layer)
        return self.moe(latent, layer) @ self.w(f"{r}/layer_up_projection", layer)

    def logits(self, tokens):
        batch, length = tokens.shape
        self.balance_losses = []
        x = self.w("embed/token_embedding")[tokens]
        if self.family == "gpt3":
            x = x + self.w("embed/position_embedding")[torch.arange(length)][None]
        self.mhc_matrices = []
        streams = getattr(self.args, "mhc_expansion_rate", 1)  # other scripts pass no such key
        if streams > 1:
            # MaxText mhc.py get_functions: expand copies the embedding into the streams.
            x = x[:, :, None, :].repeat(1, 1, streams, 1)
        for layer in range(self.layers):
            if streams > 1:
                x = self.deepseek4_layer(x, layer)
                continue
            if self.family == "qwen3_custom":
                x = x + self.latent_moe_layer(x, layer)
                continue
            x = x + self.attention(self.norm(x, f"{self.region}/pre_attention_norm", layer), layer)
            x = x + self.mlp(self.norm(x, f"{self.region}/pre_mlp_norm", layer), layer)
        if streams > 1:
            x = x.sum(dim=2)  # get_functions: reduce sums the streams
        x = self.norm(x, "head/final_norm")
        if "head/unembedding#0" in self.p:
            logits = x @ self.w("head/unembedding")
        else:  # tied to the token embedding
            logits = x @ self.w("embed/token_embedding").T
            # MaxText's tied output head: divided by sqrt(emb_dim), then soft-capped.
            if self.args.normalize_embedding_logits:
                logits = logits / math.sqrt(x.shape[-1])
            logits = soft_cap(logits, self.args.final_logits_soft_cap)
        return logits

    def loss(self, tokens, targets):
        log_probabilities = torch.log_softmax(self.logits(tokens), dim=-1)
        picked = log_probabilities.gather(-1, targets[..., None])[..., 0]
        loss = -picked.mean()
        if self.balance_losses:
            # MaxText's loss_fn (trainers/pre_train/train.py): plus the mean over the MoE layers
            # that computed one (the hash-routed layers compute none) of their load-balance losses.
            loss = loss + torch.stack(self.balance_losses).mean()
        return loss


def detect_family(names):
    bases = {split_name(n)[0] for n in names}
    if any(b.endswith("/attention/wq_a") for b in bases):
        return "deepseek4"
    if any(b.endswith("/layer_up_projection") for b in bases):
        return "qwen3_custom"
    if any(b.endswith("/moe/gate") for b in bases):
        return "moe"
    if "embed/position_embedding" in bases or "head/final_norm/bias" in bases:
        return "gpt3"
    return "llama"


# ------------------------------------------------------------------------------------------------
# Comparison
# ------------------------------------------------------------------------------------------------


class Report:
    def __init__(self):
        self.failures = 0
        self.worst = {}

    def check(self, kind, name, actual, expected, tolerance=TOLERANCE, zero_scale=None):
        """zero_scale: for a tensor that is zero by construction (see ZERO_BY_CONSTRUCTION), the
        norm its error is relative to (the global one of its kind) instead of its own."""
        actual = np.asarray(actual, dtype=np.float64)
        expected = np.asarray(expected, dtype=np.float64)
        if actual.shape != expected.shape:
            print(f"FAIL {kind:9s} {name}: shape {actual.shape} vs reference {expected.shape}")
            self.failures += 1
            return
        norm = np.linalg.norm(expected)
        difference = np.linalg.norm(actual - expected)
        if zero_scale is not None:
            name = f"{name} (zero; rel. to all)"
            norm = zero_scale
        error = difference / norm if norm > 0 else difference
        ok = error <= tolerance if tolerance is not None else True
        status = "ok  " if ok else "FAIL"
        if tolerance is None:
            status = "info"
        limit = f"{tolerance:.0e}" if tolerance is not None else "  -  "
        print(f"{status} {kind:9s} {name:44s} rel_l2 {error:.3e}  (tol {limit}, |ref| {norm:.3e})")
        if not ok:
            self.failures += 1
        if tolerance is not None and error >= self.worst.get(kind, (-1.0, ""))[0]:
            self.worst[kind] = (error, name)


def adam_step_bound(step_count, b1, b2):
    """The largest |m_hat / sqrt(v_hat)| AdamW can reach at step t from zero moments, whatever
    the gradients: m_t = (1 - b1) sum_i b1^(t-i) g_i and v_t = (1 - b2) sum_i b2^(t-i) g_i^2, so by
    Cauchy-Schwarz |m_t| <= (1 - b1) sqrt(v_t / (1 - b2)) sqrt(sum_j (b1^2 / b2)^j), times the
    bias corrections sqrt(1 - b2^t) / (1 - b1^t). 1 at step 1, 1.0004 at step 2 (b1 0.9, b2
    0.95)."""
    ratio = b1 * b1 / b2
    spread = math.sqrt(sum(ratio**j for j in range(step_count)))
    return ((1 - b1) / math.sqrt(1 - b2) * spread *
            math.sqrt(1 - b2**step_count) / (1 - b1**step_count))


def check_noise_step(report, name, actual, expected, learning_rate, step_count, args):
    """A parameter whose gradient is zero by construction: its updated value within AdamW's
    largest step (adam_step_bound x lr per element) plus fp32 rounding of the value."""
    actual = np.asarray(actual, dtype=np.float64)
    worst = float(np.abs(actual - expected).max()) if actual.shape == expected.shape else math.inf
    bound = (learning_rate * adam_step_bound(step_count, args.b1, args.b2) +
             4 * np.finfo(np.float32).eps * float(np.abs(expected).max()))
    ok = worst <= bound
    print(f"{'ok  ' if ok else 'FAIL'} updated   {name + ' (zero: max abs)':44s} "
          f"{worst:.3e}  (bound {bound:.3e}: AdamW's largest step on noise)")
    if not ok:
        report.failures += 1


def check_step(dump, initial, initial_moments, args, report):
    """Checks the step of `dump` (step.json, gradients, updated) from the parameters `initial`
    and Adam moments `initial_moments` (name -> array); returns the reference's fp64 parameters
    and moments after the step."""
    with open(os.path.join(dump, "step.json")) as stream:
        step = json.load(stream)
    with open(os.path.join(dump, "initial", "state.json")) as stream:
        step_count = int(json.load(stream)["step"]) + 1
    gradients = read_safetensors(os.path.join(dump, "gradients", "model.safetensors"))
    updated = read_safetensors(os.path.join(dump, "updated", "model.safetensors"))
    updated_moments = read_safetensors(os.path.join(dump, "updated", "optimizer.safetensors"))

    family = detect_family(initial)
    sequences, length = int(step["sequences"]), int(step["length"])
    tokens = torch.tensor(step["tokens"], dtype=torch.int64).reshape(sequences, length)
    targets = torch.tensor(step["targets"], dtype=torch.int64).reshape(sequences, length)
    print(f"# {dump}: family {family}, {len(initial)} tensors, batch {sequences}x{length}, "
          f"step {step_count}")

    params = {n: torch.tensor(v, requires_grad=True) for n, v in initial.items()}
    model = Reference(params, family, args)

    # Forward and backward.
    loss = model.loss(tokens, targets)
    balance = [value.item() for value in model.balance_losses]
    if family == "deepseek4":
        # The same model with DeepSeek-V4's interleaved RoPE layout and head_dim reordered in the
        # weights computes the same loss: the layout does not change what trains.
        routing = (list(model.dropped), list(model.loads), list(model.clipped),
                   list(model.bias_changed))
        model.interleaved = True
        with torch.no_grad():
            other = model.loss(tokens, targets)
        model.interleaved = False
        model.dropped, model.loads, model.clipped, model.bias_changed = routing
        report.check("layout", "loss with interleaved RoPE", other.item(), loss.item(), 1e-12)
    names = sorted(params)
    grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
    # Parameters with no path to the loss (deepseek4's CSA indexer: its scores end in top-k
    # indices) have a zero gradient; tpusim's dump may leave them out.
    unreached = {n for n, g in zip(names, grads) if g is None}
    grads = {n: (g if g is not None else torch.zeros_like(params[n])).detach().numpy()
             for n, g in zip(names, grads)}
    if model.dropped:
        print(f"# MoE token choices dropped per layer: {model.dropped}")
        for layer, load in enumerate(model.loads):
            shares = " ".join(f"{share:.2f}" for share in load)
            print(f"# MoE layer {layer}: token choices per expert / balanced share: {shares}")
    for layer, picked in enumerate(model.selected[:len(model.selected) // 2 or None]):
        print(f"# CSA layer {layer}: blocks the indexer picks per query, mean {picked:.2f} "
              f"(indexer_topk {args.indexer_topk})")
    for layer, (gate_share, up_share) in enumerate(model.clipped):
        print(f"# MoE layer {layer}: SwiGLU entries clipped (all experts x tokens): gate "
              f"{gate_share:.1%}, up {up_share:.1%}")
    for layer, changed in enumerate(model.bias_changed):
        print(f"# MoE layer with routed_bias {layer}: the bias changed the experts of {changed} "
              f"of {sequences * length} tokens")
    if args.load_balance_loss_weight > 0:
        if not balance:
            print("FAIL routing   --load-balance-loss-weight given for a model without a routed "
                  "MoE layer (nothing checked)")
            report.failures += 1
        values = " ".join(f"{value:.6e}" for value in balance)
        print(f"# load-balance loss per routed MoE layer: {values} (their mean is in the loss)")
    if model.mhc_matrices:
        # How far from a permutation (and from uniform) the residual matrices are: a check of
        # Sinkhorn on matrices near 1/k everywhere would see little of it.
        matrices = torch.stack(model.mhc_matrices)
        rows = (matrices.sum(-1) - 1).abs().max().item()
        columns = (matrices.sum(-2) - 1).abs().max().item()
        spread = (matrices - 1.0 / matrices.shape[-1]).abs().max().item()
        print(f"# mHC: {len(model.mhc_matrices)} residual matrices; largest |row sum - 1| "
              f"{rows:.1e}, |column sum - 1| {columns:.1e}; largest |entry - 1/k| {spread:.3f}")
    if args.routed_bias and not any(model.bias_changed):
        print("FAIL routing   --routed-bias: the bias changed no token's experts (nothing checked)")
        report.failures += 1
    if args.expect_expert_load is not None:
        if not model.loads:
            print("FAIL routing   --expect-expert-load given for a model without MoE layers")
            report.failures += 1
        for layer, load in enumerate(model.loads):
            if load.max() < args.expect_expert_load:
                print(f"FAIL routing   layer {layer}: the busiest expert gets {load.max():.2f}x its "
                      f"balanced share, expected >= {args.expect_expert_load}")
                report.failures += 1

    report.check("loss", "loss", step["loss"], loss.item())
    missing = sorted((set(names) ^ set(gradients)) - (unreached - set(gradients)))
    if unreached:
        print(f"# parameters no gradient reaches (zero, absent from the dump when not written): "
              f"{len(unreached)}")
    if missing:
        print(f"FAIL gradients: names differ from the parameters: {missing}")
        report.failures += 1
    # Global norm and clipping (optax clip_by_global_norm).
    grad_norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    zero = {n for n in names if np.linalg.norm(grads[n]) < ZERO_BY_CONSTRUCTION * grad_norm}
    for name in names:
        if name in gradients:
            report.check("gradient", name, gradients[name], grads[name],
                         zero_scale=grad_norm if name in zero else None)

    report.check("grad_norm", "grad_norm", step["grad_norm"], grad_norm)
    scale = 1.0 if args.clip <= 0 or grad_norm <= args.clip else args.clip / grad_norm
    report.check("clip", "gradient_scale", step["gradient_scale"], scale)

    # AdamW (optax adamw: scale_by_adam, add_decayed_weights, scale by -lr).
    learning_rate = float(step["learning_rate"])
    if args.learning_rate is not None:
        report.check("lr", "learning_rate", learning_rate, args.learning_rate)
        learning_rate = args.learning_rate
    after, after_moments = {}, {}
    for name in names:
        base, layer = split_name(name)
        mu_name, nu_name = f"{base}/mu#{layer}", f"{base}/nu#{layer}"
        absent = [f"{where}:{n}" for where, table, keys in (
            ("initial", initial_moments, (mu_name, nu_name)),
            ("updated", updated_moments, (mu_name, nu_name)),
            ("updated", updated, (name,))) for n in keys if n not in table]
        if absent:
            print(f"FAIL adamw     {name}: missing {absent}")
            report.failures += 1
            continue
        g = grads[name] * scale
        mu = args.b1 * initial_moments[mu_name] + (1.0 - args.b1) * g
        nu = args.b2 * initial_moments[nu_name] + (1.0 - args.b2) * g * g
        mu_hat = mu / (1.0 - args.b1**step_count)
        nu_hat = nu / (1.0 - args.b2**step_count)
        update = mu_hat / (np.sqrt(nu_hat + args.adam_eps_root) + args.adam_eps)
        new = initial[name] - learning_rate * (update + args.weight_decay * initial[name])
        if args.routed_bias_update_rate != 0 and name in model.bias_counts:
            # MaxText's routed_bias_update_rate (moe.py calculate_load_balance_updates, added to
            # the bias after the optimizer step by train.py): rate x sign(T k / E - count_e), the
            # counts over the whole batch's choices.
            counts = model.bias_counts[name]
            balanced = counts.sum() / counts.shape[0]
            new = new + args.routed_bias_update_rate * np.sign(balanced - counts)
        zero_mu = zero_nu = None
        if name in zero:  # the moments' global norms: (1 - b1) |g| and (1 - b2) |g|^2
            zero_mu = (1.0 - args.b1) * grad_norm * scale
            zero_nu = (1.0 - args.b2) * (grad_norm * scale) ** 2
        report.check("mu", mu_name, updated_moments[mu_name], mu, zero_scale=zero_mu)
        # nu is a sum of squared gradients: a relative error e in g is 2 e in g^2 (first order),
        # so the gradients' tolerance carries over to nu doubled (a near-cancelling mHC bias
        # gradient, 3e-7 of the global norm, at 4.7e-6 gives its nu 1.01e-5).
        report.check("nu", nu_name, updated_moments[nu_name], nu, NU_TOLERANCE, zero_scale=zero_nu)
        if name in zero:
            # Zero by construction: both sides' gradients are rounding noise, which Adam
            # normalizes into a step of up to adam_step_bound x lr per element (tpusim's fp32
            # noise takes it, the fp64 reference's is far smaller): compared in absolute terms.
            check_noise_step(report, name, updated[name], new, learning_rate, step_count, args)
        else:
            report.check("updated", name, updated[name], new)
        # The step itself, against the reference rounded to fp32 like tpusim's stored result.
        new_fp32 = new.astype(np.float32).astype(np.float64)
        report.check("delta", name, updated[name] - initial[name], new_fp32 - initial[name], None)
        after[name] = new
        after_moments[mu_name], after_moments[nu_name] = mu, nu
    return after, after_moments



def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dump", help="directory written by tpusim train --dump")
    parser.add_argument("--eps", type=float, default=1e-5, help="normalization_layer_epsilon")
    parser.add_argument("--rope-max-timescale", type=float, default=10000.0)
    parser.add_argument("--normalize-embedding-logits", action="store_true",
                        help="divide tied logits by sqrt(embed) (false for GPT-3)")
    parser.add_argument("--attn-logits-soft-cap", type=float, default=0.0,
                        help="attention logits -> cap tanh(logits / cap); 0 = off")
    parser.add_argument("--final-logits-soft-cap", type=float, default=0.0,
                        help="tied logits -> cap tanh(logits / cap) after the normalization")
    parser.add_argument("--top-k", type=int, default=2, help="num_experts_per_tok (MoE)")
    parser.add_argument("--renormalize-top-k", action="store_true",
                        help="MoE: the top-k weights renormalized to sum to 1 (norm_topk_prob)")
    parser.add_argument("--routed-scaling-factor", type=float, default=1.0,
                        help="MoE: the top-k weights times this (routed_scaling_factor)")
    parser.add_argument("--routed-score-func", default="",
                        help="MoE: the gate's score function (routed_score_func): '' or "
                             "sqrtsoftplus (deepseek4)")
    parser.add_argument("--sliding-window", type=int, default=0,
                        help="deepseek4: sliding_window_size")
    parser.add_argument("--compress-ratios", default="",
                        help="deepseek4: compress_ratios, comma-separated (0, 4 or above 4); "
                             "default: every layer 0")
    parser.add_argument("--indexer-topk", type=int, default=16,
                        help="deepseek4: indexer_topk, the blocks a CSA query keeps")
    parser.add_argument("--perturb-topk", action="store_true",
                        help="ablation: each CSA query with more complete blocks than it keeps "
                             "swaps its last pick for the next-ranked block; the check must fail")
    parser.add_argument("--swap-layers", default="",
                        help="ablation: 'i,j' computes decoder layers i and j (each with its own "
                             "parameters and kind) in swapped order; the check must fail")
    parser.add_argument("--compressed-rope-max-timescale", type=float, default=160000.0,
                        help="deepseek4: the RoPE wavelength of layers with a ratio > 0")
    parser.add_argument("--mlp-activations-limit", type=float, default=-1.0,
                        help="deepseek4: the routed experts' SwiGLU clip; <= 0: none")
    parser.add_argument("--routed-bias", action="store_true",
                        help="deepseek4: the routers outside the hash layers add moe/gate_bias to "
                             "the scores to choose the experts (MaxText routed_bias)")
    parser.add_argument("--load-balance-loss-weight", type=float, default=0.0,
                        help="MoE: MaxText's load-balance loss weight w (the routers outside the "
                             "hash layers add it); 0: none")
    parser.add_argument("--routed-bias-update-rate", type=float, default=0.0,
                        help="deepseek4 with --routed-bias: after AdamW each moe/gate_bias moves "
                             "by rate x sign(T k / E - choices of e over the batch); negative: "
                             "the sign flipped (an ablation that must fail)")
    parser.add_argument("--first-num-hash-layers", type=int, default=0,
                        help="deepseek4: the first N MoE layers route by MaxText's tid2eid table")
    parser.add_argument("--mhc-expansion-rate", type=int, default=1,
                        help="deepseek4: mHC's residual streams (mhc_expansion_rate); 1: none")
    parser.add_argument("--sinkhorn-iterations", type=int, default=20,
                        help="deepseek4 with mHC: sinkhorn_iterations (MaxText's default 20)")
    parser.add_argument("--ignore-mhc", action="store_true",
                        help="ablation: read an mHC dump as if mHC were a plain residual on the "
                             "streams' sum (its parameters unused); the check must then fail")
    parser.add_argument("--capacity-factor", type=float, default=-1.0,
                        help="MoE expert capacity factor; <= 0: dropless")
    parser.add_argument("--expect-expert-load", type=float, default=None,
                        help="fail unless, in every MoE layer, some expert gets at least this "
                             "many times its balanced share of token choices (checks that a "
                             "deliberately unbalanced router really is)")
    parser.add_argument("--clip", type=float, default=1.0, help="gradient_clipping_threshold")
    parser.add_argument("--b1", type=float, default=0.9)
    parser.add_argument("--b2", type=float, default=0.95)
    parser.add_argument("--adam-eps", type=float, default=1e-8)
    parser.add_argument("--adam-eps-root", type=float, default=0.0)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--learning-rate", type=float, default=None,
                        help="expected learning rate of the step (default: trust step.json)")
    parser.add_argument("--second-step", metavar="DUMP2", default=None,
                        help="a dump of the run's next step (tpusim resumed after the first): "
                             "its starting state must be the first dump's updated one bit for "
                             "bit, and its step is checked from this script's own fp64 state "
                             "after the first (so the second step sees the reference's updated "
                             "router biases)")
    args = parser.parse_args()

    report = Report()
    initial = read_safetensors(os.path.join(args.dump, "initial", "model.safetensors"))
    moments = read_safetensors(os.path.join(args.dump, "initial", "optimizer.safetensors"))
    state = check_step(args.dump, initial, moments, args, report)
    if args.second_step is not None:
        # tpusim's resume: the second run starts from the first run's checkpoint, bit for bit.
        for part in ("model", "optimizer"):
            saved = read_safetensors(os.path.join(args.dump, "updated", f"{part}.safetensors"))
            resumed = read_safetensors(
                os.path.join(args.second_step, "initial", f"{part}.safetensors"))
            differ = [name for name in sorted(set(saved) | set(resumed))
                      if name not in saved or name not in resumed or
                      not np.array_equal(saved[name], resumed[name])]
            status = "FAIL" if differ else "ok  "
            print(f"{status} resume    {part}: {len(saved)} tensors after the first step, "
                  f"{len(differ)} differ where the second starts {differ[:3]}")
            report.failures += 1 if differ else 0
        print(f"# second step: {args.second_step}, from the reference's own state after the first")
        check_step(args.second_step, state[0], state[1], args, report)

    print("# worst relative L2 error per kind:")
    for kind, (error, name) in report.worst.items():
        print(f"#   {kind:9s} {error:.3e}  {name}")
    if report.failures:
        print(f"# FAILED: {report.failures} comparison(s) above tolerance")
        return 1
    print("# PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
