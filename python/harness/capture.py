"""Capture the failing attention step of a training job, without editing the job.

    python -m harness.capture [--out DIR] [--max-bytes N] [--nan-check] -- train.py ARGS
    python -m harness.capture --out DIR -m package.module ARGS     # like python -m
    torchrun --nproc-per-node 4 -m harness.capture --out DIR -- train.py ARGS
    with harness.capture("captures"):                              # in code
        train()
    HARNESS_CAPTURE=DIR launcher ...                               # the installed package's .pth starts it

While it is active, every `torch.nn.attention.flex_attention.flex_attention` call (also through
`torch.compile(flex_attention)`) and every `torch.nn.functional.scaled_dot_product_attention` call
is observed: shapes, dtypes, the BlockMask or attn_mask, scale, enable_gqa, whether the op was
compiled. The inputs of the most recent calls stay referenced (not copied) within a byte budget,
grad_out is caught by a tensor hook when the backward reaches the call, and on CUDA the caching
allocator records its history. When an exception leaves an observed call, a backward
(`torch.autograd.backward` / `grad`) or the script, the failing call's step is written to DIR
(harness/capture_file.py) and the exception goes on unchanged, so the job fails as before. Nothing
is written when nothing fails. Then: `harness triage DIR/capture-....safetensors`.

What it cannot see: attention calls inside a graph that torch.compile traced (a compiled model):
the compiled graph runs them, not the Python functions patched here. A compiled *attention*
(`torch.compile(flex_attention)`) is observed through its inputs and outputs; a compiled model is
observed only in its failure (exception, allocator snapshot). python/README.md, "Capture".
"""

import argparse
import collections
import functools
import inspect
import json
import os
import runpy
import sys
import threading
import time
import traceback
import types

DEFAULT_OUT_DIR = "harness-captures"
DEFAULT_MAX_BYTES = 2 << 30
#: Observed calls whose description is kept (their tensors only within the byte budget).
_MAX_CALL_RECORDS = 256
#: Allocator events kept by the memory history (PyTorch's ring buffer).
_MEMORY_HISTORY_ENTRIES = 100_000

_state = None            # the active _Capture, or None
_state_lock = threading.Lock()
_oom_observer_attached = False


def _tensor_bytes(tensor):
    return tensor.numel() * tensor.element_size()


def _meta(tensor):
    """What a call's description needs of a tensor: the objects themselves, formatted at write time
    (a call pays for four attribute reads, not for strings)."""
    return tensor.shape, tensor.dtype, tensor.device, tensor.requires_grad


def _format_meta(meta):
    shape, dtype, device, requires_grad = meta
    return {"shape": list(shape), "dtype": str(dtype).replace("torch.", ""), "device": str(device),
            "requires_grad": bool(requires_grad)}


class _Call:
    """One observed attention call: its description, and its tensors while the budget keeps them."""

    def __init__(self, index, op, compiled, compile_options):
        self.index = index
        self.op = op
        self.compiled = compiled
        self.compile_options = compile_options
        self.tensors = {}          # q, k, v, out, grad_out: references, not copies
        self.mask = None           # the BlockMask, or an SDPA attn_mask tensor
        self.kept_bytes = 0
        self.dropped = None        # why the tensors are gone, once they are
        self.metas = {}            # q, k, v, out, attn_mask: _meta tuples
        self.block_mask = None     # (BLOCK_SIZE, seq_lengths, list shape, mask_mod name) of a BlockMask
        self.info = {}             # scale, enable_gqa, the mask's description ...
        self.grad_out_caught = False
        self.watched = None        # the input whose gradient tells that the call's backward is done
        self.watched_grad = False
        self.forward_error = False

    def describe(self):
        description = {"index": self.index, "op": self.op, "compiled": self.compiled,
                       **{name: _format_meta(meta) for name, meta in self.metas.items()}, **self.info,
                       "grad_out_caught": self.grad_out_caught,
                       "tensors_kept": sorted(self.tensors) if self.dropped is None else [],
                       "kept_bytes": self.kept_bytes if self.dropped is None else 0}
        if self.block_mask is not None:
            block_size, lengths, shape, mask_mod = self.block_mask
            description["block_mask"] = {"block_size": [int(x) for x in block_size],
                                         "seq_lengths": [int(x) for x in lengths], "shape": list(shape),
                                         "mask_mod": mask_mod}
        if self.watched is not None:
            description["input_grad_arrived"] = {self.watched: self.watched_grad}
        if self.compile_options is not None:
            description["compile_options"] = self.compile_options
        if self.dropped is not None:
            description["tensors_dropped"] = self.dropped
        if self.forward_error:
            description["forward_error"] = True
        return description


class Options:
    """What a capture does (the flags of `python -m harness.capture`)."""

    def __init__(self, out_dir=None, max_bytes=DEFAULT_MAX_BYTES, nan_check=False, memory_history="python",
                 max_capsules=1):
        self.out_dir = os.path.abspath(out_dir or DEFAULT_OUT_DIR)
        if int(max_bytes) < 0:
            raise ValueError(f"capture: max_bytes must be >= 0 (got {max_bytes})")
        self.max_bytes = int(max_bytes)
        self.nan_check = bool(nan_check)
        if memory_history not in ("python", "all", "off"):
            raise ValueError(f"capture: memory_history must be python, all or off (got {memory_history!r})")
        self.memory_history = memory_history
        if int(max_capsules) < 1:
            raise ValueError(f"capture: max_capsules must be >= 1 (got {max_capsules})")
        self.max_capsules = int(max_capsules)

    def to_env(self):
        return {"HARNESS_CAPTURE": self.out_dir, "HARNESS_CAPTURE_MAX_BYTES": str(self.max_bytes),
                "HARNESS_CAPTURE_NAN_CHECK": "1" if self.nan_check else "0",
                "HARNESS_CAPTURE_MEMORY_HISTORY": self.memory_history,
                "HARNESS_CAPTURE_MAX_CAPSULES": str(self.max_capsules)}

    @classmethod
    def from_env(cls, environ=os.environ):
        return cls(out_dir=environ.get("HARNESS_CAPTURE") or None,
                   max_bytes=int(environ.get("HARNESS_CAPTURE_MAX_BYTES", DEFAULT_MAX_BYTES)),
                   nan_check=environ.get("HARNESS_CAPTURE_NAN_CHECK", "0") == "1",
                   memory_history=environ.get("HARNESS_CAPTURE_MEMORY_HISTORY", "python"),
                   max_capsules=int(environ.get("HARNESS_CAPTURE_MAX_CAPSULES", "1")))


# ---- the hooks' entry points: plain functions of the call's index, so that no hook holds a tensor ----

def _on_grad_out(index, grad):
    state = _state
    if state is not None:
        state.grad_out(index, grad)


def _on_out_of_memory(device, alloc, device_allocated, device_free):
    # Attached once per process (the allocator has no detach): it hands the event to the active capture.
    state = _state
    if state is not None:
        state._on_oom(device, alloc, device_allocated, device_free)


def _on_input_grad(index, grad):
    state = _state
    if state is not None:
        state.input_grad(index)


class _Capture:
    def __init__(self, options):
        import torch

        self.torch = torch
        self.options = options
        self.lock = threading.RLock()
        self.calls = collections.deque()    # _Call, oldest first (descriptions capped at _MAX_CALL_RECORDS)
        self.holding = collections.deque()  # the calls whose tensors are kept, oldest first
        self.next_index = 0
        self.kept_bytes = 0
        self.written = []             # paths of the capture files written
        self.seen_errors = set()      # id() of exceptions already handled
        self.oom_event = None         # the allocator's failing request, with the snapshot then
        self.oom_snapshot = None
        self.memory_history = "off"
        self.cuda_devices = set()
        self.patches = []             # (object, attribute name, original value)
        self.started = time.time()
        self.bookkeeping_warned = False
        self.cuda_started = False

    # ---- observing -----------------------------------------------------------------------------

    def observe(self, op, function, args, kwargs, parameters, compiled, compile_options):
        """Runs `function(*args, **kwargs)`, the attention op, observing it."""
        call = self._guard(self._begin, op, args, kwargs, parameters, compiled, compile_options)
        try:
            result = function(*args, **kwargs)
            if call is not None:
                self._guard(self._after, call, result)
                if self.options.nan_check:
                    self._check_output(call, result)
        except BaseException as error:
            if call is not None:
                call.forward_error = True
            self.failure(error, "forward")
            raise
        return result

    def _guard(self, method, *args):
        # The capture's own bookkeeping never fails the job: a problem there is reported once and
        # that call goes unobserved.
        try:
            return method(*args)
        except Exception as error:  # noqa: BLE001
            if not self.bookkeeping_warned:
                self.bookkeeping_warned = True
                print(f"harness.capture: could not observe an attention call ({type(error).__name__}: {error}); "
                      f"the job goes on", file=sys.stderr)
            return None

    def _check_output(self, call, result):
        torch = self.torch
        out = result if isinstance(result, torch.Tensor) else result[0]
        if not bool(torch.isfinite(out.detach()).all()):
            raise FloatingPointError(f"harness.capture --nan-check: the output of {call.op} call {call.index} "
                                     f"holds NaN or Inf")

    def _begin(self, op, args, kwargs, parameters, compiled, compile_options):
        torch = self.torch
        named = dict(zip(parameters, args))
        named.update(kwargs)
        q, k, v = named.get("query"), named.get("key"), named.get("value")
        if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
            return None
        with self.lock:
            call = _Call(self.next_index, op, compiled, compile_options)
            self.next_index += 1
            call.metas.update(q=_meta(q), k=_meta(k), v=_meta(v))
            info = call.info
            scale = named.get("scale")
            info["scale"] = None if scale is None else float(scale)
            info["enable_gqa"] = bool(named.get("enable_gqa", False))
            if op == "flex_attention":
                block_mask = named.get("block_mask")
                score_mod = named.get("score_mod")
                info["score_mod"] = None if score_mod is None else getattr(score_mod, "__qualname__", repr(score_mod))
                info["return_lse"] = bool(named.get("return_lse", False)) or named.get("return_aux") is not None
                kernel_options = named.get("kernel_options")
                info["kernel_options"] = None if kernel_options is None else {key: repr(value) for key, value in
                                                                              dict(kernel_options).items()}
                if block_mask is not None:
                    call.mask = block_mask
                    call.block_mask = (block_mask.BLOCK_SIZE, block_mask.seq_lengths, block_mask.kv_num_blocks.shape,
                                       getattr(block_mask.mask_mod, "__qualname__", None))
            else:
                attn_mask = named.get("attn_mask")
                info["is_causal"] = bool(named.get("is_causal", False))
                info["dropout_p"] = float(named.get("dropout_p", 0.0) or 0.0)
                if isinstance(attn_mask, torch.Tensor):
                    call.metas["attn_mask"] = _meta(attn_mask)
                    call.mask = attn_mask
            if q.is_cuda:
                self.cuda_devices.add(q.device.index or 0)
                self._start_cuda_recording()
            self.calls.append(call)
            if len(self.calls) > _MAX_CALL_RECORDS:
                oldest = self.calls.popleft()
                if oldest.dropped is None and oldest.kept_bytes:
                    self.holding.remove(oldest)
                    self._drop(oldest, "")
            self._keep(call, {"q": q, "k": k, "v": v}, call.mask if isinstance(call.mask, torch.Tensor) else None)
            return call

    def _after(self, call, result):
        torch = self.torch
        out = result if isinstance(result, torch.Tensor) else result[0] if isinstance(result, (tuple, list)) else None
        if not isinstance(out, torch.Tensor):
            return
        call.metas["out"] = _meta(out)
        with self.lock:
            if call.dropped is None:
                self._keep(call, {"out": out})
        if out.requires_grad:
            out.register_hook(functools.partial(_on_grad_out, call.index))
            # One input's gradient tells that the call's backward is done. Hooks on non-leaf inputs live
            # on their grad_fn, which goes with the step's graph; one on a leaf would stay on it for good.
            for name in ("q", "k", "v"):
                tensor = call.tensors.get(name)
                if tensor is not None and tensor.requires_grad and tensor.grad_fn is not None:
                    call.watched = name
                    tensor.register_hook(functools.partial(_on_input_grad, call.index))
                    break

    def _find(self, index):
        for call in reversed(self.calls):
            if call.index == index:
                return call
        return None

    def grad_out(self, index, grad):
        with self.lock:
            call = self._find(index)
            if call is None:
                return
            call.grad_out_caught = True
            if call.dropped is None:
                self._keep(call, {"grad_out": grad})
        if self.options.nan_check and not bool(self.torch.isfinite(grad).all()):
            raise FloatingPointError(f"harness.capture --nan-check: the gradient reaching {call.op} call {call.index} "
                                     f"(grad_out) holds NaN or Inf")

    def input_grad(self, index):
        with self.lock:
            call = self._find(index)
            if call is not None:
                call.watched_grad = True

    # ---- the byte budget -----------------------------------------------------------------------

    def _keep(self, call, tensors, extra=None):
        added = sum(_tensor_bytes(t) for t in tensors.values()) + (0 if extra is None else _tensor_bytes(extra))
        call.tensors.update(tensors)
        if not call.kept_bytes:
            self.holding.append(call)
        call.kept_bytes += added
        self.kept_bytes += added
        # The oldest calls go first; the newest is kept while it alone fits.
        while self.kept_bytes > self.options.max_bytes and self.holding:
            self._drop(self.holding.popleft(), f"over the byte budget of {self.options.max_bytes} bytes")

    def _drop(self, call, why):
        if call.dropped is None:
            self.kept_bytes -= call.kept_bytes
            call.tensors = {}
            call.mask = None
            call.dropped = why or "older than the calls kept"

    # ---- CUDA: allocator history and the failing request --------------------------------------

    def _start_cuda_recording(self):
        if self.cuda_started or self.options.memory_history == "off" or _state is not self:
            return
        self.cuda_started = True
        torch = self.torch
        try:
            torch.cuda.memory._record_memory_history(context="all", stacks=self.options.memory_history,
                                                     max_entries=_MEMORY_HISTORY_ENTRIES)
            self.memory_history = self.options.memory_history
        except Exception as error:  # noqa: BLE001 - the history is evidence, never a reason to fail the job
            self.memory_history = f"unavailable: {error}"
        global _oom_observer_attached
        if not _oom_observer_attached:
            try:
                torch._C._cuda_attach_out_of_memory_observer(_on_out_of_memory)
                _oom_observer_attached = True
            except Exception:  # noqa: BLE001
                pass

    def _on_oom(self, device, alloc, device_allocated, device_free):
        # Called by the caching allocator at the failing request, before the exception exists: the
        # snapshot now shows what held the memory when it ran out.
        if self.oom_event is not None:
            return
        self.oom_event = {"device": int(device), "requested_bytes": int(alloc), "device_allocated_bytes": int(device_allocated),
                          "device_free_bytes": int(device_free), "time": time.time()}
        try:
            self.oom_snapshot = self.torch.cuda.memory._snapshot()
        except Exception as error:  # noqa: BLE001
            self.oom_event["snapshot_error"] = str(error)

    # ---- failure ---------------------------------------------------------------------------------

    def failure(self, error, where):
        """An exception left an observed call ("forward"), a backward ("backward") or the script
        ("script"): write the capture file once for it."""
        if isinstance(error, (KeyboardInterrupt, GeneratorExit)):
            return
        if isinstance(error, SystemExit):
            return
        with self.lock:
            if id(error) in self.seen_errors:
                return
            self.seen_errors.add(id(error))
            if len(self.written) >= self.options.max_capsules:
                return
            if not self.calls and self.oom_event is None:
                print(f"harness.capture: {type(error).__name__} before any attention call was observed; nothing to "
                      f"capture", file=sys.stderr)
                return
            try:
                path = self._write(error, where)
            except Exception as write_error:  # noqa: BLE001 - never hide the job's own exception
                print(f"harness.capture: could not write the capture file: {type(write_error).__name__}: {write_error}",
                      file=sys.stderr)
                return
        self.written.append(path)
        print(f"harness.capture: {type(error).__name__} captured in {path}\n"
              f"harness.capture: next: harness triage {path}", file=sys.stderr)

    def at_exit(self):
        """An allocator OOM that no handler saw (the job caught it and exited): write it anyway."""
        if self.oom_event is not None and not self.written:
            error = MemoryError(f"CUDA out of memory (seen by the allocator's observer; the exception itself never "
                                f"reached the capture): tried to allocate {self.oom_event['requested_bytes']} bytes")
            self.failure(error, "exit")

    def _failing_call(self, where):
        """The call whose step is written, and how the failure relates to it."""
        with_tensors = [call for call in self.calls if call.dropped is None and "q" in call.tensors]
        for call in reversed(with_tensors):
            if call.forward_error:
                return call, {"phase": "forward", "in_attention": True,
                              "detail": f"the exception left {call.op} call {call.index} itself (its forward)"}
        if where in ("backward", "script", "exit"):
            for call in reversed(with_tensors):
                if call.grad_out_caught:
                    inside = call.watched is None or not call.watched_grad
                    detail = (f"in the backward of {call.op} call {call.index}: its grad_out had arrived, the gradient of "
                              f"its input {call.watched} had not" if call.watched is not None and inside else
                              f"in the backward of {call.op} call {call.index}: its grad_out had arrived (its inputs' "
                              f"gradients are not watched: they are leaves)" if inside else
                              f"in the backward, after {call.op} call {call.index} had delivered its input gradients")
                    return call, {"phase": "backward", "in_attention": inside, "detail": detail}
        if with_tensors:
            call = with_tensors[-1]
            return call, {"phase": "backward" if where == "backward" else "outside", "in_attention": False,
                          "detail": f"outside the attention calls (the last observed one, {call.op} call {call.index}, "
                                    f"is the step written)"}
        return None, {"phase": "backward" if where == "backward" else "outside", "in_attention": False,
                      "detail": "no observed call has its tensors (over the byte budget, or none observed)"}

    def _mask_tables(self, call, notes):
        torch = self.torch
        from harness import mask_tables

        q_len = call.metas["q"][0][-2]
        kv_len = call.metas["k"][0][-2]
        if call.op == "flex_attention":
            if call.mask is None:
                return {}, {"type": "full"}
            tables, block = mask_tables.block_mask_tables(call.mask, q_len, kv_len)
            return tables, {"type": "blockmask", "block_size": list(block)}
        if call.mask is not None:
            mask = call.mask
            if mask.dtype != torch.bool:
                finite = torch.isfinite(mask)
                if bool((mask[finite] != 0).any()) or bool((mask[~finite] > 0).any()):
                    notes.append("the SDPA attn_mask is additive with values other than 0 and -inf: no boolean mask "
                                 "describes it, so the step cannot be replayed")
                    return {}, {"type": "unsupported", "why": "additive attn_mask"}
                mask = finite
            if call.info.get("is_causal"):
                notes.append("attn_mask and is_causal both given")
            tables, block = mask_tables.dense_mask_tables(mask)
            return tables, {"type": "blockmask", "block_size": list(block)}
        if call.info.get("is_causal"):
            # SDPA's is_causal is top-left aligned: query i sees keys j <= i.
            causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril()
            tables, block = mask_tables.dense_mask_tables(causal)
            return tables, {"type": "blockmask", "block_size": list(block)}
        return {}, {"type": "full"}

    def _write(self, error, where):
        from harness import capture_file

        torch = self.torch
        os.makedirs(self.options.out_dir, exist_ok=True)
        rank = capture_file.rank_info()
        stem = capture_file.capture_stem(self.options.out_dir, rank["rank"])
        notes = []
        call, failure = self._failing_call(where)
        failure["where"] = where
        tensors = {}
        meta = None
        if call is not None:
            for name in ("q", "k", "v", "grad_out", "out"):
                if name in call.tensors:
                    try:
                        tensors[name] = call.tensors[name].detach().to("cpu").contiguous()
                    except Exception as copy_error:  # noqa: BLE001 - a broken device loses that tensor only
                        notes.append(f"{name} could not be copied from {call.tensors[name].device}: {copy_error}")
            try:
                mask_tensors, mask_description = self._mask_tables(call, notes)
            except Exception as mask_error:  # noqa: BLE001
                mask_tensors, mask_description = {}, {"type": "unsupported",
                                                      "why": f"the mask could not be evaluated: {mask_error}"}
                notes.append(mask_description["why"])
            tensors.update(mask_tensors)
            meta = {"name": "captured_step", "dims": {}, "mask": mask_description,
                    "captured": {"op": call.op, "call": call.index, "compiled": call.compiled}}
            if call.info.get("scale") is not None:
                meta["scale"] = call.info["scale"]
            if call.op == "flex_attention" and call.info.get("score_mod"):
                meta["score_mod"] = call.info["score_mod"]
            if call.info.get("dropout_p"):
                meta["dropout_p"] = call.info["dropout_p"]
            if "grad_out" not in tensors:
                meta["grad_out"] = "drawn"  # the import draws one (seeded) for a step that failed before it
        snapshot_file = None
        snapshot = self.oom_snapshot
        if snapshot is None and self.memory_history not in ("off",) and not self.memory_history.startswith("unavailable"):
            try:
                snapshot = torch.cuda.memory._snapshot()
            except Exception as snapshot_error:  # noqa: BLE001
                notes.append(f"no allocator snapshot: {snapshot_error}")
        if snapshot is not None:
            import pickle

            snapshot_file = stem + ".memory.pickle"
            with open(snapshot_file + ".tmp", "wb") as stream:
                pickle.dump(snapshot, stream)
            os.replace(snapshot_file + ".tmp", snapshot_file)
        header = {
            "format": capture_file.CAPTURE_FORMAT,
            "version": capture_file.CAPTURE_VERSION,
            "exception": {"type": f"{type(error).__module__}.{type(error).__qualname__}".replace("builtins.", ""),
                          "message": str(error),
                          "traceback": _full_traceback(error)},
            "failure": failure,
            "step_call": None if call is None else call.index,
            "rank": rank,
            "process": {"pid": os.getpid(), "argv": list(sys.argv), "cwd": os.getcwd(), "python": sys.executable,
                        "started": self.started, "failed": time.time()},
            "env": capture_file.env_fingerprint(self.cuda_devices),
            "memory": {"history": self.memory_history, "oom": self.oom_event,
                       "snapshot": None if snapshot_file is None else os.path.basename(snapshot_file)},
            "options": {"max_bytes": self.options.max_bytes, "nan_check": self.options.nan_check},
            "calls_observed": self.next_index,
            "calls": [c.describe() for c in self.calls],
            "notes": notes,
        }
        metadata = {"capture": json.dumps(header)}
        if meta is not None and "q" in tensors and "k" in tensors and "v" in tensors:
            metadata["meta"] = json.dumps(meta)
        path = stem + ".safetensors"
        capture_file.write_safetensors(path, tensors, metadata)
        return path

    # ---- patching --------------------------------------------------------------------------------

    def _patch(self, owner, name, replacement):
        self.patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def install(self):
        torch = self.torch
        import torch.nn.functional as functional
        import torch.nn.attention.flex_attention as flex_module

        originals = {}
        flex = flex_module.flex_attention
        originals[id(flex)] = _observed(flex, "flex_attention")
        sdpa = functional.scaled_dot_product_attention
        originals[id(sdpa)] = _observed(sdpa, "scaled_dot_product_attention")
        self._patch(flex_module, "flex_attention", originals[id(flex)])
        self._patch(functional, "scaled_dot_product_attention", originals[id(sdpa)])
        # Modules imported before the capture started hold their own reference (`from ... import
        # flex_attention`): point those at the observed functions too (torch's own modules excepted).
        for module in list(sys.modules.values()):
            module_name = getattr(module, "__name__", "") or ""
            if not isinstance(module, types.ModuleType) or module_name.split(".")[0] in ("torch", "harness"):
                continue
            try:
                names = [key for key, value in vars(module).items() if id(value) in originals and value in (flex, sdpa)]
            except Exception:  # noqa: BLE001 - a module whose namespace cannot be read is left alone
                continue
            for key in names:
                self._patch(module, key, originals[id(getattr(module, key))])
        self._patch(torch, "compile", _observed_compile(torch.compile, (flex, originals[id(flex)])))
        self._patch(torch.autograd, "backward", _guarded(torch.autograd.backward, "backward"))
        self._patch(torch.autograd, "grad", _guarded(torch.autograd.grad, "backward"))
        self._patch_spawn()
        self._start_cuda_when_ready()

    def _patch_spawn(self):
        # Children started with multiprocessing's spawn or forkserver (torch.multiprocessing.spawn)
        # run under the same capture: their `python -c "...spawn_main(...)"` starts it first.
        import multiprocessing.spawn as spawn

        original = spawn.get_command_line
        settings = self.options.to_env()
        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

        @functools.wraps(original)
        def get_command_line(**kwargs):
            command = original(**kwargs)
            if "-c" not in command or getattr(sys, "frozen", False):
                return command
            at = command.index("-c") + 1
            command[at] = (f"import sys; sys.path.insert(0, {package_parent!r}); import harness.capture; "
                           f"harness.capture._run_child({settings!r}, {command[at]!r})")
            return command

        self._patch(spawn, "get_command_line", get_command_line)

    def _start_cuda_when_ready(self):
        torch = self.torch
        try:
            if not torch.cuda.is_available():
                return
            if torch.cuda.is_initialized():
                self._start_cuda_recording()
            else:
                # At CUDA's lazy initialization, not now: starting CUDA here would change the job
                # (a context before a fork, before CUDA_VISIBLE_DEVICES is set).
                torch.cuda._lazy_call(self._start_cuda_recording)
        except Exception:  # noqa: BLE001 - the first CUDA attention call starts it then
            pass

    def uninstall(self):
        for owner, name, original in reversed(self.patches):
            setattr(owner, name, original)
        self.patches = []
        if self.memory_history not in ("off",) and not self.memory_history.startswith("unavailable"):
            try:
                self.torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:  # noqa: BLE001
                pass


def _full_traceback(error):
    """The traceback Python will print when the exception reaches the top: an exception caught where
    it left a backward or an attention call only carries the frames below that point, so the frames
    above it (the script's `loss.backward()` and its callers) come from the stack. The capture's own
    frames are left out."""
    own = os.path.abspath(__file__)
    def shown(frame):  # not the capture's frames, nor runpy's (python -m harness.capture runs the script through it)
        return os.path.abspath(frame.filename) != own and frame.filename != "<frozen runpy>"

    below = [frame for frame in traceback.extract_tb(error.__traceback__) if shown(frame)]
    above = [frame for frame in traceback.extract_stack()[:-1] if shown(frame)]
    if error.__traceback__ is not None and error.__traceback__.tb_frame.f_code.co_filename == __file__:
        frames = above + below          # caught by the capture: add the callers
    else:
        frames = below                  # caught at the top: the traceback is complete
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)]
    lines += traceback.format_exception_only(type(error), error)
    return "".join(lines)


def _parameter_names(function):
    try:
        return [name for name, parameter in inspect.signature(function).parameters.items()
                if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        # A builtin without a signature (scaled_dot_product_attention in some versions).
        return ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]


def _observed(function, op, compiled=False, compile_options=None, parameters=None):
    """`function` (an attention op, or its compiled form) with every call observed while a capture
    is active. While torch.compile traces it, it is the original: a traced graph has no hooks."""
    import torch

    names = parameters or _parameter_names(function)

    @functools.wraps(function)
    def observed(*args, **kwargs):
        state = _state
        if state is None or torch.compiler.is_compiling():
            return function(*args, **kwargs)
        return state.observe(op, function, args, kwargs, names, compiled, compile_options)

    observed.__harness_observed__ = function
    return observed


def _observed_compile(compile_function, flex_forms):
    """torch.compile, except that compiling flex_attention gives a compiled flex_attention whose
    calls are observed (their inputs and outputs; the kernels inside are the compiled ones)."""
    flex = flex_forms[0]

    @functools.wraps(compile_function)
    def compile(model=None, *args, **kwargs):
        if model is None:  # @torch.compile(...) as a decorator factory
            return lambda function: compile(function, *args, **kwargs)
        if any(model is form for form in flex_forms):
            options = {key: repr(value) for key, value in kwargs.items()}
            return _observed(compile_function(flex, *args, **kwargs), "flex_attention", compiled=True,
                             compile_options=options, parameters=_parameter_names(flex))
        return compile_function(model, *args, **kwargs)

    return compile


def _guarded(function, where):
    """torch.autograd.backward / grad, writing the capture file when the backward raises."""

    @functools.wraps(function)
    def guarded(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except BaseException as error:
            state = _state
            if state is not None:
                state.failure(error, where)
            raise

    return guarded


# ---- starting and stopping ---------------------------------------------------------------------------

def start(options=None):
    """Starts capturing in this process (idempotent: a second start keeps the first one's options).
    Returns the active capture."""
    global _state
    with _state_lock:
        if _state is not None:
            return _state
        state = _Capture(options or Options())
        _state = state  # before install: a CUDA already initialized starts its history there
        try:
            state.install()
        except BaseException:
            _state = None
            state.uninstall()
            raise
        return state


def stop():
    """Stops capturing and restores everything patched. Returns the capture files written."""
    global _state
    with _state_lock:
        state, _state = _state, None
    if state is None:
        return []
    state.uninstall()
    return list(state.written)


def written():
    """The capture files this process wrote so far."""
    state = _state
    return [] if state is None else list(state.written)


class capture:  # noqa: N801 - used as `with harness.capture(DIR):`, like a function
    """`with harness.capture(DIR, max_bytes=..., nan_check=...):` captures a failing step of the
    block (see the module's docstring) and lets the exception go on. Inside an active capture
    (`python -m harness.capture`) it adds nothing."""

    def __init__(self, out_dir=None, *, max_bytes=DEFAULT_MAX_BYTES, nan_check=False, memory_history="python",
                 max_capsules=1):
        self.options = Options(out_dir, max_bytes, nan_check, memory_history, max_capsules)
        self._owner = False

    def __enter__(self):
        self._owner = _state is None
        self.state = start(self.options)
        return self

    @property
    def written(self):
        return list(self.state.written)

    def __exit__(self, kind, error, trace):
        if error is not None:
            self.state.failure(error, "script")
        if self._owner:
            stop()
        return False


# ---- python -m harness.capture --------------------------------------------------------------------------

_VALUE_OPTIONS = ("--out", "--max-bytes", "--memory-history", "--max-capsules")


def _split(argv):
    """(the capture's own options, how to run the job, the job's arguments): everything after
    `--`, `-m MODULE`, `-c CODE` or the first word that is no option belongs to the job."""
    ours = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return ours, ("script", argv[i + 1] if i + 1 < len(argv) else None), argv[i + 2:]
        if word in ("-m", "-c"):
            return ours, ("module" if word == "-m" else "code", argv[i + 1] if i + 1 < len(argv) else None), argv[i + 2:]
        if not word.startswith("-"):
            return ours, ("script", word), argv[i + 1:]
        ours.append(word)
        if word in _VALUE_OPTIONS and i + 1 < len(argv):
            ours.append(argv[i + 1])
            i += 1
        i += 1
    return ours, (None, None), []


def _parse(argv):
    parser = argparse.ArgumentParser(
        prog="python -m harness.capture",
        description="Run a training script unchanged; when a step fails, write its attention step, the exception "
                    "and the allocator state for `harness triage`, and fail as before.",
        usage="python -m harness.capture [options] (-- script.py | -m module | -c code) [args ...]")
    parser.add_argument("--out", default=os.environ.get("HARNESS_CAPTURE") or DEFAULT_OUT_DIR,
                        help=f"folder for the capture files (default ./{DEFAULT_OUT_DIR}, or $HARNESS_CAPTURE)")
    parser.add_argument("--max-bytes", type=_byte_size, default=DEFAULT_MAX_BYTES,
                        help="bytes of the recent calls' tensors kept referenced (default 2GiB; 512MiB, 1e9 ...)")
    parser.add_argument("--nan-check", action="store_true",
                        help="also fail on NaN/Inf in an attention output or its grad_out (one device sync per call)")
    parser.add_argument("--memory-history", choices=["python", "all", "off"], default="python",
                        help="CUDA allocator history: Python stacks (default), Python and C++ stacks, or none")
    parser.add_argument("--max-capsules", type=int, default=1, help="capture files one process writes at most (default 1)")
    ours, (mode, target), rest = _split(argv)
    args = parser.parse_args(ours)
    if mode is None or target is None:
        parser.error("name what to run: -- train.py ARGS, -m module ARGS or -c code ARGS")
    if args.max_capsules < 1:
        parser.error("--max-capsules must be at least 1")
    return args, mode, target, rest


def _byte_size(text):
    units = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}
    cleaned = text.strip().lower().replace(" ", "")
    number = cleaned.rstrip("kmgib")
    unit = cleaned[len(number):]
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 2GiB, 512MiB, 1000000)") from None
    if unit not in units or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 2GiB, 512MiB, 1000000)")
    return int(value * units[unit])


def _run_as_python(mode, target, rest):
    """Runs the job the way `python script.py`, `python -m module` or `python -c code` would."""
    if mode == "code":
        sys.argv = ["-c", *rest]
        main_module = types.ModuleType("__main__")
        main_module.__builtins__ = __builtins__
        sys.modules["__main__"] = main_module
        exec(compile(target, "<string>", "exec"), main_module.__dict__)  # noqa: S102 - what `python -c` does
    elif mode == "module":
        sys.argv = [target, *rest]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *rest]
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")


def main(argv=None):
    args, mode, target, rest = _parse(sys.argv[1:] if argv is None else argv)
    if mode == "script" and not os.path.isfile(target):
        print(f"python -m harness.capture: {target}: no such file", file=sys.stderr)
        return 2
    options = Options(args.out, args.max_bytes, args.nan_check, args.memory_history, args.max_capsules)
    # Processes the job starts by other routes (a launcher's workers, subprocesses) see the same
    # settings; with the package installed, its .pth starts the capture in them (python/README.md).
    os.environ.update(options.to_env())
    state = start(options)
    import atexit

    atexit.register(state.at_exit)
    try:
        _run_as_python(mode, target, rest)
    except BaseException as error:
        state.failure(error, "script")
        raise
    return 0


def _run_child(settings, program):
    """A multiprocessing child of a captured job: the capture first, then multiprocessing's own
    `python -c` program (which runs the child's target and exits with its code)."""
    os.environ.update(settings)
    state = start(Options.from_env())
    import atexit

    atexit.register(state.at_exit)
    _run_as_python("code", program, sys.argv[1:])


class _CallableModule(types.ModuleType):
    """`harness.capture` is this module once it is imported; calling it is `capture(...)`."""

    def __call__(self, *args, **kwargs):
        return capture(*args, **kwargs)


if __name__ == "__main__":
    # Run through the module of that name, so that the script's own `import harness.capture` (and
    # the patched functions) share one state with the runner.
    import harness.capture as _capture_module

    sys.exit(_capture_module.main())
else:
    sys.modules[__name__].__class__ = _CallableModule

__all__ = ["capture", "start", "stop", "written", "main", "Options", "DEFAULT_OUT_DIR", "DEFAULT_MAX_BYTES"]
