"""Stand-ins for the modules a verl release imports but its logging path never uses.

Used by scripts/verl_fixture_driver.py in the driver process and in its Ray actor.
"""

import os
import sys

# Top-level packages that verl imports but the logging path does not use. They are replaced by
# empty modules whose attributes are inert classes (and `is_*` functions that return False).
STUBBED = [
    "transformers", "vllm", "sglang", "liger_kernel", "megatron", "peft",
    "accelerate", "datasets", "torchdata", "wandb", "pylatexenc", "PIL", "transfer_queue",
    "uvicorn", "fastapi", "starlette", "openai", "aiohttp", "regex",
]
# flash_attn too, before 0.8: those releases import it unconditionally. 0.8+ fall back to torch
# code for unpad_input and friends when it is missing, and need that fallback here.
STUBBED_BEFORE_0_8 = ["flash_attn"]


def release_tuple(release):
    return tuple(int(p) for p in release.split(".")[:3] if p.isdigit())



def install_stubs(release):
    """Make imports of STUBBED packages succeed with inert modules (idempotent)."""
    import importlib.abc
    import importlib.machinery
    import types

    if any(getattr(f, "_verl_fixture_stub", False) for f in sys.meta_path):
        return
    stubbed = set(STUBBED) | (set(STUBBED_BEFORE_0_8) if release_tuple(release) < (0, 8) else set())

    class _Meta(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Meta(name, (_Stub,), {})

    class _Stub(metaclass=_Meta):
        def __init__(self, *a, **k):
            pass

        def __call__(self, *a, **k):
            return _Stub()

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Stub()

        def __bool__(self):
            return False

        def __iter__(self):
            return iter(())

    class _Module(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            value = (lambda *a, **k: False) if name.startswith("is_") else _Meta(name, (_Stub,), {})
            setattr(self, name, value)
            return value

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        _verl_fixture_stub = True

        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in stubbed:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            module = _Module(spec.name)
            module.__path__ = []
            module.__version__ = "0.0.0"
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, _Finder())


def install_bert_padding():
    """flash_attn.bert_padding in plain torch, for 0.8 (which imports it with no fallback).

    The padding helpers only move tokens between padded (batch, seqlen, ...) and packed
    (total_tokens, ...) layouts; written here from their documented behaviour.
    """
    import types

    import torch

    def index_first_axis(tensor, indices):
        return tensor.reshape(-1, *tensor.shape[2:])[indices] if tensor.dim() > 2 else tensor.reshape(-1)[indices]

    def unpad_input(hidden_states, attention_mask, unused_mask=None):
        seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)
        indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
        cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
        flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
        return flat[indices], indices, cu_seqlens, int(seqlens.max()), seqlens

    def pad_input(hidden_states, indices, batch, seqlen):
        out = torch.zeros(batch * seqlen, *hidden_states.shape[1:], dtype=hidden_states.dtype)
        out[indices] = hidden_states
        return out.reshape(batch, seqlen, *hidden_states.shape[1:])

    def rearrange(tensor, pattern, **sizes):
        raise NotImplementedError(f"rearrange({pattern!r}) is not needed by the logging path")

    package = types.ModuleType("flash_attn")
    package.__path__ = []
    module = types.ModuleType("flash_attn.bert_padding")
    module.index_first_axis, module.unpad_input = index_first_axis, unpad_input
    module.pad_input, module.rearrange = pad_input, rearrange
    package.bert_padding = module
    sys.modules["flash_attn"], sys.modules["flash_attn.bert_padding"] = package, module


class Quiet:
    """Silence file descriptors 1 and 2 (import-time warnings about stubbed engines)."""

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = os.dup(1), os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
        return self

    def __exit__(self, *exc):
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        os.close(self.saved[0])
        os.close(self.saved[1])
        return False
