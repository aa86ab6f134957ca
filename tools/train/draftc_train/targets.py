"""The target a drafter is trained for, and what follows from it.

Every command that reads the target (`data`, `train`, `heldout-prompts`,
`prompts`) takes ``--model DIR|NAME``: a converted checkpoint directory (what
``draftc fetch`` or ``draftc convert`` writes, or any directory ``draftc
generate --model`` takes), or the name of a model ``draftc fetch`` knows
(``smollm2-135m-instruct``, ``gemma-3-270m``: its directory under
``$DRAFTC_CACHE``). Without it the target is SmolLM2-135M-Instruct, the
default, and every command behaves as it did before targets were chosen.

From the directory follow:

- the family (``config.json``'s ``model_type``: ``llama``, ``qwen2``,
  ``qwen3``, ``gemma3_text``), hence the model file the trainer computes the
  target's hidden states with (``models/<family>.draft``, as the runtime
  picks it) and the transformers class ``data`` generates with;
- the prompt format: a ChatML ``chat_template`` in ``tokenizer_config.json``
  is rendered as the Rust runtime renders it (default system turn, user
  turn, ``<|im_start|>assistant\\n``); any other template (Llama 3's,
  Gemma's, Mistral's, Qwen 2.5's ...) is rendered by jinja2 set up as
  ``runtime/src/model/chat.rs`` sets up minijinja (transformers'
  ``apply_chat_template`` setup, with the variables the runtime passes) and
  encoded without added special tokens, as ``Tokenizer::encode_chat``; a
  checkpoint without one (a base model such as Gemma 3 270M) gets each
  prompt as raw text, encoded as ``draftc generate --raw`` encodes it (the
  tokenizer's own special tokens added: Gemma's ``<bos>``);
- the ids that end an answer (``eos_token_id``, one or a list; ChatML's
  ``<|im_end|>``; for another template, the special token it writes after
  an assistant turn: Llama 3's ``<|eot_id|>``, Gemma's ``<end_of_turn>``),
  the vocabulary, and a tied or untied head;
- for ``draftc emit``, the target sizes: a non-default target is passed as
  ``--target DIR``, so a drafter's module is compiled against the
  checkpoint's own ``config.json``, as the runtime compiles it when it runs.

No torch here: ``record-tau`` and the prompt selection import it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from . import prompts as P

REPO = Path(__file__).resolve().parents[3]
DEFAULT = "smollm2-135m-instruct"
# Models `draftc fetch NAME` knows, by their name (their converted
# directory is $DRAFTC_CACHE/NAME/float32).
FETCHED = ("smollm2-135m-instruct", "gemma-3-270m")
# config.json's model_type -> the family's model file (engine::FAMILIES).
FAMILIES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3"}


def default_dir() -> Path:
    return P.cache_dir() / DEFAULT / "float32"


def model_dir(arg: str | Path | None = None) -> Path:
    """The converted checkpoint directory `--model` names (None: the
    default target)."""
    if arg is None:
        return default_dir()
    p = Path(arg)
    if p.is_dir():
        return p
    if str(arg) in FETCHED:
        return P.cache_dir() / str(arg) / "float32"
    raise SystemExit(f"--model {arg}: not a directory, nor a model `draftc fetch` knows ({', '.join(FETCHED)})")


# --- chat template (mirrors runtime/src/model/tokenizer.rs) ----------------


def default_system_prompt(tokenizer_config: dict) -> str | None:
    """The default system text of a ChatML template, extracted like the Rust
    side: the text between ``'<|im_start|>system\\n`` and the next ``<|im_end|>``,
    present only when the template inserts it for a non-system first message."""
    t = tokenizer_config.get("chat_template")
    if not isinstance(t, str):
        raise ValueError("tokenizer_config.json has no chat_template")
    if not is_chatml(t):
        raise ValueError("unsupported chat template (only ChatML)")
    if "messages[0]['role'] != 'system'" not in t:
        return None
    tag = "'<|im_start|>system\n"
    start = t.find(tag)
    if start < 0:
        raise ValueError("chat template: default system turn not found")
    start += len(tag)
    end = t.find("<|im_end|>", start)
    if end < 0:
        raise ValueError("chat template: default system turn is not closed")
    return t[start:end]


def is_chatml(template: str) -> bool:
    return ("'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'" in template
            and "'<|im_start|>assistant\n'" in template)


def render_chat(prompt: str, default_system: str | None, history: list[tuple[str, str]] = ()) -> str:
    """The ChatML text of a conversation: the default system turn, the
    earlier `(role, text)` turns of `history` (role `user` or `assistant`),
    then `prompt` and the assistant's opening."""
    out = ""
    if default_system is not None:
        out += f"<|im_start|>system\n{default_system}<|im_end|>\n"
    for role, text in history:
        out += f"<|im_start|>{role}\n{text}<|im_end|>\n"
    out += f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    return out


# --- any other chat template (mirrors runtime/src/model/chat.rs) -----------


class ChatRefused(ValueError):
    """The chat template refused a conversation (its `raise_exception`), or
    failed rendering it: the runtime answers the same conversation with an
    error."""


def compile_template(template: str):
    """A chat template as the runtime parses it (runtime/src/model/chat.rs):
    jinja2 as transformers' `apply_chat_template` sets it up (sandboxed,
    `trim_blocks`, `lstrip_blocks`, loop controls, `raise_exception`, its
    `tojson`), without what minijinja lacks there: no `strftime_now` (a
    template that falls back when it is undefined, as Llama 3.1's, takes its
    fallback date, as the runtime does) and no `{% generation %}` tag (such
    a template does not parse, here or there). A syntax error raises
    jinja2's TemplateSyntaxError."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def special_token(tokenizer_config: dict, key: str) -> str:
    """A special token's text in tokenizer_config.json (a string, or an
    added-token object with `content`); "" when absent, as the runtime."""
    v = tokenizer_config.get(key)
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else ""


def render_template(compiled, messages: list[dict], bos_token: str, eos_token: str,
                    add_generation_prompt: bool = True) -> str:
    """`messages` (`{role, content}`) rendered with the context the runtime
    gives a template (chat.rs `ChatTemplate::render`): `messages`,
    `add_generation_prompt`, `bos_token`, `eos_token`, `tools` none. A
    refusal raises ChatRefused with the template's message."""
    import jinja2

    try:
        return compiled.render(messages=[{"role": m["role"], "content": m["content"]} for m in messages],
                               add_generation_prompt=add_generation_prompt, bos_token=bos_token,
                               eos_token=eos_token, tools=None)
    except jinja2.exceptions.TemplateError as e:
        raise ChatRefused(f"the chat template refused the conversation: {e}") from None


# --- the target ------------------------------------------------------------


class TargetSpec:
    """A converted checkpoint directory and what the training tools read of
    it (no weights: `data.Target` loads them for generation, the trainer
    through the emitted family module)."""

    def __init__(self, arg: str | Path | None = None):
        self.dir = model_dir(arg)
        cfg_path = self.dir / "config.json"
        if not cfg_path.is_file():
            raise SystemExit(f"{self.dir}: no config.json (run `draftc fetch` first, or pass a converted checkpoint)")
        self.is_default = self.dir.resolve() == default_dir().resolve()
        self.config = json.loads(cfg_path.read_text())
        self.model_type = self.config.get("model_type")
        if self.model_type not in FAMILIES:
            raise SystemExit(f"{cfg_path}: model_type {self.model_type!r}; the training tools know "
                             f"{', '.join(FAMILIES)}")
        self.family = FAMILIES[self.model_type]
        self.family_file = REPO / "models" / f"{self.family}.draft"
        # transformers' default (and the runtime's) for an absent field: untied.
        self.tied = bool(self.config.get("tie_word_embeddings", False))
        self.vocab = int(self.config["vocab_size"])
        # The name `--model` takes back: a fetched model's, else the path.
        parent = self.dir.resolve().parent
        self.name = parent.name if self.dir.name == "float32" and parent.name in FETCHED else str(self.dir)
        tc_path = self.dir / "tokenizer_config.json"
        self.tokenizer_config = json.loads(tc_path.read_text()) if tc_path.is_file() else {}
        template = self.tokenizer_config.get("chat_template")
        if isinstance(template, list):  # a list of named templates: the default one, as the runtime
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
            if not isinstance(template, str):
                raise SystemExit(f"{tc_path}: chat_template is a list without a `default` template")
        self.template = None
        if template is None:
            self.chat = "raw"
            self.default_system = None
        elif isinstance(template, str) and is_chatml(template):
            self.chat = "chatml"
            self.default_system = default_system_prompt({"chat_template": template})
        elif isinstance(template, str):
            # Any other template: rendered as the runtime renders it. Its
            # default system text, if any, is the template's own business.
            self.chat = "template"
            self.default_system = None
            self.template = template
            try:
                self._compiled = compile_template(template)
            except Exception as e:  # jinja2.TemplateSyntaxError; the runtime refuses it at load too
                raise SystemExit(f"{tc_path}: chat template does not parse: {e}") from None
            self.bos_token = special_token(self.tokenizer_config, "bos_token")
            self.eos_token = special_token(self.tokenizer_config, "eos_token")
        else:
            raise SystemExit(f"{tc_path}: chat_template is neither a string nor a list of templates")
        eos = self.config.get("eos_token_id")
        self._eos = [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(self.dir / "tokenizer.json"))
        return self._tokenizer

    @functools.cached_property
    def runtime_eos_ids(self) -> list[int]:
        """The ids `draftc generate` stops on: config.json's `eos_token_id`,
        or the runtime's default for the family when it is absent
        (runtime/src/model/config.rs: Llama 2, Qwen none, Gemma 3 1), and
        those of a `generation_config.json` beside it (what transformers'
        `generate` stops on)."""
        if "eos_token_id" in self.config and self.config["eos_token_id"] is not None:
            ids = set(self._eos)
        else:
            ids = set({"llama": [2], "gemma3_text": [1]}.get(self.model_type, []))
        gen = self.dir / "generation_config.json"
        if gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            ids |= {int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None}
        return sorted(ids)

    @functools.cached_property
    def end_of_turn(self) -> int | None:
        """The special token a template writes right after an assistant
        turn's text (Llama 3's `<|eot_id|>`, Gemma's `<end_of_turn>`,
        Mistral's `</s>`, ChatML's `<|im_end|>`), found by rendering a short
        conversation; None when what follows is not one special token, or
        the template refuses the conversation."""
        if self.chat != "template":
            return None
        answer = "Hello there"
        try:
            text = self.render_messages([{"role": "user", "content": "Hi"},
                                         {"role": "assistant", "content": answer}], add_generation_prompt=False)
        except ChatRefused:
            return None
        at = text.rfind(answer)
        if at < 0:
            return None
        after = self.tokenizer.encode(text[at + len(answer):], add_special_tokens=False).ids
        specials = {i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special}
        return after[0] if after and after[0] in specials else None

    @property
    def eos_ids(self) -> list[int]:
        """The ids that end an answer: the runtime's stop ids (config.json's
        and generation_config.json's eos ids), and the template's end of a
        turn (ChatML's `<|im_end|>`, another template's end-of-turn token)."""
        ids = set(self.runtime_eos_ids)
        if self.chat == "chatml":
            im_end = self.tokenizer.token_to_id("<|im_end|>")
            if im_end is not None:
                ids.add(im_end)
        elif self.end_of_turn is not None:
            ids.add(self.end_of_turn)
        return sorted(ids)

    @property
    def prompt_format(self) -> str:
        """How a prompt becomes ids, in words (data manifests)."""
        if self.chat == "chatml":
            return "ChatML as runtime/src/model/tokenizer.rs renders it, add_generation_prompt"
        if self.chat == "template":
            digest = hashlib.sha256(self.template.encode()).hexdigest()[:16]
            return (f"the checkpoint's chat template (sha256 {digest}...) rendered as runtime/src/model/chat.rs "
                    "renders it (jinja2 set up as transformers' apply_chat_template; messages, bos_token, "
                    "eos_token), add_generation_prompt, encoded without added special tokens")
        return ("raw text, as `draftc generate --raw` encodes it (tokenizer.json's encode with its special "
                "tokens: the tokenizer's own <bos>); no chat template")

    def render_messages(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The text of a conversation (`{role, content}` dicts) as the
        runtime's `Tokenizer::chat_prompt` renders it (a template target)."""
        if self.chat != "template":
            raise ValueError(f"{self.name}: render_messages is for a chat-template target ({self.chat})")
        return render_template(self._compiled, messages, self.bos_token, self.eos_token, add_generation_prompt)

    def encode_messages(self, messages: list[dict]) -> list[int]:
        """The ids `Tokenizer::encode_chat` gives a conversation (a template
        target): its rendering with the generation prompt, encoded without
        added special tokens (the template writes its own)."""
        return self.tokenizer.encode(self.render_messages(messages), add_special_tokens=False).ids

    def encode_prompt(self, prompt: str, history: list[tuple[str, str]] = ()) -> list[int]:
        """The ids the Rust runtime feeds the target for `prompt` (after the
        conversation `history`; not for a raw target). A template that
        refuses the conversation raises ChatRefused."""
        if self.chat == "chatml":
            return self.tokenizer.encode(render_chat(prompt, self.default_system, history),
                                         add_special_tokens=False).ids
        if self.chat == "template":
            return self.encode_messages([{"role": r, "content": t} for r, t in history]
                                        + [{"role": "user", "content": prompt}])
        if history:
            raise SystemExit(f"{self.name}: a raw-text target has no turns to put a conversation in (--context)")
        return self.tokenizer.encode(prompt, add_special_tokens=True).ids

    def user_text(self, ids: list[int], n_prompt: int) -> str | None:
        """The user's text of a ChatML prompt's ids (the template stripped);
        None for a raw or another template's target (its text is the prompt
        list's, checked against the ids by `heldout-prompts`)."""
        if self.chat != "chatml":
            return None
        user, end = "<|im_start|>user\n", "<|im_end|>"
        text = self.tokenizer.decode(list(ids[:n_prompt]), skip_special_tokens=False)
        start = text.rfind(user)
        if start < 0 or end not in text[start:]:
            raise SystemExit(f"a held-out prompt has no user turn: {text[:80]!r}")
        return text[start + len(user):].split(end, 1)[0]

    def emit_args(self) -> list[str]:
        """`draftc emit`'s target flag: none for the default target (its
        preset, `smollm2-135m`), else the checkpoint directory."""
        return [] if self.is_default else ["--target", str(self.dir)]

    def describe(self) -> dict:
        """What a manifest records of the target."""
        return dict(model=self.name, model_type=self.model_type, family=f"models/{self.family}.draft",
                    vocab=self.vocab, tied_head=self.tied, prompt_format=self.chat, eos_ids=self.eos_ids)
