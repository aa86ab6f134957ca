#!/usr/bin/env python3
"""PyTorch/transformers autoregressive decode throughput on the same converted
weights `draftc bench decode --backend cuda` runs: the peers draftc is
measured against (issue 31).

Modes:
  eager    the model's forward in a greedy argmax loop with the dynamic KV
           cache (what transformers does without compilation);
  compile  `generate()` with the static KV cache and torch.compile in
           mode="reduce-overhead" (CUDA graphs), greedy: a streamer stamps
           every token, and the decode step time is the mean interval after
           the first token, timed after warm-up calls that compile and
           capture (one shape per batch size).

Usage: python3 tools/gpu/hf_decode.py MODEL_DIR BATCHES STEPS DTYPE MODE [DEADLINE_S]
  DTYPE f32 | f16; MODE eager | compile | eager,compile
  DEADLINE_S: stop starting new batch sizes after this many seconds (a row
  says "skipped: time").
Prints a markdown table; also the device-to-device copy bandwidth (bytes read
+ written) as the machine's measured memory roofline. A mode that fails
prints its error in its row instead of stopping the others.
"""

import sys
import time

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

PROMPT = "Summarise the following in two sentences: the quick brown fox jumps over the lazy dog."


def copy_bandwidth():
    n = 1 << 28  # 1 GiB of f32
    a = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    start = time.perf_counter()
    reps = 20
    for _ in range(reps):
        b.copy_(a)
    torch.cuda.synchronize()
    secs = time.perf_counter() - start
    del a, b
    torch.cuda.empty_cache()
    return 2 * n * 4 * reps / secs


@torch.no_grad()
def decode_eager(model, ids, steps):
    out = model(input_ids=ids, use_cache=True)
    past = out.past_key_values
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(3):  # warm-up steps
        out = model(input_ids=tok, past_key_values=past, use_cache=True)
        past = out.past_key_values
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        out = model(input_ids=tok, past_key_values=past, use_cache=True)
        past = out.past_key_values
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def compile_kwargs():
    kw = dict(do_sample=False, cache_implementation="static")
    try:
        from transformers import CompileConfig

        kw["compile_config"] = CompileConfig(fullgraph=True, mode="reduce-overhead")
    except ImportError:  # older transformers: generate() compiles a static cache by itself
        pass
    return kw


class _Clock:
    """A generate() streamer that timestamps each token (`put` is called once
    for the prompt, then once per new token, after the token reached the
    host, so each stamp follows a synchronisation)."""

    def __init__(self):
        self.stamps = []

    def put(self, _value):
        self.stamps.append(time.perf_counter())

    def end(self):
        pass


@torch.no_grad()
def decode_compiled(model, ids, steps):
    kw = compile_kwargs()
    mask = torch.ones_like(ids)

    def step_time():
        clock = _Clock()
        model.generate(ids, attention_mask=mask, max_new_tokens=steps + 1, min_new_tokens=steps + 1,
                       streamer=clock, **kw)
        # stamps: prompt, first token (after prefill), then `steps` decode steps.
        t = clock.stamps
        return (t[-1] - t[1]) / (len(t) - 2)

    # One shape per batch size (the static cache's length is fixed by
    # max_new_tokens), so the warm-up compiles and captures once.
    for _ in range(2):
        step_time()
    return min(step_time() for _ in range(3))


def main():
    model_dir, batches, steps, dt, modes = sys.argv[1:6]
    steps = int(steps)
    deadline = float(sys.argv[6]) if len(sys.argv) > 6 else 1e9
    t0 = time.perf_counter()
    dtype = {"f32": torch.float32, "f16": torch.float16}[dt]
    tok = AutoTokenizer.from_pretrained(model_dir)
    try:
        model = LlamaForCausalLM.from_pretrained(model_dir, dtype=dtype)
    except TypeError:  # transformers < 4.56 names it torch_dtype
        model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=dtype)
    model = model.cuda().eval()
    model.generation_config.pad_token_id = tok.eos_token_id
    text = tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True)
    ids = tok(text, return_tensors="pt").input_ids.cuda()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bw = copy_bandwidth()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {dtype}, weights {weight_bytes / 1e6:.1f} MB, "
          f"device copy {bw / 1e9:.0f} GB/s (read + write), prompt {ids.shape[1]} tokens")
    print("| transformers | batch | steps | step ms | tokens/s | weight GB/s | of copy bw |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode in modes.split(","):
        for b in [int(x) for x in batches.split(",")]:
            if time.perf_counter() - t0 > deadline:
                print(f"| {mode} | {b} | {steps} | skipped: time | | | |", flush=True)
                continue
            try:
                f = {"eager": decode_eager, "compile": decode_compiled}[mode]
                step = f(model, ids.repeat(b, 1), steps)
                print(f"| {mode} | {b} | {steps} | {step * 1e3:.3f} | {b / step:.1f} | "
                      f"{weight_bytes / step / 1e9:.1f} | {weight_bytes / step / bw:.3f} |", flush=True)
            except Exception as e:  # noqa: BLE001 - one mode's failure must not stop the others
                msg = str(e).replace("\n", " ").replace("|", "/")[:160]
                print(f"| {mode} | {b} | {steps} | failed: {type(e).__name__}: {msg} | | | |", flush=True)


if __name__ == "__main__":
    main()
