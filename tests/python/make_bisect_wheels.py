#!/usr/bin/env python3
"""Builds the wheels `harness bisect`'s tests install: one tiny pure-Python package,
`harness_probe_pkg`, in versions 1.0 ... 1.7, whose behaviour changes at one release.

    make_bisect_wheels.py OUT_DIR [--versions 1.0,1.1,...] [--flip-at 1.5] [--broken 1.3 ...]

Standard library only (a wheel is a zip archive holding the package, METADATA, WHEEL and a RECORD
of sha256 hashes), so the tests need no network and no build backend. What a version does:

- `flipped`: 0 before the flip version, 1 from it on: the verdict the bisect searches;
- `peak_bytes`: 1 MiB before the flip, 2 MiB from it on, each repeat within 1 % of that: a metric
  regression far outside the noise;
- `step_ms`: 10 ms before the flip, 10.3 ms (+3 %) from it on, each repeat spread over +-8 %: a
  shift inside the noise, which a noise-aware comparison must not call.

A `--broken` version's wheel is written truncated (not a valid zip archive), so installing it fails
the way a damaged download or a bad upload does; bisect must skip that version.
"""
import argparse
import base64
import hashlib
import io
import pathlib
import sys
import zipfile

PACKAGE = "harness_probe_pkg"
DEFAULT_VERSIONS = [f"1.{minor}" for minor in range(8)]

# The module each version installs. Only the constants differ between versions; the jitter is the
# same fixed sequence for every version, so that results do not depend on when a test runs.
MODULE_TEMPLATE = '''"""harness_probe_pkg {version}: a fixture of harness bisect's tests (tests/python/make_bisect_wheels.py)."""
__version__ = "{version}"
FLIPPED = {flipped}
PEAK_BYTES = {peak_bytes}
STEP_MS = {step_ms}

# Fixed per-repeat offsets in [-1, 1]: the noise of the measurement.
_JITTER = [0.0, 0.9, -0.7, 0.4, -1.0, 0.6, -0.3, 1.0, -0.5, 0.2]


def measure(repeats):
    """What the probe script prints: one value per repeat for each metric."""
    def series(base, spread):
        return [base * (1.0 + spread * _JITTER[i % len(_JITTER)]) for i in range(repeats)]
    return {{"flipped": 1 if FLIPPED else 0, "peak_bytes": series(PEAK_BYTES, 0.01),
             "step_ms": series(STEP_MS, 0.08)}}
'''


def version_key(version):
    return tuple(int(part) for part in version.split("."))


def record_hash(data):
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def wheel_bytes(version, flipped):
    dist_info = f"{PACKAGE}-{version}.dist-info"
    files = {
        f"{PACKAGE}/__init__.py": MODULE_TEMPLATE.format(
            version=version, flipped=flipped, peak_bytes=2 * 1048576 if flipped else 1048576,
            step_ms=10.3 if flipped else 10.0).encode(),
        f"{dist_info}/METADATA": (f"Metadata-Version: 2.1\nName: {PACKAGE.replace('_', '-')}\nVersion: {version}\n"
                                  "Summary: Fixture of harness bisect's tests\n").encode(),
        f"{dist_info}/WHEEL": (b"Wheel-Version: 1.0\nGenerator: make_bisect_wheels\nRoot-Is-Purelib: true\n"
                               b"Tag: py3-none-any\n"),
    }
    record = "".join(f"{name},{record_hash(data)},{len(data)}\n" for name, data in files.items())
    record += f"{dist_info}/RECORD,,\n"
    files[f"{dist_info}/RECORD"] = record.encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))  # reproducible bytes
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--versions", default=",".join(DEFAULT_VERSIONS), help="comma-separated, e.g. 1.0,1.1")
    parser.add_argument("--flip-at", default="1.5", help="first version with the new behaviour")
    parser.add_argument("--broken", action="append", default=[], help="a version whose wheel is truncated")
    args = parser.parse_args()
    versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    try:
        flip = version_key(args.flip_at)
        keys = {v: version_key(v) for v in versions}
    except ValueError:
        sys.exit(f"make_bisect_wheels: versions are dotted numbers (got --versions {args.versions!r}, "
                 f"--flip-at {args.flip_at!r})")
    for broken in args.broken:
        if broken not in versions:
            sys.exit(f"make_bisect_wheels: --broken {broken} is not one of the versions {', '.join(versions)}")
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for version in versions:
        data = wheel_bytes(version, keys[version] >= flip)
        if version in args.broken:
            data = data[: len(data) // 3]  # cut inside the archive: no central directory, not a zip
        path = out / f"{PACKAGE}-{version}-py3-none-any.whl"
        temporary = path.with_suffix(".whl.tmp")
        temporary.write_bytes(data)
        temporary.replace(path)
    print(f"{len(versions)} wheels of {PACKAGE} in {out} (flip at {args.flip_at}"
          + (f", broken: {', '.join(args.broken)}" if args.broken else "") + ")")


if __name__ == "__main__":
    main()
