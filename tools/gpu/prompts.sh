#!/usr/bin/env bash
# Here (with the training venv): builds the ShareGPT prompt selections the
# training tools cache (from the wheels here) and the conversations of the
# first 6,400 later turns, which tools/gpu/campaign.sh answers later turns
# with (data --context), in the draftc cache ($DRAFTC_CACHE, else
# ~/.cache/draftc); with TAR, packs them into TAR for a stage
# (tools/gpu/stage-train.sh, tools/gpu/stage-campaign.sh). The toy campaign
# (runtime/tests/campaign_toy.rs) builds them with it too.
#
#   bash tools/gpu/prompts.sh [TAR]
set -euo pipefail
cd "$(dirname "$0")/../.."
cache="${DRAFTC_CACHE:-$HOME/.cache/draftc}"
(cd tools/train && ../../.venv-train/bin/python -c '
from tokenizers import Tokenizer
from draftc_train import prompts as P, data as D
tok = Tokenizer.from_file(str(D.default_model_dir() / "tokenizer.json"))
for s in P.SOURCES:
    print(s, len(P.training_prompts(tok, s)[0]), "prompts")
print(P.write_contexts(tok, 6400))')
[ -z "${1:-}" ] || tar -C "$cache" -cJf "$1" prompts
