"""Serving benchmark: `draftc serve` with speculation off and on, side by
side in one run, under closed-loop load at several concurrencies.

Both servers are started here (the same binary, model and settings; one
with --no-spec, one with the drafter) and stay up for the whole run; each
concurrency level runs the no-draft server, then the drafting one, and
repeats that pair, so the two are measured minutes apart at most. Every
request streams (stream_options.include_usage: token counts are the
server's exact ones, no tokenizer guesswork) through the official OpenAI
client, so time to first token and inter-token latency are measured as a
client sees them.

Every level runs the same requests, the first --requests prompts in order,
so levels differ in concurrency alone (a count that grew with concurrency
gave the smaller levels other, shorter prompts: the first six held-out
prompts average 23 words, the first 32 average 28).

Reported per server and concurrency: output tokens/s (completion tokens of
the level over its wall time), time to first token and inter-token latency
(per request, (end - first token) / (tokens - 1)) at p50 and p99, and the
drafting server's /metrics (draft tokens proposed and accepted, rounds
without a draft). Writes bench.json, bench.md and bench.png under --out.

    .venv-serve/bin/python tools/serve/bench.py --draftc target/release/draftc \
        --drafter models/beagle.draft --concurrency 1,4,16 --out docs/bench/lavapipe/serve
"""

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request



def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


class Server:
    def __init__(self, name, cmd, log_path):
        self.name = name
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "w")
        full = cmd + ["--host", "127.0.0.1", "--port", str(self.port)]
        print(f"[{name}] {' '.join(full)}", file=sys.stderr)
        self.proc = subprocess.Popen(full, stdout=self.log, stderr=subprocess.STDOUT)

    def wait(self, limit_s):
        t0 = time.time()
        while time.time() - t0 < limit_s:
            if self.proc.poll() is not None:
                raise SystemExit(f"[{self.name}] exited with {self.proc.returncode}; see {self.log.name}")
            if get(self.base + "/health")[0] == 200:
                print(f"[{self.name}] ready after {time.time() - t0:.0f} s", file=sys.stderr)
                return
            time.sleep(0.5)
        raise SystemExit(f"[{self.name}] not ready after {limit_s} s; see {self.log.name}")

    def model(self):
        return json.loads(get(self.base + "/v1/models")[1])["data"][0]["id"]

    def metrics(self):
        text = get(self.base + "/metrics")[1]
        out = {}
        for line in text.splitlines():
            m = re.match(r"^(draftc_[a-z_]+) ([0-9.e+-]+)$", line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


async def one(port, model, prompt, max_tokens):
    """One streamed chat request over a plain asyncio connection (the GPU
    machine has no network to install a client library from)."""
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }).encode()
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()
    status = (await reader.readline()).split()
    if len(status) < 2 or status[1] != b"200":
        raise RuntimeError(f"HTTP {status!r}")
    chunked = False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        if line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower():
            chunked = True
    first = None
    usage = None
    buf = b""

    async def chunks():
        if not chunked:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                yield data
        while True:
            size = int((await reader.readline()).strip() or b"0", 16)
            if size == 0:
                return
            data = await reader.readexactly(size)
            await reader.readline()
            yield data

    async for data in chunks():
        buf += data
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if not event.startswith(b"data: ") or event == b"data: [DONE]":
                continue
            ch = json.loads(event[6:])
            if "error" in ch:
                raise RuntimeError(ch["error"])
            if first is None and ch.get("choices") and ch["choices"][0]["delta"].get("content"):
                first = time.perf_counter()
            if ch.get("usage"):
                usage = ch["usage"]
    writer.close()
    end = time.perf_counter()
    n = usage["completion_tokens"] if usage else 0
    first = first or end
    itl = (end - first) / (n - 1) if n > 1 else None
    return {"ttft": first - t0, "e2e": end - t0, "tokens": n, "itl": itl}


async def level(server, model, prompts, concurrency, requests, max_tokens):
    queue = list(range(requests))
    results = []

    async def worker():
        while queue:
            i = queue.pop(0)
            results.append(await one(server.port, model, prompts[i % len(prompts)], max_tokens))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return wall, results


def pct(xs, p):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
    return xs[k]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draftc", default="target/release/draftc")
    ap.add_argument("--model", help="a converted model directory (default: draftc's default model)")
    ap.add_argument("--drafter", default="models/beagle.draft")
    ap.add_argument(
        "--second",
        help="instead of --drafter, these `draftc serve` arguments for the second server (an A/B of one "
        "setting against the first server, e.g. \"--no-spec --no-prefix-cache\"); its rows stay named spec",
    )
    ap.add_argument("--serve-arg", action="append", default=[], help="extra `draftc serve` argument (repeat)")
    ap.add_argument("--prompts", default="data/train/heldout-prompts.jsonl")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument(
        "--requests",
        type=int,
        default=32,
        help="requests per level and pass: the first N prompts, the same at every level, so the levels "
        "differ in concurrency alone",
    )
    ap.add_argument("--repeat", type=int, default=2, help="passes of each level per server, alternated")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-running", type=int, default=16)
    ap.add_argument("--ready-timeout", type=float, default=1200)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    levels = [int(x) for x in a.concurrency.split(",")]
    prompts = [json.loads(l)["prompt"] for l in open(a.prompts) if l.strip()]
    base = [a.draftc, "serve", "--max-running", str(max(a.max_running, max(levels)))]
    base += ["--max-queued", "256", "--served-model-name", "bench"] + a.serve_arg
    if a.model:
        base += ["--model", a.model]
    servers = [
        Server("no-spec", base + ["--no-spec"], os.path.join(a.out, "server-no-spec.log")),
        Server(
            "spec",
            base + (a.second.split() if a.second else ["--drafter", a.drafter]),
            os.path.join(a.out, "server-spec.log"),
        ),
    ]
    try:
        for s in servers:
            s.wait(a.ready_timeout)
        model = servers[0].model()
        runs = {s.name: {c: [] for c in levels} for s in servers}
        walls = {s.name: {c: [] for c in levels} for s in servers}
        # Warm-up: every concurrency once, untimed (kernel shapes compile).
        for c in levels:
            for s in servers:
                asyncio.run(level(s, model, prompts, c, c, min(16, a.max_tokens)))
        before = servers[1].metrics()
        for c in levels:
            n = a.requests
            for rep in range(a.repeat):
                for s in servers:
                    wall, res = asyncio.run(level(s, model, prompts, c, n, a.max_tokens))
                    runs[s.name][c].extend(res)
                    walls[s.name][c].append((wall, sum(r["tokens"] for r in res)))
                    print(
                        f"[{s.name}] concurrency {c} pass {rep + 1}: {sum(r['tokens'] for r in res)} tokens "
                        f"in {wall:.1f} s = {sum(r['tokens'] for r in res) / wall:.1f} tokens/s",
                        file=sys.stderr,
                    )
        after = servers[1].metrics()
    finally:
        for s in servers:
            s.stop()
    rows = []
    for s in servers:
        for c in levels:
            rs = runs[s.name][c]
            tok = sum(t for _, t in walls[s.name][c])
            wall = sum(w for w, _ in walls[s.name][c])
            rows.append({
                "server": s.name,
                "concurrency": c,
                "requests": len(rs),
                "tokens": tok,
                "tokens_per_s": tok / wall,
                "ttft_p50": pct([r["ttft"] for r in rs], 50),
                "ttft_p99": pct([r["ttft"] for r in rs], 99),
                "itl_p50": pct([r["itl"] for r in rs], 50),
                "itl_p99": pct([r["itl"] for r in rs], 99),
            })
    by = {(r["server"], r["concurrency"]): r for r in rows}
    drafted = after.get("draftc_draft_tokens_proposed_total", 0) - before.get("draftc_draft_tokens_proposed_total", 0)
    accepted = after.get("draftc_draft_tokens_accepted_total", 0) - before.get("draftc_draft_tokens_accepted_total", 0)
    rounds = after.get("draftc_rounds_total", 0) - before.get("draftc_rounds_total", 0)
    nodraft = after.get("draftc_rounds_without_draft_total", 0) - before.get("draftc_rounds_without_draft_total", 0)
    report = {
        "command": sys.argv,
        "second": a.second,
        "drafter": a.drafter,
        "max_tokens": a.max_tokens,
        "repeat": a.repeat,
        "rows": rows,
        "speedup": {c: by[("spec", c)]["tokens_per_s"] / by[("no-spec", c)]["tokens_per_s"] for c in levels},
        "scaling_no_spec": by[("no-spec", levels[-1])]["tokens_per_s"] / by[("no-spec", levels[0])]["tokens_per_s"],
        "spec_server": {"draft_proposed": drafted, "draft_accepted": accepted, "rounds": rounds, "rounds_without_draft": nodraft},
    }
    json.dump(report, open(os.path.join(a.out, "bench.json"), "w"), indent=2)
    ms = lambda x: "–" if x is None else f"{x * 1e3:.0f}"
    md = [
        f"# Serving benchmark: {a.second or a.drafter} (rows `spec`) against --no-spec",
        "",
        f"`{' '.join(sys.argv)}`",
        "",
        f"Chat requests from `{a.prompts}`, greedy, max_tokens {a.max_tokens}, streamed; "
        f"{a.repeat} alternated passes per level and server, after an untimed warm-up.",
        "",
        "| server | concurrency | requests | tokens/s | speedup | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        sp = r["tokens_per_s"] / by[("no-spec", r["concurrency"])]["tokens_per_s"]
        md.append(
            f"| {r['server']} | {r['concurrency']} | {r['requests']} | {r['tokens_per_s']:.1f} | {sp:.2f}x | "
            f"{ms(r['ttft_p50'])} / {ms(r['ttft_p99'])} | {ms(r['itl_p50'])} / {ms(r['itl_p99'])} |"
        )
    md += [
        "",
        f"No-spec scaling, concurrency {levels[-1]} over {levels[0]}: {report['scaling_no_spec']:.2f}x.",
        f"Drafting server in the timed passes: {drafted:.0f} draft tokens verified, {accepted:.0f} accepted "
        f"({accepted / max(drafted, 1):.0%}); {nodraft:.0f} of {rounds:.0f} rounds without a draft.",
    ]
    open(os.path.join(a.out, "bench.md"), "w").write("\n".join(md) + "\n")
    print("\n".join(md))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(1, 3, figsize=(13, 3.8))
        for name, style in (("no-spec", "o-"), ("spec", "s-")):
            xs = levels
            ax[0].plot(xs, [by[(name, c)]["tokens_per_s"] for c in xs], style, label=name)
            ax[1].plot(xs, [by[(name, c)]["ttft_p50"] * 1e3 for c in xs], style, label=name)
            ax[2].plot(xs, [(by[(name, c)]["itl_p50"] or 0) * 1e3 for c in xs], style, label=name)
        for axis, title in zip(ax, ("output tokens/s", "TTFT p50 (ms)", "ITL p50 (ms)")):
            axis.set_xscale("log", base=2)
            axis.set_xticks(levels, [str(c) for c in levels])
            axis.set_xlabel("concurrency")
            axis.set_title(title)
            axis.grid(alpha=0.3)
        ax[0].legend()
        fig.suptitle(f"draftc serve: {os.path.basename(a.drafter)} vs --no-spec")
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "bench.png"), dpi=110)
    except Exception as e:  # noqa: BLE001 - the numbers matter more than the plot
        print(f"no plot: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
