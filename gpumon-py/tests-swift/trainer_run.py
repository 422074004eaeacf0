"""`swift sft` through ms-swift's Python API, with gpumon added to the trainer ms-swift built
rather than through the plugin:

    trainer_run.py MODE SWIFT_SFT_ARGS...      (MODE: attach | add_callback)

``SwiftSft`` (``swift.pipelines``, ms-swift 4.x) builds the model, the dataset and the trainer,
then calls ``train(trainer)``; this subclass adds a ``GpumonCallback`` on the mock backend there.
One training per process: a second one in the same process writes its TensorBoard events into
the first one's directory (ms-swift 4.6).

- ``attach``: ``GpumonCallback(...).attach(trainer)``, placed before the reporting callbacks;
- ``add_callback``: ``trainer.add_callback(GpumonCallback(...))``, the Hugging Face way, which
  appends it after the reporters (the callback moves itself before them when training begins).

Run by run.sh next to the plugin run; check_logs.py then reads each run's logging.jsonl and
TensorBoard events the same way. gpumon must not also come from ``--callbacks``: the run fails
if it does, so the figures checked can only be this callback's.
"""

import sys

from swift.pipelines import SwiftSft

from gpumon.integrations.transformers import GpumonCallback

MODES = ("attach", "add_callback")


class GpumonSft(SwiftSft):
    mode = "attach"

    def train(self, trainer):
        names = [type(c).__name__ for c in trainer.callback_handler.callbacks]
        if any(isinstance(c, GpumonCallback) for c in trainer.callback_handler.callbacks):
            sys.exit(f"trainer_run.py: the trainer ms-swift built already has a GpumonCallback: {names}")
        callback = GpumonCallback(backend="mock")
        if self.mode == "attach":
            callback.attach(trainer)
        else:
            trainer.add_callback(callback)
        print(f"trainer_run.py: {self.mode}: GpumonCallback added to {type(trainer).__name__} ({names})", flush=True)
        return super().train(trainer)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in MODES:
        sys.exit(f"usage: trainer_run.py {{{'|'.join(MODES)}}} SWIFT_SFT_ARGS...")
    GpumonSft.mode = sys.argv[1]
    GpumonSft(sys.argv[2:]).main()


if __name__ == "__main__":
    main()
