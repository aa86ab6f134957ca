#!/usr/bin/env bash
# Here (with the training venv): stages the one thing tools/gpu/campaign.sh
# needs beyond what tools/gpu/stage.sh's calls leave in a warm machine's
# stage (the GGUF's parts and bin/draftc): the ShareGPT prompt selections,
# and the conversations of the first 6,400 later turns (data --context), in
# .gpu4/ (about 7 MB; git-ignored). After run.sh's calls, on the same warm
# machine and stage, the campaign is then one call:
#
#   bash tools/gpu/stage-campaign.sh
#   bash tools/gpu/slim.sh on 3                       # every drafter's weights and the data travel
#   #   device call, carry [.gpu4], timeout_s 600:  bash tools/gpu/campaign.sh run /root/stage 400
#   bash tools/gpu/slim.sh off
#
# On a bare machine, stage with tools/gpu/stage-train.sh instead (three
# calls: campaign.sh's header).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$(git rev-parse --git-dir)/info"
exclude="$(git rev-parse --git-dir)/info/exclude"
grep -qsx '/.gpu4/' "$exclude" || printf '/.gpu4/\n' >>"$exclude"
rm -rf .gpu4
mkdir -p .gpu4
bash tools/gpu/prompts.sh .gpu4/prompts.tar.xz
du -sh .gpu4
