"""The file `harness.capture` writes when a step fails (python/README.md, "Capture file").

One safetensors file per failure, `capture-rank<R>-pid<P>.safetensors` (`capture-pid<P>...` when no
RANK is set): the failing attention call's tensors under the names `harness replay --import` reads
(q, k, v, grad_out, out; replay/README.md) and its mask as tables (harness/mask_tables.py), with two
metadata strings: `meta` (what the import reads: mask description, dims) and `capture` (the
exception, where it happened, every observed call, the env fingerprint, the rank, the allocator
state). The allocator snapshot at the failing request, when there is one, lies beside it as
`<stem>.memory.pickle` (the pickle `torch.cuda.memory._dump_snapshot` writes; memory_viz opens it).

The safetensors format is written here (8-byte header length, JSON header, the tensors' bytes back to
back), so capturing needs no package beyond torch.
"""

import ctypes
import json
import os
import platform
import socket
import struct
import sys

import torch

#: "format" of the capture header.
CAPTURE_FORMAT = "harness-capture"
CAPTURE_VERSION = 1

_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
                       torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}

#: Environment variables the fingerprint keeps (the launcher's view of this process).
_ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
             "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_PROCID",
             "SLURM_LOCALID", "SLURM_NODEID", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_COMPILE_DEBUG")


def write_safetensors(path, tensors, metadata):
    """Writes `tensors` ({name: tensor}) and `metadata` ({str: str}) as a safetensors file at `path`
    (through a temporary file and a rename, so a reader never sees half of it)."""
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name, tensor in tensors.items():
        dtype = _SAFETENSORS_DTYPES.get(tensor.dtype)
        if dtype is None:
            raise TypeError(f"capture: tensor {name!r} has dtype {tensor.dtype}, which the capture file cannot hold")
        data = tensor.detach().to("cpu").contiguous()
        # The bytes straight from the tensor's memory: numpy is not a dependency of harness or of torch.
        raw = ctypes.string_at(data.data_ptr(), data.numel() * data.element_size()) if data.numel() else b""
        header[name] = {"dtype": dtype, "shape": list(data.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for raw in blobs:
            out.write(raw)
    os.replace(temporary, path)


def read_safetensors_metadata(path):
    """The metadata strings of a safetensors file (for tests and tools)."""
    with open(path, "rb") as stream:
        (length,) = struct.unpack("<Q", stream.read(8))
        return json.loads(stream.read(length)).get("__metadata__", {})


def _package_version(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001 - a missing or broken distribution is "not installed"
        return None


def env_fingerprint(devices):
    """What ran the job: versions, GPUs (of `devices`, the CUDA devices the calls used), env vars."""
    fingerprint = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": _package_version("triton"),
        "env": {key: os.environ[key] for key in _ENV_KEYS if key in os.environ},
    }
    try:
        fingerprint["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # noqa: BLE001 - the fingerprint never fails the capture
        fingerprint["cudnn"] = None
    gpus = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index in sorted(devices):
            try:
                properties = torch.cuda.get_device_properties(index)
                gpus.append({"index": index, "name": properties.name, "capability": f"{properties.major}.{properties.minor}",
                             "total_memory_bytes": properties.total_memory})
            except Exception as error:  # noqa: BLE001
                gpus.append({"index": index, "error": str(error)})
    fingerprint["gpus"] = gpus
    return fingerprint


def rank_info():
    """RANK, LOCAL_RANK and WORLD_SIZE as torchrun (or Slurm) set them; None where unset."""
    def number(*keys):
        for key in keys:
            value = os.environ.get(key)
            if value is not None and value.lstrip("-").isdigit():
                return int(value)
        return None

    return {"rank": number("RANK", "SLURM_PROCID"), "local_rank": number("LOCAL_RANK", "SLURM_LOCALID"),
            "world_size": number("WORLD_SIZE", "SLURM_NTASKS")}


def capture_stem(out_dir, rank):
    """`<out_dir>/capture-rank<R>-pid<P>` (or `capture-pid<P>`), not yet taken."""
    base = f"capture-rank{rank}-pid{os.getpid()}" if rank is not None else f"capture-pid{os.getpid()}"
    stem = os.path.join(out_dir, base)
    suffix = 1
    while os.path.exists(stem + ".safetensors"):
        suffix += 1
        stem = os.path.join(out_dir, f"{base}-{suffix}")
    return stem


__all__ = ["CAPTURE_FORMAT", "CAPTURE_VERSION", "write_safetensors", "read_safetensors_metadata", "env_fingerprint",
           "rank_info", "capture_stem"]
