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
  turn, ``<|im_start|>assistant\\n``); a checkpoint without one (a base
  model such as Gemma 3 270M) gets each prompt as raw text, encoded as
  ``draftc generate --raw`` encodes it (the tokenizer's own special tokens
  added: Gemma's ``<bos>``). Other templates are refused by name;
- the ids that end an answer (``eos_token_id``, one or a list, and ChatML's
  ``<|im_end|>``), the vocabulary, and a tied or untied head;
- for ``draftc emit``, the target sizes: a non-default target is passed as
  ``--target DIR``, so a drafter's module is compiled against the
  checkpoint's own ``config.json``, as the runtime compiles it when it runs.

No torch here: ``record-tau`` and the prompt selection import it.
"""

from __future__ import annotations

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
        if template is None:
            self.chat = "raw"
            self.default_system = None
        elif isinstance(template, str) and is_chatml(template):
            self.chat = "chatml"
            self.default_system = default_system_prompt({"chat_template": template})
        else:
            raise SystemExit(f"{tc_path}: the training tools render ChatML templates (SmolLM2's, Qwen's) or "
                             "none (raw text); this chat template is neither")
        eos = self.config.get("eos_token_id")
        self._eos = [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(self.dir / "tokenizer.json"))
        return self._tokenizer

    @property
    def eos_ids(self) -> list[int]:
        """The ids that end an answer: the checkpoint's eos ids, and
        ChatML's `<|im_end|>`."""
        ids = set(self._eos)
        if self.chat == "chatml":
            im_end = self.tokenizer.token_to_id("<|im_end|>")
            if im_end is not None:
                ids.add(im_end)
        return sorted(ids)

    @property
    def prompt_format(self) -> str:
        """How a prompt becomes ids, in words (data manifests)."""
        if self.chat == "chatml":
            return "ChatML as runtime/src/model/tokenizer.rs renders it, add_generation_prompt"
        return ("raw text, as `draftc generate --raw` encodes it (tokenizer.json's encode with its special "
                "tokens: the tokenizer's own <bos>); no chat template")

    def encode_prompt(self, prompt: str, history: list[tuple[str, str]] = ()) -> list[int]:
        """The ids the Rust runtime feeds the target for `prompt` (after the
        conversation `history`, ChatML only)."""
        if self.chat == "chatml":
            return self.tokenizer.encode(render_chat(prompt, self.default_system, history),
                                         add_special_tokens=False).ids
        if history:
            raise SystemExit(f"{self.name}: a raw-text target has no turns to put a conversation in (--context)")
        return self.tokenizer.encode(prompt, add_special_tokens=True).ids

    def user_text(self, ids: list[int], n_prompt: int) -> str | None:
        """The user's text of a ChatML prompt's ids (the template stripped);
        None for a raw target (its text is the prompt list's)."""
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
