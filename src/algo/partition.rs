//! Cutting element ranges into blocks (one per rank) and slices (one per message). Every rank
//! computes the same cuts from the same numbers, which is what lets a send and a receive on two
//! ranks agree on a message's size without talking.

use std::ops::Range;

/// Block `i` of `count` elements cut into `parts` nearly equal blocks: the first
/// `count % parts` blocks hold one element more. Blocks may be empty when `count < parts`.
pub fn block(count: usize, parts: usize, i: usize) -> Range<usize> {
    debug_assert!(parts > 0 && i < parts);
    let base = count / parts;
    let extra = count % parts;
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

/// Consecutive slices of at most `slice` elements covering a range, in order.
#[derive(Clone, Debug)]
pub struct Slices {
    next: usize,
    end: usize,
    slice: usize,
}

impl Slices {
    /// Slices of `range`, each at most `slice` (≥ 1) elements.
    pub fn new(range: Range<usize>, slice: usize) -> Slices {
        Slices {
            next: range.start,
            end: range.end,
            slice: slice.max(1),
        }
    }
}

impl Iterator for Slices {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        if self.next >= self.end {
            return None;
        }
        let start = self.next;
        self.next = (start + self.slice).min(self.end);
        Some(start..self.next)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.end.saturating_sub(self.next)).div_ceil(self.slice);
        (n, Some(n))
    }
}

impl ExactSizeIterator for Slices {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_exactly_and_differ_by_at_most_one() {
        for count in 0..40 {
            for parts in 1..12 {
                let mut next = 0;
                for i in 0..parts {
                    let b = block(count, parts, i);
                    assert_eq!(b.start, next);
                    assert!(b.len() == count / parts || b.len() == count / parts + 1);
                    next = b.end;
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn slices_cover_in_order() {
        let s: Vec<_> = Slices::new(3..13, 4).collect();
        assert_eq!(s, vec![3..7, 7..11, 11..13]);
        assert_eq!(Slices::new(5..5, 4).count(), 0);
        assert_eq!(Slices::new(0..10, 0).len(), 10);
    }
}
