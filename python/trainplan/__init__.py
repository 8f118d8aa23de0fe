"""trainplan from Python: plan the parallel layout of a large-model training run.

Each function runs the trainplan command of the same name inside this process, with the CLI's own
flag parsing and command code (no subprocess, no LibTorch), and returns what that command's
``--json FILE`` would hold, as plain dicts and lists::

    import trainplan
    p = trainplan.predict(model="llama3-8b", cluster="dgx-h100", gpus=8, global_batch=64, tp=2)
    p["time"]["step_s"], p["memory"]["peak_bytes"]

Flags are keyword arguments named as on the command line with ``_`` for ``-`` (``global_batch=``
for ``--global-batch``): numbers and strings as their text, lists and tuples as comma lists
(``zero=[1, 2]``), ``True``/``False`` as ``on``/``off`` for on|off flags and as present/absent for
switch flags (``exact_gpus=True``), ``None`` as not given. ``model=`` is a built-in name, a file or
folder path, a Hugging Face config ``dict`` (or trainplan model dict), or any config object with
``to_dict()`` (a ``transformers`` config). Bad input raises :class:`InputError`, whose text is
exactly the line the CLI prints; the CLI's notes (e.g. which sequence length a config got) are
issued as :class:`Note` warnings. See docs/python.md.
"""
from __future__ import annotations

import json as _json
import os as _os
import tempfile as _tempfile
import warnings as _warnings
from collections.abc import Mapping as _Mapping
from pathlib import Path as _Path

from . import _core

# (help is left out of __all__: `from trainplan import *` would hide the built-in help.)
__all__ = ["predict", "simulate", "search", "capacity", "data_dir", "InputError", "PlanError", "Note"]
__version__ = _core.VERSION


class InputError(ValueError):
    """Bad input. The message is the one line the trainplan CLI prints for it (exit status 2)."""


class PlanError(RuntimeError):
    """The command found nothing to return (exit status 3 without a JSON document, e.g. a plan
    simulate cannot cost); the message is the command's report."""


class Note(UserWarning):
    """A note the CLI prints on stderr ("trainplan predict: note: ..."), one warning per line."""


# The CLI's switch flags (given alone, without a value), by command; every other boolean flag
# takes on|off. A switch missing here reaches the CLI as --name=on, which it refuses by name;
# tests/python checks this table against each command's --help.
_SWITCHES = {"search": {"exact-gpus"}, "capacity": {"elastic"}}


def data_dir() -> str:
    """Where the built-in models/, topologies/, software/ and reliability/ are read: the
    TRAINPLAN_DATA_DIR environment variable when set (as for the CLI), else the copy installed
    inside this package, else the source tree this module was built from."""
    env = _os.environ.get("TRAINPLAN_DATA_DIR")
    if env:
        return env
    packaged = _Path(__file__).resolve().parent / "data"
    return str(packaged) if packaged.is_dir() else _core.BUILD_DATA_DIR


def _text(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back as the same double
    return _os.fspath(value) if isinstance(value, _os.PathLike) else str(value)


def _flag_args(command: str, flags: dict) -> list[str]:
    args = []
    for key, value in flags.items():
        if value is None:
            continue
        name = key.replace("_", "-")
        if isinstance(value, bool) and name in _SWITCHES.get(command, ()):
            if value:
                args.append("--" + name)
            continue
        if isinstance(value, (list, tuple, range)):
            value = ",".join(_text(v) for v in value)
        # --name=value: a value that starts with '-' is still the flag's value.
        args.append(f"--{name}={_text(value)}")
    return args


def _model_file(model, folder: str) -> tuple[str, str | None]:
    """The --model value for `model`, and the temporary file written for it (None for none)."""
    if isinstance(model, (str, _os.PathLike)):
        return _os.fspath(model), None
    if not isinstance(model, _Mapping) and callable(getattr(model, "to_dict", None)):
        model = model.to_dict()  # a transformers PretrainedConfig, or anything like it
    if not isinstance(model, _Mapping):
        raise TypeError(f"model= must be a name, a path, a config dict or an object with to_dict(), "
                        f"not {type(model).__name__}")
    # The file's stem names an unnamed Hugging Face config, as the CLI names a file: its model_type.
    stem = model.get("model_type") if isinstance(model.get("model_type"), str) else "model"
    if not stem or not stem.replace("-", "").replace("_", "").replace(".", "").isalnum():
        stem = "model"
    path = _os.path.join(folder, stem + ".json")
    with open(path, "w", encoding="utf-8") as f:
        _json.dump(dict(model), f, default=str)  # default=str: e.g. a torch.dtype in an old config
    return path, path


def _run(command: str, flags: dict):
    with _tempfile.TemporaryDirectory(prefix="trainplan-py-") as folder:
        written = None
        if flags.get("model") is not None:
            flags["model"], written = _model_file(flags["model"], folder)
        code, out, err, doc = _core.run(command, _flag_args(command, flags), data_dir())
    out = out.decode("utf-8", "replace")
    lines = err.decode("utf-8", "replace").splitlines()
    if written:  # name the dict, not a file the caller never saw
        lines = [line.replace(written, "model=<dict>") for line in lines]
    if code == 2:
        raise InputError(lines[-1] if lines else f"trainplan {command}: bad input")
    if code not in (0, 3):
        raise RuntimeError(lines[-1] if lines else f"trainplan {command}: exit status {code}")
    for line in lines:
        if ": note: " in line:
            _warnings.warn(line, Note, stacklevel=3)
    if not doc:
        raise PlanError(out.strip() or f"trainplan {command}: no result (exit status {code})")
    return _json.loads(doc)


def predict(*, model=None, cluster=None, gpus=None, global_batch=None, **flags) -> dict:
    """`trainplan predict`: memory and step time of one layout (trainplan/prediction/v1).
    An infeasible layout is returned too, with "feasible": false and its reasons."""
    return _run("predict", dict(model=model, cluster=cluster, gpus=gpus, global_batch=global_batch, **flags))


def simulate(*, model=None, cluster=None, gpus=None, global_batch=None, **flags) -> dict:
    """`trainplan simulate`: one step event by event, per rank (its --json document)."""
    return _run("simulate", dict(model=model, cluster=cluster, gpus=gpus, global_batch=global_batch, **flags))


def search(*, model=None, cluster=None, gpus=None, global_batch=None, **flags) -> dict:
    """`trainplan search`: every valid layout ranked, best first (trainplan/search/v1)."""
    return _run("search", dict(model=model, cluster=cluster, gpus=gpus, global_batch=global_batch, **flags))


def capacity(*, model=None, tokens=None, **flags) -> dict:
    """`trainplan capacity`: time, GPU-hours, cost and energy to train `tokens` tokens
    (trainplan/capacity/v1)."""
    return _run("capacity", dict(model=model, tokens=tokens, **flags))


def help(command: str) -> str:  # noqa: A001 - named as the CLI's --help
    """The CLI's --help text of `command` (predict, simulate, search, capacity): every flag."""
    code, out, err, _ = _core.run(command, ["--help"], data_dir())
    if code != 0:
        raise InputError(err.decode("utf-8", "replace").strip())
    return out.decode("utf-8", "replace")
