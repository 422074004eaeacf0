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

#[cfg(test)]
mod tests {
    use super::*;

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
