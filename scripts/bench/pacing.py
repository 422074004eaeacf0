"""Fixed-interval pacing shared by the bench loops (pynvml_loop.py, scrape_loop.py), so every peer
in scripts/bench-peers.sh is paced by the same rule."""
import time


class Pacer:
    """Rounds at a fixed interval from the start: `wait()` sleeps until the next round is due. A
    round that overran restarts the schedule from now rather than running the missed rounds back to
    back (a burst would measure something else than the steady rate)."""

    def __init__(self, interval: float):
        self.interval = interval
        self.next_t = time.monotonic()

    def wait(self) -> None:
        self.next_t += self.interval
        delay = self.next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            self.next_t = time.monotonic()
