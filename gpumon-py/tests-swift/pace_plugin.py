"""Test-only ms-swift plugin: registers ``callbacks_map["gpumon_test_pace"]``, which sleeps at the
start of each training step for a time that tells the steps apart (PACE[step % 3]).

Why: the callback's own Monitor samples once a second. Steps longer than that are each reported
by a tick before the next step's log, so every step's figures reach ms-swift's logs; and a
step's ``step_seconds`` must hold at least its own sleep.
"""

import time

from swift.callbacks import callbacks_map
from transformers import TrainerCallback

# Seconds slept at the start of step s: PACE[s % 3]; the lowest above the Monitor's 1 s interval.
PACE = (1.2, 1.6, 2.0)


class PaceCallback(TrainerCallback):
    def __init__(self, *swift_args, **swift_kwargs):
        pass  # ms-swift 4.6 calls callbacks_map[name](args, trainer)

    def on_step_begin(self, args, state, control, **kwargs):
        time.sleep(PACE[(state.global_step + 1) % 3])


callbacks_map["gpumon_test_pace"] = PaceCallback
