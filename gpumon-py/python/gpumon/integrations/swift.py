"""ms-swift integration: the transformers :class:`~gpumon.integrations.transformers.GpumonCallback`
in the forms each ms-swift release takes.

**ms-swift 4.x** (tested: 4.6.0) — a plugin file registers ``gpumon`` in ms-swift's
``callbacks_map``; name it with ``--callbacks``::

    swift sft --model ... --dataset ... \\
        --external_plugins "$(python -m gpumon.integrations.swift --plugin-path)" \\
        --callbacks gpumon

ms-swift calls the registered factory with its training arguments and the trainer (4.6:
``(args, trainer)``, 4.0: ``(trainer)``); :func:`gpumon_callback` takes any of these forms,
keywords included, and returns a fresh ``GpumonCallback``. The callback's settings come from
the environment: ``GPUMON_SWIFT_BACKEND`` (``auto`` | ``nvml`` | ``mock``; default ``auto``),
``GPUMON_SWIFT_EVERY_N_STEPS`` (default 1), ``GPUMON_SWIFT_PER_GPU`` (``1`` adds per-GPU keys).
Your own plugin file can register other settings instead::

    from swift.callbacks import callbacks_map
    from gpumon.integrations.swift import callback_factory

    callbacks_map["gpumon"] = callback_factory(every_n_steps=10, backend="nvml")

From ms-swift's Python API, add the callback to the trainer ms-swift has built, with
``attach`` (placed before the reporting callbacks) or the Hugging Face ``add_callback``::

    from swift.pipelines import SwiftSft
    from gpumon.integrations.transformers import GpumonCallback

    class GpumonSft(SwiftSft):
        def train(self, trainer):
            GpumonCallback().attach(trainer)  # or: trainer.add_callback(GpumonCallback())
            return super().train(trainer)

    GpumonSft(["--model", "...", "--dataset", "..."]).main()

**ms-swift 3.x** — its plugin module's ``extra_callbacks`` list: the same plugin file appends a
``GpumonCallback`` there (``--external_plugins`` exists in 3.x too; no ``--callbacks``), or add
it yourself in ``swift/plugin/callback.py``: ``extra_callbacks = [GpumonCallback()]``.

:func:`register` picks the hook from the installed ms-swift's version and raises
:class:`SwiftVersionError` for any other major version (ms-swift 2.x and earlier, 5.x...).
Known pins: ms-swift 4.6 pins ``transformers<5.20`` and ``datasets<4.8.5`` (installing it
downgrades newer ones); give it a virtualenv of its own. The shipped plugin, ``attach`` and
``add_callback`` are tested against a real ms-swift 4.6.0 (``gpumon-py/tests-swift/run.sh``, in
CI); the other call forms and 3.x against stand-in modules.
"""

import os
import re
import sys
from typing import Any, Callable, Optional

__all__ = [
    "SwiftVersionError",
    "callback_factory",
    "gpumon_callback",
    "plugin_path",
    "register",
    "swift_major_version",
]

CALLBACK_NAME = "gpumon"
SUPPORTED_MAJORS = (3, 4)

_PLUGIN_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "swift_plugin", "gpumon_swift_plugin.py")


class SwiftVersionError(RuntimeError):
    """The installed ms-swift has no hook this module knows (or is not installed)."""


def plugin_path() -> str:
    """The plugin file to pass to ``swift ... --external_plugins``. It sits alone in its
    directory: ms-swift puts that directory first on ``sys.path``, where gpumon's own
    ``transformers.py`` / ``lightning.py`` would shadow the real packages."""
    return _PLUGIN_FILE


def swift_major_version(version: Optional[str] = None) -> int:
    """The major version of ``version``, or of the installed ms-swift (its distribution's
    metadata, else ``swift.__version__``). Raises :class:`SwiftVersionError` when ms-swift is not
    installed or the version cannot be read."""
    if version is None:
        version = _installed_version()
    match = re.match(r"\s*v?(\d+)\.", str(version))
    if match is None:
        raise SwiftVersionError(f"ms-swift version {version!r} is not a version number")
    return int(match.group(1))


def _installed_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("ms-swift")
    except metadata.PackageNotFoundError:
        pass
    try:
        import swift
    except ImportError as e:
        raise SwiftVersionError("ms-swift is not installed (no `ms-swift` distribution, no `swift` module)") from e
    version = getattr(swift, "__version__", None)
    if version is None:
        raise SwiftVersionError("the `swift` module has no __version__ and no `ms-swift` distribution is installed")
    return str(version)


def _env_settings() -> dict:
    backend = os.environ.get("GPUMON_SWIFT_BACKEND", "").strip() or "auto"
    raw_every = os.environ.get("GPUMON_SWIFT_EVERY_N_STEPS", "").strip() or "1"
    try:
        every = int(raw_every)
    except ValueError:
        raise ValueError(f"GPUMON_SWIFT_EVERY_N_STEPS: {raw_every!r} is not a positive int") from None
    raw_per_gpu = os.environ.get("GPUMON_SWIFT_PER_GPU", "").strip().lower() or "0"
    if raw_per_gpu not in ("0", "1", "true", "false"):
        raise ValueError(f"GPUMON_SWIFT_PER_GPU: {raw_per_gpu!r} is not 0 or 1")
    return {"backend": backend, "every_n_steps": every, "per_gpu": raw_per_gpu in ("1", "true")}


def callback_factory(
    monitor_or_client: Any = None,
    every_n_steps: int = 1,
    per_gpu: bool = False,
    backend: str = "auto",
) -> Callable[..., Any]:
    """A factory for ms-swift's ``callbacks_map``: called as ms-swift calls it — ``()``,
    ``(trainer)``, ``(args, trainer)`` or with keywords — it ignores those arguments and returns
    a new ``GpumonCallback`` with these settings. The settings are checked now, not at the
    first training step."""
    from .transformers import GpumonCallback

    settings = dict(monitor_or_client=monitor_or_client, every_n_steps=every_n_steps, per_gpu=per_gpu, backend=backend)
    GpumonCallback(**settings)  # raises here on a bad setting

    def make(*_swift_args: Any, **_swift_kwargs: Any) -> GpumonCallback:
        return GpumonCallback(**settings)

    make.__name__ = make.__qualname__ = "gpumon_callback"
    return make


def gpumon_callback(*swift_args: Any, **swift_kwargs: Any) -> Any:
    """The factory the shipped plugin registers: a new ``GpumonCallback`` with the settings of
    ``GPUMON_SWIFT_BACKEND``, ``GPUMON_SWIFT_EVERY_N_STEPS`` and ``GPUMON_SWIFT_PER_GPU``, read at
    the call. Takes ms-swift's arguments in any form and ignores them (the callback reads the
    run's name from the training arguments at ``on_train_begin``)."""
    from .transformers import GpumonCallback

    return GpumonCallback(**_env_settings())


def register(version: Optional[str] = None) -> str:
    """Hooks gpumon into the installed ms-swift (or the one ``version`` names); returns how.

    - 4.x: ``swift.callbacks.callbacks_map["gpumon"] = gpumon_callback`` (select it with
      ``--callbacks gpumon``);
    - 3.x: appends a ``GpumonCallback`` (settings from the environment) to
      ``swift.plugin.callback.extra_callbacks``, once;
    - anything else: :class:`SwiftVersionError`.

    Idempotent: ms-swift replays plugin imports in its dataloader workers."""
    major = swift_major_version(version)
    if version is None:
        version = _installed_version()
    if major == 4:
        try:
            from swift.callbacks import callbacks_map
        except ImportError as e:
            raise SwiftVersionError(f"ms-swift {version}: no swift.callbacks.callbacks_map ({e})") from e
        callbacks_map[CALLBACK_NAME] = gpumon_callback
        return f"ms-swift {version}: callbacks_map[{CALLBACK_NAME!r}] registered; pass --callbacks {CALLBACK_NAME}"
    if major == 3:
        try:
            from swift.plugin import callback as plugin_callback
        except ImportError as e:
            raise SwiftVersionError(f"ms-swift {version}: no swift.plugin.callback ({e})") from e
        from .transformers import GpumonCallback

        extra = plugin_callback.extra_callbacks
        if not any(isinstance(c, GpumonCallback) for c in extra):
            extra.append(gpumon_callback())
        return f"ms-swift {version}: GpumonCallback added to swift.plugin.callback.extra_callbacks"
    supported = " and ".join(f"{m}.x" for m in SUPPORTED_MAJORS)
    raise SwiftVersionError(
        f"ms-swift {version} is not supported: gpumon hooks into ms-swift {supported} "
        "(4.x: callbacks_map via --external_plugins/--callbacks; 3.x: extra_callbacks). "
        "On another version, add GpumonCallback().attach(trainer) to the trainer yourself"
    )


def _main(argv: list) -> int:
    if argv == ["--plugin-path"]:
        print(plugin_path())
        return 0
    print(
        "usage: python -m gpumon.integrations.swift --plugin-path\n"
        "  prints the plugin file for `swift sft ... --external_plugins <file> --callbacks gpumon`",
        file=sys.stderr,
    )
    return 0 if argv in (["-h"], ["--help"]) else 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
