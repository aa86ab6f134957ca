#!/usr/bin/env python3
"""PyTorch/transformers autoregressive decode throughput on the same converted
weights `draftc bench decode --backend cuda` runs, for comparison (eager,
KV cache, greedy argmax loop; the same batch sizes and timed steps).

Usage: python3 tools/gpu/hf_decode.py MODEL_DIR BATCHES STEPS [f32|f16]
Prints a markdown table; also the device-to-device copy bandwidth (bytes read
+ written) as the machine's measured memory roofline.
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
    return 2 * a.numel() * 4 * reps / (time.perf_counter() - start)


@torch.no_grad()
def decode(model, ids, steps):
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
    return time.perf_counter() - start


def main():
    model_dir, batches, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dtype = {"f32": torch.float32, "f16": torch.float16}[sys.argv[4] if len(sys.argv) > 4 else "f32"]
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=dtype).cuda().eval()
    text = tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True)
    ids = tok(text, return_tensors="pt").input_ids.cuda()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bw = copy_bandwidth()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {dtype}, weights {weight_bytes / 1e6:.1f} MB, "
          f"device copy {bw / 1e9:.0f} GB/s (read + write)")
    print("| batch | steps | step ms | tokens/s | weight GB/s | of copy bw |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for b in [int(x) for x in batches.split(",")]:
        secs = decode(model, ids.repeat(b, 1), steps)
        step = secs / steps
        print(f"| {b} | {steps} | {step * 1e3:.2f} | {b / step:.1f} | {weight_bytes / step / 1e9:.1f} | "
              f"{weight_bytes / step / bw:.3f} |")


if __name__ == "__main__":
    main()
