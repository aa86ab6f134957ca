"""Checkpoint directories with chat templates, and the prompt ids the
training tools (`draftc_train.targets.TargetSpec`) give their conversations.

Both sides of the training-data/runtime parity check use this:
`test_chat_templates.py` (Python: the tools against transformers'
`apply_chat_template` and the fixture `runtime/tests/fixtures/chat_templates.json`)
and `runtime/tests/train_chat_templates.rs` (Rust: the same directories
loaded by the runtime's `Tokenizer::from_dir`, whose `encode_chat` must give
the same ids, and whose `config.json` gives the eos ids the tools call the
runtime's).

    .venv-train/bin/python tools/train/tests/chat_template_cases.py OUT   # writes OUT/<dir>/ and OUT/cases.json

The directories (no weights: the tools and the tokenizer read none):

- one per template of the fixture (SmolLM2's ChatML verbatim; Llama 3,
  Mistral, Qwen 2.5, Gemma and block styles), plus Gemma 3's instruction
  template, a Llama 3.1-style one (its `strftime_now` fallback date) and
  one with indented block tags (`lstrip_blocks`, `trim_blocks`), on
  the repository's tiny byte-level tokenizer
  (`runtime/tests/fixtures/targets/llama-tied/tokenizer.json`) with the
  special tokens those templates write added (`<s>`, `</s>`, `<|eot_id|>`,
  `<end_of_turn>`, ...), bos `<s>` and eos `</s>` as in the fixture;
- when `draftc fetch` has put them in the cache: SmolLM2-135M-Instruct as
  converted (ChatML), and Gemma 3 270M's converted directory (its
  SentencePiece tokenizer, `<bos>`, `<end_of_turn>`) with Gemma 3's
  instruction template added.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "runtime" / "tests" / "fixtures" / "chat_templates.json"
TINY = REPO / "runtime" / "tests" / "fixtures" / "targets" / "llama-tied"

# Special tokens the fixture's templates write, added to the tiny tokenizer.
SPECIALS = ["<s>", "</s>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
            "<start_of_turn>", "<end_of_turn>"]

# Gemma 3's instruction template (google/gemma-3-*-it), as it ships.
GEMMA3_IT = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)

# The shape of Llama 3.1/3.2's template: a dated system turn (the date from
# `strftime_now` where the engine has it, else a fixed one: the runtime's
# minijinja and the tools have none, so both write 26 Jul 2024), `tools`
# tests, `in` on a message.
LLAMA31_STYLE = (
    "{{- bos_token }}\n"
    "{%- if not date_string is defined %}\n"
    "    {%- if strftime_now is defined %}\n"
    "        {%- set date_string = strftime_now(\"%d %b %Y\") %}\n"
    "    {%- else %}\n"
    "        {%- set date_string = \"26 Jul 2024\" %}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- if not tools is defined %}\n"
    "    {%- set tools = none %}\n"
    "{%- endif %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = \"\" %}\n"
    "{%- endif %}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{%- if tools is not none %}\n"
    "    {{- \"Environment: ipython\\n\" }}\n"
    "{%- endif %}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{{- system_message }}\n"
    "{{- \"<|eot_id|>\" }}\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)

# Indented block tags without `-`: what `lstrip_blocks` and `trim_blocks`
# decide (the fixture's templates all strip with `-`, or start tags at a
# line's start).
INDENTED_STYLE = (
    "{% for message in messages %}\n"
    "    {% if message['role'] == 'user' %}\n"
    "    U: {{ message['content'] }}\n"
    "    {% else %}\n"
    "    A: {{ message['content'] }}{{ eos_token }}\n"
    "    {% endif %}\n"
    "{% endfor %}\n"
    "{% if add_generation_prompt %}\n"
    "    A:{% endif %}"
)

# Conversations beyond the fixture's: a longer alternating one (a data
# `--context` prompt), and one that opens with the assistant (a history cut
# from its question).
MORE_CONVERSATIONS = [
    [{"role": "user", "content": "What is a B-tree?"},
     {"role": "assistant", "content": "A balanced search tree.\n\nEach node holds many keys."},
     {"role": "user", "content": "And a B+ tree?"},
     {"role": "assistant", "content": "Leaves hold the data; inner nodes only keys."},
     {"role": "user", "content": "  Show one in Python, please.  "}],
    [{"role": "assistant", "content": "Earlier answer."}, {"role": "user", "content": "Thanks!"}],
]


def fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def templates() -> dict[str, str]:
    t = dict(fixture()["templates"])
    t["gemma3_it"] = GEMMA3_IT
    t["llama31_style"] = LLAMA31_STYLE
    t["indented_style"] = INDENTED_STYLE
    return t


def conversations() -> list[list[dict]]:
    return fixture()["conversations"] + MORE_CONVERSATIONS


def tiny_tokenizer():
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(TINY / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return tok


def write_dir(d: Path, config: dict, tokenizer_json: str, tokenizer_config: dict) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config, indent=1))
    (d / "tokenizer.json").write_text(tokenizer_json)
    (d / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1, ensure_ascii=False))
    return d


def build(root: Path) -> dict[str, Path]:
    """The checkpoint directories under `root`, by name."""
    root = Path(root)
    f = fixture()
    tok = tiny_tokenizer()
    tok_json = tok.to_str()
    config = json.loads((TINY / "config.json").read_text())
    config["vocab_size"] = tok.get_vocab_size()
    # eos `</s>` as the fixture's tokens say; bos `<s>`.
    config["eos_token_id"] = tok.token_to_id("</s>")
    config["bos_token_id"] = tok.token_to_id("<s>")
    dirs = {}
    for name, template in templates().items():
        tc = {"bos_token": f["bos_token"], "eos_token": f["eos_token"], "chat_template": template}
        if name == "qwen25_style":
            # The list form: `default` is the chat template.
            tc["chat_template"] = [{"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
                                   {"name": "default", "template": template}]
        if name == "mistral_style":
            # An added-token object for a special token's text, and no
            # eos_token_id in config.json (the runtime's Llama default, 2).
            tc["eos_token"] = {"content": f["eos_token"], "lstrip": False, "rstrip": False,
                               "normalized": False, "special": True, "__type": "AddedToken"}
            cfg = {k: v for k, v in config.items() if k != "eos_token_id"}
        else:
            cfg = config
        dirs[name] = write_dir(root / name, cfg, tok_json, tc)
    cache = cache_dir()
    smol = cache / "smollm2-135m-instruct" / "float32"
    if (smol / "tokenizer.json").is_file():
        d = root / "smollm2_real"
        d.mkdir(parents=True, exist_ok=True)
        for n in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(smol / n, d / n)
        dirs["smollm2_real"] = d
    gemma = cache / "gemma-3-270m" / "float32"
    if (gemma / "tokenizer.json").is_file():
        tc = json.loads((gemma / "tokenizer_config.json").read_text())
        tc["chat_template"] = GEMMA3_IT
        dirs["gemma3_it_real"] = write_dir(root / "gemma3_it_real", json.loads((gemma / "config.json").read_text()),
                                           (gemma / "tokenizer.json").read_text(), tc)
    return dirs


def cache_dir() -> Path:
    sys.path.insert(0, str(REPO / "tools" / "train"))
    from draftc_train import prompts as P

    return P.cache_dir()


def as_history(conv: list[dict]):
    """`(prompt, history)` of a conversation `encode_prompt` can take (user
    and assistant turns ending with the user's), else None."""
    if not conv or conv[-1]["role"] != "user" or any(m["role"] not in ("user", "assistant") for m in conv):
        return None
    return conv[-1]["content"], [(m["role"], m["content"]) for m in conv[:-1]]


def cases(dirs: dict[str, Path]) -> list[dict]:
    """Per directory and conversation: the tools' rendered text and prompt
    ids (or the template's refusal), and the tools' eos ids."""
    sys.path.insert(0, str(REPO / "tools" / "train"))
    from draftc_train import targets as T

    out = []
    for name, d in dirs.items():
        spec = T.TargetSpec(d)
        for ci, conv in enumerate(conversations()):
            case = {"name": name, "dir": str(d), "chat": spec.chat, "conversation": ci, "messages": conv,
                    "eos_ids": spec.eos_ids, "runtime_eos_ids": spec.runtime_eos_ids}
            h = as_history(conv)
            try:
                if spec.chat == "template":
                    case["text"] = spec.render_messages(conv)
                    case["ids"] = spec.encode_messages(conv)
                    if h is not None:
                        assert spec.encode_prompt(h[0], h[1]) == case["ids"], (name, ci)
                elif h is not None:  # ChatML: encode_prompt only (no system turn of its own)
                    case["ids"] = spec.encode_prompt(h[0], h[1])
                else:
                    continue
            except T.ChatRefused as e:
                case["error"] = str(e).split(": ", 1)[1]
            out.append(case)
    return out


def main(argv):
    if len(argv) != 1:
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    root = Path(argv[0])
    dirs = build(root)
    cs = cases(dirs)
    (root / "cases.json").write_text(json.dumps(cs, indent=1, ensure_ascii=False))
    refused = sum("error" in c for c in cs)
    print(f"{len(cs)} conversations ({refused} refused) over {len(dirs)} checkpoint directories "
          f"({', '.join(dirs)}) -> {root / 'cases.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
