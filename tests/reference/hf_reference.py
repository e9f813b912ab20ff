"""fp64 PyTorch model read by Hugging Face Transformers' tensor names (Llama/Mistral, Qwen3, GPT-2, Mixtral, Qwen3-MoE).

What it checks
--------------
`tpusim export-hf DUMP/initial HF_DIR` writes the weights tpusim trained from as HF_DIR/model.safetensors
(Transformers' names and layouts) and HF_DIR/config.json. This script builds the model from those
two files alone, as Transformers defines it (it is not packaged for Debian, so the model is
written out here): Llama = RMSNorm, rotate-half RoPE, q.k / sqrt(head_dim) at run time, SwiGLU;
Qwen3 = Llama plus Qwen3Attention's q_norm / k_norm (an RMSNorm over head_dim of each head's
projected query and key, before RoPE, rms_norm_eps); GPT-2 = LayerNorm, learned positions, fused
c_attn (Conv1D, [in, out]) with biases, q.k / sqrt(head_dim), gelu_new, tied lm_head. Then, on the
batch of DUMP/step.json:

  * its loss against tpusim's (step.json "loss"), relative error <= 1e-6;
  * its logits against those of the MaxText-convention reference of torch_reference.py fed
    DUMP/initial (tpusim's names, MaxText's query scaling; --eps and --rope-max-timescale give
    its epsilon and RoPE theta, independently of the exported config.json): max |difference|
    <= 1e-9 (the two differ only by fp64 rounding when the export converted the query scale
    correctly);
  * with --import-dump DIR (a `tpusim train load_parameters_path=HF_DIR --dump DIR` run): the
    weights tpusim loaded equal DUMP/initial's exactly, and its loss equals this model's.

Run: /usr/bin/python3 tests/reference/hf_reference.py HF_DIR DUMP [--import-dump DIR]
"""

import argparse
import json
import math
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as ref  # noqa: E402

torch.set_num_threads(1)
torch.set_default_dtype(torch.float64)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def llama_logits(w, config, tokens):
    """Transformers' LlamaForCausalLM forward (eager attention), x[batch, length]."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim", config["hidden_size"] // heads)
    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    batch, length = tokens.shape

    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    freqs = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]
    mask = torch.full((length, length), float("-inf")).triu(1)
    x = w["model.embed_tokens.weight"][tokens]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(batch, length, heads, head_dim)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(batch, length, kv_heads, head_dim)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(batch, length, kv_heads, head_dim)
        if p + "self_attn.q_norm.weight" in w:  # Qwen3: per-head RMSNorm before RoPE
            q = rms(q, w[p + "self_attn.q_norm.weight"])
            k = rms(k, w[p + "self_attn.k_norm.weight"])
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(heads // kv_heads, dim=1)  # repeat_kv
        v = v.repeat_interleave(heads // kv_heads, dim=1)
        scores = q @ k.transpose(2, 3) / math.sqrt(head_dim) + mask
        context = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, length, -1)
        x = x + context @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        if p + "block_sparse_moe.gate.weight" in w or p + "mlp.gate.weight" in w:
            x = x + moe_block(w, config, p, h)
            continue
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + (gate * torch.sigmoid(gate) * (h @ w[p + "mlp.up_proj.weight"].T)) @ \
            w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if config["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def moe_block(w, config, p, h):
    """Transformers' MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock: a softmax over every
    expert's router logit, the top num_experts_per_tok (renormalized to sum to one always for
    Mixtral, with norm_topk_prob for Qwen3-MoE), each chosen expert's SwiGLU weighted by it."""
    mixtral = p + "block_sparse_moe.gate.weight" in w
    block = p + ("block_sparse_moe." if mixtral else "mlp.")
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    experts = config["num_local_experts" if mixtral else "num_experts"]
    probs = torch.softmax(h @ w[block + "gate.weight"].T, dim=-1)
    weights, chosen = torch.topk(probs, config["num_experts_per_tok"], dim=-1)
    if mixtral or config.get("norm_topk_prob", False):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(h)
    for expert in range(experts):
        e = f"{block}experts.{expert}."
        gate = h @ w[e + names[0] + ".weight"].T
        y = (gate * torch.sigmoid(gate) * (h @ w[e + names[1] + ".weight"].T)) @ \
            w[e + names[2] + ".weight"].T
        weight = (weights * (chosen == expert)).sum(dim=-1, keepdim=True)
        out = out + weight * y
    return out


def gpt2_logits(w, config, tokens):
    """Transformers' GPT2LMHeadModel forward."""
    heads, embed = config["n_head"], config["n_embd"]
    head_dim, eps = embed // heads, config["layer_norm_epsilon"]
    batch, length = tokens.shape

    def ln(x, name):
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).pow(2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + eps) * w[name + ".weight"] + w[name + ".bias"]

    def conv1d(x, name):
        return x @ w[name + ".weight"] + w[name + ".bias"]

    mask = torch.full((length, length), float("-inf")).triu(1)
    x = w["transformer.wte.weight"][tokens] + w["transformer.wpe.weight"][:length][None]
    for layer in range(config["n_layer"]):
        p = f"transformer.h.{layer}."
        q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(embed, dim=-1)
        q, k, v = (t.view(batch, length, heads, head_dim).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(2, 3) / math.sqrt(head_dim) + mask
        context = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, length, embed)
        x = x + conv1d(context, p + "attn.c_proj")
        h = conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc")
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)))
        x = x + conv1d(h, p + "mlp.c_proj")
    x = ln(x, "transformer.ln_f")
    return x @ w["transformer.wte.weight"].T


def tpusim_convention_logits(dump, tokens, eps, rope_max_timescale):
    """Logits of torch_reference.py's MaxText-convention model on DUMP/initial."""
    initial = ref.read_safetensors(os.path.join(dump, "initial", "model.safetensors"))
    params = {n: torch.tensor(v) for n, v in initial.items()}
    family = ref.detect_family(initial)
    args = argparse.Namespace(eps=eps, rope_max_timescale=rope_max_timescale, top_k=2,
                              capacity_factor=-1.0, normalize_embedding_logits=False,
                              attn_logits_soft_cap=0.0, final_logits_soft_cap=0.0)
    return ref.Reference(params, family, args).logits(tokens)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("hf_dir")
    parser.add_argument("dump")
    parser.add_argument("--import-dump", default=None)
    parser.add_argument("--eps", type=float, default=1e-5,
                        help="normalization_layer_epsilon of the MaxText-convention reference")
    parser.add_argument("--rope-max-timescale", type=float, default=10000.0)
    args = parser.parse_args()
    with open(os.path.join(args.hf_dir, "config.json")) as stream:
        config = json.load(stream)
    weights = {n: torch.tensor(v) for n, v in
               ref.read_safetensors(os.path.join(args.hf_dir, "model.safetensors")).items()}
    with open(os.path.join(args.dump, "step.json")) as stream:
        step = json.load(stream)
    shape = (int(step["sequences"]), int(step["length"]))
    tokens = torch.tensor(step["tokens"], dtype=torch.int64).reshape(shape)
    targets = torch.tensor(step["targets"], dtype=torch.int64).reshape(shape)
    forward = gpt2_logits if config["model_type"] == "gpt2" else llama_logits
    logits = forward(weights, config, tokens)
    loss = -torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).mean().item()
    failures = 0

    def check(what, error, tolerance):
        nonlocal failures
        ok = error <= tolerance
        failures += 0 if ok else 1
        print(f"{'ok  ' if ok else 'FAIL'} {what:58s} {error:.3e}  (tol {tolerance:.0e})")

    print(f"# {args.hf_dir}: {config['architectures'][0]}, {len(weights)} tensors, "
          f"batch {shape[0]}x{shape[1]}")
    check("loss by HF names vs tpusim's (relative)", abs(loss - step["loss"]) / abs(loss), 1e-6)
    reference = tpusim_convention_logits(args.dump, tokens, args.eps, args.rope_max_timescale)
    check("logits by HF names vs MaxText-convention reference (max abs)",
          (logits - reference).abs().max().item(), 1e-9)
    if args.import_dump:
        with open(os.path.join(args.import_dump, "step.json")) as stream:
            imported = json.load(stream)
        check("loss of tpusim after importing HF weights (relative)",
              abs(imported["loss"] - loss) / abs(loss), 1e-6)
        original = ref.read_safetensors(os.path.join(args.dump, "initial", "model.safetensors"))
        loaded = ref.read_safetensors(os.path.join(args.import_dump, "initial", "model.safetensors"))
        worst = max(float(np.abs(loaded[n] - original[n]).max()) for n in original)
        check("weights tpusim imported vs the ones exported (max abs)", worst, 0.0)
        if set(loaded) != set(original):
            print("FAIL imported tensor names differ from the exported ones")
            failures += 1
    print("# PASSED" if not failures else f"# FAILED: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
