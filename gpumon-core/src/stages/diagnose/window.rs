//! Fixed-size rolling windows over ticks, allocated once per device.

/// The last `capacity` values pushed, oldest first. Pushing never allocates.
#[derive(Clone, Debug)]
pub(crate) struct Ring<T> {
    items: Vec<T>,
    capacity: usize,
    /// Index of the next slot to write once full.
    head: usize,
}

impl<T: Copy> Ring<T> {
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self { items: Vec::with_capacity(capacity), capacity, head: 0 }
    }

    /// Appends `v`, returning the value that fell out of the window, if any.
    pub(crate) fn push(&mut self, v: T) -> Option<T> {
        if self.items.len() < self.capacity {
            self.items.push(v);
            None
        } else {
            let old = std::mem::replace(&mut self.items[self.head], v);
            self.head = (self.head + 1) % self.capacity;
            Some(old)
        }
    }

    /// Oldest to newest.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + '_ {
        let (newer, older) = self.items.split_at(self.head);
        older.iter().chain(newer.iter())
    }

    /// How many values the window holds when full.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn first(&self) -> Option<&T> {
        self.iter().next()
    }

    pub(crate) fn last(&self) -> Option<&T> {
        self.iter().next_back()
    }
}

/// A window of answers to `K` yes/no questions per tick (one per finding kind), with a running
/// count of yeses for each. One ring of bitmasks, not `K` rings of `bool`s: a tick writes one
/// slot, and an agent that sleeps between ticks pays per cache line it touches, not per
/// instruction (see the `process_cold_100ms` bench).
#[derive(Clone, Debug)]
pub(crate) struct Tallies<const K: usize> {
    ring: Ring<u16>,
    yes: [u32; K],
}

impl<const K: usize> Tallies<K> {
    pub(crate) fn new(capacity: usize) -> Self {
        const { assert!(K <= 16, "one bit per question in a u16") };
        Self { ring: Ring::new(capacity), yes: [0; K] }
    }

    /// Appends one tick's answers; the oldest tick's leave the counts once the window is full.
    pub(crate) fn push(&mut self, answers: [bool; K]) {
        let mut bits = 0u16;
        for (k, &a) in answers.iter().enumerate() {
            if a {
                bits |= 1 << k;
                self.yes[k] += 1;
            }
        }
        if let Some(left) = self.ring.push(bits) {
            for (k, yes) in self.yes.iter_mut().enumerate() {
                if left & (1 << k) != 0 {
                    *yes -= 1;
                }
            }
        }
    }

    /// How many of the answers to question `k` in the window are yes.
    pub(crate) fn yes(&self, k: usize) -> usize {
        self.yes[k] as usize
    }

    /// How many of the most recent answers to question `k` in a row are yes.
    pub(crate) fn trailing_yes(&self, k: usize) -> usize {
        self.ring.iter().rev().take_while(|bits| *bits & (1 << k) != 0).count()
    }
}

/// The lowest and highest value over the same window as a [`Ring`], kept as values enter and
/// leave it (monotonic queues: amortised constant time per tick), so a rule reads the window's
/// spread without scanning it — up to 36 000 ticks per GPU per tick otherwise.
///
/// Values enter and leave in the order of the ring they shadow: call [`entered`](Self::entered)
/// once per tick pushed (with `None` when the tick has no value) and [`left`](Self::left) once
/// per tick the ring drops.
#[derive(Clone, Debug, Default)]
pub(crate) struct Extremes {
    /// Candidates for the minimum: (tick number, value), values increasing front to back.
    lows: std::collections::VecDeque<(u64, f64)>,
    /// Candidates for the maximum: values decreasing front to back.
    highs: std::collections::VecDeque<(u64, f64)>,
    /// Tick number of the next tick to enter, and of the oldest still in the window.
    next: u64,
    oldest: u64,
}

impl Extremes {
    /// Counts a tick in: its lowest and highest reading (NaN is no reading).
    pub(crate) fn entered(&mut self, low: Option<f64>, high: Option<f64>) {
        let tick = self.next;
        self.next += 1;
        if let Some(v) = low.filter(|v| !v.is_nan()) {
            // A value at or above the new one can never be the minimum again: it leaves sooner.
            while self.lows.back().is_some_and(|&(_, b)| b >= v) {
                self.lows.pop_back();
            }
            self.lows.push_back((tick, v));
        }
        if let Some(v) = high.filter(|v| !v.is_nan()) {
            while self.highs.back().is_some_and(|&(_, b)| b <= v) {
                self.highs.pop_back();
            }
            self.highs.push_back((tick, v));
        }
    }

    /// Counts the oldest tick out.
    pub(crate) fn left(&mut self) {
        self.oldest += 1;
        let oldest = self.oldest;
        while self.lows.front().is_some_and(|&(t, _)| t < oldest) {
            self.lows.pop_front();
        }
        while self.highs.front().is_some_and(|&(t, _)| t < oldest) {
            self.highs.pop_front();
        }
    }

    /// The lowest and highest value in the window, if any tick had one.
    pub(crate) fn get(&self) -> (Option<f64>, Option<f64>) {
        (self.lows.front().map(|&(_, v)| v), self.highs.front().map(|&(_, v)| v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running extremes equal a scan of the window, tick by tick, through values that rise,
    /// fall, repeat, go missing and are NaN, for windows of one tick to longer than the run.
    #[test]
    fn extremes_equal_a_scan_of_the_window() {
        let values: Vec<Option<f64>> = (0..400u64)
            .map(|i| match (i * 7919 + 13) % 23 {
                0 => None,
                1 => Some(f64::NAN),
                k if i % 50 < 25 => Some(k as f64 / 23.0),
                k => Some(1.0 - (k % 5) as f64 / 5.0),
            })
            .collect();
        for capacity in [1, 2, 3, 7, 30, 500] {
            let mut ring = Ring::new(capacity);
            let mut extremes = Extremes::default();
            for (i, &v) in values.iter().enumerate() {
                // Low and high differ, as a tick's lowest and highest driver sample do.
                let (lo, hi) = (v.map(|x| x * 0.5), v);
                extremes.entered(lo, hi);
                if ring.push((lo, hi)).is_some() {
                    extremes.left();
                }
                let real = |v: &Option<f64>| v.filter(|x| !x.is_nan());
                let low = ring.iter().filter_map(|(lo, _)| real(lo)).reduce(f64::min);
                let high = ring.iter().filter_map(|(_, hi)| real(hi)).reduce(f64::max);
                let want = (low, high);
                assert_eq!(extremes.get(), want, "capacity {capacity}, tick {i}");
            }
        }
    }

    #[test]
    fn ring_keeps_the_last_values_in_order() {
        let mut r = Ring::new(3);
        assert_eq!(r.push(1), None);
        r.push(2);
        r.push(3);
        assert_eq!(r.push(4), Some(1));
        assert_eq!(r.iter().copied().collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!((r.first(), r.last()), (Some(&2), Some(&4)));
    }

    #[test]
    fn tallies_count_each_question_over_the_window_only() {
        let mut t = Tallies::<2>::new(3);
        for answers in [[true, false], [true, true], [false, true], [true, true]] {
            t.push(answers);
        }
        // The window: [true, true], [false, true], [true, true].
        assert_eq!((t.yes(0), t.yes(1)), (2, 3));
        assert_eq!((t.trailing_yes(0), t.trailing_yes(1)), (1, 3));
        t.push([false, false]);
        t.push([false, true]);
        assert_eq!((t.yes(0), t.yes(1)), (1, 2));
        assert_eq!((t.trailing_yes(0), t.trailing_yes(1)), (0, 1));
        t.push([false, false]);
        assert_eq!((t.yes(0), t.yes(1)), (0, 1));
    }
}
