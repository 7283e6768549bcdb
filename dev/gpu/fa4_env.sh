#!/usr/bin/env bash
# Sourced by the GPU machine's scripts: where flash-attn-4 is installed there (FA4_SITE, default
# /tmp/fa4-site, outside the tree so that a later command on the same machine reuses it),
# fa4_keep_part1 and fa4_install, which install it from the wheel halves of dev/gpu/fa4_wheels.sh,
# and fa4_path, which puts it on PYTHONPATH when the install finished.
fa4_site=${FA4_SITE:-/tmp/fa4-site}
# fa4_keep_part1 ROOT: a .whl/fa4-part1 sent with this command is copied to /tmp/fa4-part1, where a
# later command on the same machine, sent with the second half, finds it.
fa4_keep_part1() {
  [[ -d $1/.whl/fa4-part1 ]] || return 0
  rm -rf /tmp/fa4-part1 && cp -r "$1/.whl/fa4-part1" /tmp/fa4-part1 && echo "fa4-part1 kept in /tmp"
}
# fa4_install ROOT: with both halves on the machine (ROOT/.whl/fa4-part2 and the first half in
# ROOT/.whl or /tmp), joins the split wheel, checks every wheel against SHA256SUMS and installs them
# into fa4_site, once per machine. Without them it does nothing.
fa4_install() {
  local root=$1 part1=$1/.whl/fa4-part1 part2=$1/.whl/fa4-part2 wheels first name w
  fa4_keep_part1 "$root"
  [[ -d $part1 ]] || part1=/tmp/fa4-part1
  [[ -d $part1 && -d $part2 && ! -f $fa4_site/.installed ]] || return 0
  echo "== installing flash-attn-4 from $part1 + $part2 into $fa4_site"
  wheels=$(mktemp -d)
  cp "$part2"/*.whl "$wheels/"
  for first in "$part1"/*.whl.part0; do
    name=$(basename "${first%.part0}")
    cat "$first" "$part2/$name.part1" >"$wheels/$name"
  done
  (cd "$wheels" && sha256sum -c --quiet "$part2/SHA256SUMS") || return 1
  rm -rf "$fa4_site" && mkdir -p "$fa4_site"
  if python3 -m pip --version >/dev/null 2>&1; then
    python3 -m pip install -q --no-deps --no-index --target "$fa4_site" "$wheels"/*.whl || return 1
  else  # no pip on the image: a wheel is a zip of its site-packages files
    for w in "$wheels"/*.whl; do python3 -m zipfile -e "$w" "$fa4_site" || return 1; done
  fi
  touch "$fa4_site/.installed"
  rm -rf "$wheels"
}
fa4_path() {
  [[ -f $fa4_site/.installed ]] || return 0
  # nvidia_cutlass_dsl_packages.pth would add dsl_packages/ in a site dir; --target is not one.
  export PYTHONPATH=$fa4_site:$fa4_site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
}
