#!/usr/bin/env bash
# Sourced by the GPU machine's scripts: where flash-attn-4 is installed there (FA4_SITE, default
# /tmp/fa4-site, outside the tree so that a later command on the same machine reuses it; installed by
# dev/gpu/gpu_check_bench.sh from the wheel halves), and fa4_path, which puts it on PYTHONPATH when
# the install finished.
fa4_site=${FA4_SITE:-/tmp/fa4-site}
fa4_path() {
  [[ -f $fa4_site/.installed ]] || return 0
  # nvidia_cutlass_dsl_packages.pth would add dsl_packages/ in a site dir; --target is not one.
  export PYTHONPATH=$fa4_site:$fa4_site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
}
