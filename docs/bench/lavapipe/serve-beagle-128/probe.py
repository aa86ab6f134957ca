"""One no-draft `draftc serve`, a warm-up, then N requests at one concurrency
(the ad-hoc runs of this report's "Why 64-token answers" section).

Run from the repository root:
    [DRAFTC_ENGINE_TRACE=1] [N=32] [PROMPTS=data/train/heldout-prompts.jsonl] \
        .venv-serve/bin/python docs/bench/lavapipe/serve-beagle-128/probe.py DRAFTC LOG CONCURRENCY [SERVE ARGS...]
Prints the tokens/s and the change of every nonzero /metrics counter."""
import sys, asyncio, json, time, os
sys.path.insert(0, "tools/serve")
import bench
s = bench.Server("probe", [sys.argv[1], "serve", "--max-running", "16", "--max-queued", "256", "--served-model-name", "bench", "--no-spec"] + sys.argv[4:], sys.argv[2])
try:
    s.wait(1200)
    model = s.model()
    prompts = [json.loads(l)["prompt"] for l in open(os.environ.get("PROMPTS","data/train/heldout-prompts.jsonl")) if l.strip()]
    asyncio.run(bench.level(s, model, prompts, 16, 16, 16))
    m0 = s.metrics()
    c = int(sys.argv[3])
    wall, res = asyncio.run(bench.level(s, model, prompts, c, int(os.environ.get("N","32")), 64))
    m1 = s.metrics()
    tok = sum(r["tokens"] for r in res)
    print(f"c{c}: {tok} tokens in {wall:.1f} s = {tok/wall:.2f} tok/s")
    for k in sorted(m1):
        d = m1[k] - m0.get(k, 0)
        if d: print(k, d)
finally:
    s.stop()
