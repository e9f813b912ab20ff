"""Independent greedy decoding from a Hugging Face export, against `tpusim generate`.

What it checks
--------------
`tpusim export-hf CHECKPOINT HF_DIR` writes the model; `tpusim generate ... --json --with-logits`
decodes a prompt (greedy) and prints its prompt tokens, the generated tokens and the logits each
was chosen from. This script decodes the same prompt itself, from HF_DIR's model.safetensors and
config.json alone: Transformers' Llama forward in fp64 (hf_reference.llama_logits), the whole
prefix recomputed each step, the argmax appended. For every `tpusim generate` result given
(unsharded, sharded, ...) and every step:

  * where the reference's two largest logits differ by more than 1e-3 the tokens must be equal;
  * where they are within 1e-3 (a near tie that fp32 rounding may break either way) the logits
    are compared instead, and decoding goes on from tpusim's token;
  * at every step the logits must agree within --logit-tolerance (max |difference| over the
    step's largest |logit|, at least 1; tpusim computes in fp32).

With --sentencepiece, HF_DIR/tokenizer.model is loaded through Debian's python3-sentencepiece:
its encoding of --prompt must be tpusim's prompt tokens and its decoding of the generated tokens
tpusim's text.

Run: /usr/bin/python3 tests/reference/generate_reference.py HF_DIR RESULT.json [...] --prompt P
(or everything at once: bash tests/reference/run_generate_reference.sh [path/to/tpusim]).
"""

import argparse
import json
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference  # noqa: E402
import torch_reference as ref  # noqa: E402

TIE = 1e-3  # top-2 logit gap below which tokens are not compared (the threshold)


def reference_step(weights, config, prefix):
    """fp64 logits of the token after `prefix`."""
    tokens = torch.tensor([prefix], dtype=torch.int64)
    return hf_reference.llama_logits(weights, config, tokens)[0, -1]


def compare(weights, config, result, tolerance, label):
    """Failures of one tpusim result against the reference decoding loop."""
    prefix = list(result["prompt_tokens"])
    failures, worst, ties, compared = 0, 0.0, 0, 0
    for step, token in enumerate(result["tokens"]):
        expected = reference_step(weights, config, prefix)
        got = torch.tensor(result["logits"][step], dtype=torch.float64)
        # Relative to the step's largest logit: fp32 rounds a logit of size L by about L 6e-8.
        scale = max(1.0, expected.abs().max().item())
        worst = max(worst, (expected - got).abs().max().item() / scale)
        top2 = torch.topk(expected, 2).values
        if (top2[0] - top2[1]).item() <= TIE:
            ties += 1  # a near tie: the logits were compared (above), tokens are not
        else:
            compared += 1
            if int(torch.argmax(expected)) != token:
                print(f"FAIL {label}: step {step}: tpusim chose {token}, the reference "
                      f"{int(torch.argmax(expected))} (top-2 gap {(top2[0] - top2[1]).item():.3e})")
                failures += 1
                break
        prefix.append(token)
    ok = worst <= tolerance
    failures += 0 if ok else 1
    print(f"{'ok  ' if not failures else 'FAIL'} {label}: {len(result['tokens'])} tokens "
          f"({compared} compared by id, {ties} near ties by logits), max |logit difference| / "
          f"max(1, max |logit|) "
          f"{worst:.3e} (tol {tolerance:.0e}), devices {result.get('devices')}")
    return failures


def check_sentencepiece(hf_dir, prompt, result):
    import sentencepiece  # Debian's python3-sentencepiece

    processor = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(hf_dir, "tokenizer.model"))
    failures = 0
    encoded = processor.encode(prompt)
    if encoded != result["prompt_tokens"]:
        print(f"FAIL sentencepiece: encode({prompt!r}) = {encoded}, tpusim {result['prompt_tokens']}")
        failures += 1
    decoded = processor.decode(result["tokens"])
    if decoded != result["text"]:
        print(f"FAIL sentencepiece: decode = {decoded!r}, tpusim {result['text']!r}")
        failures += 1
    if not failures:
        print(f"ok   sentencepiece {sentencepiece.__version__}: the prompt's {len(encoded)} pieces "
              "and the generated text agree with tpusim's")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("hf_dir")
    parser.add_argument("results", nargs="+", help="`tpusim generate --json --with-logits` outputs")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--logit-tolerance", type=float, default=1e-5)
    parser.add_argument("--sentencepiece", action="store_true")
    args = parser.parse_args()
    with open(os.path.join(args.hf_dir, "config.json")) as stream:
        config = json.load(stream)
    weights = {n: torch.tensor(v) for n, v in
               ref.read_safetensors(os.path.join(args.hf_dir, "model.safetensors")).items()}
    failures = 0
    results = []
    for path in args.results:
        with open(path) as stream:
            results.append(json.load(stream))
        failures += compare(weights, config, results[-1], args.logit_tolerance,
                            os.path.basename(path))
    if any(r["tokens"] != results[0]["tokens"] for r in results[1:]):
        print("note: the results' tokens differ (allowed only after a near tie, checked above)")
    if args.sentencepiece:
        failures += check_sentencepiece(args.hf_dir, args.prompt, results[0])
    print("# PASSED" if not failures else f"# FAILED: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
