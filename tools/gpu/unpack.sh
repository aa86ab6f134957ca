# Sourced by tools/gpu/campaign.sh and tools/gpu/train.sh in the
# repository's root, once they have read $what, $stage and $usage: what
# this call carried (.gpu1 to .gpu4, when present) goes to the stage;
# `unpack` then lists the stage and exits, and anything but `run` exits 2
# with $usage.
for d in .gpu1 .gpu2 .gpu3 .gpu4; do
  # -p: a carried file keeps its time, so a stage's newer draftc is not
  # replaced by an older draftc.xz left in a carry folder.
  [ -d "$d" ] && cp -np "$d"/* "$stage"/ 2>/dev/null
done
if [ "$what" = unpack ]; then
  ls -la "$stage"
  exit 0
fi
[ "$what" = run ] || { echo "$usage" >&2; exit 2; }
