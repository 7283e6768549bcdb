#!/usr/bin/env python3
"""The include rule of docs/DESIGN.md: one layer per folder, and a file includes only from its own
layer or lower ones. Scans every C++/CUDA source under the layered folders for `#include "..."`
and fails (exit 1) on an include that reaches up, naming the file, the line, the include and the
rule it breaks.

    dev/check_layers.py [--root DIR]

Folders outside the table (tests/, bench/, python/, scripts/, dev/, notebooks/) may include anything;
generated headers (build_info.h, git_info.h) and system headers are not layered.
"""

import argparse
import os
import re
import sys

# Lowest first. A folder's subfolders (kernels/cuda, experiments/kinds) share its layer.
LAYERS = {
    "core": 1,
    "db": 2,
    "kernels": 2,
    "experiments": 3,
    "trials": 4,
    "replay": 4,
    "analysis": 5,
    "harness": 6,
}
SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


# Within harness/: the commands (cli/) use the run engine (runner/), never the reverse.
SUBLAYERS = {"harness/runner": 0, "harness/cli": 1}


def layer_of(relative_path):
    top = relative_path.split("/", 1)[0]
    return top, LAYERS.get(top)


def sublayer_of(relative_path):
    for folder, rank in SUBLAYERS.items():
        if relative_path.startswith(folder + "/"):
            return folder, rank
    return None, None


def violations(root):
    found = []
    for folder in sorted(LAYERS):
        for directory, _, files in os.walk(os.path.join(root, folder)):
            for name in sorted(files):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, root).replace(os.sep, "/")
                own_folder, own_layer = layer_of(relative)
                with open(path, encoding="utf-8", errors="replace") as source:
                    for number, line in enumerate(source, 1):
                        match = INCLUDE.match(line)
                        if not match or "/" not in match.group(1):
                            continue  # same-folder or generated header
                        included = match.group(1)
                        folder_included, layer_included = layer_of(included)
                        if layer_included is None:
                            found.append(f"{relative}:{number}: includes \"{included}\", which is in no layer "
                                         f"(layered folders: {', '.join(sorted(LAYERS, key=LAYERS.get))})")
                        elif layer_included > own_layer:
                            found.append(f"{relative}:{number}: includes \"{included}\" ({folder_included}/ is layer "
                                         f"{layer_included}) but {own_folder}/ is layer {own_layer}: a file includes "
                                         f"only from its own layer or lower ones (docs/DESIGN.md, Layout)")
                        elif layer_included == own_layer:
                            own_sub, own_rank = sublayer_of(relative)
                            sub_included, rank_included = sublayer_of(included)
                            if own_rank is not None and rank_included is not None and rank_included > own_rank:
                                found.append(f"{relative}:{number}: includes \"{included}\" but {own_sub}/ sits "
                                             f"below {sub_included}/ (harness/README.md)")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    missing = [folder for folder in LAYERS if not os.path.isdir(os.path.join(root, folder))]
    if missing:
        print(f"check_layers: {root} lacks the layered folders {', '.join(missing)}", file=sys.stderr)
        return 2
    found = violations(root)
    for line in found:
        print(line, file=sys.stderr)
    if found:
        print(f"check_layers: {len(found)} include(s) break the layering", file=sys.stderr)
        return 1
    print(f"check_layers: ok ({len(LAYERS)} layered folders under {root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
