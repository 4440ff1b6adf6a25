"""Exceptions the library raises. The CLI maps each family to one exit code."""
from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence

_QUOTED = re.compile(r"`([a-z][a-z0-9_]*)`")  # an option named by its key, as the library's messages name them


class MptError(Exception):
    """Base class for every error mpt reports to the user as a one-line message."""


class ConfigError(MptError):
    """Bad configuration: YAML, list files, presets, plans, options. Holds every problem found.

    `fields` says which option each problem is about, parallel to `errors`
    ("" where none): a problem about `max_evals` starts with "max_evals:", so
    a front end can name its own flag (`--max-evals`) instead. A problem about
    two options starts with both, joined by " and ".
    """

    def __init__(self, errors: list[str] | str, *, source: str | None = None,
                 fields: Sequence[str] = ()) -> None:
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        self.source = source
        self.fields = tuple(fields[:len(self.errors)]) + ("",) * (len(self.errors) - len(fields))
        prefix = f"{source}: " if source else ""
        if len(self.errors) == 1:
            msg = prefix + self.errors[0]
        else:
            msg = prefix + f"{len(self.errors)} problems:\n" + "\n".join(f"  - {e}" for e in self.errors)
        super().__init__(msg)

    def respelled(self, names: Mapping[str, str]) -> ConfigError:
        """This error with each option named in backticks (`overwrite`) written as a front end spells it
        (`names["overwrite"]`, e.g. "overwrite=True" for Python), so the fix it names is one the caller can type."""
        def spell(text: str) -> str:
            return _QUOTED.sub(lambda m: names.get(m.group(1), m.group(0)), text)
        made = copy.copy(self)
        made.errors = [spell(e) for e in self.errors]
        made.args = (spell(str(self)),)
        return made


class UserCodeError(MptError):
    """The user's model file failed: import, build_model, evaluate or example_inputs."""

    def __init__(self, message: str, *, where: str | None = None, original: BaseException | None = None) -> None:
        self.where = where
        self.original = original
        super().__init__(message if where is None else f"{message} ({where})")


class PlanMismatchError(MptError):
    """A plan or checkpoint does not fit the model it is applied to."""


class DeviceError(MptError):
    """The device cannot run the requested dtype."""


class OutOfMemory(DeviceError):
    """The machine ran out of memory (tuner.core.memory): one message wherever it hits, exit 2.

    mpt retried once where it could (a trial's evaluation); `original` is the allocator's error.
    """

    def __init__(self, message: str, *, original: BaseException | None = None) -> None:
        self.original = original
        super().__init__(message + "; free memory, make the batches in evaluate/example_inputs smaller, or use a "
                         "device with more memory")


class OutputError(MptError):
    """An output could not be written (disk full, permission): names the path and the cause."""


class DeployError(MptError, RuntimeError):
    """A plan the search approved cannot run on this machine once loaded (`tuner.load`'s torch.autocast path).

    Raised by `tuner.engine.probe.autocast_failures` when a failure under
    torch.autocast cannot be worked around by keeping submodules in FP32.
    `modules` holds the submodules found (path -> reason) before it gave up.
    A RuntimeError too, like the torch error it stands for.
    """

    def __init__(self, message: str, *, modules: dict[str, str] | None = None) -> None:
        self.modules = dict(modules or {})
        super().__init__(message)


class OutputFolderBusy(ConfigError):
    """Another mpt run holds the output folder's lock."""


class Interrupted(BaseException):
    """SIGTERM, turned into an exception by the CLI so it unwinds like Ctrl-C.

    A BaseException, like KeyboardInterrupt, so `except Exception` in mpt or in
    the user's code does not swallow it. The tune session treats both the same:
    it stops and keeps the best plan confirmed so far.
    """


def exc_line(exc: BaseException, limit: int | None = None) -> str:
    """`Type: first line of the message` (shortened to `limit` characters), for one-line reports of torch errors."""
    text = (str(exc).strip().splitlines() or [""])[0]
    if limit is not None and len(text) > limit:
        text = text[:limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
