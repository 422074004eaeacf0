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

    pub(crate) fn first(&self) -> Option<&T> {
        self.iter().next()
    }

    pub(crate) fn last(&self) -> Option<&T> {
        self.iter().next_back()
    }
}

/// A window of yes/no answers with a running count of yeses.
#[derive(Clone, Debug)]
pub(crate) struct Tally {
    ring: Ring<bool>,
    yes: usize,
}

impl Tally {
    pub(crate) fn new(capacity: usize) -> Self {
        Self { ring: Ring::new(capacity), yes: 0 }
    }

    pub(crate) fn push(&mut self, v: bool) {
        if v {
            self.yes += 1;
        }
        if self.ring.push(v) == Some(true) {
            self.yes -= 1;
        }
    }

    /// How many of the values in the window are `true`.
    pub(crate) fn yes(&self) -> usize {
        self.yes
    }

    /// How many of the most recent values in a row are `true`.
    pub(crate) fn trailing_yes(&self) -> usize {
        self.ring.iter().rev().take_while(|v| **v).count()
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
    fn tally_counts_only_the_window() {
        let mut t = Tally::new(3);
        for v in [true, true, false, true] {
            t.push(v);
        }
        assert_eq!(t.yes(), 2); // [true, false, true]
        assert_eq!(t.trailing_yes(), 1);
        t.push(false);
        t.push(false);
        assert_eq!(t.yes(), 1);
        t.push(false);
        assert_eq!(t.yes(), 0);
    }
}
