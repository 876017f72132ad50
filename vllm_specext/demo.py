"""The demo (main job): no speculation vs each vllm_specext method on the default model.

Prepares SmolLM2-135M-Instruct, then for each configuration starts a fresh vLLM engine
through the plugin, generates greedily for the built-in prompts and prints output
tokens/s, mean acceptance length (vLLM's: drafted steps only), tau (output tokens per
target step) and whether the outputs are token-identical to no speculation.
"""
from __future__ import annotations

import argparse
import json
import sys

from vllm_specext.config import METHODS, SpecExtConfigError, validate_config
from vllm_specext.engine_run import generate_in_subprocess

_CODE = '''def moving_average(values, window):
    result = []
    for i in range(len(values)):
        chunk = values[i:i + window]
        result.append(sum(chunk) / len(chunk))
    return result
'''

_ARTICLE = ("The city council met on Tuesday to discuss the new bicycle lanes on Main Street. "
            "Supporters said the lanes cut accidents by a third during the six-month trial, "
            "while shop owners said they lost parking spaces and customers. The council voted "
            "five to two to keep the lanes and to add forty parking spaces on Oak Avenue by "
            "spring. The mayor said the city will publish accident and sales figures every "
            "quarter so that residents can judge the lanes for themselves.")

_INVOICE = ("Invoice 2024-117 from Northwind Traders to Contoso Ltd, dated 12 March 2024. "
            "Items: 3 laptops at 899.00 EUR each, 5 docking stations at 129.50 EUR each. "
            "Payment due within 30 days to IBAN DE44 5001 0517 5407 3249 31.")

#: chat conversations written for this project: code editing, summarization, extraction, chat
DEMO_CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Rename the function moving_average to rolling_mean and the "
      "parameter values to data. Return the whole code.\n\n" + _CODE}],
    [{"role": "user", "content": "Add type hints and a docstring to this function. Return the "
      "whole code.\n\n" + _CODE}],
    [{"role": "user", "content": "Summarize this article in two sentences.\n\n" + _ARTICLE}],
    [{"role": "user", "content": "Extract the invoice number, the seller, the buyer, the date and "
      "every item with its price as JSON.\n\n" + _INVOICE}],
    [{"role": "user", "content": "Repeat the following text exactly:\n\n" + _ARTICLE}],
    [{"role": "user", "content": "What are three good habits for writing readable Python code?"}],
]


def demo_methods() -> list[str]:
    """Implemented model-free methods, ``naive`` last (``mtp_ngram`` needs MTP weights)."""
    names = [m for m, c in METHODS.items() if c.IMPLEMENTED and m not in ("mtp_ngram", "naive")]
    return names + ["naive"]


def run_demo(methods: list[str], k: int, max_tokens: int, dtype: str,
             batch_size: int) -> list[dict]:
    """Run the baseline and each method; returns one result row per configuration."""
    job = {"chats": DEMO_CHATS, "max_tokens": max_tokens, "dtype": dtype, "temperature": 0.0,
           "batch_size": batch_size}
    rows = []
    base = generate_in_subprocess({**job, "spec": None})
    rows.append({"method": "none", "k": 0, **base, "identical": True})
    print(_format_row(rows[-1], base), flush=True)
    for m in methods:
        res = generate_in_subprocess(
            {**job, "spec": {"method": m, "num_speculative_tokens": k}})
        rows.append({"method": m, "k": k, **res,
                     "identical": res["token_ids"] == base["token_ids"]})
        print(_format_row(rows[-1], base), flush=True)
    return rows


def _format_row(row: dict, base: dict) -> str:
    speedup = row["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else 0.0
    return (f"{row['method']:>16} k={row['k']:<2} {row['tokens_per_s']:7.1f} tok/s "
            f"({speedup:4.2f}x)  mean acceptance length {row['mean_acceptance_length']:5.2f}  "
            f"tau {row['tau']:5.2f}  identical outputs: {'yes' if row['identical'] else 'NO'}")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vllm-specext demo", description=__doc__)
    ap.add_argument("--methods", default=",".join(demo_methods()),
                    help="comma-separated methods (default: every implemented one)")
    ap.add_argument("-k", "--num-speculative-tokens", type=_positive_int, default=8)
    ap.add_argument("--max-tokens", type=_positive_int, default=128)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="float32 (default) makes greedy outputs comparable bit for bit")
    ap.add_argument("--batch-size", type=_positive_int, default=1,
                    help="prompts per generate() call (default 1: one user at a time)")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    if not methods:
        ap.error("--methods: name at least one method")
    for m in methods:  # before any engine starts
        try:
            validate_config({"method": m, "num_speculative_tokens": args.num_speculative_tokens})
        except SpecExtConfigError as err:
            ap.error(f"--methods {m}: {err}")
    print(f"vllm-specext demo: SmolLM2-135M-Instruct, {len(DEMO_CHATS)} prompts, greedy, "
          f"{args.dtype}, max_tokens={args.max_tokens}, batch size {args.batch_size}, "
          "one fresh engine per method", flush=True)
    rows = run_demo(methods, args.num_speculative_tokens, args.max_tokens, args.dtype,
                    args.batch_size)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
