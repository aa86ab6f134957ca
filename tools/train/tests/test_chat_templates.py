"""The training tools' prompt ids for any chat template (draftc_train.targets).

    .venv-train/bin/python -m unittest discover -s tools/train/tests -v

- every rendering of `runtime/tests/fixtures/chat_templates.json` (what
  transformers' `apply_chat_template` gives several real templates' styles,
  and what the runtime's own test checks its minijinja rendering against)
  is what the tools render, refusals included;
- the tools' prompt ids are transformers' `apply_chat_template(...,
  tokenize=True)` ids on the same tokenizer (the tiny in-repository one
  with the templates' special tokens, and SmolLM2's and Gemma 3's real
  ones where `draftc fetch` has cached them);
- the ChatML path (SmolLM2's template) gives the ids the jinja2 path gives
  for the same template, so the two agree where both apply;
- eos ids: the template's end-of-turn token is one (Llama 3's
  `<|eot_id|>`, Gemma's `<end_of_turn>`, Mistral's `</s>`);
- `data --context` cuts a history the template refuses.

The runtime side (`Tokenizer::encode_chat` on the same directories) is
`runtime/tests/train_chat_templates.rs`.
"""

from __future__ import annotations

import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import chat_template_cases as C  # noqa: E402
from draftc_train import targets as T  # noqa: E402


def hf_tokenizer(d: Path, template: str):
    """transformers' tokenizer for a directory's tokenizer.json with the
    template and the special tokens of its tokenizer_config.json."""
    import json

    from transformers import PreTrainedTokenizerFast

    tc = json.loads((d / "tokenizer_config.json").read_text())
    return PreTrainedTokenizerFast(tokenizer_file=str(d / "tokenizer.json"),
                                   bos_token=T.special_token(tc, "bos_token") or None,
                                   eos_token=T.special_token(tc, "eos_token") or None,
                                   chat_template=template)


class ChatTemplates(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dirs = C.build(Path(cls.tmp.name))
        cls.fixture = C.fixture()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_fixture_renderings(self):
        """Every fixture case, with and without the generation prompt."""
        f = self.fixture
        n = refused = 0
        for case in f["cases"]:
            name = case["template"]
            conv = f["conversations"][case["conversation"]]
            gen = case["add_generation_prompt"]
            spec = T.TargetSpec(self.dirs[name])
            if spec.chat == "chatml":
                # SmolLM2's template takes the ChatML path; the jinja2 one
                # renders it too.
                compiled = T.compile_template(f["templates"][name])
                render = lambda c, g: T.render_template(compiled, c, f["bos_token"], f["eos_token"], g)  # noqa: E731
            else:
                render = spec.render_messages
            with self.subTest(template=name, conversation=case["conversation"], generation_prompt=gen):
                if "text" in case:
                    self.assertEqual(render(conv, gen), case["text"])
                else:
                    refused += 1
                    with self.assertRaises(T.ChatRefused) as e:
                        render(conv, gen)
                    self.assertIn(case["error"], str(e.exception))
                n += 1
        self.assertEqual(n, len(f["cases"]))
        self.assertGreater(refused, 0)
        print(f"\n  {n} fixture renderings ({refused} refused) reproduced", file=sys.stderr)

    def test_prompt_ids_are_transformers_ids(self):
        """encode_prompt / encode_messages against apply_chat_template's ids
        (no special tokens added: the template writes its own bos)."""
        checked = 0
        for name, d in self.dirs.items():
            spec = T.TargetSpec(d)
            template = spec.template if spec.chat == "template" else spec.tokenizer_config["chat_template"]
            if "strftime_now" in template:
                # transformers writes today's date; the runtime and the tools
                # have no strftime_now and write the template's fallback.
                text = spec.render_messages(C.conversations()[0])
                self.assertIn("Today Date: 26 Jul 2024", text)
                continue
            hf = hf_tokenizer(d, template)
            for ci, conv in enumerate(C.conversations()):
                h = C.as_history(conv)
                with self.subTest(dir=name, conversation=ci):
                    try:
                        want = hf.apply_chat_template(conv, tokenize=True, add_generation_prompt=True)
                    except Exception as e:  # jinja2's TemplateError: refused, here too
                        self.assertEqual(spec.chat, "template", e)
                        with self.assertRaises(T.ChatRefused) as mine:
                            spec.encode_messages(conv)
                        self.assertIn(str(e), str(mine.exception))
                        continue
                    if spec.chat == "template":
                        self.assertEqual(spec.encode_messages(conv), want)
                    if h is not None:
                        self.assertEqual(spec.encode_prompt(*h), want)
                    elif spec.chat == "chatml":
                        continue
                    checked += 1
        self.assertGreater(checked, 30)
        print(f"\n  {checked} conversations' ids equal transformers' over {len(self.dirs)} directories "
              f"({', '.join(self.dirs)})", file=sys.stderr)

    def test_chatml_path_equals_the_template_path(self):
        """SmolLM2's template: the ChatML path's ids (unchanged) are the
        jinja2 path's for the same template."""
        for name in ("smollm2", "smollm2_real"):
            if name not in self.dirs:
                continue
            spec = T.TargetSpec(self.dirs[name])
            self.assertEqual(spec.chat, "chatml")
            compiled = T.compile_template(spec.tokenizer_config["chat_template"])
            bos = T.special_token(spec.tokenizer_config, "bos_token")
            eos = T.special_token(spec.tokenizer_config, "eos_token")
            for conv in C.conversations():
                h = C.as_history(conv)
                if h is None:
                    continue
                text = T.render_template(compiled, conv, bos, eos)
                self.assertEqual(spec.encode_prompt(*h), spec.tokenizer.encode(text, add_special_tokens=False).ids)

    def test_eos_ids(self):
        tok = C.tiny_tokenizer()
        eos, eot, eot_gemma = tok.token_to_id("</s>"), tok.token_to_id("<|eot_id|>"), tok.token_to_id("<end_of_turn>")
        im_end = tok.token_to_id("<|im_end|>")
        want = {"llama3_style": [eos, eot], "llama31_style": [eos, eot], "gemma_style": [eos, eot_gemma],
                "gemma3_it": [eos, eot_gemma], "qwen25_style": [im_end, eos], "block_style": [eos],
                # no eos_token_id in its config.json: the runtime's Llama default, 2 (`<|im_end|>` here)
                "mistral_style": [2, eos], "smollm2": [im_end, eos], "indented_style": [eos]}
        for name, ids in want.items():
            with self.subTest(template=name):
                self.assertEqual(T.TargetSpec(self.dirs[name]).eos_ids, sorted(ids))
        self.assertEqual(T.TargetSpec(self.dirs["mistral_style"]).runtime_eos_ids, [2])
        if "gemma3_it_real" in self.dirs:
            spec = T.TargetSpec(self.dirs["gemma3_it_real"])
            self.assertEqual((spec.eos_ids, spec.runtime_eos_ids), ([1, 106], [1]))
            self.assertEqual(spec.tokenizer.id_to_token(106), "<end_of_turn>")

    def test_prompt_format_and_describe(self):
        spec = T.TargetSpec(self.dirs["gemma3_it"])
        self.assertEqual(spec.describe()["prompt_format"], "template")
        self.assertIn("chat template (sha256 ", spec.prompt_format)
        self.assertIsNone(spec.user_text([1, 2, 3], 3))
        self.assertIsNone(spec.default_system)
        chatml = T.TargetSpec(self.dirs["smollm2"])
        self.assertEqual(chatml.prompt_format, "ChatML as runtime/src/model/tokenizer.rs renders it, add_generation_prompt")

    def test_refused_and_unparsable_templates(self):
        import json

        d = Path(self.tmp.name) / "broken"
        C.write_dir(d, json.loads((self.dirs["gemma3_it"] / "config.json").read_text()),
                    (self.dirs["gemma3_it"] / "tokenizer.json").read_text(),
                    {"chat_template": "{% for m in messages %}{{ m.content }"})
        with self.assertRaises(SystemExit) as e:
            T.TargetSpec(d)
        self.assertIn("does not parse", str(e.exception))
        C.write_dir(d, json.loads((self.dirs["gemma3_it"] / "config.json").read_text()),
                    (self.dirs["gemma3_it"] / "tokenizer.json").read_text(),
                    {"chat_template": [{"name": "tool_use", "template": "x"}]})
        with self.assertRaises(SystemExit) as e:
            T.TargetSpec(d)
        self.assertIn("without a `default`", str(e.exception))

    def test_context_history_cut_until_the_template_accepts_it(self):
        """`data --context`: a ShareGPT history that opens with the
        assistant's turn, or has two user turns in a row, is cut from the
        oldest turn until Gemma's template takes it."""
        from draftc_train import data

        spec = T.TargetSpec(self.dirs["gemma3_it"])

        class Target:
            encode_prompt = staticmethod(spec.encode_prompt)

        conv = object.__new__(data.Conversations)
        conv.tokens = 10_000
        conv.turns = {"r": [{"from": "gpt", "value": "Earlier."}, {"from": "human", "value": "One"},
                            {"from": "human", "value": "Two"}, {"from": "gpt", "value": "Answer."}]}
        ids = conv.encode(Target, {"id": "r#4", "prompt": "Three"})
        want = spec.encode_messages([{"role": "user", "content": "Two"}, {"role": "assistant", "content": "Answer."},
                                     {"role": "user", "content": "Three"}])
        self.assertEqual(ids, want)


if __name__ == "__main__":
    unittest.main()
