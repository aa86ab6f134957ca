"""Black-box checks of a running `draftc serve` with the official OpenAI
Python client: chat and completions, streamed and not (streamed text equals
non-streamed text, usage chunk), and each error class as the client raises
it. Run by serve/tests/openai_client.rs; exits non-zero on the first failed
check.

    python client_check.py --base http://127.0.0.1:PORT --model NAME \
        --keyed http://127.0.0.1:PORT2 --key KEY --full http://127.0.0.1:PORT3
"""

import argparse
import sys

import openai
from openai import OpenAI


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def raises(cls, what, fn):
    try:
        fn()
    except cls as e:
        print(f"ok: {what} -> {type(e).__name__} {getattr(e, 'status_code', '')}")
        return e
    except Exception as e:  # noqa: BLE001 - report the wrong class
        check(False, f"{what}: expected {cls.__name__}, got {type(e).__name__}: {e}")
    check(False, f"{what}: expected {cls.__name__}, nothing raised")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--keyed", required=True, help="a server started with --api-key")
    ap.add_argument("--key", required=True)
    ap.add_argument("--full", required=True, help="a server started with --max-queued 0")
    a = ap.parse_args()
    c = OpenAI(base_url=a.base + "/v1", api_key="unused", max_retries=0)
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tell me about the sea"},
    ]

    models = c.models.list()
    check([m.id for m in models.data] == [a.model], "models.list names the served model")
    check(models.data[0].owned_by == "draftc", "owned_by is draftc")
    check(c.models.retrieve(a.model).id == a.model, "models.retrieve")
    raises(openai.NotFoundError, "retrieving an unknown model", lambda: c.models.retrieve("gpt-4o"))

    r = c.chat.completions.create(model=a.model, messages=msgs, max_tokens=16, temperature=0)
    text = r.choices[0].message.content
    check(r.object == "chat.completion" and r.choices[0].message.role == "assistant", "chat shape")
    check(r.choices[0].finish_reason in ("stop", "length"), "chat finish_reason")
    u = r.usage
    check(u.prompt_tokens > 0 and 1 <= u.completion_tokens <= 16, f"chat usage {u}")
    check(u.total_tokens == u.prompt_tokens + u.completion_tokens, "total_tokens")

    again = c.chat.completions.create(
        model=a.model, messages=msgs, max_completion_tokens=16, temperature=0, seed=5
    )
    check(again.choices[0].message.content == text, "greedy is repeatable")

    pieces, ids, usage, finish, roles = [], set(), None, None, []
    stream = c.chat.completions.create(
        model=a.model,
        messages=msgs,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for ch in stream:
        ids.add(ch.id)
        if ch.usage is not None:
            usage = ch.usage
        for choice in ch.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    check("".join(pieces) == text, "streamed chat text equals non-streamed text")
    check(len(ids) == 1, "one id per stream")
    check(roles == ["assistant"], "the first chunk carries the role")
    check(finish == r.choices[0].finish_reason, "stream finish_reason")
    check(usage is not None and usage.completion_tokens == u.completion_tokens, "usage chunk")

    cr = c.completions.create(model=a.model, prompt="Once upon a time", max_tokens=8, temperature=0)
    check(cr.object == "text_completion" and cr.usage.completion_tokens <= 8, "completion shape")
    streamed = "".join(
        ch.choices[0].text
        for ch in c.completions.create(
            model=a.model, prompt="Once upon a time", max_tokens=8, temperature=0, stream=True
        )
        if ch.choices
    )
    check(streamed == cr.choices[0].text, "streamed completion equals non-streamed")

    s1 = c.completions.create(
        model=a.model, prompt="Once upon a time", max_tokens=10, temperature=0.9, seed=11
    )
    s2 = c.completions.create(
        model=a.model, prompt="Once upon a time", max_tokens=10, temperature=0.9, seed=11
    )
    check(s1.choices[0].text == s2.choices[0].text, "a seeded sample is repeatable")

    e = raises(
        openai.BadRequestError,
        "n=2",
        lambda: c.chat.completions.create(model=a.model, messages=msgs, max_tokens=2, n=2),
    )
    check(e.body.get("param") == "n", "the 400 names n")
    raises(
        openai.BadRequestError,
        "logit_bias",
        lambda: c.chat.completions.create(
            model=a.model, messages=msgs, max_tokens=2, logit_bias={"5": 3}
        ),
    )
    raises(
        openai.BadRequestError,
        "a prompt longer than the context",
        lambda: c.completions.create(model=a.model, prompt="word " * 400, max_tokens=2),
    )
    raises(
        openai.NotFoundError,
        "an unknown model",
        lambda: c.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=2),
    )
    e = raises(
        openai.APIStatusError,
        "an oversized body",
        lambda: c.completions.create(model=a.model, prompt="x" * (5 << 20), max_tokens=2),
    )
    check(e.status_code == 413, "oversized is 413")

    keyed = OpenAI(base_url=a.keyed + "/v1", api_key="wrong", max_retries=0)
    raises(
        openai.AuthenticationError,
        "a wrong API key",
        lambda: keyed.chat.completions.create(model=a.model, messages=msgs, max_tokens=2),
    )
    good = OpenAI(base_url=a.keyed + "/v1", api_key=a.key, max_retries=0)
    check(
        good.chat.completions.create(model=a.model, messages=msgs, max_tokens=2).usage
        is not None,
        "the right API key works",
    )

    full = OpenAI(base_url=a.full + "/v1", api_key="unused", max_retries=0)
    raises(
        openai.RateLimitError,
        "a full queue",
        lambda: full.chat.completions.create(model=a.model, messages=msgs, max_tokens=2),
    )
    print("all client checks passed")


if __name__ == "__main__":
    main()
